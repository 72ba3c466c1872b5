"""Tests that close the gaps a mutation audit of the sharding code found.

Each test fails on hand-made mutants of ``distributed.py`` or ``nm/backbone.py``
that the rest of the suite let through (``docs/mutation-audit.md``, section
"The sharding code": the mutants' ids are in each docstring). They check the
layout rules against an oracle written from their specification — DTensor's
``Shard`` cuts a dimension as ``torch.chunk`` does, nested in mesh order, and an
N:M group is ``m`` consecutive entries of a row in the layer's group order — by
brute force over every entry, not against today's output.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from feather_sparse.distributed import shard_cuts
from feather_sparse.nm import NMPattern
from feather_sparse.nm.backbone import NMBackbone, _splits_groups

Shard = pytest.importorskip("torch.distributed.tensor").Shard


class _Layout:
    """What the layout rules read of a DTensor: its shape, placements and mesh sizes."""

    def __init__(self, shape: tuple[int, ...], dims: tuple[int, ...], mesh: tuple[int, ...]):
        self.shape = torch.Size(shape)
        self.placements = tuple(Shard(d) for d in dims)
        self.device_mesh = SimpleNamespace(size=lambda i: mesh[i])

    def dim(self) -> int:
        return len(self.shape)


def _owners_along(length: int, dim: int, dims: tuple[int, ...], mesh: tuple[int, ...]) -> Any:
    """Which part each index of dimension ``dim`` lands in: ``torch.chunk`` of each
    part again for every mesh dimension that shards ``dim``, in mesh order."""
    owner = torch.zeros(length, dtype=torch.int64)
    for mesh_dim, d in enumerate(dims):
        if d != dim:
            continue
        parts = mesh[mesh_dim]
        new = torch.empty_like(owner)
        for label in owner.unique().tolist():
            where = (owner == label).nonzero().flatten()
            for k, piece in enumerate(torch.chunk(where, parts)):
                new[piece] = label * parts + k
        owner = new
    return owner


def _cuts_by_chunking(
    shape: tuple[int, ...], dims: tuple[int, ...], mesh: tuple[int, ...]
) -> dict[int, list[int]]:
    cuts = {}
    for dim in sorted(set(dims)):
        owner = _owners_along(shape[dim], dim, dims, mesh)
        cuts[dim] = [i for i in range(1, shape[dim]) if owner[i] != owner[i - 1]]
    return cuts


def _splits_by_brute_force(
    shape: tuple[int, ...], dims: tuple[int, ...], mesh: tuple[int, ...], order: str, m: int
) -> bool:
    """Whether some group of ``m`` consecutive entries of a row (group order) holds
    entries of two ranks' parts."""
    owner = torch.zeros(shape, dtype=torch.int64)
    for dim in range(len(shape)):
        along = _owners_along(shape[dim], dim, dims, mesh)
        view = [1] * len(shape)
        view[dim] = shape[dim]
        owner = owner * (int(along.max()) + 1) + along.reshape(view)
    if order == "channels":  # the input channels run innermost
        owner = owner.movedim(1, -1)
    elif order == "transposed":  # stored (in, out): a row is a column
        owner = owner.t()
    groups = owner.reshape(owner.shape[0], -1, m)
    return bool((groups != groups[..., :1]).any())


SHAPES = [
    (8, 12),
    (8, 16),
    (5, 8),
    (12, 8),
    (20, 12),
    (8, 4, 3, 3),
    (8, 6, 3, 3),
    (8, 8, 5),
    (8, 3, 10),
    (6, 4, 5, 2),
]


def _layouts() -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], str]]:
    out = []
    for shape in SHAPES:
        orders = ["flat"] + (["transposed"] if len(shape) == 2 else ["channels"])
        for order, n_mesh in itertools.product(orders, (1, 2)):
            for dims in itertools.product(range(len(shape)), repeat=n_mesh):
                for mesh in itertools.product((2, 3, 4), repeat=n_mesh):
                    out.append((shape, dims, mesh, order))
    return out


LAYOUTS = _layouts()


def test_shard_cuts_are_torch_chunks_nested_in_mesh_order() -> None:
    """dist01 (floor for ceil), dist02 (part ends past the length), dist03 (no nesting):
    the cuts are where ``torch.chunk``'s parts meet, a part chunked again by each
    later mesh dimension, for every layout, uneven and empty last parts included."""
    wrong = []
    for shape, dims, mesh, _ in LAYOUTS:
        got = shard_cuts(_Layout(shape, dims, mesh))
        want = _cuts_by_chunking(shape, dims, mesh)
        if got != want:
            wrong.append((shape, dims, mesh, got, want))
    assert not wrong, wrong[:5]


@pytest.mark.parametrize("m", [2, 4])
def test_splits_groups_is_true_exactly_when_a_group_spans_two_parts(m: int) -> None:
    """nmsplit01-05: a layout splits groups iff some group of ``m`` consecutive entries
    of a row, in the layer's group order (flat, transposed or channels innermost),
    holds entries of two ranks' parts — by brute force over every entry."""
    wrong = []
    checked = 0
    for shape, dims, mesh, order in LAYOUTS:
        row = shape[0] if order == "transposed" else torch.Size(shape).numel() // shape[0]
        if row % m:  # the pattern does not apply to such a layer
            continue
        checked += 1
        got = _splits_groups(_Layout(shape, dims, mesh), order, NMPattern(m // 2, m))
        want = _splits_by_brute_force(shape, dims, mesh, order, m)
        if got is not want:
            wrong.append((shape, dims, mesh, order, got, want))
    assert checked > 100
    assert not wrong, wrong[:5]


def _each_rank_its_own_group(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_tensor

    from feather_sparse.distributed import shard_like, whole_on_first

    mesh = init_device_mesh("cpu", (world,))
    whole = torch.arange(8.0).reshape(4, 2)
    w = distribute_tensor(whole, mesh, [Shard(0)])
    # One group per rank (all ranks create every group, in the same order), as
    # replicas that each select over their own ranks: this rank is the first of
    # its group, whatever its global rank.
    groups = [dist.new_group([r]) for r in range(world)]
    gathered = whole_on_first(w, groups[rank])
    part = torch.ones(2, 2)  # a part's shape, not the whole one
    kept = shard_like(part, w)
    loaded = shard_like(whole.clone(), w)
    return {
        "gathered": gathered,
        "part_kept_as_is": kept is part,
        "loaded_local": loaded.to_local() if isinstance(loaded, DTensor) else None,
    }


@pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="needs torch.distributed + gloo",
)
def test_whole_on_first_keeps_it_on_the_groups_first_rank_and_shard_like_cuts_whole_ones() -> None:
    """dist05 (the global rank 0 instead of the group's) and dist16 (``shard_like``'s
    whole-shape check dropped). ``whole_on_first``: "only the group's rank 0 keeps
    it" — with one group per rank, every rank is its group's first and keeps the
    whole weight. ``shard_like``: a value that is not of ``like``'s whole shape
    "comes back as it is"; a whole one gives this rank's rows (``torch.chunk``)."""
    from _dist import launch

    whole = torch.arange(8.0).reshape(4, 2)
    for rank, got in enumerate(launch(_each_rank_its_own_group, world=2)):
        assert torch.equal(got["gathered"], whole), rank
        assert got["part_kept_as_is"], rank
        assert torch.equal(got["loaded_local"], torch.chunk(whole, 2)[rank]), rank


def _local_sizes(rank: int, world: int) -> list[int]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    from feather_sparse.distributed import local_weights

    mesh = init_device_mesh("cpu", (world,))
    sharded = distribute_tensor(torch.randn(4, 6), mesh, [Shard(0)])
    replicated = distribute_tensor(torch.randn(3, 5), mesh, [Replicate()])
    plain = torch.randn(2, 7)  # a whole weight every rank holds (e.g. left out of the plan)
    local, group = local_weights([sharded, replicated, plain], None)
    assert group is not None
    return [t.numel() for t in local]


@pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="needs torch.distributed + gloo",
)
def test_local_weights_count_each_weight_once_over_the_group() -> None:
    """dist12 (a replicated DTensor's holders taken as this rank alone) and dist15 (a
    plain tensor counted on every rank): "Each weight counts once over the group: a
    weight replicated on some mesh dimensions (a plain tensor, a DTensor replicated
    among sharded ones, ...) is counted on one rank per shard" — summed over the
    ranks, the local parts hold each weight's elements exactly once."""
    from _dist import launch

    sizes = launch(_local_sizes, world=2)
    assert [sum(s) for s in zip(*sizes)] == [4 * 6, 3 * 5, 2 * 7], sizes


def test_nm_report_threshold_is_the_float64_mean_of_the_group_thresholds() -> None:
    """nmrep01 (``Σ T_g`` summed in float32): the report's N:M threshold is the mean
    ``r·T_g`` over the groups, ``T_g`` the ``(m − n)``-th smallest magnitude of each
    group. Magnitudes in [1, 2) make every float64 sum of them exact (one
    exponent), so the mean is known to the last bit; 65,536 groups in float32 lose
    the low bits."""
    import feather_sparse as fs

    torch.manual_seed(0)
    layer = torch.nn.Linear(4096, 64, bias=False)
    w = (1 + torch.rand(64, 4096)) * torch.sign(torch.randn(64, 4096))
    with torch.no_grad():
        layer.weight.copy_(w)
    pruner = fs.Pruner(torch.nn.Sequential(layer), pattern="2:4", sparsity=0.5)
    t_g = w.double().abs().reshape(-1, 4).sort(dim=1).values[:, 1]  # the 2nd smallest
    want = float(t_g.sum()) / t_g.numel()
    backbone = pruner.backbone
    assert isinstance(backbone, NMBackbone)
    for ramp in (1.0, 0.5):
        got = backbone.report_thresholds([w], [torch.tensor(ramp)])
        assert got == [want * ramp]
