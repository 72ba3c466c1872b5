"""From a run's config to its sparsifier: the method names and :func:`build_pruner`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch import nn

from feather_sparse.baselines import METHODS, make_pruner
from feather_sparse.recipes import TrainConfig
from feather_sparse.registry import Registry

#: The sparsification methods ``build_pruner`` knows (``config.method``): the
#: registry of :mod:`feather_sparse.baselines`.
SUPPORTED_METHODS = tuple(METHODS.names())

#: Config fields a method other than ``feather`` decides itself unless the run
#: sets them (GMP fixes the operator, Spartan its schedule, ...).
_METHOD_FIELDS = ("operator", "p", "theta", "backbone")
_SCHEDULE_FIELDS = ("schedule", "schedule_start", "schedule_end")


#: Extension point: more named sparsifiers, ``builder(config, model, total_steps) -> pruner``,
#: consulted before :data:`~feather_sparse.baselines.METHODS` (the experiments register
#: their variants here: Feather on the GMP and ASL+ backbones, ASL+ alone).
PRUNER_BUILDERS: Registry[Callable[[TrainConfig, nn.Module, int], Any]] = Registry("method")


def _check_method(config: TrainConfig) -> None:
    if config.dense or config.method in SUPPORTED_METHODS or config.method in PRUNER_BUILDERS:
        return
    names = sorted({*SUPPORTED_METHODS, *PRUNER_BUILDERS.names()})
    raise ValueError(f"method: unknown method {config.method!r}; choose one of: {', '.join(names)}")


def build_pruner(config: TrainConfig, model: nn.Module, total_steps: int) -> Any | None:
    """The sparsifier a config asks for, attached to ``model``; ``None`` when dense.

    The one place that turns a config into a pruner. For ``feather``, the
    paper's method, the config's sparsity options map one to one onto the
    :class:`~feather_sparse.pruner.Pruner`'s arguments. The other methods
    (:data:`~feather_sparse.baselines.METHODS`: hard, soft, nonste, gmp, st3,
    spartan) set their own operator, θ, backbone and schedule: those fields
    left at their defaults are the method's to decide; one set to another
    value is passed on, and the method refuses a value that contradicts it
    (``--method st3 --backbone global-flops`` is ST-3σ; ``--method gmp
    --operator soft`` is an error).
    What is returned has the ``Pruner`` interface: ``step``, ``report``,
    ``finalize``, ``state_dict``, ``dense_state_dict``, ...

    Raises:
        ValueError: for an unknown method (naming the field and the choices),
            or a field that contradicts the method.
    """
    if config.dense:
        return None
    _check_method(config)
    if config.method in PRUNER_BUILDERS:
        return PRUNER_BUILDERS.get(config.method)(config, model, total_steps)
    chosen: dict[str, Any] = {name: getattr(config, name) for name in _METHOD_FIELDS}
    schedule: dict[str, Any] | None = {
        "name": config.schedule,
        "start": config.schedule_start,
        "end": config.schedule_end,
    }
    if config.method != "feather":
        default = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
        chosen = {k: v for k, v in chosen.items() if v != default[k]}
        if all(getattr(config, k) == default[k] for k in _SCHEDULE_FIELDS):
            schedule = None  # the method's own schedule (Spartan's linear ramp)
    if schedule is not None:
        chosen["schedule"] = schedule
    return make_pruner(
        model,
        config.method,
        sparsity=config.sparsity,
        total_steps=total_steps,
        theta_rule=config.theta_rule,
        update_every=config.update_every,
        exclude=config.exclude,
        max_layer_sparsity=config.max_layer_sparsity,
        **chosen,
    )
