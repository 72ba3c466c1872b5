"""torch.distributed.checkpoint (DCP) of a model with a Pruner attached, under FSDP2 and DDP.

While a Pruner is attached, ``model.state_dict()`` has the plain model's keys
(module ``plain_keys``). DCP's state-dict API resolves every key to the
object it names and keys optimizer state by ``named_parameters()`` names
(``<layer>.parametrizations.weight.original``). Checked for real on 2 CPU
processes (gloo), for unstructured and 2:4 pruning, with the model sharded
by FSDP2 (``fully_shard``) and wrapped in DDP: ``get_model_state_dict``
(sharded and full), ``dcp.save`` of model, optimizer and Pruner, and a
resume in fresh processes that ends bit for bit where the uninterrupted run
does (docs/distributed.md, "Checkpointing with torch.distributed.checkpoint").

The scenarios include backbones whose state gains tensors during training
(N:M with ``rescale`` or ``freeze`` after a cubic ramp, Spartan after its
freeze): their state keeps one structure from the start, so DCP loads a
state saved after the tensors were taken into a fresh Pruner's state. And
under FSDP2, ``layer.weight`` read outside the forward (where the stored
weight is sharded) is ``P_T(w)`` computed on each rank's shard.

Two launches (save, then resume in fresh processes) run every scenario;
the tests check their per-rank results, and load what was saved into
one-process models.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn

import feather_sparse as fs
from _dist import dcp_resume, launch, recorded
from _guards import guard
from _helpers import SAFETENSORS_MISSING
from feather_sparse import distributed

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed + gloo"
)

WORLD = 2
HALF, STEPS = 3, 6  # checkpoint after HALF steps, of STEPS in all
#: Backbones whose state gains tensors during training: by HALF (the end of the
#: cubic ramp, Spartan's freeze), after a fresh Pruner's state was made.
GAINING = ["2:4-rescale", "2:4-freeze", "spartan"]
#: (how the model is distributed, how it is pruned). A frozen N:M mask and Spartan
#: take no sharded weights: DDP for them.
SCENARIOS = [
    ("fsdp2", "unstructured"),
    ("fsdp2", "2:4"),
    ("ddp", "unstructured"),
    ("ddp", "2:4"),
    ("fsdp2", "2:4-rescale"),
    ("ddp", "2:4-freeze"),
    ("ddp", "spartan"),
]
ORIGINAL = "parametrizations.weight.original"


# ---------------------------------------------------------------- the model and its run
def _net(seed: int = 0) -> nn.Module:
    """Three linear layers whose input widths are multiples of 4 (2:4 groups)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4)
    )


def _attach(model: nn.Module, kind: str) -> fs.Pruner:
    from feather_sparse.baselines import SpartanBackbone
    from feather_sparse.nm.backbone import NMBackbone

    if kind == "2:4":
        return fs.Pruner(model, pattern="2:4")
    if kind in ("2:4-rescale", "2:4-freeze"):  # the cubic ramp ends at STEPS / 2 = HALF
        option = {kind.removeprefix("2:4-"): True}
        backbone = NMBackbone("2:4", **option)
        return fs.Pruner(model, 0.5, STEPS, backbone=backbone, schedule="cubic")
    if kind == "spartan":  # frozen at STEPS / 2 = HALF
        return fs.Pruner(model, 0.5, STEPS, backbone=SpartanBackbone(freeze_at=0.5))
    # the cubic schedule moves the threshold every step: a resume at the wrong step shows
    return fs.Pruner(model, sparsity=0.5, total_steps=STEPS)


def _distribute(model: nn.Module, how: str) -> tuple[nn.Module, nn.Module]:
    """The module to train and the one to give DCP's ``set_*`` functions.

    FSDP2 shards the model in place (the Pruner is attached first); DCP takes
    the model. DDP wraps it; DCP's ``set_*`` functions take the model inside
    the wrapper (docs/distributed.md says why).
    """
    if how == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        return model, model
    return nn.parallel.DistributedDataParallel(model), model


def _train(model: nn.Module, opt: torch.optim.Optimizer, pruner: fs.Pruner, rank: int,
           first: int, last: int) -> None:  # fmt: skip
    for step in range(first, last):
        g = torch.Generator().manual_seed(100 * step + rank)  # each rank its own batches
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()


def _whole(state: dict[str, Any]) -> dict[str, Tensor]:
    """Every value gathered whole (a collective for DTensors), as a tensor of its own."""
    return {key: distributed.full_tensor(value).detach().clone() for key, value in state.items()}


def _stored(model: nn.Module) -> dict[str, Tensor]:
    """The parameters, whole, by the plain model's names, read from ``named_parameters()``
    (where a pruned weight is ``<layer>.parametrizations.weight.original``)."""
    found = {
        name.replace(ORIGINAL, "weight"): distributed.full_tensor(p).detach().clone()
        for name, p in model.named_parameters()
    }
    return {key: found[key] for key in _plain_keys()}


def _adam(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Tensor]:
    """Each parameter's first moment, whole, by its ``named_parameters`` name."""
    return {
        name: distributed.full_tensor(opt.state[p]["exp_avg"]).clone()
        for name, p in model.named_parameters()
    }


# ---------------------------------------------------------------- launch 1: train and save
def _save_one(rank: int, how: str, kind: str, root: Path) -> dict[str, Any]:
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    model = _net()
    pruner = _attach(model, kind)
    trained, _ = _distribute(model, how)
    opt = torch.optim.Adam(trained.parameters(), lr=0.01)
    out: dict[str, Any] = {"fresh": pruner.state_dict()["backbone"]}
    _train(trained, opt, pruner, rank, 0, HALF)
    out["pruner"] = pruner.state_dict()
    if how == "fsdp2":
        out["read"] = recorded(functools.partial(_read_weights, model))
        out["pruned"] = pruner.dense_state_dict(pruned=True, full=True)
    sharded = get_model_state_dict(trained)
    out["keys"] = list(sharded)
    out["sharded"] = _whole(sharded)
    offloaded = get_model_state_dict(
        trained, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    out["full_types"] = {type(v).__name__ for v in offloaded.values()}
    out["full"] = {key: value.clone() for key, value in offloaded.items()}
    out["dense"] = _stored(model)
    optim = get_optimizer_state_dict(trained, opt)
    out["optim_keys"] = sorted(optim["state"])
    out["adam"] = _adam(model, opt)
    dcp.save(
        {"model": sharded, "optim": optim, "pruner": pruner.state_dict()},
        checkpoint_id=str(root / f"{how}-{kind}"),
    )
    if how == "fsdp2":
        loads = functools.partial(_fsdp2_full_loads, rank, kind, trained, opt)
        out["full_loads"] = recorded(loads)
    else:
        out["wrapper_error"] = _ddp_wrapper_load(kind, sharded)
    _train(trained, opt, pruner, rank, HALF, STEPS)
    out["final"] = _stored(model)
    return out


def _read_weights(model: nn.Module) -> dict[str, Any]:
    """Each pruned ``<layer>.weight`` read outside the forward: its type, and the value
    gathered whole."""
    read = {f"{i}.weight": model[i].weight for i in (0, 2, 4)}
    return {
        "types": {type(w).__name__ for w in read.values()},
        "whole": {key: distributed.full_tensor(w).detach().clone() for key, w in read.items()},
    }


def _fsdp2_full_loads(
    rank: int, kind: str, trained: nn.Module, opt: torch.optim.Optimizer
) -> dict[str, Any]:
    """A full state dict into a fresh sharded model: held by every rank, or broadcast from 0."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True)
    model_state = get_model_state_dict(trained, options=full)  # every rank holds it whole
    optim_state = get_optimizer_state_dict(trained, opt, options=full)
    out: dict[str, Any] = {}

    model = _net(seed=1)
    _attach(model, kind)
    _distribute(model, "fsdp2")
    fresh = torch.optim.Adam(model.parameters(), lr=0.01)
    # copies: set_model_state_dict adds the model's own entries to the dict it is given
    set_model_state_dict(model, dict(model_state), options=full)
    set_optimizer_state_dict(model, fresh, optim_state, options=full)
    out["full_loaded"] = _stored(model)
    out["full_adam"] = _adam(model, fresh)

    model = _net(seed=1)
    _attach(model, kind)
    _distribute(model, "fsdp2")
    broadcast = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    try:
        set_model_state_dict(model, dict(model_state) if rank == 0 else {}, options=broadcast)
        out["broadcast_error"] = ""
    except RuntimeError as err:
        out["broadcast_error"] = str(err)
    return out


def _ddp_wrapper_load(kind: str, state: dict[str, Any]) -> dict[str, Any]:
    """``set_model_state_dict`` given the DDP wrapper instead of the model inside it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    out: dict[str, Any] = {}
    for strict in (True, False):
        model = _net(seed=1)
        _attach(model, kind)
        wrapper, _ = _distribute(model, "ddp")
        try:
            keys = set_model_state_dict(
                wrapper, dict(state), options=StateDictOptions(strict=strict)
            )
            out[strict] = sorted(keys.unexpected_keys)
        except RuntimeError as err:
            out[strict] = str(err)
    return out


#: N:M layers sharded so that each rank's part holds whole groups, or splits them:
#: (layer, its input features, the tensor dimension fully_shard shards)
SHARDINGS = {
    "linear-dim1-whole": ("linear", 16, 1),  # (8, 16) cut into (8, 8): 2 groups a row each
    "linear-dim1-split": ("linear", 12, 1),  # (8, 12) cut into (8, 6): a group cut in two
    "conv1d-whole": ("conv1d", 16, 0),  # GPT-2's (in, out): (16, 8) cut into (8, 8)
    "conv1d-split": ("conv1d", 12, 0),  # (12, 8) cut into (6, 8)
}


def _sharded_layer(layer: str, inputs: int) -> nn.Module:
    torch.manual_seed(0)
    if layer == "linear":
        return nn.Sequential(nn.Linear(inputs, 8))
    from transformers.pytorch_utils import Conv1D

    return nn.Sequential(Conv1D(8, inputs))


def _read_sharded(rank: int, name: str) -> dict[str, Any]:
    """An N:M layer's weight read outside the forward under FSDP2, and in one process."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    layer, inputs, dim = SHARDINGS[name]
    whole = _sharded_layer(layer, inputs)
    whole_pruner = fs.Pruner(whole, pattern="2:4")
    model = _sharded_layer(layer, inputs)
    pruner = fs.Pruner(model, pattern="2:4")
    fully_shard(model, shard_placement_fn=lambda p: Shard(dim) if p.dim() > 1 else None)
    local = distributed.to_local(model[0].parametrizations.weight.original)
    out: dict[str, Any] = {"one_process": whole[0].weight.detach().clone()}
    out["local_shape"] = tuple(local.shape)
    try:
        out["read"] = model[0].weight.to_local().detach().clone()
    except ValueError as err:
        out["refused"] = str(err)
    del whole_pruner, pruner  # attached until here
    return out


def _save_all(rank: int, world: int, root: str) -> dict[Any, Any]:
    out: dict[Any, Any] = {
        (how, kind): recorded(functools.partial(_save_one, rank, how, kind, Path(root)))
        for how, kind in SCENARIOS
    }
    for name in SHARDINGS:
        out[name] = recorded(functools.partial(_read_sharded, rank, name))
    return out


# ---------------------------------------------------------------- launch 2: resume
def _resume_one(rank: int, how: str, kind: str, root: Path) -> dict[str, Any]:
    """The recipe of docs/distributed.md, in fresh processes, on a differently initialised model."""
    model = _net(seed=1)
    pruner = _attach(model, kind)
    trained, target = _distribute(model, how)
    opt = torch.optim.Adam(trained.parameters(), lr=0.01)
    dcp_resume(target, opt, pruner, str(root / f"{how}-{kind}"))
    out: dict[str, Any] = {"step": pruner.current_step}
    out["backbone"] = pruner.state_dict()["backbone"]
    out["loaded"] = _stored(model)
    out["adam"] = _adam(model, opt)
    _train(trained, opt, pruner, rank, HALF, STEPS)
    out["final"] = _stored(model)
    return out


def _resume_all(rank: int, world: int, root: str) -> dict[Any, Any]:
    return {
        (how, kind): recorded(functools.partial(_resume_one, rank, how, kind, Path(root)))
        for how, kind in SCENARIOS
    }


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dcp")


@pytest.fixture(scope="module")
def saved(root: Path) -> list[dict[Any, Any]]:
    return launch(functools.partial(_save_all, root=str(root)), WORLD)


@pytest.fixture(scope="module")
def resumed(saved: list[dict[Any, Any]], root: Path) -> list[dict[Any, Any]]:
    return launch(functools.partial(_resume_all, root=str(root)), WORLD)


def _ok(runs: list[dict[Any, Any]], scenario: tuple[str, str]) -> list[dict[str, Any]]:
    """Each rank's results of ``scenario``, failing with the rank's traceback if it raised."""
    for rank, run in enumerate(runs):
        assert "error" not in run[scenario], f"rank {rank}:\n{run[scenario]['error']}"
    return [run[scenario] for run in runs]


def _plain_keys() -> list[str]:
    return list(_net().state_dict())


def _assert_equal(got: dict[str, Tensor], want: dict[str, Tensor]) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key


# ---------------------------------------------------------------- the checks
@pytest.mark.parametrize("scenario", SCENARIOS, ids="-".join)
def test_get_model_state_dict_gives_the_plain_keys_and_the_dense_weights(
    saved: list[dict[Any, Any]], scenario: tuple[str, str]
) -> None:
    for out in _ok(saved, scenario):
        assert out["keys"] == _plain_keys()
        _assert_equal(out["sharded"], out["dense"])  # the stored dense weights, gathered
    r0, r1 = _ok(saved, scenario)
    # full_state_dict=True, cpu_offload=True: whole plain tensors, on rank 0 only
    assert r0["full_types"] == {"Tensor"}
    _assert_equal(r0["full"], r0["dense"])
    assert r1["full"] == {}


@pytest.mark.parametrize("scenario", SCENARIOS, ids="-".join)
def test_a_dcp_checkpoint_resumes_bit_exactly_in_fresh_processes(
    saved: list[dict[Any, Any]], resumed: list[dict[Any, Any]], scenario: tuple[str, str]
) -> None:
    for before, after in zip(_ok(saved, scenario), _ok(resumed, scenario)):
        assert after["step"] == HALF
        _assert_equal(after["loaded"], before["dense"])
        _assert_equal(after["final"], before["final"])


@pytest.mark.parametrize("scenario", SCENARIOS, ids="-".join)
def test_the_optimizer_state_lands_on_its_own_parameter(
    saved: list[dict[Any, Any]], resumed: list[dict[Any, Any]], scenario: tuple[str, str]
) -> None:
    for before, after in zip(_ok(saved, scenario), _ok(resumed, scenario)):
        # keyed by named_parameters() names: the stored weight under its parametrize name
        assert before["optim_keys"] == sorted(
            f"{i}.{ORIGINAL}" if name == "weight" else f"{i}.{name}"
            for i in (0, 2, 4)
            for name in ("weight", "bias")
        )
        _assert_equal(after["adam"], before["adam"])
        for name, moment in after["adam"].items():
            assert moment.abs().sum() > 0, name  # a real state, not a fresh one


@pytest.mark.parametrize("kind", ["unstructured", "2:4"])
def test_a_full_state_from_fsdp2_loads_strictly_into_the_plain_model(
    saved: list[dict[Any, Any]], kind: str
) -> None:
    out = _ok(saved, ("fsdp2", kind))[0]
    plain = _net(seed=1)
    plain.load_state_dict(out["full"])  # strict
    _assert_equal(plain.state_dict(), out["dense"])


@pytest.mark.parametrize("kind", ["unstructured", "2:4"])
def test_a_full_state_from_fsdp2_loads_into_a_one_process_attached_model(
    saved: list[dict[Any, Any]], kind: str
) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    out = _ok(saved, ("fsdp2", kind))[0]
    model = _net(seed=1)
    pruner = _attach(model, kind)
    model.load_state_dict(out["full"])  # strict
    _assert_equal(pruner.dense_state_dict(), out["dense"])
    model = _net(seed=1)
    pruner = _attach(model, kind)
    set_model_state_dict(model, out["full"], options=StateDictOptions(full_state_dict=True))
    _assert_equal(pruner.dense_state_dict(), out["dense"])


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # what no_dist=True means
@pytest.mark.parametrize("kind", ["unstructured", "2:4"])
def test_a_dcp_checkpoint_of_fsdp2_loads_in_one_process(
    saved: list[dict[Any, Any]], root: Path, kind: str
) -> None:
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    out = _ok(saved, ("fsdp2", kind))[0]
    checkpoint = str(root / f"fsdp2-{kind}")
    plain = _net(seed=1)  # no Pruner: the checkpoint's model keys are the plain model's
    state = {"model": plain.state_dict()}
    dcp.load(state, checkpoint_id=checkpoint, no_dist=True)
    plain.load_state_dict(state["model"])
    _assert_equal(plain.state_dict(), out["dense"])

    model = _net(seed=1)  # with a Pruner: resumes on one process
    pruner = _attach(model, kind)
    state = {"model": get_model_state_dict(model), "pruner": pruner.state_dict()}
    dcp.load(state, checkpoint_id=checkpoint, no_dist=True)
    set_model_state_dict(model, state["model"])
    pruner.load_state_dict(state["pruner"])
    assert pruner.current_step == HALF
    _assert_equal(pruner.dense_state_dict(), out["dense"])


@pytest.mark.parametrize("kind", ["unstructured", "2:4"])
def test_a_full_state_held_by_every_rank_loads_into_the_sharded_model(
    saved: list[dict[Any, Any]], kind: str
) -> None:
    for rank, out in enumerate(_ok(saved, ("fsdp2", kind))):
        loads = out["full_loads"]
        assert "error" not in loads, f"rank {rank}:\n{loads['error']}"
        _assert_equal(loads["full_loaded"], out["dense"])
        _assert_equal(loads["full_adam"], out["adam"])


@guard(
    "`set_model_state_dict(fsdp2_model, full, StateDictOptions(full_state_dict=True, "
    "broadcast_from_rank0=True))` while a Pruner is attached",
    "the ranks other than 0 (which DCP hands no pruned weight) raise a `RuntimeError` naming "
    "the option and what to do instead",
)
def test_broadcast_from_rank0_names_what_to_do_instead(saved: list[dict[Any, Any]]) -> None:
    r0, r1 = (out["full_loads"] for out in _ok(saved, ("fsdp2", "unstructured")))
    assert "error" not in r0 and "error" not in r1, r0.get("error") or r1.get("error")
    assert r0["broadcast_error"] == ""  # rank 0 holds the state, and loads its part of it
    assert "Missing key(s)" in r1["broadcast_error"]
    assert "broadcast_from_rank0" in r1["broadcast_error"]
    assert "give every rank the whole state" in r1["broadcast_error"]


@pytest.mark.parametrize("kind", ["unstructured", "2:4"])
def test_ddp_set_model_state_dict_takes_the_model_inside_the_wrapper(
    saved: list[dict[Any, Any]], kind: str
) -> None:
    # A torch limitation, documented: DCP re-prefixes only the keys it finds among the
    # parameters' names, so the wrapper fails (strict) or skips the pruned weights (not
    # strict). The recipe passes ddp.module (resumed above).
    for out in _ok(saved, ("ddp", kind)):
        assert f"Missing key: 0.{ORIGINAL}" in out["wrapper_error"][True]
        assert out["wrapper_error"][False] == ["0.weight", "2.weight", "4.weight"]


# ---------------------------------------------------------------- reading outside the forward
@guard(
    "`layer.weight` read outside the forward of an FSDP2-sharded model with a Pruner attached "
    "(logging, a metric, `torch.save(layer.weight)`), where FSDP2 leaves the stored weight sharded",
    "`P_T(w)` computed on each rank's shard, a DTensor laid out as the stored weight; gathered, "
    "the value one process computes",
)
@pytest.mark.parametrize("kind", ["unstructured", "2:4", "2:4-rescale"])
def test_a_pruned_weight_read_outside_the_fsdp2_forward_is_the_one_process_value(
    saved: list[dict[Any, Any]], kind: str
) -> None:
    for rank, out in enumerate(_ok(saved, ("fsdp2", kind))):
        read = out["read"]
        assert "error" not in read, f"rank {rank}:\n{read['error']}"
        assert read["types"] == {"DTensor"}
        model = _net(seed=1)  # one process, at the saved weights and thresholds (and β)
        pruner = _attach(model, kind)
        model.load_state_dict(out["dense"])
        pruner.load_state_dict(out["pruner"])
        _assert_equal(read["whole"], {key: model[int(key[0])].weight for key in read["whole"]})
        _assert_equal(read["whole"], {key: out["pruned"][key] for key in read["whole"]})


def _sharded(saved: list[dict[Any, Any]], name: str) -> list[dict[str, Any]]:
    runs = [run[name] for run in saved]
    for rank, out in enumerate(runs):
        if "error" in out and "No module named 'transformers'" in out["error"]:
            pytest.skip("needs transformers (GPT-2's Conv1D)")
        if SAFETENSORS_MISSING and "No module named 'safetensors'" in out.get("error", ""):
            pytest.skip(
                f"GPT-2's Conv1D needs transformers, which needs safetensors: {SAFETENSORS_MISSING}"
            )
        assert "error" not in out, f"rank {rank}:\n{out['error']}"
    return runs


@pytest.mark.parametrize("name", ["linear-dim1-whole", "conv1d-whole"])
def test_a_shard_across_the_nm_groups_that_keeps_them_whole_reads_exactly(
    saved: list[dict[Any, Any]], name: str
) -> None:
    """A shard along the dimension the groups run through, cut at a multiple of M, holds
    whole groups: each rank's part is the one-process weight's part."""
    dim = SHARDINGS[name][2]
    for rank, out in enumerate(_sharded(saved, name)):
        part = out["one_process"].chunk(WORLD, dim)[rank]
        assert out["local_shape"] == tuple(part.shape) == (8, 8)
        assert torch.equal(out["read"], part)


@guard(
    "an N:M layer's `weight` read outside the forward under FSDP2, where this rank's shard "
    "splits the layer's groups (GPT-2's `Conv1D`, stored (in, out), cut at a row that is not "
    "a multiple of M; a `shard_placement_fn` sharding across the groups)",
    "`ValueError` naming the layer, the shard and how to shard it instead (the forward, which "
    "gathers the whole weight, is not affected)",
)
@pytest.mark.parametrize("name", ["linear-dim1-split", "conv1d-split"])
def test_a_shard_that_splits_nm_groups_is_refused_naming_the_layer(
    saved: list[dict[Any, Any]], name: str
) -> None:
    for out in _sharded(saved, name):
        assert "read" not in out
        message = out["refused"]
        assert "layer '0'" in message and f"shard {out['local_shape']}" in message
        assert "splits its 2:4 groups" in message and "shard_placement_fn" in message


# ---------------------------------------------------------------- states gaining tensors
def _structure(state: Any) -> Any:
    """The layout of a state: its keys and, for each tensor, its shape and dtype."""
    if isinstance(state, dict):
        return {key: _structure(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return [_structure(value) for value in state]
    if isinstance(state, Tensor):
        return ("tensor", tuple(state.shape), state.dtype)
    return type(state).__name__


def _taken(kind: str, backbone: dict[str, Any]) -> bool:
    """Whether a backbone state holds the tensors taken during training."""
    return bool(backbone["frozen"] if kind == "spartan" else backbone["taken"])


def _assert_same_state(got: Any, want: Any) -> None:
    assert _structure(got) == _structure(want)
    if isinstance(want, dict):
        for key, value in want.items():
            _assert_same_state(got[key], value)
    elif isinstance(want, (list, tuple)):
        for a, b in zip(got, want):
            _assert_same_state(a, b)
    elif isinstance(want, Tensor):
        assert torch.equal(got, want)
    else:
        assert got == want


@guard(
    "`dcp.load` of a Pruner state saved after its backbone took tensors during training (N:M "
    "`rescale=True` or `freeze=True` after a ramp, Spartan after its freeze) into a fresh "
    "Pruner's `state_dict()`",
    "loads: a backbone's state has the same keys and tensor shapes from `setup()` on "
    "(placeholders and a flag until taken); the run resumes bit for bit",
)
@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s[1] in GAINING], ids="-".join)
def test_a_backbone_state_that_gains_tensors_resumes_through_dcp(
    saved: list[dict[Any, Any]], resumed: list[dict[Any, Any]], scenario: tuple[str, str]
) -> None:
    kind = scenario[1]
    for before, after in zip(_ok(saved, scenario), _ok(resumed, scenario)):
        fresh, trained = before["fresh"], before["pruner"]["backbone"]
        assert not _taken(kind, fresh) and _taken(kind, trained)  # gained during training
        assert _structure(fresh) == _structure(trained)
        _assert_same_state(after["backbone"], trained)
        assert after["step"] == HALF
        _assert_equal(after["final"], before["final"])


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("kind", GAINING)
def test_a_state_that_gains_tensors_resumes_through_dcp_in_one_process(
    tmp_path: Path, kind: str
) -> None:
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    model = _net()
    pruner = _attach(model, kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no state of its own to carry
    _train(model, opt, pruner, 0, 0, HALF)
    saved = pruner.state_dict()
    assert _taken(kind, saved["backbone"])
    state = {"model": get_model_state_dict(model), "pruner": saved}
    dcp.save(state, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    _train(model, opt, pruner, 0, HALF, STEPS)

    fresh_model = _net(seed=1)
    fresh = _attach(fresh_model, kind)
    state = {"model": get_model_state_dict(fresh_model), "pruner": fresh.state_dict()}
    dcp.load(state, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    set_model_state_dict(fresh_model, state["model"])
    fresh.load_state_dict(state["pruner"])
    assert fresh.current_step == HALF
    _assert_same_state(fresh.state_dict(), saved)
    fresh_opt = torch.optim.SGD(fresh_model.parameters(), lr=0.1)
    _train(fresh_model, fresh_opt, fresh, 0, HALF, STEPS)
    _assert_equal(_stored(fresh_model), _stored(model))


def _earlier(kind: str, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as versions before the fixed structure wrote it: None (N:M) or no masks
    (Spartan) for tensors not taken yet, and no ``"taken"``."""
    backbone = dict(state["backbone"])
    if kind == "spartan":
        if not backbone["frozen"]:
            backbone["frozen_masks"] = []
    else:
        taken = backbone.pop("taken")
        backbone = {key: value if taken else None for key, value in backbone.items()}
    return {**state, "backbone": backbone}


@pytest.mark.parametrize("steps", [1, HALF], ids=["not-taken", "taken"])
@pytest.mark.parametrize("kind", GAINING)
def test_a_state_saved_by_an_earlier_version_resumes_as_before(kind: str, steps: int) -> None:
    model = _net()
    pruner = _attach(model, kind)
    _train(model, torch.optim.SGD(model.parameters(), lr=0.1), pruner, 0, 0, steps)
    state = pruner.state_dict()
    assert _taken(kind, state["backbone"]) == (steps == HALF)
    finals = []
    for given in (state, _earlier(kind, state)):
        resumed = _net(seed=1)
        resumed.load_state_dict(model.state_dict())
        again = _attach(resumed, kind)
        again.load_state_dict(given)
        _assert_same_state(again.state_dict(), state)
        _train(resumed, torch.optim.SGD(resumed.parameters(), lr=0.1), again, 0, steps, STEPS)
        finals.append(_stored(resumed))
    _assert_equal(finals[1], finals[0])


# ---------------------------------------------------------------- one process
def test_get_model_state_dict_does_not_compute_the_pruned_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DCP resolves ``<layer>.weight`` without evaluating the parametrization (which, on
    FSDP2's sharded storage, would fail; elsewhere it costs a pass over every weight)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from feather_sparse.pruner import FeatherParametrization

    model = _net()
    pruner = _attach(model, "unstructured")
    calls: list[int] = []
    forward = FeatherParametrization.forward

    def counted(self: FeatherParametrization, weight: Tensor) -> Tensor:
        calls.append(1)
        return forward(self, weight)

    monkeypatch.setattr(FeatherParametrization, "forward", counted)
    state = get_model_state_dict(model)
    assert calls == []
    _assert_equal(state, pruner.dense_state_dict())


class _Renamed(nn.Linear):
    """A layer that already answers DCP's ``_fqn_modifiers`` (as a renaming module would)."""

    def _fqn_modifiers(self) -> dict[str, str]:
        return {"scale": "inner"}


@pytest.mark.parametrize("end", ["finalize", "remove"])
def test_the_dcp_lookup_comes_off_with_the_pruner(end: str) -> None:
    model = nn.Sequential(nn.Linear(8, 8), _Renamed(8, 4))
    pruner = fs.Pruner(model, sparsity=0.5, total_steps=4)
    for layer in model:
        modifiers = layer._fqn_modifiers()
        assert modifiers.get("weight") == "parametrizations"
        assert list(modifiers.values()) == (["inner"] if isinstance(layer, _Renamed) else [])
    assert model[1]._fqn_modifiers().get("scale") == "inner"  # its own answers kept
    getattr(pruner, end)()
    assert "_fqn_modifiers" not in model[0].__dict__ and "_fqn_modifiers" not in model[1].__dict__
    assert not hasattr(model[0], "_fqn_modifiers")
    assert model[1]._fqn_modifiers() == {"scale": "inner"}


def test_a_compiled_model_takes_dcp_set_functions_through_the_model_it_compiled() -> None:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    model = _net()
    pruner = _attach(model, "unstructured")
    compiled = torch.compile(model)  # compiles at the first call: none here
    state = get_model_state_dict(compiled)
    assert list(state) == _plain_keys()
    changed = {key: value + 1 for key, value in state.items()}
    with pytest.raises(RuntimeError, match=f"Missing key: 0.{ORIGINAL}"):
        set_model_state_dict(compiled, dict(changed))
    set_model_state_dict(model, dict(changed))
    _assert_equal(pruner.dense_state_dict(), changed)
