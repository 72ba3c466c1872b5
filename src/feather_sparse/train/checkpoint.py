"""Training checkpoints: writing and reading ``last.pt``, the RNG states, resume checks.

Resuming (``resume=True`` / ``--resume RUN_DIR``) continues from the last
checkpoint so that, on CPU, the weights are bit-identical to an uninterrupted
run: model, optimizer, LR schedule, Pruner and every RNG state are restored,
and the data loaders shuffle as a pure function of ``(seed, epoch)``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from feather_sparse.recipes import TrainConfig

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "feather-sparse-checkpoint"
CHECKPOINT_VERSION = 1

#: Config fields a resumed run may change: they move the run, not its numbers.
RESUME_FREE_FIELDS = frozenset(
    {
        "device",
        "threads",
        "data_dir",
        "num_workers",
        "eval_batch_size",
        "eval_every",
        "tensorboard",
        "recipe",
    }
)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def _rng_state() -> dict[str, Any]:
    """Every global RNG state, in types that ``torch.load(weights_only=True)`` reads."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, cached],
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if state["cuda"] and torch.cuda.is_available():
        if len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])
        else:
            logger.warning(
                "checkpoint holds RNG states of %d CUDA devices, %d present: not restored",
                len(state["cuda"]),
                torch.cuda.device_count(),
            )


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def checkpoint_path(run_dir: str | os.PathLike[str]) -> Path:
    """``RUN_DIR/checkpoints/last.pt``."""
    return Path(run_dir) / "checkpoints" / "last.pt"


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``state`` with ``torch.save`` so that ``path`` is always a whole checkpoint.

    The bytes go to a temporary file in the same folder, are flushed to disk,
    and the file is renamed over ``path`` (``os.replace`` is atomic on one file
    system): until the rename, the previous checkpoint stays in place, so a
    crash mid-write leaves it untouched. The temporary file is removed on an
    exception; one left by a killed process is removed by the next save.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp_name, 0o666 & ~_umask())  # mkstemp makes it private (0600)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a killed process
        stale.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # persist the rename itself (POSIX; best effort)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a training checkpoint (tensors on the CPU).

    ``path`` may be the file or the run folder holding ``checkpoints/last.pt``.

    Raises:
        FileNotFoundError: when there is no checkpoint.
        ValueError: when the file is unreadable or not a training checkpoint.
    """
    path = Path(path)
    if path.is_dir():
        path = checkpoint_path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no checkpoint at {path}: a run folder to resume holds checkpoints/last.pt, "
            "written at the end of every epoch"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(f"checkpoint {path} is unreadable ({type(err).__name__}: {err})") from err
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a feather-sparse training checkpoint")
    return state


def _check_resume(config: TrainConfig, saved: TrainConfig) -> None:
    """Refuse a resume whose config contradicts the checkpoint's, naming the fields."""
    diff = {k: v for k, v in saved.diff(config).items() if k not in RESUME_FREE_FIELDS}
    if diff:
        parts = [f"{k}={old!r} in the checkpoint but {new!r} now" for k, (old, new) in diff.items()]
        raise ValueError(
            "cannot resume: the config contradicts the checkpoint: "
            + "; ".join(parts)
            + " (drop these overrides, or start a new run)"
        )


def resume_config(
    run_dir: str | os.PathLike[str], overrides: dict[str, Any] | None = None
) -> TrainConfig:
    """The config saved in ``run_dir``'s checkpoint, with ``overrides`` applied.

    Raises:
        FileNotFoundError: when the folder holds no checkpoint.
        ValueError: for an unknown field or bad value in ``overrides``.
    """
    saved = TrainConfig.from_dict(load_checkpoint(run_dir)["config"])
    return saved.replace(**(overrides or {}))
