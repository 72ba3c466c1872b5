"""Tests that close the gaps a mutation audit of the distributed helpers found.

Each test fails on hand-made mutants of ``distributed.py`` (or of the two places in
``pruner.py`` that must refuse before changing anything) that the rest of the suite
let through (``docs/mutation-audit.md``, section "The DDP reconnection, the
reductions and the DTensor helpers": the mutants' ids are in each docstring). They
check the documented contract against an independent computation: DDP's gradients
against each rank's own gradient of an unwrapped copy, averaged here; the reductions
against sums and maxima written out by hand; a DTensor's helpers against
``torch.chunk`` of the whole tensor.

All scenarios run in one launch of 2 gloo processes (a module fixture, about 20 s).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.utils import parametrize

import feather_sparse as fs
from _dist import launch, recorded
from _guards import guard
from _helpers import conv1d_net

WORLD = 2
STEPS = 2
KWARGS: dict[str, Any] = {"sparsity": 0.8, "total_steps": 10}  # cubic: the threshold moves
#: Where DDP sits relative to the module the Pruner attaches to (see _ddp_gradients).
LAYOUTS = ("plain", "frozen", "ignored", "wrapped", "inside")
AGAIN = ("again after remove", "again after finalize")

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed + gloo"
)


# ------------------------------------------------------------------ DDP
class _Wrapper(nn.Module):
    """A framework's wrapper around the user's module (as Lightning's, inside DDP)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.inner(x)
        return out


def _batch(rank: int, step: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)  # each rank its own batch
    return torch.randn(6, 2, 16, generator=g), torch.randint(0, 4, (6,), generator=g)


def _ddp_gradients(rank: int, world: int, layout: str) -> dict[str, Any]:
    """Train ``STEPS`` steps of a DDP model whose Pruner attached after wrapping, and
    give, at every step, each trainable parameter's gradient and the one expected:
    the mean over the ranks of each rank's own gradient, computed on an unwrapped
    copy holding the same weights and Pruner state (a parameter DDP ignores keeps
    its own rank's gradient)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = conv1d_net(seed=rank)  # DDP broadcasts rank 0's weights
    ignored: set[str] = set()
    if layout == "frozen":  # a frozen parameter before the pruned ones
        model[0].bias.requires_grad_(False)
    if layout == "ignored":  # a parameter DDP leaves alone, before the pruned ones
        ignored = {"0.bias"}
        DDP._set_params_and_buffers_to_ignore_for_model(model, sorted(ignored))
    if layout == "wrapped":  # Pruner(model) inside a wrapper inside DDP
        run: nn.Module = DDP(_Wrapper(model))
        pruner = fs.Pruner(model, **KWARGS)
    elif layout == "inside":  # a DDP inside the module given to the Pruner
        holder = nn.ModuleDict({"net": DDP(model)})
        run = holder["net"]
        pruner = fs.Pruner(holder, **KWARGS)
    elif layout in ("again after remove", "again after finalize"):  # a second Pruner
        run = DDP(model)
        first = fs.Pruner(run, **KWARGS)
        getattr(first, layout.split()[-1])()
        pruner = fs.Pruner(run, **KWARGS)
    else:
        run = DDP(model)
        pruner = fs.Pruner(run, **KWARGS)
    reference = conv1d_net(seed=0)  # the same layers and names, no DDP around it
    reference[0].bias.requires_grad_(model[0].bias.requires_grad)
    reference_pruner = fs.Pruner(reference, **KWARGS)  # its weights and state: set below
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    for step in range(STEPS):
        reference.load_state_dict(model.state_dict())
        with torch.no_grad():  # the same thresholds (its layer names differ: no state load)
            for mine, theirs in zip(reference_pruner._buffers(), pruner._buffers()):
                mine.copy_(theirs)
        x, y = _batch(rank, step)
        reference.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()
        expected = {}
        for name, p in reference.named_parameters():
            if p.grad is None:
                continue
            g = p.grad.clone()
            if name.replace(".parametrizations.weight.original", ".weight") not in ignored:
                dist.all_reduce(g)
                g /= world
            expected[name] = g
        opt.zero_grad()
        nn.functional.cross_entropy(run(x), y).backward()
        got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        pruner.step()
        steps.append({"got": got, "expected": expected})
    return {"steps": steps, "pruned": len(pruner.weights())}


def _refused_ddp_options() -> dict[str, Any]:
    """Attaching inside DDP with static_graph or mixed_precision: refused, model untouched."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    out: dict[str, Any] = {}
    options: dict[str, dict[str, Any]] = {"static_graph": {"static_graph": True}}
    try:
        from torch.nn.parallel.distributed import _MixedPrecision

        options["mixed_precision"] = {"mixed_precision": _MixedPrecision(param_dtype=torch.float64)}
    except ImportError:  # pragma: no cover - older torch
        pass
    for name, option in options.items():
        model = conv1d_net(seed=0)
        try:
            ddp = DDP(model, **option)
        except Exception as err:  # pragma: no cover - an option this build lacks
            out[name] = {"skip": repr(err)}
            continue
        try:
            fs.Pruner(ddp.module, **KWARGS)
            message = ""
        except ValueError as err:
            message = str(err)
        touched = any(parametrize.is_parametrized(m) for m in model.modules())
        out[name] = {"message": message, "touched": touched}
    return out


# ------------------------------------------------------------------ FSDP2
def _fsdp2_refusals() -> dict[str, Any]:
    """A model sharded in part (its layers alone, or one layer) is refused at attach;
    finalize() and remove() of a sharded model are refused before any change."""
    from torch.distributed.fsdp import fully_shard

    out: dict[str, Any] = {}
    for how in ("layers", "one layer"):
        model = conv1d_net(seed=0)
        layers = [m for m in model if isinstance(m, (nn.Conv1d, nn.Linear))]
        for m in layers if how == "layers" else layers[:1]:
            fully_shard(m)  # the root left unsharded
        try:
            fs.Pruner(model, **KWARGS)
            out[how] = ""
        except ValueError as err:
            out[how] = str(err)

    model = conv1d_net(seed=0)
    pruner = fs.Pruner(model, **KWARGS)  # attached first, then sharded: the documented order
    for m in model:
        if isinstance(m, (nn.Conv1d, nn.Linear)):
            fully_shard(m)
    fully_shard(model)
    before = [t.clone() for t in pruner.thresholds()]
    keys = list(model.state_dict())
    for what in ("finalize", "remove"):
        try:
            getattr(pruner, what)()
            out[what] = ""
        except RuntimeError as err:
            out[what] = str(err)
    out["thresholds"] = (before, [t.clone() for t in pruner.thresholds()])
    out["keys"] = (keys, list(model.state_dict()))
    return out


# ------------------------------------------------------------------ reductions
def _reductions(rank: int, world: int) -> dict[str, Any]:
    from feather_sparse.distributed import all_reduce_max, all_reduce_sum

    out: dict[str, Any] = {}
    values = torch.tensor([1.0, 10.0, -3.0]) * (rank + 1)
    returned = all_reduce_sum(values, dist.group.WORLD)
    out["sum"], out["sum_in_place"] = values.clone(), returned is values
    alone = torch.tensor([5.0, 7.0]) * (rank + 1)
    groups = [dist.new_group([r]) for r in range(world)]  # every rank makes every group
    all_reduce_sum(alone, groups[rank])  # a group of this rank alone: nothing to add
    out["sum_alone"] = alone
    out["sum_none"] = all_reduce_sum(torch.tensor([2.0]), None)
    maxima = [
        torch.tensor([1.0, math.nan, 3.0, -math.inf, 2.0, 4.0]),
        torch.tensor([5.0, 0.0, math.inf, 1.0, -7.0, 6.0]),
    ][rank]
    out["max"] = all_reduce_max(maxima, dist.group.WORLD)
    return out


# ------------------------------------------------------------------ DTensor helpers
def _dtensor_helpers(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    from feather_sparse import distributed as fd

    mesh = init_device_mesh("cpu", (world,))
    out: dict[str, Any] = {"type": fd.dtensor_type() is DTensor}
    for dim, whole in (
        (0, torch.arange(15.0).reshape(5, 3)),
        (1, torch.arange(21.0).reshape(3, 7)),
    ):
        w = distribute_tensor(whole, mesh, [Shard(dim)])  # uneven parts: 3 and 2, 4 and 3
        mapped = fd.on_local_shard(lambda t: t * 2 + 1, w)
        # Gathered only where every rank's DTensor has the whole shape: parts of a wrong
        # one would be gathered at mismatched sizes, which aborts a gloo process.
        whole_shaped = torch.tensor([int(mapped.shape == w.shape)])
        dist.all_reduce(whole_shaped, op=dist.ReduceOp.MIN)
        own = whole + 100 * rank  # each rank's own copy differs: each cuts its own
        loaded = fd.shard_like(own, w)
        plain = torch.ones(2)
        replicated = distribute_tensor(whole, mesh, [Replicate()])  # a DTensor laid out otherwise
        out[dim] = {
            "is": (fd.is_dtensor(w), fd.is_dtensor(whole), fd.is_dtensor(mapped)),
            "local": fd.to_local(w).clone(),
            "full": fd.full_tensor(w),
            "plain_full_is_plain": fd.full_tensor(plain) is plain,
            "mapped": (
                tuple(mapped.placements) == tuple(w.placements),  # type: ignore[attr-defined]
                mapped.shape,
                mapped.stride(),
                w.stride(),
                mapped.full_tensor() if int(whole_shaped) else None,  # type: ignore[attr-defined]
                mapped.to_local().clone(),  # type: ignore[attr-defined]
            ),
            "loaded": loaded.to_local().clone() if isinstance(loaded, DTensor) else None,
            "passed": [
                fd.shard_like(None, w) is None,
                fd.shard_like(7, w) == 7,
                fd.shard_like("x", w) == "x",
                fd.shard_like(w, w) is w,
                fd.shard_like(replicated, w) is replicated,
                fd.shard_like(own, whole) is own,
            ],
        }
    return out


def _all(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        layout: recorded(lambda layout=layout: _ddp_gradients(rank, world, layout))
        for layout in LAYOUTS + AGAIN
    }
    out["ddp_options"] = recorded(_refused_ddp_options)
    out["fsdp2"] = recorded(_fsdp2_refusals)
    out["reductions"] = recorded(lambda: _reductions(rank, world))
    out["dtensor"] = recorded(lambda: _dtensor_helpers(rank, world))
    return out


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    return launch(_all, WORLD)


def _ok(runs: list[dict[str, Any]], key: str) -> list[Any]:
    for rank, run in enumerate(runs):
        assert "error" not in run[key], f"rank {rank}: {run[key]['error']}"
    return [run[key] for run in runs]


# ------------------------------------------------------------------ checks
def _check_averaged(runs: list[dict[str, Any]], layout: str) -> None:
    for rank, run in enumerate(_ok(runs, layout)):
        assert run["pruned"] == 3
        for step in run["steps"]:
            got, expected = step["got"], step["expected"]
            assert got.keys() == expected.keys(), (rank, layout)
            for name in expected:
                torch.testing.assert_close(got[name], expected[name], msg=f"{layout} {name}")
    if layout != "ignored":  # the averaged gradients are the same on both ranks
        for a, b in zip(runs[0][layout]["steps"], runs[1][layout]["steps"]):
            for name in a["got"]:
                torch.testing.assert_close(a["got"][name], b["got"][name])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ddp_averages_every_gradient_after_the_pruner_attaches(
    runs: list[dict[str, Any]], layout: str
) -> None:
    """ddp24 (one level up only: DDP around a framework's wrapper missed), ddp26 (a
    DDP inside the model missed), ddp29 and ddp30 (a frozen or an ignored parameter
    counted: every later index shifted), and the reconnection itself: with the
    Pruner attached after DDP wrapped the model, "DDP's gradient hooks must be
    re-attached" so that every trainable parameter's gradient is the mean over the
    ranks of each rank's own gradient (each rank sees its own batch), at every step."""
    _check_averaged(runs, layout)


@guard(
    "a second Pruner attached to a DDP-wrapped model after the first one's remove() or finalize()",
    "DDP averages every gradient once, as with the first (the backward failed: a weight "
    "'marked as ready twice')",
)
@pytest.mark.parametrize("layout", AGAIN)
def test_a_second_pruner_inside_ddp_reports_each_gradient_to_ddp_once(
    runs: list[dict[str, Any]], layout: str
) -> None:
    """A real bug the audit found: each Pruner attached after DDP wrapped the model
    hooked every pruned weight, and those hooks outlive the Pruner (they are on the
    weight, which survives ``remove()`` and ``finalize()``); a second Pruner hooked
    them again, and DDP's reducer, told twice that a gradient was ready, stopped the
    backward. Each (DDP, weight) pair is now hooked once."""
    _check_averaged(runs, layout)


@guard(
    "the Pruner attached inside DDP(static_graph=True) or DDP(mixed_precision=...)",
    "`ValueError` naming the order that works (attach, then wrap); the model left as it was",
)
@pytest.mark.parametrize("option", ["static_graph", "mixed_precision"])
def test_ddp_options_the_reconnection_cannot_serve_are_refused_before_attaching(
    runs: list[dict[str, Any]], option: str
) -> None:
    """ddp27, ddp28 (static_graph, mixed_precision no longer refused): "Raises
    ValueError: for DDP options under which the reconnection is not sound"; the
    model is left without parametrizations."""
    got = _ok(runs, "ddp_options")[0].get(option)
    if got is None or "skip" in got:
        pytest.skip(f"DDP({option}=...) is not available here: {got}")
    assert "attach the Pruner before wrapping the model" in got["message"], got
    assert option in got["message"]
    assert not got["touched"]


@guard(
    "a model FSDP2 sharded in part (its layers, not the root, or one layer) given to the Pruner",
    "`ValueError`: attach the Pruner to the unsharded model first, then call fully_shard",
)
@pytest.mark.parametrize("how", ["layers", "one layer"])
def test_a_partly_sharded_model_is_refused_at_attach(runs: list[dict[str, Any]], how: str) -> None:
    """ddp18 (only the root checked for an FSDPModule) and ddp19 (every weight must be
    a DTensor): "Whether FSDP2 (fully_shard) has sharded any of weights" — a model
    whose layers alone, or one of whose layers, ``fully_shard`` sharded is refused."""
    for out in _ok(runs, "fsdp2"):
        assert "attach the Pruner to the unsharded model first" in out[how], out[how]


@guard(
    "finalize() or remove() of a Pruner whose model FSDP2 shards",
    "`RuntimeError` naming `dense_state_dict(pruned=True, full=True)`; nothing changed",
)
def test_refused_finalize_and_remove_under_fsdp2_change_nothing(
    runs: list[dict[str, Any]],
) -> None:
    """ddp22 (finalize's check after its update) and ddp23 (remove's check after the
    state-dict keys are released): both are refused, and before anything changed —
    the thresholds (at step 0 of a cubic schedule, not those of the final sparsity)
    and the model's plain state-dict keys are as they were."""
    for out in _ok(runs, "fsdp2"):
        for what in ("finalize", "remove"):
            assert "dense_state_dict(pruned=True, full=True)" in out[what], out[what]
        before, after = out["thresholds"]
        assert all(torch.equal(a, b) for a, b in zip(before, after)), (before, after)
        keys_before, keys_after = out["keys"]
        assert keys_after == keys_before
        assert not any("parametrizations" in k for k in keys_after)


def test_reductions_reduce_over_their_group_with_their_operation(
    runs: list[dict[str, Any]],
) -> None:
    """ddp11-ddp16: ``all_reduce_sum`` is the elementwise sum over ``group``, in place
    (callers ignore the return value), over that group only (a group of one rank
    adds nothing), and unchanged for None; ``all_reduce_max`` is the elementwise
    maximum, "NaN where any rank had a non-finite value" (NaN, +inf or -inf)."""
    base = torch.tensor([1.0, 10.0, -3.0])
    for rank, out in enumerate(_ok(runs, "reductions")):
        assert torch.equal(out["sum"], base * 1 + base * 2)
        assert out["sum_in_place"]
        assert torch.equal(out["sum_alone"], torch.tensor([5.0, 7.0]) * (rank + 1))
        assert torch.equal(out["sum_none"], torch.tensor([2.0]))
        got = out["max"]
        assert torch.isnan(got).tolist() == [False, True, True, True, False, False]
        assert got[[0, 4, 5]].tolist() == [5.0, 2.0, 6.0]


def test_dtensor_helpers_process_the_local_shard_and_rewrap_it(
    runs: list[dict[str, Any]],
) -> None:
    """ddp02-ddp10: a DTensor's local shard is ``torch.chunk``'s part of the whole;
    ``on_local_shard`` maps it and gives back a DTensor of the same placements,
    global shape and stride whose whole is the function of the whole (uneven parts
    on both dimensions); ``shard_like`` cuts each rank's part from that rank's own
    copy, and passes through anything that is not a plain tensor of the whole shape
    (None, a number, a string, a DTensor) or whose ``like`` is not a DTensor."""
    wholes = {0: torch.arange(15.0).reshape(5, 3), 1: torch.arange(21.0).reshape(3, 7)}
    for rank, out in enumerate(_ok(runs, "dtensor")):
        assert out["type"]
        for dim, whole in wholes.items():
            got = out[dim]
            part = torch.chunk(whole, WORLD, dim=dim)[rank]
            assert got["is"] == (True, False, True)
            assert torch.equal(got["local"], part)
            assert torch.equal(got["full"], whole)
            assert got["plain_full_is_plain"]
            same_placements, shape, stride, w_stride, mapped_full, mapped_local = got["mapped"]
            assert same_placements
            assert shape == whole.shape and stride == w_stride == whole.stride()
            assert torch.equal(mapped_full, whole * 2 + 1)
            assert torch.equal(mapped_local, part * 2 + 1)
            own = whole + 100 * rank
            assert torch.equal(got["loaded"], torch.chunk(own, WORLD, dim=dim)[rank])
            assert all(got["passed"]), got["passed"]
