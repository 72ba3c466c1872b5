"""Training checkpoints for resuming: the RNG states, resume checks, and the file itself.

The file (``last.pt``, ``prev.pt``, the SHA-256 seal, the fallback to
``prev.pt``) is :mod:`feather_sparse.run_files`, re-exported here; this
module adds what only the training loop needs.

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
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from feather_sparse.recipes import TrainConfig
from feather_sparse.run_files import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    CHECKPOINTS_DIR,
    LAST_NAME,
    PREVIOUS_NAME,
    LatestCheckpoint,
    checkpoint_path,
    load_checkpoint,
    load_latest_checkpoint,
    previous_checkpoint_path,
    read_latest_checkpoint,
    save_checkpoint,
)

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "PREVIOUS_NAME",
    "RESUME_FREE_FIELDS",
    "checkpoint_path",
    "load_checkpoint",
    "load_latest_checkpoint",
    "previous_checkpoint_path",
    "resume_config",
    "save_checkpoint",
]

logger = logging.getLogger(__name__)

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


@contextlib.contextmanager
def _random_state_kept() -> Iterator[None]:
    """Give Python's, numpy's and torch's global random states back as they were when the
    block ends (returns or fails).

    A run seeds them (:func:`_seed_everything`) and draws from them. Left so, every
    later draw of the process would start again from the run's seed: a search script
    that picks each trial's learning rate with ``random.uniform`` before ``train()``
    would pick the same one for every trial after the first. The CUDA generators are
    given back too where CUDA was initialised before the block (reading them would
    initialise it in a run on the CPU).
    """
    python = random.getstate()
    numpy = np.random.get_state()
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


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


def _contradictions(saved: TrainConfig, other: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """The fields on which ``other`` contradicts the checkpoint's config ``saved`` (all
    but :data:`RESUME_FREE_FIELDS`, which a resume may change): ``(saved's, other's)``."""
    return {k: v for k, v in saved.diff(other).items() if k not in RESUME_FREE_FIELDS}


def _check_resume(
    config: TrainConfig,
    saved: TrainConfig,
    *,
    recipe: str | None = None,
    overrides: Collection[str] = (),
) -> None:
    """Refuse a resume whose config contradicts the checkpoint's, naming the fields.

    Args:
        config: the config the resume was given.
        saved: the checkpoint's.
        recipe: the recipe ``config`` was read from, when the user named one
            (``--resume RUN --recipe R``): the fields it sets are blamed on it,
            not on overrides the user never typed.
        overrides: the fields the user set on the command line.
    """
    diff = _contradictions(saved, config)
    if not diff:
        return
    if recipe is None:
        parts = [f"{k}={old!r} in the checkpoint but {new!r} now" for k, (old, new) in diff.items()]
        raise ValueError(
            "cannot resume: the config contradicts the checkpoint: "
            + "; ".join(parts)
            + " (drop these overrides, or start a new run)"
        )
    parts = [
        f"{k}={old!r} in the checkpoint but {new!r} "
        + ("given on the command line" if k in overrides else f"in recipe {recipe}")
        for k, (old, new) in diff.items()
    ]
    drop = [f"--recipe {recipe}"] + ["--" + k.replace("_", "-") for k in diff if k in overrides]
    raise ValueError(
        f"cannot resume: recipe {recipe} contradicts the checkpoint: "
        + "; ".join(parts)
        + f" (drop {', '.join(drop)}: --resume reads the run's config from its checkpoint; "
        "or start a new run)"
    )


def _check_same_run(run_dir: Path, latest: LatestCheckpoint, recorded: TrainConfig | None) -> None:
    """Refuse a checkpoint that belongs to another run than the folder's ``config.json``.

    Every session writes its config to ``config.json`` before its first
    checkpoint, so within one run the two agree up to the fields a resume may
    change (``RESUME_FREE_FIELDS``). A checkpoint copied in from another run
    does not: resuming it would continue that run here, rewrite the folder's
    ``config.json`` and mix the two runs' metrics.

    Args:
        run_dir: the run folder.
        latest: the checkpoint the resume would read.
        recorded: the config ``config.json`` holds (None: unreadable, not compared).

    Raises:
        ValueError: naming the checkpoint, ``config.json``, the fields, and the fix.
    """
    if recorded is None:
        return
    saved = TrainConfig.from_record(latest.state["config"])
    diff = _contradictions(saved, recorded)
    if not diff:
        return
    parts = [
        f"{k}={theirs!r} in the checkpoint but {ours!r} in config.json"
        for k, (theirs, ours) in diff.items()
    ]
    raise ValueError(
        f"cannot resume {run_dir}: its checkpoint {latest.path} belongs to another run than "
        f"its {run_dir / 'config.json'}: "
        + "; ".join(parts)
        + f" (put this run's own checkpoints back into {latest.path.parent}, or resume the "
        "checkpoint in the folder of the run that wrote it); nothing was changed"
    )


def _check_resume_folder(run_dir: str | os.PathLike[str]) -> None:
    """Refuse ``--resume`` given a file (a checkpoint, say) instead of the run folder.

    Raises:
        ValueError: naming the run folder to give when the file is a run's checkpoint.
    """
    path = Path(run_dir)
    if not path.exists() or path.is_dir():
        return
    if path.parent.name == CHECKPOINTS_DIR:
        hint = f"give its run folder: --resume {path.parent.parent}"
    else:
        hint = f"give the run folder, the one holding {CHECKPOINTS_DIR}/{LAST_NAME}"
    raise ValueError(
        f"--resume takes a run folder, and {path} is a file; {hint} "
        "(the run continues from its newest intact checkpoint)"
    )


def resume_config(
    run_dir: str | os.PathLike[str], overrides: dict[str, Any] | None = None
) -> TrainConfig:
    """The config saved in ``run_dir``'s checkpoint, with ``overrides`` applied.

    A finished run whose checkpoints are gone or damaged still has a config:
    the one its ``config.json`` recorded (resuming it hands back its model).
    Nothing is logged here: when ``last.pt`` is damaged, the resume itself
    says that it falls back to ``prev.pt``.

    Args:
        run_dir: the run folder (as ``train(..., run_dir=...)`` wrote it).
        overrides: field values that replace the saved config's (checked
            like any other value).

    Raises:
        FileNotFoundError: when the folder holds no checkpoint (and no finished run).
        ValueError: for an unknown field or bad value in ``overrides``, when no
            intact checkpoint is left (and the run did not finish), or when
            ``run_dir`` is a file (a checkpoint) rather than the run folder.
    """
    _check_resume_folder(run_dir)
    try:
        record = read_latest_checkpoint(run_dir).state["config"]
    except (FileNotFoundError, ValueError) as err:
        from feather_sparse.train.run_dir import _finished_run, read_run_info

        if _finished_run(Path(run_dir)) is None:
            raise
        try:
            record = read_run_info(run_dir)["config"]
        except (OSError, ValueError, KeyError):
            raise err from None
    return TrainConfig.from_record(record).replace(**(overrides or {}))
