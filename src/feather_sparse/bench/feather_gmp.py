"""The bench's one method of its own, ``feather-gmp``, and its registration for training.

Feather on the GMP backbone as the paper's appendix runs it (uniform per-layer
sparsity, first conv dense), which a ``TrainConfig`` cannot say: its
``backbone`` is a name, without options. The training loop's extension point
:data:`feather_sparse.train.PRUNER_BUILDERS` takes it, so every process that
trains a bench run (the main one and each worker) calls :func:`register_methods`
first.
"""

from __future__ import annotations

from typing import Any

from feather_sparse.baselines import make_pruner
from feather_sparse.train import PRUNER_BUILDERS

__all__ = ["FEATHER_GMP", "register_methods"]

#: The bench's own method name. Every other row of an experiment is a plain
#: config: ``method`` one of ``baselines.METHODS``, with ``backbone="asl+"``
#: for the ASL+ rows.
FEATHER_GMP = "feather-gmp"


def _build_feather_gmp(config: Any, model: Any, total_steps: int) -> Any:
    """Feather (the config's operator, p and θ) on the uniform backbone, first conv dense."""
    return make_pruner(
        model,
        "feather",
        sparsity=config.sparsity,
        total_steps=total_steps,
        operator=config.operator,
        p=config.p,
        theta=config.theta,
        theta_rule=config.theta_rule,
        backbone={"name": "uniform", "keep_first_dense": True},
        schedule={
            "name": config.schedule,
            "start": config.schedule_start,
            "end": config.schedule_end,
        },
        update_every=config.update_every,
        exclude=config.exclude,
        max_layer_sparsity=config.max_layer_sparsity,
    )


def register_methods() -> None:
    """Register ``feather-gmp`` in ``train.PRUNER_BUILDERS``, the training loop's extension point.

    Called before a sweep, in the main process and in every worker; a name
    already registered is left alone.
    """
    if FEATHER_GMP not in PRUNER_BUILDERS:
        PRUNER_BUILDERS.register(FEATHER_GMP, _build_feather_gmp)
