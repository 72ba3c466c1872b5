"""The Lightning callback on a tiny LightningModule on CPU.

One uninterrupted fit (gradient accumulation 2, a checkpoint after each epoch)
and one fit resumed from the first checkpoint are shared through a
module-scoped fixture.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

pl = pytest.importorskip(
    "lightning.pytorch",
    reason="lightning is not installed (pip install 'feather-sparse[lightning]')",
)

from _guards import guard  # noqa: E402
from _helpers import one_thread  # noqa: E402
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


def bare_trainer(callbacks: list[Any]) -> Any:
    return pl.Trainer(
        max_epochs=EPOCHS,
        accumulate_grad_batches=ACCUMULATION,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


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
