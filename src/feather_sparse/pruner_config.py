"""PrunerConfig: a Pruner's settings, frozen, versioned and checked once.

A :class:`~feather_sparse.pruner.Pruner` is built from one of these
(``Pruner.from_config``; ``Pruner(model, sparsity, ...)`` makes one from its
keyword arguments), the training loop makes one from its ``TrainConfig``
(:func:`feather_sparse.methods.pruner_config`), and every value is checked
here, in ``__post_init__``, with the rules of :mod:`feather_sparse.rules` —
never again on the way to the operator.

An N:M ``pattern`` (``"2:4"``) is resolved here too: it implies the
sparsity ``(M − N)/M``, the N:M backbone (:mod:`feather_sparse.nm`) and, by
default, the full pattern from the first step; a value that contradicts it
is an error naming both.

Names are resolved against the registries of operators, backbones and
schedules, including the baselines' (``st3``, ``spartan``): this module
imports :mod:`feather_sparse.baselines` so that a config accepts them however
the library was imported.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from torch import nn

from feather_sparse.backbones import BACKBONES, Backbone
from feather_sparse.baselines import SpartanBackbone, ST3Operator
from feather_sparse.nm.backbone import nm_settings
from feather_sparse.nm.operator import NMPattern
from feather_sparse.ops import OPERATORS, Operator, ThresholdOperator
from feather_sparse.registry import Registry
from feather_sparse.rules import as_int, check_p, check_sparsity, check_theta
from feather_sparse.schedules import SCHEDULES, ConstantSchedule, CubicSchedule, Schedule

__all__ = [
    "AUTO_THETA_BOUNDARY",
    "AUTO_THETA_LOW",
    "DEFAULT_INCLUDE",
    "FORMAT_VERSION",
    "REGISTRIES",
    "PrunerConfig",
    "auto_theta",
]

#: The baselines' registry entries (operator ``st3``, backbone ``spartan``),
#: named here so that importing this module always registers them.
BASELINE_COMPONENTS = (ST3Operator, SpartanBackbone)

#: The registries a config's names are looked up in, by field (with the
#: baselines' entries, whatever was imported first).
REGISTRIES: dict[str, Registry[Any]] = {
    "operator": OPERATORS,
    "backbone": BACKBONES,
    "schedule": SCHEDULES,
}

#: Version of the saved form of a Pruner's settings and state. 0: states
#: saved before it existed (the same layout); 1: adds ``format_version``.
FORMAT_VERSION = 1

#: Layer types pruned by default: every convolution and linear weight, as in
#: the authors' released code (first conv and classifier included; biases and
#: normalisation layers never).
DEFAULT_INCLUDE: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)

#: The automatic θ rule's boundary (§2.2.2): θ = 0.5 for final sparsity S at or
#: above it, 1.0 below.
AUTO_THETA_BOUNDARY = 0.95
AUTO_THETA_LOW = 0.5

THETA_RULES = ("paper", "released")


def auto_theta(sparsity: float, rule: str = "paper") -> float:
    """The paper's automatic gradient scale ``θ = g(S)``.

    Args:
        sparsity: the final target sparsity ``S``.
        rule: ``"paper"`` — θ = 0.5 when ``S >= 0.95`` (the paper's text, §2.2.2);
            ``"released"`` — θ = 0.5 when ``S > 0.95`` (the authors' released
            code). They differ only at exactly ``S = 0.95``.

    Returns:
        0.5 or 1.0.
    """
    if rule == "paper":
        return AUTO_THETA_LOW if sparsity >= AUTO_THETA_BOUNDARY else 1.0
    if rule == "released":
        return AUTO_THETA_LOW if sparsity > AUTO_THETA_BOUNDARY else 1.0
    raise ValueError(f"unknown theta rule {rule!r}; choose one of: {', '.join(THETA_RULES)}")


def _int_at_least(name: str, value: Any, low: int) -> int:
    number = as_int(value)
    if number is None or number < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return number


T = TypeVar("T")


def _build(kind: str, cls: Callable[..., T], options: dict[str, Any]) -> T:
    """``cls(**options)``, a wrong option name or type reported as a ValueError.

    Raises:
        ValueError: naming the ``kind`` (backbone, schedule), the options given
            and the ones ``cls`` accepts.
    """
    try:
        return cls(**options)
    except TypeError as err:
        kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        accepted = [n for n, p in inspect.signature(cls).parameters.items() if p.kind in kinds]
        raise ValueError(
            f"invalid {kind} options {options!r} for {getattr(cls, '__name__', cls)}: {err}; "
            f"its options are: {', '.join(accepted) or 'none'}"
        ) from None


def _layer_selection(name: str, value: Any, types: bool) -> tuple[Any, ...]:
    """``include``/``exclude`` as a tuple of module names, ``"re:"`` patterns and
    (``include`` only) ``nn.Module`` subclasses; one name or type alone makes a tuple of one.

    Raises:
        ValueError: for anything else, naming the argument and the item.
    """
    if isinstance(value, str) or (types and isinstance(value, type)):
        value = (value,)
    what = "module names, 're:' patterns" + (" or nn.Module types" if types else "")
    try:
        items = tuple(value)
    except TypeError:
        raise ValueError(f"{name} must be a list of {what}, got {value!r}") from None
    for item in items:
        if not (
            isinstance(item, str)
            or (types and isinstance(item, type) and issubclass(item, nn.Module))
        ):
            raise ValueError(f"{name} must hold {what}; {item!r} is none of them")
    return items


@dataclass(frozen=True)
class PrunerConfig:
    """What a Pruner does, apart from the model and the length of training.

    Args:
        sparsity: final target sparsity ``S`` in ``[0, 1)``, over all prunable
            weights; required unless ``pattern`` implies it.
        operator: ``"feather"`` (p = 3, default), ``"soft"`` (p = 1),
            ``"hard"`` (p = inf), another registered name, or an
            :class:`~feather_sparse.ops.Operator`.
        p: the operator's power in ``[1, inf]``, overriding ``operator``'s
            (Feather family only; see :func:`feather_sparse.rules.check_p`).
        theta: gradient scale of pruned weights in ``[0, 1]``, or ``"auto"``
            (the paper's rule, see :func:`auto_theta`).
        theta_rule: boundary of the auto rule: ``"paper"`` (S ≥ 0.95) or
            ``"released"`` (S > 0.95, the authors' code).
        backbone: ``"global"`` (one threshold, the paper's main backbone),
            another registered name, ``{"name": ..., **options}``, or a
            :class:`~feather_sparse.backbones.Backbone`.
        schedule: a :class:`~feather_sparse.schedules.Schedule` (default
            ``CubicSchedule(start=0, end=0.5)``), a registered name,
            ``{"name": ..., **options}``, or any callable ``step -> sparsity``.
        update_every: recompute thresholds every this many steps (1 = every
            step, as in the paper).
        include: layer types to prune, and/or module names / ``"re:"`` patterns.
        exclude: module names (a name also excludes its children) or
            ``"re:<regex>"`` patterns (full match) never to prune.
        min_params: skip weights with fewer elements.
        max_layer_sparsity: layer-collapse guard, off (``None``) by default as in
            the paper: cap each layer's threshold so that at most this fraction of
            the layer is pruned. With the guard active the overall sparsity can
            fall below the target (the capped layers keep more weights); a cap
            below ``sparsity``, which no model could reach, is refused.
        check_finite: raise at ``step()`` if a weight holds NaN or inf.
        pattern: ``"N:M"`` (``"2:4"``, ``"4:8"``, …) for N:M sparsity with
            Feather's per-group thresholds (:mod:`feather_sparse.nm`), or
            ``None`` (unstructured). It implies ``sparsity = (M − N)/M`` (given
            as well, it must agree), the backbone ``{"name": "nm", "pattern": ...}``
            (``"global"``, the default, or ``"nm"`` become it; another is an
            error) and, unless ``schedule`` is given, the full pattern from
            the first step. Stored as its string. An ``"nm"`` backbone given
            without ``pattern`` sets it.

    Raises:
        ValueError: for any value outside its rule, naming the field.
    """

    version: ClassVar[int] = FORMAT_VERSION

    sparsity: float | None = None
    operator: str | Operator = "feather"
    p: float | None = None
    theta: float | str = "auto"
    theta_rule: str = "paper"
    backbone: str | Backbone | Mapping[str, Any] = "global"
    schedule: Schedule | Callable[[int], float] | str | Mapping[str, Any] | None = None
    update_every: int = 1
    include: Sequence[type[nn.Module] | str] = DEFAULT_INCLUDE
    exclude: Sequence[str] = ()
    min_params: int = 0
    max_layer_sparsity: float | None = None
    check_finite: bool = True
    pattern: str | NMPattern | None = None
    _operator: Operator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        nm = nm_settings(
            self.pattern, self.sparsity, self.backbone, self.schedule, self.max_layer_sparsity
        )
        if nm is not None:
            put("pattern", str(nm.pattern))
            put("sparsity", nm.sparsity)
            put("backbone", nm.backbone)
            put("schedule", nm.schedule)
        if self.sparsity is None:
            raise ValueError(
                "sparsity is required (e.g. sparsity=0.9), or pattern='N:M' for N:M sparsity"
            )
        put("sparsity", check_sparsity(self.sparsity))
        if self.p is not None:
            put("p", check_p(self.p))
        if self.theta_rule not in THETA_RULES:
            raise ValueError(
                f"unknown theta rule {self.theta_rule!r}; choose one of: {', '.join(THETA_RULES)}"
            )
        put("theta", check_theta(self.theta, allow_auto=True))
        put("update_every", _int_at_least("update_every", self.update_every, 1))
        put("min_params", _int_at_least("min_params", self.min_params, 0))
        if not isinstance(self.check_finite, bool):  # "no" would be truthy: checks left on
            raise ValueError(f"check_finite must be True or False, got {self.check_finite!r}")
        if self.max_layer_sparsity is not None:
            cap = check_sparsity(self.max_layer_sparsity, "max_layer_sparsity")
            if cap < self.sparsity:  # every layer at most cap: the model at most cap
                raise ValueError(
                    f"max_layer_sparsity={cap:g} caps every layer below the target sparsity "
                    f"{self.sparsity:g}, so the model could reach {cap:g} at most: give a cap "
                    f"above the target (e.g. max_layer_sparsity=0.99) or a lower sparsity"
                )
            put("max_layer_sparsity", cap)
        put("include", _layer_selection("include", self.include, types=True))
        put("exclude", _layer_selection("exclude", self.exclude, types=False))
        for pat in [*(i for i in self.include if isinstance(i, str)), *self.exclude]:
            if pat.startswith("re:"):
                try:
                    re.compile(pat[3:])
                except re.error as err:
                    raise ValueError(f"invalid regular expression in {pat!r}: {err}") from None
        put("_operator", _resolve_operator(self.operator, self.p))
        self.make_backbone()  # checks the name and the options; the Pruner makes its own
        self.make_schedule()

    # ------------------------------------------------------------- resolved
    @property
    def final_sparsity(self) -> float:
        """``sparsity`` as a number (set from ``pattern`` when that implied it)."""
        assert self.sparsity is not None  # __post_init__ resolved it
        return float(self.sparsity)

    @property
    def needs_total_steps(self) -> bool:
        """Whether a Pruner needs ``total_steps`` (all but an N:M pattern from the first step)."""
        return self.pattern is None or not _from_first_step(self.make_schedule())

    @property
    def theta_value(self) -> float:
        """θ as a number: the given one, or the automatic rule's at ``sparsity``."""
        if isinstance(self.theta, str):
            return auto_theta(self.final_sparsity, self.theta_rule)
        return float(self.theta)

    def make_operator(self) -> Operator:
        """The operator (immutable, so one object serves every call)."""
        return self._operator

    def make_backbone(self) -> Backbone:
        """A fresh backbone (a Backbone object is passed through: it holds its own state)."""
        backbone = self.backbone
        if isinstance(backbone, Backbone):
            return backbone
        if isinstance(backbone, Mapping):
            options = dict(backbone)
            cls = BACKBONES.get(options.pop("name", None) or "")
            return _build("backbone", cls, options)
        cls = BACKBONES.get(backbone)
        if not (isinstance(cls, type) and issubclass(cls, Backbone)):
            raise ValueError(
                f"backbone must be one of {', '.join(BACKBONES.names())} or a Backbone, "
                f"got {backbone!r}"
            )
        return cls()

    def make_schedule(self) -> Schedule | Callable[[int], float]:
        """The schedule: a registered one built from its name or options, or the callable."""
        schedule = self.schedule
        if schedule is None:
            return CubicSchedule()
        if isinstance(schedule, str):
            cls: type[Schedule] = SCHEDULES.get(schedule)
            return cls()
        if isinstance(schedule, Mapping):
            options = dict(schedule)
            cls = SCHEDULES.get(options.pop("name", None) or "")
            return _build("schedule", cls, options)
        if isinstance(schedule, Schedule) or callable(schedule):
            return schedule
        raise ValueError(
            f"schedule must be a name ({', '.join(SCHEDULES.names())}), a Schedule, "
            f"or a callable step -> sparsity; got {schedule!r}"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able record of the settings, with ``version``.

        Objects are written as their ``config()`` (operators, backbones,
        schedules), a custom callable schedule as ``{"name": "<callable>"}``
        and layer types by class name: a record to read, not to rebuild from.
        """
        schedule = self.make_schedule()
        return {
            "version": self.version,
            "sparsity": self.sparsity,
            "operator": self._operator.config(),
            "theta": self.theta,
            "theta_rule": self.theta_rule,
            "backbone": self.make_backbone().config(),
            "schedule": schedule.config()
            if isinstance(schedule, Schedule)
            else {"name": "<callable>"},
            "update_every": self.update_every,
            "include": [i.__name__ if isinstance(i, type) else i for i in self.include],
            "exclude": list(self.exclude),
            "min_params": self.min_params,
            "max_layer_sparsity": self.max_layer_sparsity,
            "check_finite": self.check_finite,
            "pattern": self.pattern,
        }


def _from_first_step(schedule: Any) -> bool:
    """Whether ``schedule`` is the constant one from step 0 (it needs no length)."""
    return isinstance(schedule, ConstantSchedule) and schedule.start == 0.0


def _resolve_operator(operator: str | Operator, p: float | None) -> Operator:
    op = OPERATORS.get(operator)
    if not isinstance(op, Operator):
        raise ValueError(
            f"operator must be one of {', '.join(OPERATORS.names())} or an Operator, "
            f"got {operator!r}"
        )
    if p is None:
        return op
    if not isinstance(op, ThresholdOperator):
        raise ValueError(f"p applies to the thresholding operators only, not to {op!r}")
    if op.name in ("hard", "soft") and float(p) != op.p:
        raise ValueError(
            f"operator {op.name!r} fixes p = {op.p}; pass operator='feather' to choose p={p}"
        )
    return ThresholdOperator(p=float(p), name=op.name)
