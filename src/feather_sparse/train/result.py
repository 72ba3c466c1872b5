"""What a call of :func:`~feather_sparse.train.train` hands back: a result, or where it stopped."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from feather_sparse.pruner import PrunerReport
from feather_sparse.recipes import TrainConfig


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` hands back.

    Attributes:
        run_dir: the run folder.
        config: the config the run used.
        model: the trained model; after a completed run the weights hold
            ``P_T(w)`` (exact zeros) and no parametrization is attached.
        completed: False when stopped early (``stop_after_epoch``); the run
            can be resumed then, and nothing was finalized or exported.
        epochs: epochs completed.
        steps: optimizer steps completed.
        test_accuracy: top-1 accuracy of the final (finalized) model, or of the
            last epoch when not completed.
        test_loss: its mean cross-entropy.
        sparsity: fraction of zeros among the prunable weights (0 when dense).
        target_sparsity: the requested sparsity (0 when dense).
        report: the Pruner's per-layer report before finalizing (None when dense).
        table: the per-layer table printed at the end (Markdown).
        model_path: the saved model (``model.fsp`` or ``model.pt``), if any.
        wall_time: seconds spent in this call.
        history: the per-epoch metrics of this and earlier sessions.
    """

    run_dir: Path
    config: TrainConfig
    model: nn.Module
    completed: bool
    epochs: int
    steps: int
    test_accuracy: float
    test_loss: float
    sparsity: float
    target_sparsity: float
    report: PrunerReport | None
    table: str
    model_path: Path | None
    wall_time: float
    history: list[dict[str, Any]] = field(default_factory=list)


def resume_command(run_dir: str | Path, world_size: int = 1) -> str:
    """The command that continues the run in ``run_dir`` with ``world_size`` processes.

    A run trained by several processes resumes only with as many (the global
    batch depends on it), so it is continued under ``torchrun`` again.
    """
    if world_size > 1:
        return f"torchrun --nproc_per_node={world_size} -m feather_sparse train --resume {run_dir}"
    return f"feather-sparse train --resume {run_dir}"


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during training: where the run stopped, and the command that continues it.

    A ``KeyboardInterrupt``, so code that catches that still does; the CLI
    prints the message and exits with 130.

    Attributes:
        run_dir: the run folder.
        epoch: epochs completed when interrupted.
        step: optimizer steps completed.
        saved_epoch: the epoch the newest checkpoint holds (None: none saved).
        world_size: the number of processes that trained it (the command says so).
    """

    def __init__(
        self,
        run_dir: Path,
        epoch: int,
        step: int,
        epochs: int,
        saved_epoch: int | None,
        world_size: int = 1,
    ) -> None:
        self.run_dir, self.epoch, self.step, self.saved_epoch = run_dir, epoch, step, saved_epoch
        self.world_size = world_size
        where = (
            f"while finishing, after epoch {epoch}/{epochs}"
            if epoch >= epochs
            else f"in epoch {epoch + 1}/{epochs} at step {step}"
        )
        if saved_epoch is None:
            then = "no epoch was finished, nothing was saved; start the run again"
        else:
            then = (
                f"the last checkpoint holds epoch {saved_epoch}; continue with: "
                f"{resume_command(run_dir, world_size)}"
            )
        super().__init__(f"interrupted {where}; {then}")
