"""One training session's state: built from a config, restored from and saved to a checkpoint.

:func:`_setup` seeds, loads the data and builds the model, Pruner, optimizer
and LR schedule; with a checkpoint it restores every piece of it so that a
resumed run continues bit-exactly. :func:`_checkpoint_state` is the inverse,
and :func:`_write_run_info` describes the session in ``config.json``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from feather_sparse._version import __version__
from feather_sparse.methods import build_pruner
from feather_sparse.models import MODEL_SPEC_ATTR
from feather_sparse.provenance import numerics
from feather_sparse.recipes import TrainConfig
from feather_sparse.train.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    _rng_state,
    _seed_everything,
    _set_rng_state,
)
from feather_sparse.train.dist import DistContext
from feather_sparse.train.fit import check_model_takes
from feather_sparse.train.init_from import load_init, resolve_init
from feather_sparse.train.optim import build_lr_scheduler, build_optimizer
from feather_sparse.train.run_dir import RUN_FORMAT, _trim_metrics, _write_json

logger = logging.getLogger(__name__)


@dataclass
class _Session:
    """Everything one training session works with (built by ``_setup``)."""

    config: TrainConfig
    run_dir: Path
    ctx: DistContext
    device: torch.device
    bundle: Any
    model: nn.Module
    forward_model: nn.Module  # `model`, or its DistributedDataParallel wrapper
    spec: dict[str, Any]
    pruner: Any | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    amp_dtype: torch.dtype
    steps_per_epoch: int
    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps completed
    saved_epoch: int | None = None  # the epoch the newest checkpoint holds
    history: list[dict[str, Any]] = field(default_factory=list)
    init: dict[str, Any] | None = None  # {"path", "sha256"} of the weights it started from

    @property
    def metrics_file(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Mixed precision when the config asks for it (CUDA only), else a no-op."""
        return torch.autocast(
            device_type=self.device.type, dtype=self.amp_dtype, enabled=self.config.amp
        )


def _setup(
    config: TrainConfig,
    run_dir: Path,
    *,
    device: torch.device,
    ctx: DistContext,
    checkpoint: dict[str, Any] | None,
    load_dataset: Callable[..., Any],
    create_model: Callable[..., nn.Module],
) -> _Session:
    """Seed, load the data, build model, pruner, optimizer, LR schedule; restore a checkpoint."""
    _seed_everything(config.seed)
    if config.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = not config.deterministic

    # the file to start from, found before the data loads (a resume has its weights)
    init_path = resolve_init(config.init_from) if config.init_from and checkpoint is None else None
    bundle = load_dataset(
        config.dataset,
        data_dir=config.data_dir,
        batch_size=config.batch_size,
        eval_batch_size=config.eval_batch_size,
        device=device,
        seed=config.seed,
        rank=ctx.rank,
        world_size=ctx.world_size,
        num_workers=config.num_workers,
        **config.data_options,
    )
    model = create_model(config.model, num_classes=bundle.num_classes, **config.model_kwargs)
    # one forward of two zero samples: a model built for other data fails here, in one line
    check_model_takes(
        model,
        model_name=config.model,
        dataset=config.dataset,
        shape=tuple(bundle.input_shape),
        num_classes=bundle.num_classes,
    )
    init = load_init(model, init_path) if init_path is not None else None
    if checkpoint is not None:
        init = checkpoint.get("init")
    fallback_spec = {"name": config.model, "kwargs": {"num_classes": bundle.num_classes}}
    spec = dict(getattr(model, MODEL_SPEC_ATTR, fallback_spec))
    model.to(device)
    if checkpoint is not None:
        # The checkpoint holds plain (dense) keys: load them before attaching the Pruner.
        model.load_state_dict(checkpoint["model"])
    steps_per_epoch = len(bundle.train)
    pruner = build_pruner(config, model, config.epochs * steps_per_epoch)
    if checkpoint is not None and pruner is not None:
        if checkpoint["pruner"] is None:
            raise ValueError("cannot resume: the checkpoint is of a dense run")
        pruner.load_state_dict(checkpoint["pruner"])
    # The Pruner keeps the bare module; training runs through the DDP wrapper.
    forward_model: nn.Module = model
    if ctx.world_size > 1:
        forward_model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    optimizer = build_optimizer(config, model, pruner)
    amp_dtype = torch.bfloat16 if config.amp_dtype == "bfloat16" else torch.float16
    session = _Session(
        config=config,
        run_dir=run_dir,
        ctx=ctx,
        device=device,
        bundle=bundle,
        model=model,
        forward_model=forward_model,
        spec=spec,
        pruner=pruner,
        optimizer=optimizer,
        scheduler=build_lr_scheduler(config, optimizer, steps_per_epoch),
        # float16 needs loss scaling; bfloat16 has float32's range and does not.
        scaler=torch.amp.GradScaler(
            "cuda", enabled=config.amp and amp_dtype == torch.float16 and device.type == "cuda"
        ),
        amp_dtype=amp_dtype,
        steps_per_epoch=steps_per_epoch,
        init=init,
    )
    if checkpoint is not None:
        _restore(session, checkpoint)
    return session


def _restore(session: _Session, checkpoint: dict[str, Any]) -> None:
    """Optimizer, LR schedule, loss scaler, counters and RNG states from a checkpoint."""
    session.optimizer.load_state_dict(checkpoint["optimizer"])
    session.scheduler.load_state_dict(checkpoint["lr_scheduler"])
    if checkpoint.get("scaler"):
        session.scaler.load_state_dict(checkpoint["scaler"])
    session.epoch, session.step = int(checkpoint["epoch"]), int(checkpoint["step"])
    if session.step != session.epoch * session.steps_per_epoch:
        raise ValueError(
            f"cannot resume: the checkpoint is at step {session.step} after {session.epoch} "
            f"epochs, but an epoch now has {session.steps_per_epoch} steps "
            "(did the data set change?)"
        )
    _set_rng_state(checkpoint["rng"])
    saved, now = checkpoint.get("numerics"), numerics(session.device)
    if saved is not None and saved != now and session.ctx.is_main:
        logger.warning(
            "resuming on another floating-point environment (the checkpoint was written "
            "with %s, this process runs %s): training continues exactly from the "
            "checkpoint, but its later steps are not bit-identical to those of an "
            "uninterrupted run",
            saved,
            now,
        )
    if session.ctx.is_main:
        session.history = _trim_metrics(
            session.metrics_file, session.epoch, checkpoint.get("metrics")
        )
    session.saved_epoch = session.epoch
    logger.info(
        "resuming %s after epoch %d (step %d)", session.run_dir, session.epoch, session.step
    )


def _write_run_info(s: _Session) -> None:
    """``config.json``: the resolved config, the model spec, data facts and the Pruner's config."""
    bundle = s.bundle
    _write_json(
        s.run_dir / "config.json",
        {
            "format": RUN_FORMAT,
            "version": __version__,
            "torch": torch.__version__,
            "numerics": numerics(s.device),
            "config": s.config.to_dict(s.spec),
            "model": s.spec,
            "data": {
                "name": bundle.name,
                "num_classes": bundle.num_classes,
                "input_shape": list(bundle.input_shape),
                "train_size": bundle.train_size,
                "test_size": bundle.test_size,
            },
            "pruner": s.pruner.config() if s.pruner is not None else None,
            "device": str(s.device),
            "world_size": s.ctx.world_size,
            # processes per node (None: not launched by torchrun), for the resume hint
            "local_world_size": s.ctx.local_world_size,
            "steps_per_epoch": s.steps_per_epoch,
            "total_steps": s.config.epochs * s.steps_per_epoch,
            # the weights the run started from (init_from), None for a random init
            "init": s.init,
        },
    )


def _checkpoint_state(s: _Session, metrics: dict[str, Any]) -> dict[str, Any]:
    """What ``checkpoints/last.pt`` holds after ``s.epoch`` epochs."""
    pruner = s.pruner
    return {
        "format": CHECKPOINT_FORMAT,
        "checkpoint_version": CHECKPOINT_VERSION,
        "version": __version__,
        "numerics": numerics(s.device),
        "epoch": s.epoch,
        "step": s.step,
        # The model entry is the spec {"name", "kwargs"}: enough to rebuild it.
        "config": s.config.to_dict(s.spec),
        # Plain keys, loadable into the freshly created dense model.
        "model": pruner.dense_state_dict() if pruner is not None else s.model.state_dict(),
        "pruner": pruner.state_dict() if pruner is not None else None,
        "optimizer": s.optimizer.state_dict(),
        "lr_scheduler": s.scheduler.state_dict(),
        "scaler": s.scaler.state_dict() if s.scaler.is_enabled() else None,
        "rng": _rng_state(),
        "metrics": metrics,
        "init": s.init,
    }
