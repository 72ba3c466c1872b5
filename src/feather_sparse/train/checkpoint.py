"""Training checkpoints: writing and reading ``last.pt``, the RNG states, resume checks.

Every checkpoint carries its SHA-256 and is written atomically; the training
loop keeps the one before as ``prev.pt``, and a resume falls back to it, with
a warning, when ``last.pt`` is damaged or missing.

Resuming (``resume=True`` / ``--resume RUN_DIR``) continues from the last
checkpoint so that, on CPU, the weights are bit-identical to an uninterrupted
run: model, optimizer, LR schedule, Pruner and every RNG state are restored,
and the data loaders shuffle as a pure function of ``(seed, epoch)``.
"""

from __future__ import annotations

import io
import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from feather_sparse.integrity import IntegrityError, check_zip_seal, seal_zip, write_atomic
from feather_sparse.recipes import TrainConfig

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "feather-sparse-checkpoint"
#: 2: sealed with a SHA-256 (:mod:`feather_sparse.integrity`); 1: no checksum.
CHECKPOINT_VERSION = 2
SEALED_SINCE_VERSION = 2
#: The checkpoint before ``last.pt``, kept beside it.
PREVIOUS_NAME = "prev.pt"

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


def checkpoint_path(run_dir: str | os.PathLike[str]) -> Path:
    """``RUN_DIR/checkpoints/last.pt``."""
    return Path(run_dir) / "checkpoints" / "last.pt"


def previous_checkpoint_path(path: str | os.PathLike[str]) -> Path:
    """Where the checkpoint before ``path`` is kept: ``prev.pt`` beside ``last.pt``."""
    path = Path(path)
    if path.is_dir():
        path = checkpoint_path(path)
    return path.with_name(PREVIOUS_NAME)


def save_checkpoint(
    state: dict[str, Any], path: str | os.PathLike[str], *, keep_previous: bool = False
) -> None:
    """Write ``state`` with ``torch.save``, sealed, so that ``path`` is always a whole checkpoint.

    The archive carries its SHA-256 (:func:`feather_sparse.integrity.seal_zip`)
    and is written atomically (:func:`feather_sparse.integrity.write_atomic`):
    until the final rename the previous checkpoint stays in place, so a crash,
    a kill or a full disk mid-write leaves it untouched, and a temporary file
    left by a killed process is removed by the next save. The whole archive is
    built in memory first (about the size of the checkpoint).

    Args:
        state: the checkpoint (``torch.load(weights_only=True)`` types).
        path: the file, conventionally ``RUN_DIR/checkpoints/last.pt``.
        keep_previous: keep the checkpoint being replaced as ``prev.pt``, so a
            damaged ``last.pt`` still leaves one to resume from.

    Raises:
        DiskFullError: the disk is full; the previous checkpoint is intact.
        NotWritableError: the folder cannot be written.
    """
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    previous = previous_checkpoint_path(path) if keep_previous else None
    write_atomic(path, seal_zip(buffer.getvalue()), keep_previous=previous)


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a training checkpoint (tensors on the CPU), verifying its checksum.

    ``path`` may be the file or the run folder holding ``checkpoints/last.pt``.
    A checkpoint written before checksums existed (format version 1) is read
    with a warning that it cannot be verified.

    Raises:
        FileNotFoundError: when there is no checkpoint.
        IntegrityError: (a ``ValueError``) when the file is damaged: a changed
            byte, a truncation, or not a training checkpoint at all.
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
    data = path.read_bytes()
    fix = "resume from an intact copy, or start the run again"
    try:
        sealed = check_zip_seal(data, f"checkpoint {path}")
    except IntegrityError as err:
        raise IntegrityError(f"{err}: it is damaged or unreadable; {fix}") from None
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(f"checkpoint {path} is unreadable ({type(err).__name__}: {err})") from err
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a feather-sparse training checkpoint")
    if not sealed:
        if int(state.get("checkpoint_version", 1)) >= SEALED_SINCE_VERSION:
            raise IntegrityError(
                f"checkpoint {path}: its checksum is missing although its format has one "
                f"(the file was changed); {fix}"
            )
        logger.warning(
            "checkpoint %s has no checksum (written by an older feather-sparse): "
            "it is read unverified",
            path,
        )
    return state


def load_latest_checkpoint(
    run_dir: str | os.PathLike[str], *, set_aside_damaged: bool = False
) -> dict[str, Any]:
    """The run's newest intact checkpoint: ``last.pt``, else ``prev.pt`` with a warning.

    Args:
        run_dir: the run folder.
        set_aside_damaged: rename a damaged ``last.pt`` to ``last.pt.damaged``
            (kept for inspection), so that the next save does not rotate it
            into ``prev.pt`` over the intact one. Only the process that
            resumes (and writes) should do this.

    Raises:
        FileNotFoundError: when the folder holds no checkpoint.
        IntegrityError: when no intact checkpoint is left, naming each file.
    """
    last = checkpoint_path(run_dir)
    previous = previous_checkpoint_path(last)
    try:
        return load_checkpoint(last)
    except FileNotFoundError:
        if not previous.is_file():
            raise
        problem = f"{last} is missing"
    except ValueError as err:
        if not previous.is_file():
            raise IntegrityError(f"{err} (no previous checkpoint to fall back to)") from err
        problem = str(err)
    try:
        state = load_checkpoint(previous)
    except ValueError as err:
        raise IntegrityError(
            f"no intact checkpoint left in {Path(run_dir)}: {problem}; and {err}"
        ) from err
    logger.warning(
        "%s; resuming from the previous checkpoint %s (epoch %d) instead",
        problem,
        previous,
        int(state["epoch"]),
    )
    if set_aside_damaged and last.is_file():
        os.replace(last, last.with_name(last.name + ".damaged"))
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
        ValueError: for an unknown field or bad value in ``overrides``, or
            when no intact checkpoint is left.
    """
    saved = TrainConfig.from_record(load_latest_checkpoint(run_dir)["config"])
    return saved.replace(**(overrides or {}))
