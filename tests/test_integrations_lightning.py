"""The Lightning callback on a tiny LightningModule on CPU.

One uninterrupted fit (gradient accumulation 2, a checkpoint after each epoch)
and one fit resumed from the first checkpoint are shared through a
module-scoped fixture; so are the same pairs under manual optimization (two
optimizers stepping in every batch, and manual gradient accumulation).
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import feather_sparse as fs

pl = pytest.importorskip(
    "lightning.pytorch",
    reason="lightning is not installed (pip install 'feather-sparse[lightning]')",
)

from _guards import guard  # noqa: E402
from _helpers import one_thread, quiet_trainer  # noqa: E402
from feather_sparse.integrations.lightning import FeatherCallback  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
    pytest.mark.filterwarnings("ignore:The dirpath has changed"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
]

SPARSITY = 0.75
SAMPLES, BATCH, ACCUMULATION, EPOCHS = 64, 8, 2, 2
# 64 samples / batch 8 = 8 batches = 4 optimizer steps per epoch.
STEPS_PER_EPOCH = SAMPLES // BATCH // ACCUMULATION
OPTIMIZER_STEPS = STEPS_PER_EPOCH * EPOCHS


class TinyNet(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)
        self.optimizer_steps = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        self.optimizer_steps += 1
        super().optimizer_step(*args, **kwargs)


def loader() -> torch.utils.data.DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 16, generator=g)
    y = torch.randint(0, 3, (SAMPLES,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)


@dataclass
class Fit:
    module: TinyNet
    callback: FeatherCallback
    trainer: Any
    root: Path


def fit(root: Path, ckpt_path: str | None = None) -> Fit:
    torch.manual_seed(0)
    module = TinyNet()
    callback = FeatherCallback(SPARSITY, exclude=["head"])
    checkpoints = pl.callbacks.ModelCheckpoint(
        dirpath=root / "ckpt", save_top_k=-1, every_n_epochs=1
    )
    trainer = pl.Trainer(
        max_epochs=EPOCHS,
        accumulate_grad_batches=ACCUMULATION,
        accelerator="cpu",
        devices=1,
        logger=pl.loggers.CSVLogger(root),
        callbacks=[callback, checkpoints],
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, loader(), ckpt_path=ckpt_path)
    return Fit(module, callback, trainer, root)


@dataclass
class Runs:
    full: Fit
    resumed: Fit
    checkpoint: Path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    with one_thread():
        full = fit(tmp_path_factory.mktemp("full"))
        checkpoint = full.root / "ckpt" / f"epoch=0-step={STEPS_PER_EPOCH}.ckpt"
        resumed = fit(tmp_path_factory.mktemp("resumed"), ckpt_path=str(checkpoint))
    return Runs(full, resumed, checkpoint)


def test_pruner_steps_once_per_optimizer_step(runs: Runs) -> None:
    run = runs.full
    assert run.callback.pruner is not None
    assert run.module.optimizer_steps == OPTIMIZER_STEPS == run.trainer.global_step
    assert run.callback.pruner.current_step == OPTIMIZER_STEPS
    assert run.callback.pruner.total_steps == OPTIMIZER_STEPS


def test_final_module_is_plain_and_exactly_at_target(runs: Runs) -> None:
    module = runs.full.module
    layers = [module.body[0], module.body[2]]
    assert not any(hasattr(m, "parametrizations") for m in layers)
    n = sum(m.weight.numel() for m in layers)
    zeros = sum(int((m.weight == 0).sum()) for m in layers)
    assert zeros == round(SPARSITY * n)
    assert runs.full.callback.final_sparsity == pytest.approx(zeros / n)
    assert int((module.head.weight == 0).sum()) == 0  # excluded: dense


def test_sparsity_and_threshold_reach_the_logger(runs: Runs) -> None:
    run = runs.full
    assert run.callback.pruner is not None
    (path,) = run.root.glob("lightning_logs/*/metrics.csv")
    rows = [r for r in csv.DictReader(path.open()) if r.get("feather/sparsity")]
    assert len(rows) == OPTIMIZER_STEPS
    for k, row in enumerate(rows, start=1):  # logged after the k-th optimizer step
        scheduled = run.callback.pruner.scheduled_sparsity(k)
        assert float(row["feather/scheduled_sparsity"]) == pytest.approx(scheduled)
        assert abs(float(row["feather/sparsity"]) - scheduled) < 1e-2
        assert float(row["feather/threshold"]) > 0


def test_checkpoint_holds_pruner_state_and_loads_into_the_plain_module(runs: Runs) -> None:
    checkpoint = torch.load(runs.checkpoint, map_location="cpu", weights_only=False)
    state = checkpoint["callbacks"]["FeatherCallback"]
    assert state["step"] == STEPS_PER_EPOCH
    assert not any("parametrizations" in k for k in checkpoint["state_dict"])
    TinyNet().load_state_dict(checkpoint["state_dict"], strict=True)


def test_resume_restores_the_pruner_and_continues_identically(runs: Runs) -> None:
    full, resumed = runs.full, runs.resumed
    assert resumed.callback.pruner is not None
    assert resumed.module.optimizer_steps == OPTIMIZER_STEPS - STEPS_PER_EPOCH
    assert resumed.callback.pruner.current_step == OPTIMIZER_STEPS
    expected = full.module.state_dict()
    for key, value in resumed.module.state_dict().items():
        torch.testing.assert_close(value, expected[key], rtol=1e-6, atol=1e-7, msg=key)


def test_resume_with_other_settings_is_refused(runs: Runs, tmp_path: Path) -> None:
    module = TinyNet()
    callback = FeatherCallback(0.5, exclude=["head"])  # saved with 0.75
    trainer = pl.Trainer(
        max_epochs=EPOCHS,
        accumulate_grad_batches=ACCUMULATION,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        callbacks=[callback],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with pytest.raises(ValueError, match="sparsity"):
        trainer.fit(module, loader(), ckpt_path=str(runs.checkpoint))
    assert callback.pruner is None  # the failed attach left the module as it was
    assert not any(hasattr(m, "parametrizations") for m in module.modules())


def test_bad_arguments_are_refused_early() -> None:
    with pytest.raises(ValueError, match="unknown argument 'backbon'"):
        FeatherCallback(0.5, backbone="global", backbon="global")
    with pytest.raises(ValueError, match="total_steps"):
        FeatherCallback(0.5, total_steps=0)


@guard(
    "Lightning: a bad Pruner setting (`theta=7`, `p=0.5`) or `log_layers='yes'`",
    "`ValueError` when the callback is made, with the Pruner's own message",
)
def test_bad_values_are_refused_when_the_callback_is_made() -> None:
    with pytest.raises(ValueError, match=r"theta must be in \[0, 1\]"):
        FeatherCallback(0.5, theta=7)
    with pytest.raises(ValueError, match="p must be >= 1"):
        FeatherCallback(0.5, p=0.5)
    with pytest.raises(ValueError, match="log_layers must be True or False"):
        FeatherCallback(0.5, log_layers="yes")  # type: ignore[arg-type]


@guard(
    "Lightning: `FeatherCallback(sparsity=0.9, backbone='asl+')` (trainable backbone parameters)",
    "`ValueError` when the callback is made, not when training starts",
)
def test_a_trainable_backbone_is_refused_when_the_callback_is_made() -> None:
    with pytest.raises(
        ValueError, match=r"backbone 'asl\+' has trainable parameters.*FeatherCallback"
    ):
        FeatherCallback(0.9, backbone="asl+")


def test_the_pruner_reports_the_finalized_module_after_training(runs: Runs) -> None:
    run = runs.full
    assert run.callback.pruner is not None
    report = run.callback.pruner.report()  # the docs promise callback.pruner for its report
    layers = {"body.0": run.module.body[0], "body.2": run.module.body[2]}
    assert [row.name for row in report.layers] == list(layers)
    for row in report.layers:
        weight = layers[row.name].weight
        assert row.sparsity == int((weight == 0).sum()) / weight.numel()
        assert row.threshold > 0
    assert report.sparsity == run.callback.pruner.sparsity_achieved()
    assert report.sparsity == run.callback.final_sparsity
    with pytest.raises(RuntimeError, match=r"step\(\) is refused: this Pruner was finalized"):
        run.callback.pruner.step()


def bare_trainer(callbacks: list[Any], accumulate: int = ACCUMULATION) -> Any:
    """A Trainer without logger or checkpoints; ``accumulate=1`` for manual optimization,
    which refuses ``accumulate_grad_batches``."""
    return quiet_trainer(callbacks, max_epochs=EPOCHS, accumulate_grad_batches=accumulate)


def test_resuming_from_the_last_checkpoint_hands_back_the_finished_model(runs: Runs) -> None:
    """Lightning trains nothing then (and skips on_train_start/end): the callback still
    applies the checkpoint's Pruner state and finalizes."""
    last = runs.full.root / "ckpt" / f"epoch={EPOCHS - 1}-step={OPTIMIZER_STEPS}.ckpt"
    module, callback = TinyNet(), FeatherCallback(SPARSITY, exclude=["head"])
    bare_trainer([callback]).fit(module, loader(), ckpt_path=str(last))
    assert callback.pruner is not None and callback.pruner.current_step == OPTIMIZER_STEPS
    layers = [module.body[0], module.body[2]]
    assert not any(hasattr(m, "parametrizations") for m in layers)
    for mine, theirs in zip(layers, [runs.full.module.body[0], runs.full.module.body[2]]):
        assert torch.equal(mine.weight, theirs.weight)


@guard(
    "Lightning: resuming from a checkpoint saved without the Feather callback",
    "`ValueError`: the Pruner's step and the Trainer's differ; the module left plain",
)
def test_resuming_from_a_checkpoint_without_pruner_state_is_refused(
    runs: Runs, tmp_path: Path
) -> None:
    checkpoint = torch.load(runs.checkpoint, map_location="cpu", weights_only=False)
    del checkpoint["callbacks"]["FeatherCallback"]
    plain = tmp_path / "plain.ckpt"
    torch.save(checkpoint, plain)
    module, callback = TinyNet(), FeatherCallback(SPARSITY, exclude=["head"])
    with pytest.raises(ValueError, match=r"Pruner is at step 0 but the Trainer at \d+"):
        bare_trainer([callback]).fit(module, loader(), ckpt_path=str(plain))
    assert not any(hasattr(m, "parametrizations") for m in module.modules())


def test_validating_a_checkpoint_does_not_leak_its_state_into_a_later_fit(runs: Runs) -> None:
    module, callback = TinyNet(), FeatherCallback(SPARSITY, exclude=["head"])
    trainer = bare_trainer([callback])
    module.validation_step = module.training_step  # type: ignore[method-assign]
    trainer.validate(module, loader(), ckpt_path=str(runs.checkpoint), verbose=False)
    trainer.fit(module, loader())
    assert callback.pruner is not None
    assert callback.pruner.current_step == trainer.global_step == OPTIMIZER_STEPS


# --------------------------------------------------------------- manual optimization
# The schedule reaches the target at the last step only, so a Pruner that steps
# fewer times than its total_steps ends short of it (and finalize would jump).
RAMP = fs.CubicSchedule(start=0.0, end=1.0)
BATCHES = SAMPLES // BATCH  # 8 training batches per epoch
MANUAL_LOG_EVERY = 4


class ManualNet(pl.LightningModule):
    """``self.automatic_optimization = False`` in two shapes.

    ``"gan"``: a generator and a discriminator, each with its own optimizer,
    both stepping in every batch (``trainer.global_step`` moves by 2 a batch).
    ``"accumulate"``: one optimizer stepping every ``ACCUMULATION`` batches.
    ``"skip"``: one optimizer stepping in every batch but one of the second epoch
    (a module skipping ``optimizer.step()`` on a bad loss).
    ``"late-accumulate"``: one optimizer stepping in every batch of the first epoch,
    then every ``ACCUMULATION`` batches.
    """

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.mode = mode
        self.gen = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
        self.disc = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
        self.optimizer_steps = 0
        self.feather_logs: list[int] = []  # trainer.global_step at each Feather log_dict

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        loss = nn.functional.cross_entropy(self.disc(self.gen(x)), y)
        optimizers = self.optimizers()
        if self.mode == "gan":
            assert isinstance(optimizers, list)
            for optimizer in optimizers:
                optimizer.zero_grad()
            self.manual_backward(loss)
            for optimizer in optimizers:
                optimizer.step()
                self.optimizer_steps += 1
        elif self.mode == "skip":  # one optimizer, one batch of the second epoch skipped
            assert not isinstance(optimizers, list)
            optimizers.zero_grad()
            self.manual_backward(loss)
            if (self.current_epoch, batch_idx) != (1, 3):
                optimizers.step()
                self.optimizer_steps += 1
        else:
            assert not isinstance(optimizers, list)
            every = (
                1 if self.mode == "late-accumulate" and self.current_epoch == 0 else ACCUMULATION
            )
            self.manual_backward(loss / every)
            if (batch_idx + 1) % every == 0:
                optimizers.step()
                optimizers.zero_grad()
                self.optimizer_steps += 1

    def configure_optimizers(self) -> Any:
        if self.mode == "gan":
            return [
                torch.optim.SGD(self.gen.parameters(), lr=0.1, momentum=0.9),
                torch.optim.SGD(self.disc.parameters(), lr=0.1, momentum=0.9),
            ]
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def log_dict(self, dictionary: Any, *args: Any, **kwargs: Any) -> None:
        if any(str(k).startswith("feather/") for k in dictionary):
            self.feather_logs.append(self.trainer.global_step)
        super().log_dict(dictionary, *args, **kwargs)


@dataclass
class ManualFit:
    module: ManualNet
    callback: FeatherCallback
    trainer: Any
    root: Path


def manual_fit(
    root: Path,
    mode: str,
    ckpt_path: str | None = None,
    total_steps: int | None = None,
    **trainer_kwargs: Any,
) -> ManualFit:
    torch.manual_seed(0)
    module = ManualNet(mode)
    callback = FeatherCallback(SPARSITY, total_steps=total_steps, exclude=["disc.2"], schedule=RAMP)
    checkpoints = pl.callbacks.ModelCheckpoint(
        dirpath=root / "ckpt", save_top_k=-1, every_n_epochs=1
    )
    trainer = pl.Trainer(
        **{"max_epochs": EPOCHS, "log_every_n_steps": MANUAL_LOG_EVERY, **trainer_kwargs},
        accelerator="cpu",
        devices=1,
        logger=pl.loggers.CSVLogger(root),
        callbacks=[callback, checkpoints],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with one_thread():
        trainer.fit(module, loader(), ckpt_path=ckpt_path)
    return ManualFit(module, callback, trainer, root)


def pruned_layers(module: ManualNet) -> list[nn.Linear]:
    return [module.gen[0], module.gen[2], module.disc[0]]


def assert_reached_the_target_on_the_last_step(run: ManualFit, steps: int) -> None:
    pruner = run.callback.pruner
    assert pruner is not None
    assert pruner.current_step == pruner.total_steps == steps
    assert pruner.scheduled_sparsity() == SPARSITY  # finalize did not jump
    layers = pruned_layers(run.module)
    assert not any(hasattr(m, "parametrizations") for m in layers)
    n = sum(m.weight.numel() for m in layers)
    assert sum(int((m.weight == 0).sum()) for m in layers) == round(SPARSITY * n)


@pytest.fixture(scope="module")
def gan_full(tmp_path_factory: pytest.TempPathFactory) -> ManualFit:
    return manual_fit(tmp_path_factory.mktemp("gan"), "gan")


def gan_checkpoint(full: ManualFit) -> Path:
    """The end of the first epoch: both optimizers step in every batch, 2 steps a batch."""
    return full.root / "ckpt" / f"epoch=0-step={2 * BATCHES}.ckpt"


@pytest.fixture(scope="module")
def gan_resumed(gan_full: ManualFit, tmp_path_factory: pytest.TempPathFactory) -> ManualFit:
    return manual_fit(tmp_path_factory.mktemp("gan-resumed"), "gan", str(gan_checkpoint(gan_full)))


def test_manual_two_optimizers_step_the_pruner_once_per_batch(gan_full: ManualFit) -> None:
    run = gan_full
    assert run.trainer.global_step == run.module.optimizer_steps == 2 * BATCHES * EPOCHS
    assert run.trainer.estimated_stepping_batches == BATCHES * EPOCHS  # batches, not steps
    assert_reached_the_target_on_the_last_step(run, BATCHES * EPOCHS)


def test_manual_two_optimizers_log_every_n_pruner_steps(gan_full: ManualFit) -> None:
    """Lightning logs every ``log_every_n_steps`` batches under manual optimization;
    the callback computes its metrics at that cadence, not at every batch whose
    global_step (2 per batch) happens to divide."""
    run = gan_full
    assert run.callback.pruner is not None
    steps = range(MANUAL_LOG_EVERY, BATCHES * EPOCHS + 1, MANUAL_LOG_EVERY)
    assert run.module.feather_logs == [2 * k for k in steps]
    (path,) = run.root.glob("lightning_logs/*/metrics.csv")
    rows = [r for r in csv.DictReader(path.open()) if r.get("feather/sparsity")]
    assert [int(r["step"]) for r in rows] == [k - 1 for k in steps]  # Lightning's batch index
    for k, row in zip(steps, rows):
        scheduled = run.callback.pruner.scheduled_sparsity(k)
        assert float(row["feather/scheduled_sparsity"]) == pytest.approx(scheduled)


def test_manual_checkpoint_records_the_pruner_and_trainer_steps(gan_full: ManualFit) -> None:
    checkpoint = torch.load(gan_checkpoint(gan_full), map_location="cpu", weights_only=False)
    state = checkpoint["callbacks"]["FeatherCallback"]
    assert (state["step"], state["lightning_global_step"]) == (BATCHES, 2 * BATCHES)
    ManualNet("gan").load_state_dict(checkpoint["state_dict"], strict=True)


def test_manual_two_optimizers_resume_bit_exactly(
    gan_full: ManualFit, gan_resumed: ManualFit
) -> None:
    full, resumed = gan_full, gan_resumed
    assert resumed.module.optimizer_steps == 2 * BATCHES * (EPOCHS - 1)
    assert_reached_the_target_on_the_last_step(resumed, BATCHES * EPOCHS)
    expected = full.module.state_dict()
    for key, value in resumed.module.state_dict().items():
        assert torch.equal(value, expected[key]), key


@guard(
    "Lightning, manual optimization: resuming with a Pruner state saved at another trainer step",
    "`ValueError` naming both steps; the module left plain",
)
def test_manual_resume_from_another_step_is_refused(gan_full: ManualFit, tmp_path: Path) -> None:
    checkpoint = torch.load(gan_checkpoint(gan_full), map_location="cpu", weights_only=False)
    checkpoint["callbacks"]["FeatherCallback"]["lightning_global_step"] = 2 * BATCHES - 2
    other = tmp_path / "other.ckpt"
    torch.save(checkpoint, other)
    module = ManualNet("gan")
    callback = FeatherCallback(SPARSITY, exclude=["disc.2"], schedule=RAMP)
    trainer = bare_trainer([callback], accumulate=1)
    with pytest.raises(ValueError, match=r"saved at trainer step 14 but the Trainer resumes at 16"):
        trainer.fit(module, loader(), ckpt_path=str(other))
    assert callback.pruner is None
    assert not any(hasattr(m, "parametrizations") for m in module.modules())


@dataclass
class ManualRuns:
    full: ManualFit
    resumed: ManualFit


@pytest.fixture(scope="module")
def accumulate_runs(tmp_path_factory: pytest.TempPathFactory) -> ManualRuns:
    steps = EPOCHS * (BATCHES // ACCUMULATION)
    full = manual_fit(tmp_path_factory.mktemp("acc"), "accumulate", total_steps=steps)
    checkpoint = full.root / "ckpt" / f"epoch=0-step={BATCHES // ACCUMULATION}.ckpt"
    resumed = manual_fit(
        tmp_path_factory.mktemp("acc-resumed"), "accumulate", str(checkpoint), total_steps=steps
    )
    return ManualRuns(full, resumed)


def test_manual_accumulation_with_total_steps_reaches_the_target(
    accumulate_runs: ManualRuns,
) -> None:
    run = accumulate_runs.full
    steps = EPOCHS * (BATCHES // ACCUMULATION)
    assert run.trainer.global_step == run.module.optimizer_steps == steps
    assert_reached_the_target_on_the_last_step(run, steps)
    assert run.module.feather_logs == [MANUAL_LOG_EVERY, 2 * MANUAL_LOG_EVERY]


def test_manual_accumulation_resumes_bit_exactly(accumulate_runs: ManualRuns) -> None:
    full, resumed = accumulate_runs.full, accumulate_runs.resumed
    steps = EPOCHS * (BATCHES // ACCUMULATION)
    assert resumed.module.optimizer_steps == steps // EPOCHS
    assert_reached_the_target_on_the_last_step(resumed, steps)
    expected = full.module.state_dict()
    for key, value in resumed.module.state_dict().items():
        assert torch.equal(value, expected[key]), key


@guard(
    "Lightning, manual optimization: gradient accumulation (a batch without `optimizer.step()`)"
    " and no `total_steps`",
    "`ValueError` at that batch saying to pass `total_steps=N`; the module left dense",
)
def test_manual_accumulation_without_total_steps_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = ManualNet("accumulate")
    before = {k: v.clone() for k, v in module.state_dict().items()}
    callback = FeatherCallback(SPARSITY, exclude=["disc.2"], schedule=RAMP)
    trainer = bare_trainer([callback], accumulate=1)
    with pytest.raises(ValueError, match=r"batch 0 .* without an optimizer step.*total_steps=N"):
        trainer.fit(module, loader())
    assert callback.pruner is None
    assert not any(hasattr(m, "parametrizations") for m in module.modules())
    for key, value in module.state_dict().items():
        assert torch.equal(value, before[key]), key


@guard(
    "Lightning, manual optimization without `total_steps`: gradient accumulation that starts "
    "after the first epoch",
    "`ValueError` at the first batch without `optimizer.step()`, in any epoch, saying to pass "
    "`total_steps=N`; the module left dense",
)
def test_manual_accumulation_starting_in_a_later_epoch_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = ManualNet("late-accumulate")
    callback = FeatherCallback(SPARSITY, exclude=["disc.2"], schedule=RAMP)
    trainer = bare_trainer([callback], accumulate=1)
    with (
        one_thread(),
        pytest.raises(
            ValueError, match=r"batch 0 of epoch 1 ended without an optimizer step.*total_steps=N"
        ),
    ):
        trainer.fit(module, loader())
    assert module.optimizer_steps == BATCHES  # the first epoch stepped in every batch
    assert callback.pruner is None
    assert not any(hasattr(m, "parametrizations") for m in module.modules())


@guard(
    "Lightning, manual optimization without `total_steps`: a batch after the first epoch "
    "without `optimizer.step()` (skipped on a bad loss)",
    "`ValueError` naming the batch and the `total_steps=` that accepts such batches; the fit "
    "resumes from its last checkpoint with it and is finalized at the target",
)
def test_manual_batch_skipped_after_the_first_epoch_is_refused_then_resumes(
    tmp_path: Path,
) -> None:
    batches = BATCHES * EPOCHS
    with pytest.raises(
        ValueError,
        match=rf"batch 3 of epoch 1 ended without an optimizer step.*total_steps={batches}",
    ):
        manual_fit(tmp_path / "refused", "skip")
    checkpoint = tmp_path / "refused" / "ckpt" / f"epoch=0-step={BATCHES}.ckpt"
    run = manual_fit(tmp_path / "resumed", "skip", str(checkpoint), total_steps=batches)
    assert run.module.optimizer_steps == BATCHES - 1  # the second epoch, one batch skipped
    assert run.callback.pruner is not None and run.callback.pruner.current_step == batches - 1
    assert not any(hasattr(m, "parametrizations") for m in run.module.modules())  # finalized
    assert run.callback.final_sparsity == pytest.approx(SPARSITY, abs=1e-3)


@guard(
    "Lightning, manual optimization: `max_steps` with several `optimizer.step()` calls per batch"
    " and no `total_steps`",
    "`ValueError` at the first batch saying to pass `total_steps=N`; the module left dense",
)
def test_manual_max_steps_with_two_optimizers_needs_total_steps(tmp_path: Path) -> None:
    # max_steps counts both optimizers' steps: the fit ends after 5 of the 16 batches
    # estimated_stepping_batches promises (min(16, 10) = 10).
    with pytest.raises(ValueError, match=r"max_steps=10\).* made 2.*total_steps=N.*e\.g\. 5 "):
        manual_fit(tmp_path / "refused", "gan", max_steps=10)
    run = manual_fit(tmp_path / "given", "gan", max_steps=10, total_steps=5)
    assert run.trainer.global_step == 10
    assert_reached_the_target_on_the_last_step(run, 5)


def test_manual_max_steps_that_cannot_end_the_fit_early_is_accepted(tmp_path: Path) -> None:
    run = manual_fit(tmp_path, "gan", max_steps=2 * BATCHES * EPOCHS)
    assert run.trainer.global_step == 2 * BATCHES * EPOCHS
    assert_reached_the_target_on_the_last_step(run, BATCHES * EPOCHS)


def test_a_fit_ending_before_the_schedule_does_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    module = TinyNet()
    callback = FeatherCallback(
        SPARSITY, total_steps=2 * OPTIMIZER_STEPS, exclude=["head"], schedule=RAMP
    )
    with caplog.at_level("WARNING", logger="feather_sparse.integrations.lightning"):
        bare_trainer([callback]).fit(module, loader())
    assert "finalize prunes to the target 0.7500 in one jump" in caplog.text
    assert f"after {OPTIMIZER_STEPS} of the schedule's {2 * OPTIMIZER_STEPS} steps" in caplog.text


# ------------------------------------------------------- checkpoints outside the fit
class ValidatedNet(TinyNet):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))


@guard(
    "Lightning: `trainer.validate/test/predict(ckpt_path=...)` of a checkpoint written during "
    "the fit (its weights are the dense ones training continues from)",
    "the module gets the checkpoint's pruned weights (its saved thresholds baked in): the "
    "model the fit validated, with exact zeros",
)
def test_validating_the_best_checkpoint_evaluates_its_pruned_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = ValidatedNet()
    callback = FeatherCallback(SPARSITY, exclude=["head"])
    best = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=1)
    trainer = pl.Trainer(
        max_epochs=EPOCHS,
        accumulate_grad_batches=ACCUMULATION,
        accelerator="cpu",
        logger=False,
        callbacks=[callback, best],
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with one_thread():
        trainer.fit(module, loader(), loader())
        (result,) = trainer.validate(module, loader(), ckpt_path="best", verbose=False)
    # The fit validated the pruned forward; the best checkpoint evaluates to the same loss.
    assert result["val_loss"] == pytest.approx(float(best.best_model_score), rel=1e-6)
    saved = torch.load(best.best_model_path, map_location="cpu", weights_only=False)
    zeros_then = saved["callbacks"]["FeatherCallback"]["current_sparsity"]
    layers = [module.body[0], module.body[2]]
    assert not any(hasattr(m, "parametrizations") for m in module.modules())
    n = sum(m.weight.numel() for m in layers)
    zeros = sum(int((m.weight == 0).sum()) for m in layers)
    assert zeros > 0 and abs(zeros / n - float(zeros_then)) <= 1 / n


@guard(
    "Lightning: `ModelCheckpoint(save_weights_only=True)` beside the callback (its checkpoints "
    "hold the dense weights and no Pruner state)",
    "a warning when training starts, naming what to save instead; the fit runs",
)
def test_weights_only_checkpoints_are_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    module = TinyNet()
    callback = FeatherCallback(SPARSITY, exclude=["head"])
    weights = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_weights_only=True)
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        callbacks=[callback, weights],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with one_thread(), caplog.at_level(logging.WARNING, logger=FeatherCallback.__module__):
        trainer.fit(module, loader())
    assert "ModelCheckpoint(save_weights_only=True)" in caplog.text
    assert "neither resume the pruning nor hold the pruned model" in caplog.text
    assert callback.final_sparsity == pytest.approx(SPARSITY, abs=1e-3)
