"""Tests that close the gaps a mutation audit of the training loop found.

Each test here fails on one or more hand-made mutants of ``train/optim.py``,
``train/loop.py``, ``train/session.py`` or ``train/checkpoint.py`` that the
rest of the suite let through (``docs/mutation-audit.md``, "The training
loop and its recipes"; the mutants' ids are in each test's docstring) and
checks the code against a computation written here from the specification —
``ALGORITHMS.md``, the paper's recipes, the docstrings — not against the
code's own output.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from _helpers import tiny_config, tiny_run
from feather_sparse.integrity import DiskFullError
from feather_sparse.recipes import TrainConfig
from feather_sparse.train import build_optimizer, evaluate, load_checkpoint, loop, train
from feather_sparse.train.dist import DistContext
from feather_sparse.train.session import _setup

pytestmark = pytest.mark.usefixtures("one_thread")

# 512 synthetic samples: 8 steps of 64 per epoch (the training batches are all full).
SMALL = tiny_run(train_size=512, test_size=128, eval_batch_size=128)
STEPS_PER_EPOCH = 8


def small_config(**overrides: Any) -> TrainConfig:
    return tiny_config(SMALL, **overrides)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if not r.get("final")]


class _RecordingF:
    """``torch.nn.functional`` as the loop sees it, recording each training loss
    (the calls that name no ``reduction``: the evaluation's ask for ``"sum"``)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(F, name)

    def cross_entropy(self, out: torch.Tensor, y: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        loss = F.cross_entropy(out, y, **kwargs)
        if "reduction" not in kwargs:
            self.calls.append({"out": out.detach().clone(), "y": y.clone(), "loss": loss.detach()})
        return loss


def smoothed_cross_entropy(out: torch.Tensor, y: torch.Tensor, eps: float) -> float:
    """Cross-entropy with label smoothing ``eps`` (target (1 - eps)·onehot + eps/K), in float64."""
    logp = torch.log_softmax(out.double(), dim=1)
    nll = -logp.gather(1, y[:, None]).squeeze(1)
    uniform = -logp.mean(dim=1)
    return float(((1 - eps) * nll + eps * uniform).mean())


def expected_lr(
    peak: float, step: int, total: int, warmup: int, schedule: str, floor: float
) -> float:
    """The recipe's learning rate at iteration ``step`` (from 0): a linear warm-up to the
    peak over ``warmup`` iterations ((t + 1)/W), then a cosine from the peak to ``floor``
    over the remaining iterations (or constant)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if schedule == "constant":
        return peak
    progress = (step - warmup) / (total - warmup)
    return floor + (peak - floor) * (1 + math.cos(math.pi * progress)) / 2


# ------------------------------------------------------------------ train/optim.py
def _one_step(config: TrainConfig, steps: int = 1) -> float:
    """Train one 2-D weight (starting at 1.0) with a constant gradient 1 for ``steps``
    steps of the optimizer ``build_optimizer`` makes; its final value."""
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = build_optimizer(config, model)
    for _ in range(steps):
        model.weight.grad = torch.ones_like(model.weight)
        opt.step()
    return float(model.weight.detach())


def test_sgd_takes_nesterov_momentum_from_the_config() -> None:
    """lp03. SGD with Nesterov momentum (μ = 0.9, lr 0.1, no decay), constant gradient 1:
    step 1 moves by lr·(g + μ·b1) = 0.19 (b1 = 1); plain momentum moves by 0.1."""
    nesterov = TrainConfig(nesterov=True, momentum=0.9, lr=0.1, weight_decay=0.0)
    assert _one_step(nesterov) == pytest.approx(1 - 0.1 * (1 + 0.9))
    plain = nesterov.replace(nesterov=False)
    assert _one_step(plain) == pytest.approx(1 - 0.1)


def test_adamw_decays_decoupled_and_takes_beta1_from_momentum() -> None:
    """lp04, lp05. AdamW (Loshchilov & Hutter): ``w ← w·(1 − lr·λ) − lr·m̂/(√v̂ + ε)``,
    ``m = β1·m + (1 − β1)·g`` with β1 = the config's momentum."""
    config = TrainConfig(optimizer="adamw", lr=0.1, momentum=0.5, weight_decay=0.5)
    # A zero gradient: only the decoupled decay moves the weight (Adam's L2 term
    # would be normalised into a step of about lr).
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = build_optimizer(config, model)
    model.weight.grad = torch.zeros_like(model.weight)
    opt.step()
    assert float(model.weight.detach()) == pytest.approx(1 - 0.1 * 0.5)
    # Two steps, gradients 1 then 0, no decay: by hand with β1 = 0.5, β2 = 0.999.
    config = config.replace(weight_decay=0.0)
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = build_optimizer(config, model)
    w, m, v, b1, b2, eps = 1.0, 0.0, 0.0, 0.5, 0.999, 1e-8
    for t, g in enumerate([1.0, 0.0], start=1):
        model.weight.grad = torch.full_like(model.weight, g)
        opt.step()
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        w -= 0.1 * (m / (1 - b1**t)) / (math.sqrt(v / (1 - b2**t)) + eps)
    assert float(model.weight.detach()) == pytest.approx(w, rel=1e-6)


def _lrs_and_losses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **overrides: Any
) -> tuple[list[float], _RecordingF, list[dict[str, Any]], TrainConfig]:
    """Train a small run; the learning rate of every optimizer step, the losses, the metrics."""
    config = small_config(**overrides)
    lrs: list[float] = []

    def before_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        lrs.append(opt.param_groups[0]["lr"])

    recorder = _RecordingF()
    monkeypatch.setattr(loop, "F", recorder)
    handle = register_optimizer_step_pre_hook(before_step)
    try:
        train(config, tmp_path / "run", progress=False)
    finally:
        handle.remove()
    return lrs, recorder, read_metrics(tmp_path / "run"), config


@pytest.mark.parametrize(
    "overrides",
    [
        {"warmup_epochs": 0.5, "min_lr": 0.01},
        {"warmup_epochs": 1.0, "lr_schedule": "constant"},
    ],
    ids=["warmup-cosine-to-min_lr", "warmup-constant"],
)
def test_every_step_runs_at_the_recipes_learning_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict[str, Any]
) -> None:
    """lp07, lp09, lp10, lp11, lp12, lp22, lp31. The learning rate of each optimizer
    step, per iteration: warm-up over ``warmup_epochs × steps per epoch`` iterations,
    then cosine to ``min_lr`` over the rest of the ``epochs × steps per epoch``
    iterations (or constant); each epoch's metrics row reports the rate the next
    step will use."""
    lrs, _, rows, config = _lrs_and_losses(tmp_path, monkeypatch, **overrides)
    total = config.epochs * STEPS_PER_EPOCH
    warmup = round(config.warmup_epochs * STEPS_PER_EPOCH)
    assert warmup in (4, 8)  # the warm-up is a whole number of iterations here

    def lr_at(t: int) -> float:
        return expected_lr(config.lr, t, total, warmup, config.lr_schedule, config.min_lr)

    assert lrs == pytest.approx([lr_at(t) for t in range(total)], rel=1e-9, abs=1e-12)
    for row in rows:
        assert row["lr"] == pytest.approx(lr_at(row["step"]), rel=1e-9, abs=1e-12)


# -------------------------------------------------------------- train/loop.py
def test_the_training_loss_is_the_recipes_and_the_epoch_means_are_per_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lp17, lp25. Each step's loss is the cross-entropy with the recipe's label
    smoothing (ImageNet: 0.1); an epoch's ``train_loss`` and ``train_acc`` are
    the means over its samples."""
    _, recorder, rows, _ = _lrs_and_losses(tmp_path, monkeypatch, label_smoothing=0.1)
    calls = recorder.calls
    assert len(calls) == 3 * STEPS_PER_EPOCH
    for call in calls:
        assert float(call["loss"]) == pytest.approx(
            smoothed_cross_entropy(call["out"], call["y"], 0.1), rel=1e-5
        )
    for row in rows:
        epoch = calls[(row["epoch"] - 1) * STEPS_PER_EPOCH : row["epoch"] * STEPS_PER_EPOCH]
        n = sum(c["y"].numel() for c in epoch)
        loss = sum(float(c["loss"]) * c["y"].numel() for c in epoch) / n
        acc = sum(int((c["out"].argmax(1) == c["y"]).sum()) for c in epoch) / n
        assert row["train_loss"] == pytest.approx(loss, rel=1e-6)
        assert row["train_acc"] == pytest.approx(acc, abs=1e-12)


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc(x))


def test_evaluate_means_over_samples_in_eval_mode_on_float32_logits() -> None:
    """lp13, lp14, lp15, lp16. ``evaluate``: the mean cross-entropy and the top-1
    accuracy over every sample (batches of unequal size), in eval mode (no
    dropout), the loss of mixed-precision logits computed in float32."""
    torch.manual_seed(0)
    model = _Tiny()
    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(n, 6, generator=g), torch.randint(0, 5, (n,), generator=g)) for n in (3, 9)
    ]

    def reference(cast: bool) -> tuple[float, float]:
        loss = correct = count = 0.0
        for x, y in batches:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=cast):
                out = model.fc(x)  # eval mode: dropout is the identity
            out = out.double()
            loss += float(F.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(1) == y).sum())
            count += y.numel()
        return loss / count, correct / count

    model.train()
    loss, acc = evaluate(model, batches)
    assert not model.training
    ref_loss, ref_acc = reference(cast=False)
    assert loss == pytest.approx(ref_loss, rel=1e-6) and acc == pytest.approx(ref_acc)
    loss, acc = evaluate(
        model, batches, autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    )
    ref_loss, ref_acc = reference(cast=True)
    assert loss == pytest.approx(ref_loss, rel=1e-5) and acc == pytest.approx(ref_acc)


def test_the_backbones_extra_loss_term_is_added_to_every_steps_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lp18. The loss each step backpropagates is the task loss plus
    ``pruner.regularizer()`` (ASL+'s sparsity loss), with weight 1: a marker
    term ``1·m`` gives ``m`` a gradient of 1 per step."""
    from feather_sparse.pruner import Pruner

    marker = torch.zeros((), requires_grad=True)
    real = Pruner.regularizer

    def regularizer(self: Pruner) -> torch.Tensor:
        return real(self) + marker

    monkeypatch.setattr(Pruner, "regularizer", regularizer)
    train(small_config(epochs=1), tmp_path / "run", progress=False)
    assert marker.grad is not None and float(marker.grad) == STEPS_PER_EPOCH


def _keep(store: dict[int, torch.Tensor], key: int) -> Any:
    """A gradient hook that keeps a copy of the gradient under ``key``."""

    def hook(grad: torch.Tensor) -> None:
        store[key] = grad.detach().clone()

    return hook


def test_gradients_are_clipped_by_their_global_norm_over_every_parameter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lp20, lp21. ``grad_clip = c``: every gradient the optimizer uses is the
    backward's gradient times ``min(1, c/‖g‖)``, ``‖g‖`` the norm over all the
    trained parameters together (weights, biases, norm parameters)."""
    raw: dict[int, torch.Tensor] = {}
    real_create = loop.create_model

    def create_model(*args: Any, **kwargs: Any) -> nn.Module:
        model = real_create(*args, **kwargs)
        for p in model.parameters():
            p.register_hook(_keep(raw, id(p)))
        return model

    checked: list[float] = []

    def before_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        params = [p for group in opt.param_groups for p in group["params"]]
        norm = math.sqrt(sum(float(raw[id(p)].double().pow(2).sum()) for p in params))
        scale = min(1.0, 0.05 / (norm + 1e-6))
        for p in params:
            assert p.grad is not None
            torch.testing.assert_close(p.grad, raw[id(p)] * scale, rtol=1e-5, atol=1e-9)
        checked.append(norm)

    monkeypatch.setattr(loop, "create_model", create_model)
    handle = register_optimizer_step_pre_hook(before_step)
    try:
        train(small_config(epochs=1, grad_clip=0.05), tmp_path / "run", progress=False)
    finally:
        handle.remove()
    assert len(checked) == STEPS_PER_EPOCH and min(checked) > 0.05  # every step was clipped


def test_the_thresholds_after_a_step_are_those_of_the_updated_weights(tmp_path: Path) -> None:
    """lp23. ``pruner.step()`` comes after ``optimizer.step()``: at the end of an
    epoch the thresholds are the ones recomputed from the current weights at the
    scheduled sparsity."""
    seen: list[int] = []

    def check(epoch: int, model: nn.Module, pruner: Any, metrics: dict[str, Any]) -> None:
        held = [t.clone() for t in pruner.thresholds()]
        pruner.update(pruner.scheduled_sparsity())
        for a, b in zip(held, pruner.thresholds()):
            assert torch.equal(a, b)
        seen.append(epoch)

    train(small_config(), tmp_path / "run", callbacks=[check], progress=False)
    assert seen == [1, 2, 3]


def test_the_report_describes_the_finalized_model_when_thresholds_update_rarely(
    tmp_path: Path,
) -> None:
    """lp28. With ``update_every = 7`` the last update (step 21 of 24) is 3 steps
    old at the end (at a constant learning rate: the weights still move); the
    report is of the thresholds finalize bakes: its sparsity is the finalized
    model's exact-zero fraction."""
    config = small_config(update_every=7, lr_schedule="constant")
    result = train(config, tmp_path / "run", progress=False)
    weights = [m.weight for m in result.model.modules() if isinstance(m, (nn.Conv1d, nn.Linear))]
    zeros = sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)
    assert result.report is not None
    assert result.report.sparsity == pytest.approx(zeros, abs=1e-9)


def test_a_full_disk_names_the_newest_checkpoint_also_after_a_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lp30, lp40. When a checkpoint cannot be written, the message names the epoch
    of the newest one on disk: the one this session wrote, or the one it resumed."""
    real_save = loop.save_checkpoint
    saves = {"left": 1}

    def save(state: dict[str, Any], path: Any, **kwargs: Any) -> None:
        if saves["left"] == 0:
            raise DiskFullError("no space left on device")
        saves["left"] -= 1
        real_save(state, path, **kwargs)

    monkeypatch.setattr(loop, "save_checkpoint", save)
    run = tmp_path / "run"
    with pytest.raises(DiskFullError, match=r"the previous checkpoint \(epoch 1\) is intact"):
        train(small_config(), run, progress=False)
    assert load_checkpoint(run)["epoch"] == 1
    saves["left"] = 0  # the resumed session cannot write its first checkpoint
    with pytest.raises(DiskFullError, match=r"the previous checkpoint \(epoch 1\) is intact"):
        train(small_config(), run, resume=True, progress=False)


# ----------------------------------------------------------- train/session.py
def test_the_config_seed_decides_the_initial_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lp32. Runs are seeded with their ``seed``: two seeds start from different
    weights, one seed from the same."""
    initial: list[dict[str, torch.Tensor]] = []
    real_create = loop.create_model

    def create_model(*args: Any, **kwargs: Any) -> nn.Module:
        model = real_create(*args, **kwargs)
        initial.append({k: v.clone() for k, v in model.state_dict().items()})
        return model

    monkeypatch.setattr(loop, "create_model", create_model)
    for i, seed in enumerate((3, 4, 3)):
        train(small_config(epochs=1, seed=seed), tmp_path / f"run{i}", stop_after_epoch=1)
    same = [all(torch.equal(a[k], b[k]) for k in a) for a, b in [initial[:2], initial[::2]]]
    assert same == [False, True]


def test_the_sparsity_schedule_spans_every_epochs_iterations(tmp_path: Path) -> None:
    """lp33. The Pruner's schedule runs over the whole training (``epochs × steps per
    epoch`` iterations): the paper's cubic ``s_t = S·(1 − (1 − t/t2)^3)`` from 0 to
    ``t2 = floor(0.5·T)`` (``ALGORITHMS.md``), here T = 24, t2 = 12, read at each
    epoch's end (t = 8, 16, 24)."""
    run = tmp_path / "run"
    train(small_config(), run, progress=False)
    total, t2, final = 3 * STEPS_PER_EPOCH, 12, 0.9
    for row in read_metrics(run):
        t = row["step"]
        expected = final * (1 - (1 - min(t, t2) / t2) ** 3)
        assert row["scheduled_sparsity"] == pytest.approx(expected, rel=1e-12)
    assert [r["step"] for r in read_metrics(run)] == [8, 16, total]


@pytest.mark.parametrize(
    ("name", "dtype"), [("bfloat16", torch.bfloat16), ("float16", torch.float16)]
)
def test_amp_dtype_is_the_configs(tmp_path: Path, name: str, dtype: torch.dtype) -> None:
    """lp35. ``amp_dtype`` picks the autocast dtype; loss scaling is only for
    float16 on CUDA (bfloat16 has float32's range)."""
    s = _setup(
        small_config(amp=True, amp_dtype=name),
        tmp_path,
        device=torch.device("cpu"),
        ctx=DistContext(),
        checkpoint=None,
        load_dataset=loop.load_dataset,
        create_model=loop.create_model,
    )
    assert s.amp_dtype == dtype and not s.scaler.is_enabled()


def test_a_resume_whose_epochs_have_another_number_of_steps_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lp38. The data behind a run changed under the same config (a data folder
    refilled: ``data_dir`` may change on a resume): the checkpoint's step count no
    longer matches epochs × steps per epoch, and the resume says so. (A pruned
    run's Pruner also refuses its other total of steps; a dense run has only this.)"""
    run = tmp_path / "run"
    train(small_config(dense=True), run, stop_after_epoch=1, progress=False)
    real_load = loop.load_dataset

    def fewer_samples(*args: Any, **kwargs: Any) -> Any:
        return real_load(*args, **{**kwargs, "train_size": 256})

    monkeypatch.setattr(loop, "load_dataset", fewer_samples)
    with pytest.raises(ValueError, match=r"step 8 after 1 epochs.*4 steps.*data set change"):
        train(small_config(dense=True), run, resume=True, progress=False)
    assert load_checkpoint(run)["epoch"] == 1


# -------------------------------------------------------- train/checkpoint.py
def test_a_resume_with_another_seed_is_refused(tmp_path: Path) -> None:
    """lp45. The seed decides the data order and every draw: a resume may not change it."""
    run = tmp_path / "run"
    train(small_config(), run, stop_after_epoch=1, progress=False)
    with pytest.raises(ValueError, match=r"seed=0 in the checkpoint but 7 now"):
        train(small_config(seed=7), run, resume=True, progress=False)
    assert load_checkpoint(run)["epoch"] == 1
