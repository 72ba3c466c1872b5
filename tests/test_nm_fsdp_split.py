"""N:M under FSDP2 with shards that split groups (gloo on CPU, 2 processes).

A Linear stored ``(in, out)`` (GPT-2's ``Conv1D``) sharded on dim 0, or a
Linear sharded along its inputs by a ``shard_placement_fn``, cut at a row or
column that is not a multiple of M: each rank's part holds pieces of groups.
The forward gathers the whole weight and is right; the Pruner's collectives
(``report()``, ``sparsity_achieved()``, ``dense_state_dict(pruned=True)``
with and without ``full=True``, S-STE's β taken after sharding) gather such a
layer whole and give what one process computes on the whole weights. Each
model also has a layer whose shards keep the groups whole (computed from the
shards, as before).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn

import feather_sparse as fs
from _dist import launch, recorded
from _guards import guard
from _helpers import SAFETENSORS_MISSING
from feather_sparse.distributed import shard_cuts
from feather_sparse.nm import NMPattern
from feather_sparse.nm.backbone import _splits_groups

WORLD = 2
STEPS = 4

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed + gloo"
)

#: (first layer, the tensor dimension fully_shard shards): the first layer's shards split
#: its 2:4 groups, the second layer's (8 inputs) keep them whole.
LAYOUTS = {
    "conv1d": ("conv1d", 0),  # Conv1D (12, 8) stored (in, out): (6, 8) per rank
    "inputs": ("linear", 1),  # Linear (8, 12) sharded on its inputs: (8, 6) per rank
}

#: Plain 2:4 from the first step; S-STE's β, taken when the pattern is reached after a
#: dense warm-up, i.e. from the sharded weights.
KINDS: dict[str, dict[str, Any]] = {
    "plain": {"pattern": "2:4", "theta": 0.5},
    "rescale": {
        "pattern": "2:4",
        "backbone": {"name": "nm", "rescale": True},
        "schedule": {"name": "constant", "start": 0.5},
        "total_steps": STEPS,
    },
}


def _model(layer: str) -> nn.Sequential:
    torch.manual_seed(0)  # the same weights on every rank, as FSDP2 expects
    if layer == "linear":
        first: nn.Module = nn.Linear(12, 8)
    else:
        from transformers.pytorch_utils import Conv1D

        first = Conv1D(8, 12)
    return nn.Sequential(first, nn.ReLU(), nn.Linear(8, 16))


def _full(value: Tensor) -> Tensor:
    full = getattr(value, "full_tensor", None)
    return (full() if full is not None else value).detach().clone()


def _measure(pruner: fs.Pruner) -> dict[str, Any]:
    report = pruner.report()
    backbone: Any = pruner.backbone
    return {
        "achieved": pruner.sparsity_achieved(),
        "sparsity": report.sparsity,
        "layers": [(r.name, r.shape, r.params, r.sparsity) for r in report.layers],
        "shown": [r.threshold for r in report.layers],
        "beta": None if backbone._beta is None else [b.clone() for b in backbone._beta],
        "pruned": {k: _full(v) for k, v in pruner.dense_state_dict(pruned=True).items()},
        "pruned_full": pruner.dense_state_dict(pruned=True, full=True),
    }


def _train(rank: int, layout: str, kind: str) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    layer, dim = LAYOUTS[layout]
    model = _model(layer)
    pruner = fs.Pruner(model, **KINDS[kind])
    for m in (model[0], model[2]):
        fully_shard(m, shard_placement_fn=lambda p: Shard(dim) if p.dim() > 1 else None)
    fully_shard(model)
    reference = _model(layer)
    one = fs.Pruner(reference, **KINDS[kind])
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    gen = torch.Generator().manual_seed(rank)  # each rank its own data
    steps = []
    for _ in range(STEPS):
        x, y = torch.randn(4, 12, generator=gen), torch.randint(0, 16, (4,), generator=gen)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        before = pruner.state_dict()
        pruner.step()
        # one process: the whole weights, the state before the step, then the step
        reference.load_state_dict(pruner.dense_state_dict(full=True))
        one.load_state_dict(before)
        one.step()
        stepped = one.state_dict()["backbone"]["beta"]
        one.load_state_dict(pruner.state_dict())  # the same β (summed otherwise) for the rest
        x_eval = torch.randn(4, 12, generator=torch.Generator().manual_seed(9))
        with torch.no_grad():
            outputs = (model(x_eval), reference(x_eval))
        steps.append(
            {
                "sharded": _measure(pruner),
                "one": {**_measure(one), "beta_stepped": stepped},
                "outputs": outputs,
            }
        )
    return {
        "steps": steps,
        "gathers": [pruner._gathers(i, w) for i, w in enumerate(pruner.weights())],
        "local_shapes": [tuple(w.to_local().shape) for w in pruner.weights()],  # type: ignore[attr-defined]
    }


def _scenario(rank: int, world: int) -> dict[Any, Any]:
    return {
        (layout, kind): recorded(functools.partial(_train, rank, layout, kind))
        for layout in LAYOUTS
        for kind in KINDS
    }


@pytest.fixture(scope="module")
def runs() -> list[dict[Any, Any]]:
    return launch(_scenario, WORLD)


def _runs(runs: list[dict[Any, Any]], layout: str, kind: str) -> list[dict[str, Any]]:
    out = [run[layout, kind] for run in runs]
    for rank, run in enumerate(out):
        if "error" in run and "No module named 'transformers'" in run["error"]:
            pytest.skip("needs transformers (GPT-2's Conv1D)")
        if SAFETENSORS_MISSING and "No module named 'safetensors'" in run.get("error", ""):
            pytest.skip(
                f"GPT-2's Conv1D needs transformers, which needs safetensors: {SAFETENSORS_MISSING}"
            )
        assert "error" not in run, f"rank {rank}:\n{run['error']}"
    return out


@guard(
    "`report()`, `sparsity_achieved()`, `dense_state_dict(pruned=True)` (with or without "
    "`full=True`) or S-STE's `rescale=True` step under FSDP2 on an N:M layer whose shards split "
    "its groups (GPT-2's `Conv1D` cut at a row off a multiple of M; a `shard_placement_fn` "
    "sharding its inputs)",
    "the layer is gathered whole for these collectives (`full_tensor`): the one-process values "
    "(a confusing shape error before)",
)
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_split_groups_give_the_one_process_values(
    runs: list[dict[Any, Any]], layout: str, kind: str
) -> None:
    split = (6, 8) if layout == "conv1d" else (8, 6)
    whole = (8, 8) if layout == "conv1d" else (16, 4)
    for run in _runs(runs, layout, kind):
        assert run["local_shapes"] == [split, whole]  # really sharded
        assert run["gathers"] == [True, False]
        for step in run["steps"]:
            got, want = step["sharded"], step["one"]
            assert got["achieved"] == want["achieved"]
            assert got["sparsity"] == want["sparsity"]
            assert got["layers"] == want["layers"]
            assert got["shown"] == pytest.approx(want["shown"], rel=1e-9)
            for key, value in want["pruned"].items():
                assert torch.equal(got["pruned"][key], value), key
                assert torch.equal(got["pruned_full"][key], value), key
            torch.testing.assert_close(*step["outputs"])
        assert run["steps"][-1]["sharded"]["achieved"] == 0.5


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_rescale_beta_taken_from_split_shards_is_the_one_process_beta(
    runs: list[dict[Any, Any]], layout: str
) -> None:
    for run in _runs(runs, layout, "rescale"):
        betas = [step["sharded"]["beta"] for step in run["steps"]]
        assert betas[0] is None  # dense warm-up: taken later, from the sharded weights
        assert betas[-1] is not None
        for step in run["steps"][1:]:
            got, want = step["sharded"]["beta"], step["one"]["beta_stepped"]
            # the split layer is gathered whole: the same sums; the other adds two halves,
            # in float64, which rounds to the same float32 β
            assert torch.equal(got[0], want[0])
            assert torch.equal(got[1], want[1])


# ------------------------------------------------ the layout rule, one process
class _Layout:
    """What shard_cuts reads of a DTensor: its shape, placements and mesh sizes."""

    def __init__(self, shape: tuple[int, ...], placements: tuple[Any, ...], mesh: tuple[int, ...]):
        self.shape = torch.Size(shape)
        self.placements = placements
        self.device_mesh = SimpleNamespace(size=lambda i: mesh[i])

    def dim(self) -> int:
        return len(self.shape)


def _shard(*dims: int) -> tuple[Any, ...]:
    from torch.distributed.tensor import Shard

    return tuple(Shard(d) for d in dims)


#: (weight shape, sharded dims per mesh dim, mesh, group order, splits 2:4 groups)
CASES = [
    ((8, 12), (1,), (2,), "flat", True),  # Linear sharded on its inputs: (8, 6)
    ((8, 16), (1,), (2,), "flat", False),  # (8, 8): two groups a row
    ((8, 16), (1,), (3,), "flat", True),  # chunks of 6, 6, 4
    ((8, 12), (0,), (3,), "flat", False),  # rows
    ((12, 8), (0,), (2,), "transposed", True),  # GPT-2's Conv1D (in, out): (6, 8)
    ((16, 8), (0,), (2,), "transposed", False),  # (8, 8)
    ((12, 8), (1,), (2,), "transposed", False),  # sharded on its outputs
    ((8, 4, 3, 3), (1,), (2,), "flat", True),  # a row of 36: cut at 18
    ((8, 8, 3, 3), (1,), (2,), "flat", False),  # cut at 36 of 72
    ((8, 8, 3, 3), (2,), (3,), "flat", True),  # kernel rows: cut at 3 within each channel
    ((8, 8, 3, 3), (2,), (3,), "channels", False),  # channels innermost: cuts at 24, 48
    ((8, 8, 3, 3), (1,), (2,), "channels", False),  # 4 of 8 channels at each position
    ((8, 6, 1, 1), (1,), (2,), "channels", True),  # 3 of 6 channels
    ((8, 16), (1, 1), (2, 2), "flat", False),  # twice halved: 4 each
    ((8, 24), (1, 1), (2, 2), "flat", True),  # 12, then 6
]


@pytest.mark.parametrize(("shape", "dims", "mesh", "order", "splits"), CASES)
def test_which_layouts_split_groups(
    shape: tuple[int, ...], dims: tuple[int, ...], mesh: tuple[int, ...], order: str, splits: bool
) -> None:
    """The same answer on every rank, from the layout: a cut must fall on a group boundary
    of every row, in the order the layer's groups run."""
    weight = _Layout(shape, _shard(*dims), mesh)
    assert _splits_groups(weight, order, NMPattern(2, 4)) is splits


def test_shard_cuts_follow_torch_chunk_and_nest_in_mesh_order() -> None:
    assert shard_cuts(_Layout((8, 16), _shard(1), (3,))) == {1: [6, 12]}
    assert shard_cuts(_Layout((8, 24), _shard(1, 1), (2, 2))) == {1: [6, 12, 18]}
    assert shard_cuts(_Layout((3, 4), _shard(0), (4,))) == {0: [1, 2]}  # an empty last part
    strided = pytest.importorskip("torch.distributed.tensor.placement_types")._StridedShard
    weight = _Layout((8, 16), (strided(0, split_factor=2),), (2,))
    assert shard_cuts(weight) is None  # not torch.chunk's layout: assumed to cut anywhere
    # ... along its dimension: rows keep the groups whole, the inputs may split them
    assert not _splits_groups(weight, "flat", NMPattern(2, 4))
    inputs = _Layout((8, 16), (strided(1, split_factor=2),), (2,))
    assert _splits_groups(inputs, "flat", NMPattern(2, 4))
