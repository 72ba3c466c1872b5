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


#: The torchrun flags that bring the nodes of a multi-node run together, for the hint.
RENDEZVOUS_FLAGS = (
    "--rdzv-backend, --rdzv-endpoint and --rdzv-id, or --node-rank, --master-addr and --master-port"
)


def resume_command(
    run_dir: str | Path, world_size: int = 1, local_world_size: int | None = None
) -> str:
    """The command that continues the run in ``run_dir`` with ``world_size`` processes.

    A run trained by several processes resumes only with as many (the global
    batch depends on it), so it is continued under ``torchrun`` again: on one
    node ``torchrun --nproc_per_node=N``; on several nodes ``torchrun
    --nnodes=K --nproc_per_node=P`` (``K × P = world_size``), run on every
    node with the rendezvous flags the run was launched with, which the hint
    names but cannot know.

    Args:
        run_dir: the run folder.
        world_size: the processes that trained it, on all nodes together.
        local_world_size: the processes on each node (torchrun's
            ``LOCAL_WORLD_SIZE``); ``None`` when not known (runs recorded
            before it was): the one-node form.
    """
    if world_size <= 1:
        return f"feather-sparse train --resume {run_dir}"
    module = f"-m feather_sparse train --resume {run_dir}"
    local = local_world_size
    if local is None or not 0 < local < world_size or world_size % local:  # one node, or not known
        return f"torchrun --nproc_per_node={world_size} {module}"
    nodes = world_size // local
    return (
        f"torchrun --nnodes={nodes} --nproc_per_node={local} {module}, on each "
        f"of the {nodes} nodes, with the rendezvous flags the run was launched with "
        f"({RENDEZVOUS_FLAGS})"
    )


def _where_and_then(
    run_dir: Path,
    epoch: int,
    step: int,
    epochs: int,
    saved_epoch: int | None,
    world_size: int,
    local_world_size: int | None,
) -> tuple[str, str]:
    """Where training stopped, and what to do: continue from the checkpoint, or start again."""
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
            f"{resume_command(run_dir, world_size, local_world_size)}"
        )
    return where, then


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
        local_world_size: how many of them ran on each node (None: not known).
    """

    def __init__(
        self,
        run_dir: Path,
        epoch: int,
        step: int,
        epochs: int,
        saved_epoch: int | None,
        world_size: int = 1,
        local_world_size: int | None = None,
    ) -> None:
        self.run_dir, self.epoch, self.step, self.saved_epoch = run_dir, epoch, step, saved_epoch
        self.world_size, self.local_world_size = world_size, local_world_size
        where, then = _where_and_then(
            run_dir, epoch, step, epochs, saved_epoch, world_size, local_world_size
        )
        super().__init__(f"interrupted {where}; {then}")


class ProcessLost(RuntimeError):
    """Another process of a multi-process run stopped: where this one was, and what next.

    The other process was killed (out of memory, say) or its node was lost;
    the message ends with the command that continues the run from its last
    checkpoint.

    Attributes:
        run_dir: the run folder.
        saved_epoch: the epoch the newest checkpoint holds (None: none saved).
    """

    def __init__(
        self,
        reason: str,
        run_dir: Path,
        epoch: int,
        step: int,
        epochs: int,
        saved_epoch: int | None,
        world_size: int,
        local_world_size: int | None = None,
    ) -> None:
        self.run_dir, self.saved_epoch = run_dir, saved_epoch
        where, then = _where_and_then(
            run_dir, epoch, step, epochs, saved_epoch, world_size, local_world_size
        )
        super().__init__(
            f"lost contact with another process of the run {where} ({reason}): it stopped, "
            f"was killed (out of memory?) or its node was lost; {then}"
        )
