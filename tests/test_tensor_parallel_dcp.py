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
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from torch import Tensor, nn

import feather_sparse as fs
from _dist import dcp_resume, launch, recorded
from _tp import INPUTS, NEEDS_GLOO, OUTPUTS, megatron, mlp, pruner_kinds
from feather_sparse import distributed

pytestmark = NEEDS_GLOO

WORLD = 2
HALF, STEPS = 3, 6  # checkpoint after HALF steps, of STEPS in all
KINDS = list(pruner_kinds(STEPS))
PLAIN_KEYS = ["0.weight", "0.bias", "2.weight", "2.bias"]


def _mlp(seed: int = 0) -> nn.Sequential:
    return mlp(seed)


def _build(kind: str, seed: int = 0) -> tuple[nn.Sequential, fs.Pruner, torch.optim.Optimizer]:
    """The recipe's order: parallelize_module, the Pruner, the optimizer."""
    from torch.distributed.device_mesh import init_device_mesh

    model = megatron(_mlp(seed), init_device_mesh("cpu", (WORLD,)))
    pruner = fs.Pruner(model, **pruner_kinds(STEPS)[kind])
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


def _by_plain_name(model: nn.Module, part: Callable[[Tensor], Tensor]) -> dict[str, Tensor]:
    """``part`` of every parameter (a copy), by the plain model's names."""
    return {
        name.replace("parametrizations.weight.original", "weight"): part(p).detach().clone()
        for name, p in model.named_parameters()
    }


def _stored(model: nn.Module) -> dict[str, Tensor]:
    """The parameters, whole, by the plain model's names."""
    return _by_plain_name(model, distributed.full_tensor)


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
    model, pruner, opt = _build(kind, seed=1)  # differently initialised: the load must count
    dcp_resume(model, opt, pruner, str(root / kind))
    out: dict[str, Any] = {"loaded": _stored(model), "loaded_pruner": pruner.state_dict()}
    _train(model, opt, pruner, HALF, STEPS)
    out["final"] = _stored(model)
    out["final_pruner"] = pruner.state_dict()
    out["final_pruned"] = pruner.dense_state_dict(pruned=True, full=True)
    return out


def _save_all(rank: int, world: int, root: str) -> dict[str, Any]:
    return {kind: recorded(functools.partial(_save_one, kind, Path(root))) for kind in KINDS}


def _resume_all(rank: int, world: int, root: str) -> dict[str, Any]:
    return {kind: recorded(functools.partial(_resume_one, kind, Path(root))) for kind in KINDS}


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


# ----------------------------------------------- FSDP2 over tensor parallelism (2-D)
#: The (dp, tp) meshes on 2 processes: between them, both mesh dimensions sharded.
MESHES_2D = [(1, 2), (2, 1)]
BATCH_2D = 4  # per dp rank


def _mlp_2d(seed: int = 0) -> nn.Sequential:
    return mlp(seed, whole_tail=True)


def _build_2d(
    kind: str, shape: tuple[int, int], seed: int = 0
) -> tuple[nn.Sequential, fs.Pruner, torch.optim.Optimizer]:
    """The 2-D recipe: parallelize_module on tp, the Pruner, fully_shard on dp, the optimizer."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    model = _mlp_2d(seed)
    megatron(model, mesh["tp"])
    pruner = fs.Pruner(model, **pruner_kinds(STEPS)[kind])
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model, pruner, torch.optim.Adam(model.parameters(), lr=0.01)


def _train_2d(model: nn.Module, opt: torch.optim.Optimizer, pruner: fs.Pruner,
              first: int, last: int) -> None:  # fmt: skip
    dp_rank = model[0].weight.device_mesh.get_local_rank("dp")  # type: ignore[index]
    for step in range(first, last):
        g = torch.Generator().manual_seed(100 + step + 1000 * dp_rank)  # each dp rank its batch
        x = torch.randn(BATCH_2D, INPUTS, generator=g)
        y = torch.randint(0, OUTPUTS, (BATCH_2D,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()


def _shards(model: nn.Module) -> dict[str, Tensor]:
    """This rank's part of every parameter, by the plain model's names."""
    return _by_plain_name(model, distributed.to_local)


def _full_state_loads(kind: str, shape: tuple[int, int], full: dict[str, Tensor]) -> dict[str, Any]:
    """A full (unsharded) state dict loaded into fresh, differently initialised 2-D models,
    three ways: ``set_model_state_dict(full_state_dict=True)``, ``model.load_state_dict``
    of the pruned weights (the Pruner's load hook cuts each rank's part with
    ``distributed.shard_like``), and ``shard_like`` itself."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    out: dict[str, Any] = {}
    model, _, _ = _build_2d(kind, shape, seed=1)
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, {k: v.clone() for k, v in full.items()}, options=options)
    out["set_full"] = _shards(model)
    model, _, _ = _build_2d(kind, shape, seed=1)
    weights = {k: v.clone() for k, v in full.items() if k.endswith("weight")}
    result = model.load_state_dict(weights, strict=False)  # FSDP2's biases need DTensors
    out["load_missing"] = sorted(result.missing_keys)
    out["load_weights"] = {k: v for k, v in _shards(model).items() if k.endswith("weight")}
    stored = {
        name.replace("parametrizations.weight.original", "weight"): p
        for name, p in model.named_parameters()
        if name.endswith("original")
    }
    out["shard_like"] = {
        k: distributed.to_local(distributed.shard_like(full[k].clone(), stored[k])).clone()
        for k in stored
    }
    out["placements"] = {k: str(p.placements) for k, p in stored.items()}  # type: ignore[attr-defined]
    return out


def _save_one_2d(kind: str, shape: tuple[int, int], root: Path) -> dict[str, Any]:
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    model, pruner, opt = _build_2d(kind, shape)
    _train_2d(model, opt, pruner, 0, HALF)
    state = get_model_state_dict(model)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    out: dict[str, Any] = {
        "keys": list(state),
        "full_keys": list(full),
        "dense": _stored(model),
        "shards": _shards(model),
        "pruner": pruner.state_dict(),
        # a copy: where a mesh dimension has one rank, the full tensor is the stored one
        "full": {k: cast(Tensor, v).detach().clone() for k, v in full.items()},
    }
    dcp.save(
        {
            "model": state,
            "optim": get_optimizer_state_dict(model, opt),
            "pruner": pruner.state_dict(),
        },
        checkpoint_id=str(root / f"2d-{shape[0]}x{shape[1]}-{kind}"),
    )
    _train_2d(model, opt, pruner, HALF, STEPS)
    out["final"] = _stored(model)
    out["final_pruner"] = pruner.state_dict()
    out["final_pruned"] = pruner.dense_state_dict(pruned=True, full=True)
    out["loads"] = _full_state_loads(kind, shape, out["full"])
    return out


def _resume_one_2d(kind: str, shape: tuple[int, int], root: Path) -> dict[str, Any]:
    model, pruner, opt = _build_2d(kind, shape, seed=1)  # differently initialised
    dcp_resume(model, opt, pruner, str(root / f"2d-{shape[0]}x{shape[1]}-{kind}"))
    out: dict[str, Any] = {"loaded": _stored(model), "loaded_pruner": pruner.state_dict()}
    _train_2d(model, opt, pruner, HALF, STEPS)
    out["final"] = _stored(model)
    out["final_pruner"] = pruner.state_dict()
    out["final_pruned"] = pruner.dense_state_dict(pruned=True, full=True)
    return out


def _save_all_2d(rank: int, world: int, root: str) -> dict[Any, Any]:
    return {
        (shape, kind): recorded(functools.partial(_save_one_2d, kind, shape, Path(root)))
        for shape in MESHES_2D
        for kind in KINDS
    }


def _resume_all_2d(rank: int, world: int, root: str) -> dict[Any, Any]:
    return {
        (shape, kind): recorded(functools.partial(_resume_one_2d, kind, shape, Path(root)))
        for shape in MESHES_2D
        for kind in KINDS
    }


@pytest.fixture(scope="module")
def runs_2d(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = str(tmp_path_factory.mktemp("dcp-2d"))
    saved = launch(functools.partial(_save_all_2d, root=root), WORLD)
    resumed = launch(functools.partial(_resume_all_2d, root=root), WORLD)
    return {"saved": saved, "resumed": resumed}


PLAIN_KEYS_2D = [*PLAIN_KEYS, "4.weight", "4.bias"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", MESHES_2D, ids=lambda s: f"{s[0]}x{s[1]}")
def test_2d_full_state_dict_loads_each_rank_its_part_exactly(
    runs_2d: dict[str, Any], shape: tuple[int, int], kind: str
) -> None:
    """``get_model_state_dict(full_state_dict=True)`` of a 2-D model loaded into a fresh,
    differently initialised one gives every rank exactly the shards the model had."""
    for saved in runs_2d["saved"]:
        saved = _ok(saved[shape, kind])
        assert saved["full_keys"] == PLAIN_KEYS_2D
        assert _same(saved["full"], saved["dense"])  # whole plain tensors
        loads = saved["loads"]
        assert _same(loads["set_full"], saved["shards"])
        weights = {k: v for k, v in saved["shards"].items() if k.endswith("weight")}
        assert _same(loads["load_weights"], weights)
        assert loads["load_missing"] == ["0.bias", "2.bias", "4.bias"]
        assert _same(loads["shard_like"], weights)
    # the layouts are those of the 2-D recipe: both mesh dimensions sharded between the meshes
    placements = _ok(runs_2d["saved"][0][shape, kind])["loads"]["placements"]
    first = (
        "_StridedShard(dim=0, sf=2), Shard(dim=0)"
        if shape == (1, 2)
        else "Shard(dim=0), Shard(dim=0)"
    )
    assert placements == {
        "0.weight": f"({first})",
        "2.weight": "(Shard(dim=0), Shard(dim=1))",
        "4.weight": "(Shard(dim=0),)",
    }


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", MESHES_2D, ids=lambda s: f"{s[0]}x{s[1]}")
def test_2d_resumed_run_ends_bit_for_bit_where_the_uninterrupted_one_does(
    runs_2d: dict[str, Any], shape: tuple[int, int], kind: str
) -> None:
    for saved, resumed in zip(runs_2d["saved"], runs_2d["resumed"]):
        saved, resumed = _ok(saved[shape, kind]), _ok(resumed[shape, kind])
        assert saved["keys"] == PLAIN_KEYS_2D
        assert _same(resumed["loaded"], saved["dense"])
        assert _same(resumed["loaded_pruner"], saved["pruner"])
        for key in ("final", "final_pruner", "final_pruned"):
            assert _same(resumed[key], saved[key]), key


def _full_state_2x2(rank: int, world: int) -> dict[str, Any]:
    """On a (2, 2) mesh (4 processes), where FSDP2's ``_StridedShard`` really interleaves:
    the full state of a trained 2-D model loaded into a fresh one."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    def run() -> dict[str, Any]:
        model, pruner, opt = _build_2d("2:4", (2, 2))
        _train_2d(model, opt, pruner, 0, 1)
        options = StateDictOptions(full_state_dict=True)
        got = get_model_state_dict(model, options=options)
        full = {k: cast(Tensor, v).detach().clone() for k, v in got.items()}
        return {
            "shards": _shards(model),
            "full": full,
            "loads": _full_state_loads("2:4", (2, 2), full),
        }

    return recorded(run)


@pytest.fixture(scope="module")
def runs_2x2() -> list[dict[str, Any]]:
    return launch(_full_state_2x2, 4)  # ~15 s on 2 cores


def test_2d_full_state_dict_loads_strided_shards_exactly(runs_2x2: list[dict[str, Any]]) -> None:
    """``_StridedShard(dim=0, sf=2)`` over ``Shard(0)``: rank (dp, tp) holds rows
    ``tp·12 + dp·6 …`` of the column-wise weight (24 rows), which for ranks 1 and 2
    is not the ``rank``-th quarter."""
    for rank, run in enumerate(runs_2x2):
        run = _ok(run)
        loads, shards = run["loads"], run["shards"]
        assert loads["placements"]["0.weight"] == "(_StridedShard(dim=0, sf=2), Shard(dim=0))"
        assert _same(loads["set_full"], shards)
        weights = {k: v for k, v in shards.items() if k.endswith("weight")}
        assert _same(loads["load_weights"], weights)
        assert _same(loads["shard_like"], weights)
        dp, tp = divmod(rank, 2)
        assert torch.equal(weights["0.weight"], run["full"]["0.weight"][tp * 12 + dp * 6 :][:6])
        naive = run["full"]["0.weight"].chunk(4)[rank]  # what a flat cut would give
        assert torch.equal(weights["0.weight"], naive) is (rank in (0, 3))
