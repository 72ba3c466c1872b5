"""Where this training process runs: its device and its place among data-parallel processes.

Under ``torchrun --nproc_per_node=N -m feather_sparse train ...`` the CLI joins
the process group from the environment (:func:`init_distributed`: ``nccl`` on
CUDA, one GPU per process by ``LOCAL_RANK``; ``gloo`` on CPU). The rank and
world size come from :func:`distributed_context` (one place) and are handed to
the data loaders, which give each rank its own shard of every epoch; the
Pruner is attached to the bare model, which is then wrapped in
``DistributedDataParallel``, so every rank computes the identical threshold
locally (see ``docs/distributed.md``). Evaluation sums are all-reduced; only
rank 0 logs to the run folder and writes files, and the other ranks wait for
each checkpoint (a barrier) before going on. The processes per node
(``LOCAL_WORLD_SIZE``, which torchrun sets on every process) are kept beside
the world size, so that a run trained on several nodes is told the
``torchrun --nnodes=K --nproc_per_node=P`` command that continues it.

The Pruner's own DDP/FSDP2 plumbing is not here: this module serves the
training loop only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from feather_sparse._text import count


@dataclass(frozen=True)
class DistContext:
    """This process's place among data-parallel processes (1 process without DDP).

    Attributes:
        rank: this process's index among all of them.
        world_size: the number of processes, on all nodes together.
        local_world_size: the processes on each node (torchrun's
            ``LOCAL_WORLD_SIZE``); ``world_size // local_world_size`` is the
            number of nodes. None when the launcher did not say (a process
            group initialised by hand) or said a number that does not divide
            ``world_size``.
    """

    rank: int = 0
    world_size: int = 1
    local_world_size: int | None = None

    @property
    def is_main(self) -> bool:
        """Only the main process writes files and logs."""
        return self.rank == 0


def distributed_context() -> DistContext:
    """Rank and world size from ``torch.distributed`` when it is initialised.

    The single place the training loop learns about other processes; the
    DDP launcher initialises the process group before calling :func:`train`.
    """
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        world_size = dist.get_world_size()
        return DistContext(
            rank=dist.get_rank(),
            world_size=world_size,
            local_world_size=_local_world_size(world_size),
        )
    return DistContext()


def _local_world_size(world_size: int) -> int | None:
    """The processes per node that torchrun announces (``LOCAL_WORLD_SIZE``), if it
    is a whole share of ``world_size`` (torchrun starts as many on every node)."""
    try:
        local = int(os.environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    if local < 1 or local > world_size or world_size % local:
        return None
    return local


def _all_reduce_sum(tensor: Tensor, ctx: DistContext) -> Tensor:
    """Sum over processes (evaluation counts); the identity with one process."""
    if ctx.world_size > 1:
        torch.distributed.all_reduce(tensor)
    return tensor


def _barrier(ctx: DistContext) -> None:
    """Wait for every process (after rank 0 wrote a checkpoint); nothing with one process."""
    if ctx.world_size > 1:
        torch.distributed.barrier()


def _sync_buffers(model: nn.Module, ctx: DistContext) -> None:
    """Rank 0's buffers (BatchNorm statistics) on every rank, as DDP does before a forward.

    Each rank's last training forward updated its running statistics from its
    own batch; evaluating with rank 0's makes every rank evaluate the model
    that rank 0 checkpoints.
    """
    if ctx.world_size > 1:
        for buf in model.buffers():
            torch.distributed.broadcast(buf, src=0)


def init_distributed(device: str = "auto") -> bool:
    """Join the process group described by ``torchrun``'s environment, if any.

    Does nothing with one process (``WORLD_SIZE`` unset or 1) or when a group
    exists already. The backend is ``nccl`` when ``device`` resolves to CUDA
    (each process then uses GPU ``LOCAL_RANK``), else ``gloo``.

    Args:
        device: the run's device setting (``TrainConfig.device``), which
            picks the backend.

    Returns:
        Whether this call initialised the group (the caller then destroys it).

    Raises:
        ValueError: on CUDA, when ``LOCAL_RANK`` names no GPU of this machine (more
            processes per machine than GPUs), before the group is joined.
    """
    dist = torch.distributed
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    cuda = resolve_device(device).type == "cuda"
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        gpus = torch.cuda.device_count()
        if local >= gpus:  # NCCL cannot put two processes on one GPU
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            shown = "" if visible is None else f" (CUDA_VISIBLE_DEVICES={visible!r} here)"
            raise ValueError(
                f"this process is number {local} (LOCAL_RANK) on its machine, which shows it "
                f"{count(gpus, 'CUDA device')}{shown}: each process of a CUDA run uses GPU "
                f"LOCAL_RANK of those it sees; start at most {gpus} per machine (torchrun "
                f"--nproc_per_node={gpus}) or train on the CPU (--device cpu)"
            )
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo")
    return True


def resolve_device(name: str) -> torch.device:
    """``"auto"`` is CUDA when available, else CPU; anything else must exist.

    Args:
        name: ``"auto"`` or a torch device string (``"cpu"``, ``"cuda:1"``, ``"mps"``).

    Raises:
        ValueError: when CUDA (or MPS) is asked for but not available.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: CUDA is not available here; use --device cpu or auto")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(
            f"device {name!r}: only {count(torch.cuda.device_count(), 'CUDA device')} present"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r}: MPS is not available here; use --device cpu or auto")
    return device
