"""The optimizer and the per-iteration learning-rate schedule of a training run."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from feather_sparse.backbones import ASL_LR_SCALE
from feather_sparse.recipes import TrainConfig


def _param_groups(
    model: nn.Module, pruner: Any | None, weight_decay: float, pruner_lr: float | None = None
) -> list[dict[str, Any]]:
    """Weight decay on weights only: norm parameters and biases are 1-D and get none.

    The paper's CIFAR recipe (and its released code) exempts BatchNorm
    parameters and biases; every such parameter is a vector, so the rule is
    ``ndim <= 1``. A pruner's own parameters (ASL+ thresholds) get no decay,
    and ``pruner_lr`` as their learning rate when given.
    """
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    seen: set[int] = set()
    for param in model.parameters():
        if not param.requires_grad or id(param) in seen:
            continue
        seen.add(id(param))
        (no_decay if param.ndim <= 1 else decay).append(param)
    extra = [p for p in (pruner.parameters() if pruner is not None else []) if id(p) not in seen]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
        {"params": extra, "weight_decay": 0.0} | ({} if pruner_lr is None else {"lr": pruner_lr}),
    ]
    return [g for g in groups if g["params"]]


def build_optimizer(
    config: TrainConfig, model: nn.Module, pruner: Any | None = None
) -> torch.optim.Optimizer:
    """SGD (momentum, optional Nesterov) or AdamW (β1 = momentum) over the model and pruner.

    Args:
        config: the run's config (``optimizer``, ``lr``, ``momentum``,
            ``nesterov``, ``weight_decay``).
        model: the model whose parameters it trains; weight decay applies to
            its weights, not to its norm parameters and biases (1-D).
        pruner: a Pruner whose own parameters (ASL+ thresholds) it trains
            too, without weight decay and at the learning rate scaled by
            ``ASL_LR_SCALE``; ``None``: none.
    """
    # ASL trains its thresholds at lr/100 (ASL_LR_SCALE).
    groups = _param_groups(model, pruner, config.weight_decay, config.lr * ASL_LR_SCALE)
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            groups, lr=config.lr, momentum=config.momentum, nesterov=config.nesterov
        )
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.momentum, 0.999))


def lr_factor(
    step: int,
    *,
    total_steps: int,
    warmup_steps: int = 0,
    schedule: str = "cosine",
    min_ratio: float = 0.0,
) -> float:
    """The learning rate at ``step`` as a fraction of the peak rate.

    Phases (every iteration, as in the paper's code):

    1. warm-up, ``step < warmup_steps``: linear, ``(step + 1) / warmup_steps``;
    2. ``"cosine"``: from 1 down to ``min_ratio`` over the remaining steps,
       ``min_ratio + (1 - min_ratio)·(1 + cos(π·progress))/2``;
       ``"constant"``: 1.

    Args:
        step: the iteration, from 0.
        total_steps: iterations in the whole training.
        warmup_steps: iterations of the linear warm-up.
        schedule: ``"cosine"`` or ``"constant"`` after the warm-up.
        min_ratio: the cosine schedule's final rate as a fraction of the peak.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_lr_scheduler(
    config: TrainConfig, optimizer: torch.optim.Optimizer, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` stepped every iteration with :func:`lr_factor`.

    Args:
        config: the run's config (``epochs``, ``lr``, ``min_lr``,
            ``warmup_epochs``, ``lr_schedule``).
        optimizer: the optimizer whose learning rates it sets.
        steps_per_epoch: iterations in one epoch.
    """
    total = config.epochs * steps_per_epoch
    warmup = round(config.warmup_epochs * steps_per_epoch)
    min_ratio = config.min_lr / config.lr

    def factor(step: int) -> float:
        return lr_factor(
            step,
            total_steps=total,
            warmup_steps=warmup,
            schedule=config.lr_schedule,
            min_ratio=min_ratio,
        )

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
