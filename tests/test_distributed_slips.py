"""Slips across ranks on 2 CPU processes (gloo): ranks given different Pruner settings
under FSDP2, ranks asking a sharded selection for different things, FSDP2 casting the
weights down for the forward, and ASL+'s learned thresholds under DDP.

Every scenario runs in one launch (a module fixture); a scenario that must fail raises
on every rank alike (``recorded``), so the next one starts with the ranks in step.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn

import feather_sparse as fs
from _dist import launch, recorded
from _guards import guard
from feather_sparse import selection

WORLD = 2
STEPS = 4

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed + gloo"
)


def _mlp(width: int = 33) -> nn.Module:
    torch.manual_seed(0)  # the same weights on every rank, as FSDP2 expects
    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 5))


def _batch(rank: int, step: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 8, generator=g), torch.randint(0, 5, (16,), generator=g)


def _train(model: nn.Module, pruner: fs.Pruner, rank: int, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = _batch(rank, step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        pruner.step()


def _shard(model: nn.Module, **kwargs: Any) -> None:
    from torch.distributed.fsdp import fully_shard

    fully_shard(model[0], **kwargs)
    fully_shard(model[2], **kwargs)
    fully_shard(model, **kwargs)


# ---------------------------------------------------------------- the scenarios
def _fsdp_settings(rank: int, slip: dict[str, Any]) -> dict[str, Any]:
    """FSDP2 where rank 1 was given ``slip`` on top of the settings rank 0 has."""
    model = _mlp()
    kwargs: dict[str, Any] = {"sparsity": 0.6, "total_steps": STEPS}
    if rank == 1:
        kwargs.update(slip)
    pruner = fs.Pruner(model, **kwargs)
    _shard(model)
    _train(model, pruner, rank, STEPS)
    return {"thresholds": [t.clone() for t in pruner.thresholds()]}


def _fsdp_update_differs(rank: int) -> dict[str, Any]:
    """The same settings, then one rank asks for another sparsity (a step out of line)."""
    model = _mlp()
    pruner = fs.Pruner(model, sparsity=0.6, total_steps=STEPS)
    _shard(model)
    _train(model, pruner, rank, 1)  # the settings agree
    pruner.update(0.5 if rank == 0 else 0.502)
    return {"thresholds": [t.clone() for t in pruner.thresholds()]}


def _shards(rank: int) -> list[Tensor]:
    g = torch.Generator().manual_seed(3)
    full = [torch.randn(40, 7, generator=g), torch.randn(9, generator=g)]
    return [torch.chunk(t, WORLD)[rank] for t in full]


def _select_differs(rank: int) -> dict[str, Any]:
    group = dist.group.WORLD
    mine = _shards(rank)
    return {"t": selection.select_threshold(mine, 0.3 if rank == 0 else 0.6, process_group=group)}


def _kth_differs(rank: int) -> dict[str, Any]:
    """k = 0 returns at once: without the check the other rank waits in the next collective."""
    group = dist.group.WORLD
    return {"t": selection.kth_magnitude(_shards(rank), 0 if rank == 0 else 5, process_group=group)}


def _fsdp_param_dtype(rank: int, param_dtype: torch.dtype | None) -> dict[str, Any]:
    """FSDP2 with a mixed-precision policy; the zeros the forward's weights hold."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    model = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 64))
    torch.manual_seed(0)
    for m in (model[0], model[2]):
        nn.init.normal_(m.weight)
    pruner = fs.Pruner(model, sparsity=0.5, total_steps=STEPS)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.bfloat16)
    _shard(model, mp_policy=policy)
    seen: dict[int, int] = {}
    for i in (0, 2):  # the weight each layer computes with, read inside the forward
        model[i].register_forward_pre_hook(
            lambda mod, args, i=i: seen.__setitem__(i, int((mod.weight == 0).sum()))
        )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 64, (8,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        pruner.step()
    model(torch.randn(2, 16))
    return {
        "k": round(pruner.scheduled_sparsity() * pruner.num_params),
        "zeros": sum(seen.values()),
    }


def _ddp_asl(rank: int, accumulate: int) -> dict[str, Any]:
    """ASL+ under DDP, each rank its own batches; ``accumulate`` micro-batches per step
    (all but the last under ``no_sync``)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)
    )
    pruner = fs.Pruner(model, sparsity=0.8, total_steps=STEPS, backbone="asl+")
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    opt.add_param_group(
        {"params": pruner.parameters(), "lr": 10 * fs.ASL_LR_SCALE, "weight_decay": 0.0}
    )
    g = torch.Generator().manual_seed(100 + rank)
    history = []
    for _ in range(STEPS):
        opt.zero_grad()
        for micro in range(accumulate):
            x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
            if micro < accumulate - 1:
                with ddp.no_sync():
                    (nn.functional.cross_entropy(ddp(x), y) + pruner.regularizer()).backward()
            else:
                (nn.functional.cross_entropy(ddp(x), y) + pruner.regularizer()).backward()
        opt.step()
        pruner.step()
        history.append(
            {
                "r": [p.detach().clone() for p in pruner.parameters()],
                "thresholds": [t.clone() for t in pruner.thresholds()],
            }
        )
    return {"history": history, "state": pruner.state_dict()}


def _all(rank: int, world: int) -> dict[str, Any]:
    slips = {
        "sparsity": {"sparsity": 0.602},
        "total_steps": {"total_steps": 3 * STEPS},
        "backbone": {"backbone": "uniform"},
    }
    out: dict[str, Any] = {
        f"settings_{k}": recorded(functools.partial(_fsdp_settings, rank, v))
        for k, v in slips.items()
    }
    out["update_differs"] = recorded(functools.partial(_fsdp_update_differs, rank))
    out["select_differs"] = recorded(functools.partial(_select_differs, rank))
    out["kth_differs"] = recorded(functools.partial(_kth_differs, rank))
    out["bf16_params"] = recorded(functools.partial(_fsdp_param_dtype, rank, torch.bfloat16))
    out["fp32_params"] = recorded(functools.partial(_fsdp_param_dtype, rank, None))
    out["ddp_asl"] = recorded(functools.partial(_ddp_asl, rank, 1))
    out["ddp_asl_no_sync"] = recorded(functools.partial(_ddp_asl, rank, 2))
    return out


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    return launch(_all, WORLD)


def _errors(runs: list[dict[str, Any]], key: str) -> list[str]:
    got = [r[key].get("error", "") for r in runs]
    assert all(got), f"{key}: no error on some rank: {[r[key] for r in runs]}"
    return [e.strip().splitlines()[-1] for e in got]


# ---------------------------------------------------------------- the checks
@guard(
    "FSDP2 ranks given different Pruner settings (sparsity 0.6 and 0.602, another "
    "total_steps, another backbone)",
    "`ValueError` on every rank at the first `step()` after `fully_shard`, naming the "
    "setting and this rank's value; no silent divergence, hang or gloo abort",
)
@pytest.mark.parametrize("setting", ["sparsity", "total_steps", "backbone"])
def test_fsdp2_ranks_with_different_settings_are_refused(
    runs: list[dict[str, Any]], setting: str
) -> None:
    errors = _errors(runs, f"settings_{setting}")
    for rank, err in enumerate(errors):
        assert err.startswith("ValueError"), err
        assert "different Pruner settings" in err and f"{setting} differs" in err, err
        assert f"rank {rank} of 2" in err and "same model and arguments on every rank" in err
    if setting == "sparsity":  # each rank names its own value
        assert "sparsity=0.6)" in errors[0] and "sparsity=0.602)" in errors[1]


@guard(
    "ranks of a sharded selection asking for different sparsities or k (a `step()` out of "
    "line on one rank)",
    "`ValueError` on every rank from the selection's first all-reduce, instead of "
    "different thresholds or a hang",
)
@pytest.mark.parametrize("case", ["update_differs", "select_differs", "kth_differs"])
def test_sharded_selection_asked_differently_is_refused(
    runs: list[dict[str, Any]], case: str
) -> None:
    for rank, err in enumerate(_errors(runs, case)):
        assert err.startswith("ValueError"), err
        assert "asked for different numbers of pruned weights" in err, err
        assert f"rank {rank} of 2" in err and "call step() the same number of times" in err


@guard(
    "FSDP2 `MixedPrecisionPolicy(param_dtype=torch.bfloat16)` over fp32 pruned weights",
    "`ValueError` at the first `step()` naming param_dtype and the fix (keep it float32; "
    "reduce_dtype may be lower)",
)
def test_fsdp2_lower_param_dtype_is_refused(runs: list[dict[str, Any]]) -> None:
    for err in _errors(runs, "bf16_params"):
        assert err.startswith("ValueError"), err
        assert "param_dtype=torch.bfloat16" in err and "keep param_dtype None" in err, err


def test_fsdp2_lower_reduce_dtype_keeps_the_masks_exact(runs: list[dict[str, Any]]) -> None:
    for r in runs:
        got = r["fp32_params"]
        assert "error" not in got, got.get("error")
        assert got["zeros"] == got["k"]


@pytest.mark.parametrize("case", ["ddp_asl", "ddp_asl_no_sync"])
def test_ddp_asl_plus_learned_thresholds_stay_identical(
    runs: list[dict[str, Any]], case: str
) -> None:
    first, second = (r[case] for r in runs)
    assert "error" not in first and "error" not in second, (first, second)
    for a, b in zip(first["history"], second["history"]):
        for key in ("r", "thresholds"):
            assert all(torch.equal(x, y) for x, y in zip(a[key], b[key])), key
    assert first["history"][0]["r"] != first["history"][-1]["r"]  # r was trained
    s0, s1 = first["state"], second["state"]
    assert torch.equal(s0["backbone"]["r"], s1["backbone"]["r"])
    assert torch.equal(s0["backbone"]["sigma"], s1["backbone"]["sigma"])
    assert all(torch.equal(x, y) for x, y in zip(s0["thresholds"], s1["thresholds"]))


def test_single_process_selection_does_not_pack_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*args: Any) -> None:
        raise AssertionError("the ranks' check ran without a process group")

    monkeypatch.setattr(selection._Comm, "agreed_counts", refuse)
    w = [torch.randn(100, generator=torch.Generator().manual_seed(0))]
    assert float(selection.select_threshold(w, 0.5)) == float(torch.sort(w[0].abs()).values[49])
    assert float(selection.kth_magnitude(w, 3)) == float(torch.sort(w[0].abs()).values[2])
