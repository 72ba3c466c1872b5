"""One rule for whether the shards of an N:M layer's weight cut through its groups.

``NMBackbone.check_shard`` (a weight read shard by shard) and
``NMBackbone.splits_groups`` (which layers the report, the sparsity count and
S-STE's β gather whole) answer from the layout, the same on every rank. The
layouts here are the fakes of ``test_mutation_gaps_dist`` (what the rules read
of a DTensor), with each rank's local part.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import feather_sparse as fs
from _guards import guard
from feather_sparse.nm import NMPattern
from feather_sparse.nm import backbone as nm_backbone
from feather_sparse.nm.backbone import _splits_groups
from test_mutation_gaps_dist import _Layout

tensor_api = pytest.importorskip("torch.distributed.tensor")
Shard = tensor_api.Shard
_StridedShard = pytest.importorskip("torch.distributed.tensor.placement_types")._StridedShard


class _RankLayout(_Layout):
    """A layout seen from one rank: its local part of ``dim``, cut as ``torch.chunk`` cuts."""

    def __init__(self, whole: torch.Tensor, dim: int, parts: int, rank: int) -> None:
        super().__init__(tuple(whole.shape), (dim,), (parts,))
        self._local = torch.chunk(whole, parts, dim)[rank]

    def to_local(self) -> torch.Tensor:
        return self._local


@guard(
    "an N:M layer's weight read shard by shard on 3 or more ranks, where one rank's own "
    "shard holds whole groups but another's splits them (a row of 16 inputs in 2:4 groups "
    "cut 6/6/4)",
    "every rank raises the same `ValueError` (the rule reads the layout, as the report's "
    "gathering does); the rank holding whole groups computed its part alone while the "
    "others raised",
)
@pytest.mark.parametrize("rank", [0, 1, 2])
def test_every_rank_refuses_a_layout_that_splits_groups_on_some_rank(
    rank: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    pruner = fs.Pruner(nn.Linear(16, 4), pattern="2:4", total_steps=2)
    monkeypatch.setattr(nm_backbone, "is_dtensor", lambda w: True)
    weight: Any = _RankLayout(torch.randn(4, 16), dim=1, parts=3, rank=rank)
    assert pruner.backbone.splits_groups(0, weight)
    with pytest.raises(ValueError, match=r"some rank's shard splits its 2:4 groups") as err:
        pruner.backbone.check_shard(0, weight)
    assert f"this rank's shard {tuple(weight.to_local().shape)}" in str(err.value)


@pytest.mark.parametrize(("inputs", "parts"), [(16, 2), (16, 4), (24, 3), (12, 3)])
def test_shards_that_keep_every_group_whole_are_computed(
    inputs: int, parts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    pruner = fs.Pruner(nn.Linear(inputs, 12), pattern="2:4", total_steps=2)
    monkeypatch.setattr(nm_backbone, "is_dtensor", lambda w: True)
    for rank in range(parts):
        weight: Any = _RankLayout(torch.randn(12, inputs), dim=1, parts=parts, rank=rank)
        pruner.backbone.check_shard(0, weight)  # no error
        rows: Any = _RankLayout(torch.randn(12, inputs), dim=0, parts=parts, rank=rank)
        pruner.backbone.check_shard(0, rows)


class _StridedLayout(_Layout):
    """FSDP2 over tensor parallelism sharding one dimension twice (a ``_StridedShard``)."""

    def __init__(self, shape: tuple[int, ...], dim: int, alone: bool) -> None:
        super().__init__(shape, (dim,), (2, 2))
        self.placements = (_StridedShard(dim, split_factor=2), Shard(dim))
        if alone:  # not a Shard (torch 2.13): its dimension is read from it
            self.placements = (_StridedShard(dim, split_factor=2),)


@pytest.mark.parametrize("alone", [False, True])
@pytest.mark.parametrize(
    ("shape", "dim", "order", "splits"),
    [
        ((8, 16), 0, "flat", False),  # rows: a group never crosses one
        ((8, 16), 1, "flat", True),  # the inputs, where the groups run: cuts unknown
        ((16, 8), 0, "transposed", True),  # stored (in, out): dim 0 holds the groups
        ((16, 8), 1, "transposed", False),
        ((8, 4, 3), 0, "channels", False),
        ((8, 4, 3), 1, "channels", True),
    ],
)
def test_a_layout_whose_cuts_are_unknown_splits_unless_it_shards_rows_only(
    shape: tuple[int, ...], dim: int, order: str, splits: bool, alone: bool
) -> None:
    """A dim-0 ``_StridedShard`` (colwise tensor parallelism under FSDP2) keeps the
    groups whole: its layer is computed shard by shard, not gathered (it was always
    gathered, as if any cut were possible)."""
    assert _splits_groups(_StridedLayout(shape, dim, alone), order, NMPattern(2, 4)) is splits


class _Unnamed:
    """A placement of a layout of its own that names no dimension."""

    def is_replicate(self) -> bool:
        return False

    def is_partial(self) -> bool:
        return False


def test_a_placement_that_names_no_dimension_may_cut_anywhere() -> None:
    layout = _StridedLayout((8, 16), 0, alone=True)
    layout.placements = (_Unnamed(),)
    assert _splits_groups(layout, "flat", NMPattern(2, 4))
