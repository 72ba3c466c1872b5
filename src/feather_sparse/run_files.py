"""The run folder's files that training writes and export reads: their names, the checkpoints.

Every checkpoint carries its SHA-256 (:mod:`feather_sparse.integrity`) and is
written atomically; the training loop keeps the one before as ``prev.pt``, and
:func:`load_latest_checkpoint` falls back to it when ``last.pt`` is damaged or
missing. What a checkpoint holds is the training loop's business
(:mod:`feather_sparse.train.session`); this module only writes and verifies the
file, and the entries a resume reads (their presence and types, not their
values), so that ``export`` reads checkpoints the way ``--resume`` does without
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
    "load_torch_bytes",
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
    """``RUN_DIR/checkpoints/last.pt``.

    Args:
        run_dir: the training run's folder.
    """
    return Path(run_dir) / CHECKPOINTS_DIR / LAST_NAME


def previous_checkpoint_path(path: str | os.PathLike[str]) -> Path:
    """Where the checkpoint before ``path`` is kept: ``prev.pt`` beside ``last.pt``.

    Args:
        path: the last checkpoint's path, or the run folder.
    """
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
    with a warning that it cannot be verified. Every checkpoint's structure
    is checked as well (the entries a resume reads, and their types), so
    that a damaged one without a checksum is refused here, where
    :func:`read_latest_checkpoint` falls back to ``prev.pt``, rather than
    failing halfway through a resume.

    Args:
        path: the checkpoint file, or the run folder holding ``checkpoints/last.pt``.

    Raises:
        FileNotFoundError: when there is no checkpoint.
        IntegrityError: (a ``ValueError``) when the file is damaged: a changed
            byte, a truncation, a missing or mistyped entry (named), or not a
            training checkpoint at all.
        ValueError: when the file is unreadable or not a training checkpoint.
    """
    return _load_checkpoint(path, _DAMAGED_FIX)


#: What to do about a damaged checkpoint when no other one is left to fall back to.
_DAMAGED_FIX = "resume from an intact copy, or start the run again"


def _load_checkpoint(path: str | os.PathLike[str], fix: str | None) -> dict[str, Any]:
    """:func:`load_checkpoint`, with ``fix`` (what to do) appended to a damaged file's error.

    :func:`read_latest_checkpoint` reads ``last.pt`` with ``fix=None``: when it
    falls back to ``prev.pt``, the fallback is what happens, not the advice.
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
    advice = f"; {fix}" if fix else ""
    try:
        sealed = check_zip_seal(data, f"checkpoint {path}")
    except IntegrityError as err:
        raise IntegrityError(f"{err}: it is damaged or unreadable{advice}") from None
    state = load_torch_bytes(data, f"checkpoint {path}", fix)
    if not isinstance(state, dict):
        raise ValueError(f"{path} is not a feather-sparse training checkpoint")
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{path} is not a feather-sparse training checkpoint: its format is "
            f"{state.get('format')!r}, not {CHECKPOINT_FORMAT!r}"
        )
    if not sealed:
        # Unverified: a damaged version entry is refused like any other damaged entry.
        problem = _field_problem(state, _VERSION_FIELD, "it", required=False)
        if problem is not None:
            raise IntegrityError(f"checkpoint {path} is damaged: {problem}{advice}")
        if int(state.get("checkpoint_version", 1)) >= SEALED_SINCE_VERSION:
            raise IntegrityError(
                f"checkpoint {path}: its checksum is missing although its format has one "
                f"(the file was changed){advice}"
            )
        logger.warning(
            "checkpoint %s has no checksum (written by an older feather-sparse): "
            "it is read unverified",
            path,
        )
    problem = _structure_problem(state)
    if problem is not None:
        raise IntegrityError(f"checkpoint {path} is damaged: {problem}{advice}")
    return state


def load_torch_bytes(data: bytes, what: str, fix: str | None = None) -> Any:
    """``torch.load(weights_only=True)`` of ``data`` onto the CPU, any failure one ``ValueError``.

    torch raises many kinds of errors for a damaged file (``RuntimeError``,
    ``EOFError`` without a message, an ``UnpicklingError`` that advises
    ``weights_only=False``, which would run whatever code the file holds);
    the error raised here names the file instead, and what to do.

    Args:
        data: the file's bytes.
        what: the file, for people: ``"checkpoint run/checkpoints/last.pt"``.
        fix: what to do instead, appended to the message.

    Raises:
        ValueError: when torch cannot read ``data``.
    """
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds; its advice here would mislead
        logger.debug("torch.load(%s) failed", what, exc_info=True)
        raise ValueError(
            f"{what} is unreadable ({type(err).__name__}): it is damaged or was not written "
            "by feather-sparse" + (f"; {fix}" if fix else "")
        ) from None


# What a training checkpoint holds (train/session.py writes it; every version
# since the first has these), by type: a missing or retyped entry means a
# damaged file, which resuming would otherwise meet as a KeyError deep inside.
_CHECKPOINT_FIELDS: dict[str, tuple[type, ...]] = {
    "epoch": (int,),
    "step": (int,),
    "config": (dict,),
    "model": (dict,),
    "pruner": (dict, type(None)),
    "optimizer": (dict,),
    "lr_scheduler": (dict,),
    "rng": (dict,),
}
_OPTIONAL_FIELDS: dict[str, tuple[type, ...]] = {
    "scaler": (dict, type(None)),
    "metrics": (dict, type(None)),
    "init": (dict, type(None)),  # the weights the run started from (init_from)
}
_RNG_FIELDS = ("torch", "numpy", "python", "cuda")
# Read before the other entries, to tell a checkpoint from before checksums (1) from
# one whose seal was cut off (2).
_VERSION_FIELD: dict[str, tuple[type, ...]] = {"checkpoint_version": (int,)}
# The Pruner state's own layout (Pruner.state_dict; the Pruner checks its values).
_PRUNER_FIELDS: dict[str, tuple[type, ...]] = {
    "step": (int,),
    "current_sparsity": (int, float),
    "thresholds": (list, tuple),
    "backbone": (dict,),
    "config": (dict,),
}


def _field_problem(
    entries: dict[str, Any], fields: dict[str, tuple[type, ...]], owner: str, required: bool
) -> str | None:
    """What in ``entries`` is missing or mistyped (``owner``: "it", "its 'pruner' entry")."""
    for key, types in fields.items():
        if key not in entries:
            if required:
                return f"{owner} has no {key!r} entry"
            continue
        value = entries[key]
        if isinstance(value, bool) or not isinstance(value, types):
            expected = " or ".join("None" if t is type(None) else t.__name__ for t in types)
            return f"{owner} has {key!r} of type {type(value).__name__}, not {expected}"
    return None


def _structure_problem(state: dict[str, Any]) -> str | None:
    """What is missing or of the wrong type in a training checkpoint (None if nothing).

    Only the structure: the values are checked by what reads them (the
    Pruner its state, the optimizer its own).
    """
    problem = _field_problem(state, _CHECKPOINT_FIELDS, "it", required=True) or _field_problem(
        state, _OPTIONAL_FIELDS, "it", required=False
    )
    if problem is not None:
        return problem
    missing = [key for key in _RNG_FIELDS if key not in state["rng"]]
    if missing:
        return f"its 'rng' entry has no {missing[0]!r} state"
    if state["pruner"] is not None:
        return _field_problem(state["pruner"], _PRUNER_FIELDS, "its 'pruner' entry", required=True)
    return None


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

    The caller words the warning (resuming and exporting say different things);
    ``problem`` says only what is wrong with ``last.pt``, not what to do.

    Args:
        run_dir: the training run's folder.

    Raises:
        FileNotFoundError: when the folder holds no checkpoint.
        IntegrityError: when no intact checkpoint is left, naming each file.
    """
    last = checkpoint_path(run_dir)
    previous = previous_checkpoint_path(last)
    try:
        return LatestCheckpoint(_load_checkpoint(last, None), last)
    except FileNotFoundError:
        if not previous.is_file():
            raise
        problem = f"{last} is missing"
    except ValueError as err:
        if not previous.is_file():
            raise IntegrityError(
                f"{err} (no previous checkpoint to fall back to); {_DAMAGED_FIX}"
            ) from err
        problem = str(err)
    try:
        state = load_checkpoint(previous)
    except ValueError as err:
        raise IntegrityError(
            f"no intact checkpoint left in {Path(run_dir)}: {problem}; and {err}"
        ) from err
    return LatestCheckpoint(state, previous, problem)


def _fall_back(run_dir: str | os.PathLike[str], latest: LatestCheckpoint, set_aside: bool) -> None:
    """Say that a resume falls back to ``prev.pt``, and why; with ``set_aside``, rename the
    damaged ``last.pt`` to ``last.pt.damaged`` (kept for inspection), so that the next save
    does not rotate it into ``prev.pt`` over the intact one.

    One warning, logged by the process that resumes (and writes): what was wrong, the
    checkpoint resumed from with its epoch, and what is lost.
    """
    last = checkpoint_path(run_dir)
    epoch = int(latest.state["epoch"])
    kept = ""
    if set_aside and last.is_file():
        damaged = last.with_name(last.name + ".damaged")
        os.replace(last, damaged)
        kept = f"; the damaged file is kept as {damaged}"
    logger.warning(
        "%s; falling back to %s: resuming from the previous checkpoint %s (epoch %d), so "
        "the training after epoch %d is lost and is done again%s",
        latest.problem,
        latest.path.name,
        latest.path,
        epoch,
        epoch,
        kept,
    )


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
    if latest.problem is not None:
        _fall_back(run_dir, latest, set_aside_damaged)
    return latest.state
