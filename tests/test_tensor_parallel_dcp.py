"""DCP checkpoints of a tensor-parallel model with a Pruner attached, on 2 gloo processes.

The Megatron pair of ``tests/test_tensor_parallel.py`` (a ``ColwiseParallel``
Linear, a ReLU, a ``RowwiseParallel`` Linear) with the Pruner attached after
``parallelize_module``, trained with Adam for ``HALF`` steps and saved with
``dcp.save`` (``get_model_state_dict``, ``get_optimizer_state_dict``,
``pruner.state_dict()``). A second launch, in fresh processes, builds a
differently initialised model, loads the checkpoint with the recipe of
docs/distributed.md and trains on: it ends bit for bit where the
uninterrupted run does. The model state has the plain model's keys, and the
checkpoint loads into the plain model in one process (``no_dist=True``).
Unstructured pruning (a moving threshold) and 2:4.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn

import feather_sparse as fs
from _dist import launch
from feather_sparse import distributed

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed + gloo"
)

WORLD = 2
HALF, STEPS = 3, 6  # checkpoint after HALF steps, of STEPS in all
INPUTS, HIDDEN, OUTPUTS = 16, 24, 8
KINDS = ["unstructured", "2:4"]
PLAIN_KEYS = ["0.weight", "0.bias", "2.weight", "2.bias"]


def _mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)  # the same weights on every rank, as parallelize_module expects
    return nn.Sequential(nn.Linear(INPUTS, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUTPUTS))


def _build(kind: str, seed: int = 0) -> tuple[nn.Sequential, fs.Pruner, torch.optim.Optimizer]:
    """The recipe's order: parallelize_module, the Pruner, the optimizer."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model = _mlp(seed)
    mesh = init_device_mesh("cpu", (WORLD,))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    if kind == "2:4":
        pruner = fs.Pruner(model, pattern="2:4", theta=0.5)
    else:  # the cubic schedule moves the threshold every step: a resume at the wrong step shows
        pruner = fs.Pruner(model, sparsity=0.7, total_steps=STEPS, theta=0.5)
    return model, pruner, torch.optim.Adam(model.parameters(), lr=0.01)


def _train(model: nn.Module, opt: torch.optim.Optimizer, pruner: fs.Pruner,
           first: int, last: int) -> None:  # fmt: skip
    for step in range(first, last):
        g = torch.Generator().manual_seed(100 + step)  # the same batch on every rank
        x, y = torch.randn(6, INPUTS, generator=g), torch.randint(0, OUTPUTS, (6,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()


def _stored(model: nn.Module) -> dict[str, Tensor]:
    """The parameters, whole, by the plain model's names."""
    return {
        name.replace("parametrizations.weight.original", "weight"): distributed.full_tensor(p)
        .detach()
        .clone()
        for name, p in model.named_parameters()
    }


def _recorded(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return fn()
    except Exception:
        return {"error": traceback.format_exc()}


def _save_one(kind: str, root: Path) -> dict[str, Any]:
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    model, pruner, opt = _build(kind)
    _train(model, opt, pruner, 0, HALF)
    state = get_model_state_dict(model)
    out: dict[str, Any] = {
        "keys": list(state),
        "types": sorted({type(v).__name__ for v in state.values()}),
        "dense": _stored(model),
        "pruner": pruner.state_dict(),
    }
    dcp.save(
        {
            "model": state,
            "optim": get_optimizer_state_dict(model, opt),
            "pruner": pruner.state_dict(),
        },
        checkpoint_id=str(root / kind),
    )
    _train(model, opt, pruner, HALF, STEPS)
    out["final"] = _stored(model)
    out["final_pruner"] = pruner.state_dict()
    out["final_pruned"] = pruner.dense_state_dict(pruned=True, full=True)
    return out


def _resume_one(kind: str, root: Path) -> dict[str, Any]:
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    model, pruner, opt = _build(kind, seed=1)  # differently initialised: the load must count
    state: dict[str, Any] = {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, opt),
        "pruner": pruner.state_dict(),
    }
    dcp.load(state, checkpoint_id=str(root / kind))
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, opt, state["optim"])
    pruner.load_state_dict(state["pruner"])
    out: dict[str, Any] = {"loaded": _stored(model), "loaded_pruner": pruner.state_dict()}
    _train(model, opt, pruner, HALF, STEPS)
    out["final"] = _stored(model)
    out["final_pruner"] = pruner.state_dict()
    out["final_pruned"] = pruner.dense_state_dict(pruned=True, full=True)
    return out


def _save_all(rank: int, world: int, root: str) -> dict[str, Any]:
    return {kind: _recorded(functools.partial(_save_one, kind, Path(root))) for kind in KINDS}


def _resume_all(rank: int, world: int, root: str) -> dict[str, Any]:
    return {kind: _recorded(functools.partial(_resume_one, kind, Path(root))) for kind in KINDS}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = str(tmp_path_factory.mktemp("dcp-tp"))
    saved = launch(functools.partial(_save_all, root=root), WORLD)
    resumed = launch(functools.partial(_resume_all, root=root), WORLD)
    return {"saved": saved, "resumed": resumed, "root": root}


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    assert "error" not in result, result.get("error")
    return result


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor):
        return isinstance(b, Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


@pytest.mark.parametrize("kind", KINDS)
def test_model_state_has_the_plain_keys(runs: dict[str, Any], kind: str) -> None:
    for run in runs["saved"]:
        saved = _ok(run[kind])
        assert saved["keys"] == PLAIN_KEYS
        assert saved["types"] == ["DTensor"]


@pytest.mark.parametrize("kind", KINDS)
def test_resume_loads_the_weights_and_the_pruner_exactly(runs: dict[str, Any], kind: str) -> None:
    for saved, resumed in zip(runs["saved"], runs["resumed"]):
        saved, resumed = _ok(saved[kind]), _ok(resumed[kind])
        assert _same(resumed["loaded"], saved["dense"])
        assert _same(resumed["loaded_pruner"], saved["pruner"])


@pytest.mark.parametrize("kind", KINDS)
def test_resumed_run_ends_bit_for_bit_where_the_uninterrupted_one_does(
    runs: dict[str, Any], kind: str
) -> None:
    for saved, resumed in zip(runs["saved"], runs["resumed"]):
        saved, resumed = _ok(saved[kind]), _ok(resumed[kind])
        for key in ("final", "final_pruner", "final_pruned"):
            assert _same(resumed[key], saved[key]), key


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoint_loads_into_the_plain_model_in_one_process(
    runs: dict[str, Any], kind: str
) -> None:
    from torch.distributed import checkpoint as dcp

    plain = _mlp(seed=1)
    state = {"model": plain.state_dict()}
    dcp.load(state, checkpoint_id=str(Path(runs["root"]) / kind), no_dist=True)
    plain.load_state_dict(state["model"])
    assert _same(plain.state_dict(), _ok(runs["saved"][0][kind])["dense"])
