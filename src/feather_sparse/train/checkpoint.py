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

import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from feather_sparse.recipes import TrainConfig
from feather_sparse.run_files import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    PREVIOUS_NAME,
    checkpoint_path,
    load_checkpoint,
    load_latest_checkpoint,
    previous_checkpoint_path,
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

    A finished run whose checkpoints are gone or damaged still has a config:
    the one its ``config.json`` recorded (resuming it hands back its model).

    Raises:
        FileNotFoundError: when the folder holds no checkpoint (and no finished run).
        ValueError: for an unknown field or bad value in ``overrides``, or
            when no intact checkpoint is left (and the run did not finish).
    """
    try:
        record = load_latest_checkpoint(run_dir)["config"]
    except (FileNotFoundError, ValueError) as err:
        from feather_sparse.train.run_dir import _finished_run, read_run_info

        if _finished_run(Path(run_dir)) is None:
            raise
        try:
            record = read_run_info(run_dir)["config"]
        except (OSError, ValueError, KeyError):
            raise err from None
    return TrainConfig.from_record(record).replace(**(overrides or {}))
