"""Distributed training: exact sharded selection, DDP and FSDP2, on 2 CPU processes (gloo).

All multi-process scenarios run in one launch (a module fixture), since
starting the processes costs more than the scenarios; each test then checks
its scenario's per-rank results. FSDP2 (``fully_shard``) runs on CPU with gloo
in torch >= 2.6, so it is tested for real, not emulated.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn

import feather_sparse as fs
from _dist import free_port, launch
from _helpers import conv1d_net
from feather_sparse import selection
from feather_sparse.backbones import layer_thresholds_at_most
from feather_sparse.schedules import ConstantSchedule

WORLD = 2
STEPS = 5
SPARSITY = 0.8

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed + gloo"
)


# ---------------------------------------------------------------- shared data
def _weights(kind: str) -> list[Tensor]:
    """The same full tensors on every rank (fixed seed), of awkward sizes."""
    g = torch.Generator().manual_seed(7)
    shapes = [(300, 7), (5,), (1, 3), (64, 33), (3, 2, 2)]
    if kind == "ties":  # few distinct magnitudes: the window never shrinks below a tie
        return [torch.randint(-3, 4, s, generator=g).float() for s in shapes]
    if kind == "zeros":
        return [torch.randn(s, generator=g) * (torch.rand(s, generator=g) < 0.5) for s in shapes]
    if kind == "float64":
        return [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    if kind == "large":
        return [torch.randn(1 << 17, generator=g), torch.randn(200, 300, generator=g) * 3]
    return [torch.randn(s, generator=g) for s in shapes]


def _shard(t: Tensor, rank: int, world: int) -> Tensor:
    """This rank's rows, as FSDP2 shards (dim 0, uneven, possibly empty)."""
    parts = torch.chunk(t, world, dim=0) if t.dim() else (t,)
    return parts[rank] if rank < len(parts) else t[:0]


KINDS = ("randn", "ties", "zeros", "float64", "large")
SPARSITIES = (0.0, 1e-4, 0.5, 0.999, 1.0)


def _hints(full: list[Tensor]) -> list[float | None]:
    near = float(selection.select_threshold(full, 0.5))
    return [None, near * 1.001, 10.0]  # no hint, a good one, a bad one


# ---------------------------------------------------------------- the scenarios
def _scenario_select(rank: int, world: int) -> dict[str, Any]:
    """select_threshold / kth_magnitude on manual shards, every kind × sparsity × hint."""
    group = dist.group.WORLD
    out: dict[str, Any] = {}
    for kind in KINDS:
        full = _weights(kind)
        mine = [_shard(t, rank, world) for t in full]
        for s in SPARSITIES:
            for h in _hints(full):
                out[kind, s, h] = selection.select_threshold(mine, s, hint=h, process_group=group)
    # All weights on rank 0, none on rank 1 (layers split over ranks by hand).
    full = _weights("randn")
    mine = full if rank == 0 else []
    out["uneven"] = [
        selection.kth_magnitude(mine, k, process_group=group) for k in (1, 17, 2000, 3019)
    ]
    # Forced narrowing in float-bit space: no window may be gathered until a single value.
    saved = selection.CANDIDATE_CAP
    selection.CANDIDATE_CAP = 2
    try:
        for kind in ("randn", "ties"):
            full = _weights(kind)
            mine = [_shard(t, rank, world) for t in full]
            out["narrow", kind] = [
                selection.select_threshold(mine, s, process_group=group) for s in (0.25, 0.5, 0.75)
            ]
    finally:
        selection.CANDIDATE_CAP = saved
    full = _weights("randn")
    mine = [_shard(t, rank, world) for t in full]
    out["layer_caps"] = layer_thresholds_at_most(mine, 0.9, process_group=group)
    return out


def _batch(rank: int, step: int) -> tuple[Tensor, Tensor]:
    """A different batch on every rank and step (as a sharded loader gives)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, 2, 16, generator=g), torch.randint(0, 4, (6,), generator=g)


def _mask_digest(pruner: fs.Pruner) -> list[int]:
    """A fingerprint of each layer's mask (which weights are pruned)."""
    out = []
    for w, t in zip(pruner.weights(), pruner.thresholds()):
        mask = (w.detach().abs() <= t).reshape(-1).long()
        out.append(int((mask * torch.arange(1, mask.numel() + 1)).sum()))
    return out


def _train_ddp(rank: int, order: str) -> dict[str, Any]:
    """``order``: the Pruner attached before DDP wraps the model (``pruner_first``), to
    the wrapper after (``wrapped_first``), or to the module inside the wrapper after
    (``inner``: what a framework's callback is given)."""
    # A different initialisation on every rank: DDP must broadcast rank 0's.
    model = conv1d_net(seed=rank)
    kwargs = {"sparsity": SPARSITY, "total_steps": STEPS, "schedule": "cubic"}
    if order == "pruner_first":
        pruner = fs.Pruner(model, **kwargs)
        ddp = nn.parallel.DistributedDataParallel(model)
    else:
        ddp = nn.parallel.DistributedDataParallel(model)
        pruner = fs.Pruner(ddp.module if order == "inner" else ddp, **kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    thresholds, masks = [], []
    for step in range(STEPS):
        x, y = _batch(rank, step)
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()
        thresholds.append([float(t) for t in pruner.thresholds()])
        masks.append(_mask_digest(pruner))
    return {
        "thresholds": thresholds,
        "masks": masks,
        "weights": [w.detach().clone() for w in pruner.weights()],
        "achieved": pruner.sparsity_achieved(),
        "scheduled": pruner.scheduled_sparsity(),
    }


def _scenario_fsdp2(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    model = conv1d_net(seed=0)  # the same weights on every rank, as FSDP2 expects
    reference = copy.deepcopy(model)
    out: dict[str, Any] = {}
    # The Pruner must be attached before sharding; after, it says so.
    late = copy.deepcopy(model)
    fully_shard(late)
    try:
        fs.Pruner(late, sparsity=SPARSITY, total_steps=STEPS)
    except ValueError as err:
        out["late_error"] = str(err)

    pruner = fs.Pruner(model, sparsity=SPARSITY, total_steps=STEPS, schedule=ConstantSchedule())
    for m in model:
        if isinstance(m, (nn.Linear, nn.Conv1d)):
            fully_shard(m)
    fully_shard(model)
    out["sharded"] = all(isinstance(w, DTensor) for w in pruner.weights())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    steps = []
    for step in range(STEPS):
        x, y = _batch(rank, step)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()
        full = [w.detach().full_tensor() for w in pruner.weights()]  # for checking only
        t = pruner.thresholds()[0]
        # The forward under FSDP2 against the unsharded model given P_T(full weights).
        with torch.no_grad():
            for m_ref, w_full in zip(
                [m for m in reference if isinstance(m, (nn.Linear, nn.Conv1d))], full
            ):
                m_ref.weight.copy_(fs.threshold(w_full, t))
            for m_ref, m in zip(reference, model):
                if isinstance(m_ref, (nn.Linear, nn.Conv1d)):
                    m_ref.bias.copy_(m.bias.full_tensor())
            x_eval, _ = _batch(99, step)
            steps.append(
                {
                    "threshold": t.clone(),
                    "single_process": selection.select_threshold(full, SPARSITY),
                    "local_sizes": [w.to_local().numel() for w in pruner.weights()],
                    "achieved": pruner.sparsity_achieved(),
                    "pruned_full": sum(int((w.abs() <= t).sum()) for w in full),
                    "out": model(x_eval),
                    "out_reference": reference(x_eval),
                }
            )
    out["steps"] = steps
    out["numel"] = pruner.num_params
    out["backbones"] = _fsdp2_other_backbones()
    dense = pruner.dense_state_dict(pruned=True)
    out["dense_zeros"] = sum(
        int((v.full_tensor() == 0).sum()) for k, v in dense.items() if k.endswith("weight")
    )
    # The export of docs/distributed.md: whole tensors into an unsharded copy.
    whole = pruner.dense_state_dict(pruned=True, full=True)
    out["whole_plain"] = not any(isinstance(v, DTensor) for v in whole.values())
    plain = conv1d_net(seed=1)
    plain.load_state_dict(whole)
    x_eval, _ = _batch(98, 0)
    with torch.no_grad():
        out["exported_out"], out["sharded_out"] = plain(x_eval), model(x_eval)
    out["with_buffers"] = _fsdp2_export_with_buffers()
    try:
        pruner.finalize()
    except RuntimeError as err:
        out["finalize_error"] = str(err)
    return out


def _fsdp2_export_with_buffers() -> dict[str, Any]:
    """FSDP2 shards parameters but leaves buffers (BatchNorm's statistics) plain."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 4))
    pruner = fs.Pruner(model, sparsity=0.5, total_steps=1, schedule=ConstantSchedule())
    fully_shard(model)
    model(torch.randn(6, 16, generator=torch.Generator().manual_seed(5)))  # moves the statistics
    whole = pruner.dense_state_dict(pruned=True, full=True)
    fresh = nn.Sequential(nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 4))
    fresh.load_state_dict(whole)  # strict: every key, every shape
    return {
        "running_mean": fresh[1].running_mean.clone(),
        "batches": int(fresh[1].num_batches_tracked),
        "zeros": sum(int((fresh[i].weight == 0).sum()) for i in (0, 3)),
        "numel": pruner.num_params,
    }


def _prunable(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv1d))]


def _scenario_stages(rank: int, world: int) -> Tensor:
    """Layers split over ranks by hand (plain tensors): the group goes to the backbone."""
    stage = nn.ModuleList(_prunable(conv1d_net(seed=0))[rank::world])
    backbone = fs.GlobalBackbone(process_group=dist.group.WORLD)
    pruner = fs.Pruner(
        stage, sparsity=SPARSITY, total_steps=1, schedule=ConstantSchedule(), backbone=backbone
    )
    return pruner.thresholds()[0]


# A few hundred synthetic MNIST-1D-shaped samples: 4 steps of 2 × 64 per epoch.
TRAIN_SMALL = {
    "dataset": "synthetic-mnist1d",
    "data_options": {"train_size": 512, "test_size": 130},
    "batch_size": 64,
    "eval_batch_size": 50,
    "epochs": 3,
    "tensorboard": False,
    "threads": 1,
    "device": "cpu",
}


def _scenario_train(rank: int, world: int, root: Path) -> dict[str, Any]:
    """The training loop under DDP: agreement across ranks, and resume."""
    from feather_sparse.recipes import load_config
    from feather_sparse.train import train

    config = load_config("mnist1d", TRAIN_SMALL)
    seen: list[Any] = []

    def record(epoch: int, model: nn.Module, pruner: Any, row: dict[str, Any]) -> None:
        seen.append(([float(t) for t in pruner.thresholds()], _mask_digest(pruner), row))

    full = train(config, root / "full", callbacks=[record], progress=False)
    first = train(config, root / "resumed", stop_after_epoch=1, progress=False)
    resumed = train(config, root / "resumed", resume=True, progress=False)
    train(config, root / "half", stop_after_epoch=1, progress=False)  # resumed alone below
    return {
        "seen": seen,
        "full": {k: v.clone() for k, v in full.model.state_dict().items()},
        "resumed": {k: v.clone() for k, v in resumed.model.state_dict().items()},
        "completed": (full.completed, first.completed, resumed.completed),
        "sparsity": full.sparsity,
        "test_accuracy": full.test_accuracy,
    }


def _fsdp2_other_backbones() -> dict[str, Any]:
    """Per-layer (uniform) thresholds under FSDP2; a backbone without sharding support refuses."""
    from torch.distributed.fsdp import fully_shard

    out: dict[str, Any] = {}
    for name in ("uniform", "global-flops"):
        model = conv1d_net(seed=0)
        pruner = fs.Pruner(model, sparsity=SPARSITY, total_steps=1, backbone=name)
        fully_shard(model)
        try:
            pruner.update(SPARSITY)
            out[name] = [t.clone() for t in pruner.thresholds()]
        except ValueError as err:
            out[name] = str(err)
    return out


def _inner_with_unused_detection() -> str:
    """The message when a callback attaches inside DDP with find_unused_parameters on."""
    ddp = nn.parallel.DistributedDataParallel(conv1d_net(seed=0), find_unused_parameters=True)
    try:
        fs.Pruner(ddp.module, sparsity=SPARSITY, total_steps=STEPS)
    except ValueError as err:
        return str(err)
    return ""


def _all_scenarios(rank: int, world: int, root: str) -> dict[str, Any]:
    return {
        "train": _scenario_train(rank, world, Path(root)),
        "select": _scenario_select(rank, world),
        "stages": _scenario_stages(rank, world),
        "ddp_pruner_first": _train_ddp(rank, "pruner_first"),
        "ddp_wrapped_first": _train_ddp(rank, "wrapped_first"),
        "ddp_inner": _train_ddp(rank, "inner"),
        "ddp_inner_unused": _inner_with_unused_detection(),
        "fsdp2": _scenario_fsdp2(rank, world),
    }


@pytest.fixture(scope="module")
def train_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ddp-runs")


@pytest.fixture(scope="module")
def runs(train_root: Path) -> list[dict[str, Any]]:
    return launch(functools.partial(_all_scenarios, root=str(train_root)), WORLD)


# ---------------------------------------------------------------- the checks
def _sorted_kth(full: list[Tensor], k: int) -> float:
    if k == 0:
        return 0.0
    flat = torch.cat([t.reshape(-1).double().abs() for t in full])
    return float(torch.sort(flat).values[k - 1])


def test_sharded_selection_equals_single_process_exactly(runs: list[dict[str, Any]]) -> None:
    r0, r1 = runs[0]["select"], runs[1]["select"]
    checked = 0
    for kind in KINDS:
        full = _weights(kind)
        n = sum(t.numel() for t in full)
        for s in SPARSITIES:
            single = selection.select_threshold(full, s)
            assert float(single) == _sorted_kth(full, round(s * n))
            for h in _hints(full):
                a, b = r0[kind, s, h], r1[kind, s, h]
                assert a.dtype == b.dtype == single.dtype
                # bit for bit: the same value on both ranks and in one process
                assert torch.equal(a, single), (kind, s, h, a, single)
                assert torch.equal(b, single), (kind, s, h, b, single)
                checked += 1
    assert checked == len(KINDS) * len(SPARSITIES) * 3


def test_sharded_selection_with_an_empty_rank(runs: list[dict[str, Any]]) -> None:
    full = _weights("randn")
    for rank in range(WORLD):
        got = [float(t) for t in runs[rank]["select"]["uneven"]]
        assert got == [_sorted_kth(full, k) for k in (1, 17, 2000, 3019)]


def test_sharded_selection_narrows_in_bit_space_when_nothing_may_be_gathered(
    runs: list[dict[str, Any]],
) -> None:
    for kind in ("randn", "ties"):
        full = _weights(kind)
        expected = [selection.select_threshold(full, s) for s in (0.25, 0.5, 0.75)]
        for rank in range(WORLD):
            assert runs[rank]["select"]["narrow", kind] == expected


def test_sharded_layer_caps(runs: list[dict[str, Any]]) -> None:
    expected = layer_thresholds_at_most(_weights("randn"), 0.9)
    for rank in range(WORLD):
        assert [float(t) for t in runs[rank]["select"]["layer_caps"]] == [
            float(t) for t in expected
        ]


def test_layers_split_over_ranks_share_one_global_threshold(runs: list[dict[str, Any]]) -> None:
    weights = [m.weight.detach() for m in _prunable(conv1d_net(seed=0))]
    expected = selection.select_threshold(weights, SPARSITY)
    assert all(torch.equal(runs[r]["stages"], expected) for r in range(WORLD))
    # ...which is not what either rank would pick from its own layers alone
    assert not torch.equal(selection.select_threshold(weights[0::2], SPARSITY), expected)


@pytest.mark.parametrize("order", ["ddp_pruner_first", "ddp_wrapped_first", "ddp_inner"])
def test_ddp_ranks_agree_on_thresholds_and_masks(runs: list[dict[str, Any]], order: str) -> None:
    r0, r1 = runs[0][order], runs[1][order]
    assert r0["thresholds"] == r1["thresholds"]
    assert r0["masks"] == r1["masks"]
    # DDP kept the weights identical (gradients were averaged) although every
    # rank started from its own initialisation and saw its own batches.
    for a, b in zip(r0["weights"], r1["weights"]):
        assert torch.equal(a, b)
    # The thresholds moved with the schedule, and the masks with them.
    firsts = [row[0] for row in r0["thresholds"]]
    assert len(set(firsts)) == STEPS and firsts == sorted(firsts)
    assert len({tuple(m) for m in r0["masks"]}) > 1
    n = sum(w.numel() for w in r0["weights"])
    assert abs(r0["achieved"] - r0["scheduled"]) <= 1.0 / n


def test_attaching_inside_ddp_with_unused_detection_names_the_frameworks_fix(
    runs: list[dict[str, Any]],
) -> None:
    message = runs[0]["ddp_inner_unused"]
    assert "find_unused_parameters" in message
    assert "TrainingArguments(ddp_find_unused_parameters=False)" in message
    assert "DDPStrategy(find_unused_parameters=False)" in message


@pytest.mark.parametrize("order", ["ddp_wrapped_first", "ddp_inner"])
def test_ddp_order_does_not_matter(runs: list[dict[str, Any]], order: str) -> None:
    a, b = runs[0]["ddp_pruner_first"], runs[0][order]
    assert a["thresholds"] == b["thresholds"]
    for x, y in zip(a["weights"], b["weights"]):
        assert torch.equal(x, y)


def test_fsdp2_threshold_is_the_single_process_one(runs: list[dict[str, Any]]) -> None:
    for rank in range(WORLD):
        out = runs[rank]["fsdp2"]
        assert out["sharded"]
        for step in out["steps"]:
            assert torch.equal(step["threshold"], step["single_process"])
    # every rank held a non-empty part of every weight, and the parts make up the whole
    sizes = [runs[r]["fsdp2"]["steps"][0]["local_sizes"] for r in range(WORLD)]
    assert all(n > 0 for per_rank in sizes for n in per_rank)
    assert sum(map(sum, sizes)) == runs[0]["fsdp2"]["numel"]
    for s0, s1 in zip(runs[0]["fsdp2"]["steps"], runs[1]["fsdp2"]["steps"]):
        assert torch.equal(s0["threshold"], s1["threshold"])


def test_fsdp2_masks_survive_sharding(runs: list[dict[str, Any]]) -> None:
    for rank in range(WORLD):
        out = runs[rank]["fsdp2"]
        n = out["numel"]
        for step in out["steps"]:
            # the all-reduced report counts exactly the pruned weights of the full tensors
            assert step["achieved"] == step["pruned_full"] / n
            assert step["pruned_full"] == round(SPARSITY * n)
            # the sharded forward uses P_T of the full weight, like an unsharded model
            torch.testing.assert_close(step["out"], step["out_reference"])
        assert out["dense_zeros"] == round(SPARSITY * n)


def test_fsdp2_exports_whole_tensors_into_an_unsharded_model(
    runs: list[dict[str, Any]],
) -> None:
    for rank in range(WORLD):
        out = runs[rank]["fsdp2"]
        assert out["whole_plain"]
        torch.testing.assert_close(out["exported_out"], out["sharded_out"])
        buffers = out["with_buffers"]
        assert buffers["batches"] == 1 and buffers["running_mean"].abs().sum() > 0
        assert buffers["zeros"] == round(0.5 * buffers["numel"])
    assert torch.equal(
        runs[0]["fsdp2"]["with_buffers"]["running_mean"],
        runs[1]["fsdp2"]["with_buffers"]["running_mean"],
    )


def test_fsdp2_uniform_backbone_equals_single_process(runs: list[dict[str, Any]]) -> None:
    model = conv1d_net(seed=0)
    pruner = fs.Pruner(model, sparsity=SPARSITY, total_steps=1, backbone="uniform")
    pruner.update(SPARSITY)
    expected = pruner.thresholds()
    assert len(set(map(float, expected))) > 1  # really one threshold per layer
    for rank in range(WORLD):
        got = runs[rank]["fsdp2"]["backbones"]["uniform"]
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
        assert "does not support sharded" in runs[rank]["fsdp2"]["backbones"]["global-flops"]


def test_fsdp2_misuse_is_explained(runs: list[dict[str, Any]]) -> None:
    out = runs[0]["fsdp2"]
    assert "unsharded model first" in out["late_error"]
    assert "dense_state_dict(pruned=True, full=True)" in out["finalize_error"]


# ---------------------------------------------------------------- single process
def test_group_without_init_is_a_clear_error() -> None:
    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    stale = SimpleNamespace()  # e.g. a group kept from an earlier, destroyed init
    with pytest.raises(ValueError, match="init_process_group"):
        selection.select_threshold([torch.ones(3)], 0.5, process_group=stale)  # type: ignore[arg-type]


@pytest.mark.parametrize("cap", [40, 2])
def test_single_process_path_is_exact_under_any_cap(
    cap: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows too full to gather are histogrammed and narrowed, down to one float if need be."""
    monkeypatch.setattr(selection, "GATHER_CAP", cap)
    monkeypatch.setattr(selection, "GATHER_DIVISOR", 1 << 62)  # the cap is GATHER_CAP
    for kind in ("randn", "ties", "zeros"):
        full = _weights(kind)
        n = sum(t.numel() for t in full)
        for s, h in [(0.0, None), (0.1, None), (0.77, 10.0), (0.77, None), (1.0, 0.3)]:
            got = selection.select_threshold(full, s, hint=h)
            assert float(got) == _sorted_kth(full, round(s * n)), (kind, s, h)


def test_nan_is_reported_not_returned() -> None:
    w = [torch.tensor([0.1, math.nan, 0.3])]
    with pytest.raises(ValueError, match="NaN"):
        selection.kth_magnitude(w, 3)


# ---------------------------------------------------------------- training loop
def test_ddp_training_loop_ranks_agree(runs: list[dict[str, Any]]) -> None:
    r0, r1 = runs[0]["train"], runs[1]["train"]
    assert r0["completed"] == r1["completed"] == (True, False, True)
    assert len(r0["seen"]) == TRAIN_SMALL["epochs"]
    for (t0, m0, row0), (t1, m1, row1) in zip(r0["seen"], r1["seen"]):
        assert t0 == t1 and m0 == m1
        # evaluation sums were all-reduced: both ranks report the whole test set's numbers
        assert row0["test_acc"] == row1["test_acc"] and row0["test_loss"] == row1["test_loss"]
    for key, value in r0["full"].items():
        assert torch.equal(value, r1["full"][key]), key
    assert r0["sparsity"] == pytest.approx(0.9, abs=1e-4)


def test_ddp_training_loop_resumes_bit_identically(runs: list[dict[str, Any]]) -> None:
    for rank in range(WORLD):
        full, resumed = runs[rank]["train"]["full"], runs[rank]["train"]["resumed"]
        assert full.keys() == resumed.keys()
        for key, value in full.items():
            assert torch.equal(value, resumed[key]), key


def test_ddp_training_loop_writes_from_rank_0(runs: list[dict[str, Any]], train_root: Path) -> None:
    run = train_root / "full"
    info = json.loads((run / "config.json").read_text())
    assert info["world_size"] == WORLD
    # 512 samples in global batches of 2 × 64: 4 steps per epoch on each rank
    assert info["steps_per_epoch"] == 4
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("epoch") for r in rows] == [1, 2, 3, 3]  # once per epoch: one writer
    assert rows[-1]["final"] and rows[-1]["test_acc"] == runs[0]["train"]["test_accuracy"]


def test_torchrun_cli(tmp_path: Path) -> None:
    """``torchrun --nproc_per_node=2 -m feather_sparse train ...`` on CPU (gloo)."""
    src = Path(fs.__file__).resolve().parents[1]
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        "-m", "feather_sparse", "train",
        "--dataset", "synthetic-mnist1d",
        "--set", "data_options={train_size = 256, test_size = 64}",
        "--batch-size", "32", "--epochs", "2", "--threads", "1", "--device", "cpu",
        "--no-tensorboard", "--no-progress", "--run-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    # rank 0 alone prints the results and the epoch lines
    assert proc.stdout.count("final test accuracy") == 1
    assert proc.stderr.count("epoch 2/2") == 1
    info = json.loads((tmp_path / "run" / "config.json").read_text())
    assert info["world_size"] == 2 and info["steps_per_epoch"] == 4
    final = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["final"] and final["sparsity"] == pytest.approx(0.9, abs=1e-4)


def test_a_missed_hint_costs_one_pass_more_than_no_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a miss the next window comes from a sample, not from the whole side."""
    passes = []
    original = selection._window_pass

    def counting(*args: Any, **kwargs: Any) -> Any:
        passes.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(selection, "_window_pass", counting)
    monkeypatch.setattr(selection, "GATHER_CAP", 1000)  # as if the model were large
    monkeypatch.setattr(selection, "GATHER_DIVISOR", 1 << 62)  # the cap is GATHER_CAP
    w = [torch.randn(300_000, generator=torch.Generator().manual_seed(3))]
    expected = _sorted_kth(w, round(0.9 * w[0].numel()))
    costs = {}
    for name, hint in [("none", None), ("10x high", 10 * expected), ("10x low", expected / 10)]:
        passes.clear()
        assert float(selection.select_threshold(w, 0.9, hint=hint)) == expected
        costs[name] = len(passes)
    assert costs["10x high"] <= costs["none"] + 1
    assert costs["10x low"] <= costs["none"] + 1


def test_resuming_with_another_number_of_processes_is_refused(
    runs: list[dict[str, Any]], train_root: Path
) -> None:
    """The run stopped half-way under 2 processes; one process may not continue it."""
    from feather_sparse.recipes import load_config
    from feather_sparse.train import train

    half = train_root / "half"
    before = (half / "checkpoints" / "last.pt").read_bytes()
    with pytest.raises(ValueError, match=r"trained by 2 processes, this is 1.*nproc_per_node=2"):
        train(load_config("mnist1d", TRAIN_SMALL), half, resume=True, progress=False)
    assert (half / "checkpoints" / "last.pt").read_bytes() == before
