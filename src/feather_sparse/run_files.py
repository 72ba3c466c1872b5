"""The run folder's files that training writes and export reads: their names, the checkpoints.

Every checkpoint carries its SHA-256 (:mod:`feather_sparse.integrity`) and is
written atomically; the training loop keeps the one before as ``prev.pt``, and
:func:`load_latest_checkpoint` falls back to it when ``last.pt`` is damaged or
missing. What a checkpoint holds is the training loop's business
(:mod:`feather_sparse.train.session`); this module only writes and verifies the
file, so that ``export`` reads checkpoints the way ``--resume`` does without
importing the training loop. The layout of the rest of the run folder is
described in :mod:`feather_sparse.train.run_dir`.
"""

from __future__ import annotations

import io
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from feather_sparse.integrity import IntegrityError, check_zip_seal, seal_zip, write_atomic

__all__ = [
    "CHECKPOINTS_DIR",
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "LAST_NAME",
    "MODEL_NAME",
    "PLAIN_MODEL_NAME",
    "PREVIOUS_NAME",
    "LatestCheckpoint",
    "checkpoint_path",
    "load_checkpoint",
    "load_latest_checkpoint",
    "previous_checkpoint_path",
    "read_latest_checkpoint",
    "save_checkpoint",
]

logger = logging.getLogger(__name__)

#: The folder of the checkpoints, inside the run folder.
CHECKPOINTS_DIR = "checkpoints"
#: The newest checkpoint, in :data:`CHECKPOINTS_DIR`.
LAST_NAME = "last.pt"
#: The checkpoint before ``last.pt``, kept beside it.
PREVIOUS_NAME = "prev.pt"
#: The finished run's compressed model, in the run folder.
MODEL_NAME = "model.fsp"
#: The finished run's plain ``state_dict`` when ``.fsp`` export is unavailable.
PLAIN_MODEL_NAME = "model.pt"

CHECKPOINT_FORMAT = "feather-sparse-checkpoint"
#: 2: sealed with a SHA-256 (:mod:`feather_sparse.integrity`); 1: no checksum.
CHECKPOINT_VERSION = 2
SEALED_SINCE_VERSION = 2


def checkpoint_path(run_dir: str | os.PathLike[str]) -> Path:
    """``RUN_DIR/checkpoints/last.pt``."""
    return Path(run_dir) / CHECKPOINTS_DIR / LAST_NAME


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
    except Exception as err:  # torch raises many kinds; its advice here would mislead
        logger.debug("torch.load(%s) failed", path, exc_info=True)
        raise ValueError(
            f"checkpoint {path} is unreadable ({type(err).__name__}): it is damaged or was "
            "not written by feather-sparse"
        ) from err
    if not isinstance(state, dict):
        raise ValueError(f"{path} is not a feather-sparse training checkpoint")
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{path} is not a feather-sparse training checkpoint: its format is "
            f"{state.get('format')!r}, not {CHECKPOINT_FORMAT!r}"
        )
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


@dataclass(frozen=True)
class LatestCheckpoint:
    """A run's newest intact checkpoint, where it came from, and why ``last.pt`` was passed over.

    Attributes:
        state: the checkpoint.
        path: the file read: ``last.pt``, or ``prev.pt`` after a fallback.
        problem: what was wrong with ``last.pt`` (``None`` when it was read).
    """

    state: dict[str, Any]
    path: Path
    problem: str | None = None


def read_latest_checkpoint(run_dir: str | os.PathLike[str]) -> LatestCheckpoint:
    """The run's newest intact checkpoint, ``last.pt`` else ``prev.pt``, without warning.

    The caller words the warning (resuming and exporting say different things).

    Raises:
        FileNotFoundError: when the folder holds no checkpoint.
        IntegrityError: when no intact checkpoint is left, naming each file.
    """
    last = checkpoint_path(run_dir)
    previous = previous_checkpoint_path(last)
    try:
        return LatestCheckpoint(load_checkpoint(last), last)
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
    return LatestCheckpoint(state, previous, problem)


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
    latest = read_latest_checkpoint(run_dir)
    if latest.problem is None:
        return latest.state
    logger.warning(
        "%s; resuming from the previous checkpoint %s (epoch %d) instead",
        latest.problem,
        latest.path,
        int(latest.state["epoch"]),
    )
    last = checkpoint_path(run_dir)
    if set_aside_damaged and last.is_file():
        os.replace(last, last.with_name(last.name + ".damaged"))
    return latest.state
