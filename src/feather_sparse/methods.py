"""The sparse-training methods by name, and the one path from a config to a Pruner.

Every method is a :class:`~feather_sparse.pruner_config.PrunerConfig` recipe —
an operator, a gradient scale θ, a backbone and a schedule — selectable by
name from :data:`METHODS` with :func:`make_pruner`::

    pruner = fs.make_pruner(model, "st3", sparsity=0.9, total_steps=steps)

| name | what it is (source) |
|---|---|
| `feather` | `P_T`, p = 3, θ automatic, any backbone (Glentis Georgoulakis et al. 2023) |
| `feather-gmp` | Feather on GMP's backbone: uniform, first conv dense (the paper's appendix) |
| `hard` | p = ∞ with the plain STE, θ = 1 (Bengio et al. 2013; the paper's §4.1) |
| `soft` | p = 1 with the plain STE, θ = 1 (Donoho 1995; the paper's §4.1) |
| `nonste` | p = 3, θ = 0: pruned weights get no gradient (the paper's §2.2.2) |
| `gmp` | uniform, hard mask, θ = 0, first conv dense (Zhu & Gupta 2017) |
| `st3` | soft threshold, channel rescale, identity backward (Vanderschueren et al. 2023) |
| `spartan` | Sinkhorn soft top-k, β and density schedules, frozen mask (Tai et al. 2022) |
| `feather-nm` | Feather per N:M group, p = 3, θ automatic (``pattern="2:4"`` unless given) |
| `hard-nm` | hard N:M mask, plain STE (θ = 1) |
| `sr-ste` | hard N:M mask, STE, sparse-refined decay λ·(1 − mask)⊙w (Zhou et al. 2021) |
| `s-ste` | soft N:M threshold, fixed per-tensor β, plain STE (Hu et al. 2024) |
| `oneshot-nm` | dense to half-way, one-shot magnitude N:M, fixed-mask fine-tuning |

The methods' operators and backbones are in :mod:`feather_sparse.baselines`
and :mod:`feather_sparse.nm` (references and formulas in
:mod:`feather_sparse.nm.methods`); all are registered here, so that importing
this module alone gives every method. A training config reaches a Pruner through
:func:`build_pruner` only: settings the config leaves unset (``None``) are the
method's to decide, and a set value that contradicts the method is an error.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import nn

from feather_sparse._text import plural
from feather_sparse.backbones import BACKBONES, Backbone
from feather_sparse.nm.backbone import DEFAULT_PATTERN
from feather_sparse.nm.methods import ONESHOT_START, SR_STE_DECAY
from feather_sparse.nm.operator import NMPattern, check_layout, layer_order
from feather_sparse.ops import OPERATORS, Operator, ThresholdOperator
from feather_sparse.pruner import Pruner, _find_targets
from feather_sparse.pruner_config import PrunerConfig
from feather_sparse.registry import Registry
from feather_sparse.schedules import LinearSchedule

if TYPE_CHECKING:
    from feather_sparse.recipes import TrainConfig

logger = logging.getLogger(__name__)

__all__ = [
    "METHODS",
    "Method",
    "build_pruner",
    "check_layers",
    "check_method",
    "make_pruner",
    "pruner_config",
]


def _pruner_arguments() -> frozenset[str]:
    params = inspect.signature(Pruner.__init__).parameters
    return frozenset(params) - {"self", "model", "sparsity", "total_steps"}


def _config_fields() -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(PrunerConfig) if f.init) - {"sparsity"}


def _backbone_name(backbone: Any) -> str:
    if isinstance(backbone, Backbone):
        return backbone.name
    if isinstance(backbone, Mapping):
        return str(backbone.get("name"))
    return str(backbone)


def _arithmetic(operator: Operator) -> dict[str, Any]:
    return {k: v for k, v in operator.config().items() if k != "name"}


def _backbone_object_misses(method: str, backbone: Backbone, own: Mapping[str, Any]) -> None:
    """Raise if a backbone object naming the method's own lacks an option the method sets."""
    missing = {
        k: v for k, v in own.items() if k != "name" and getattr(backbone, k, v) != v
    }  # e.g. NMBackbone("2:4") given to sr-ste: decay 0, no longer SR-STE
    if missing:
        have = ", ".join(f"{k}={getattr(backbone, k)!r}" for k in missing)
        want = ", ".join(f"{k}={v!r}" for k, v in missing.items())
        raise ValueError(
            f"the backbone object given to method {method!r} has {have}, but the method "
            f"sets {want}: construct it with {want}, or give the backbone as a mapping "
            f"({{'name': {own['name']!r}, ...}}), whose options are added to the method's "
            "and replace the ones they name"
        )


def _same(key: str, given: Any, fixed: Any) -> bool:
    if key == "backbone":
        return BACKBONES._normalize(_backbone_name(given)) == BACKBONES._normalize(fixed)
    if key == "operator":
        if isinstance(given, Operator):  # by what it computes: its config but for its name
            own = OPERATORS.get(fixed)
            return type(given) is type(own) and _arithmetic(given) == _arithmetic(own)
        return OPERATORS._normalize(str(given)) == OPERATORS._normalize(fixed)
    if key == "theta":
        return not isinstance(given, str) and float(given) == float(fixed)
    return bool(given == fixed)


@dataclass(frozen=True)
class Method:
    """A named sparse-training method: a Pruner configuration with a source.

    Args:
        name: the registry name (``--method`` on the command line).
        summary: one line on what it does.
        reference: where it comes from.
        fixed: Pruner arguments that define the method; passing another
            value raises (``backbone`` is compared by name, so its options
            may still be given).
        defaults: Pruner arguments set unless the caller gives them.
    """

    name: str
    summary: str
    reference: str
    fixed: Mapping[str, Any] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def pruner_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        """The Pruner's keyword arguments for this method, with the caller's overrides.

        A keyword given as ``None`` is unset: the method (or the Pruner's
        default) decides it. Keywords that are not Pruner arguments are options of the backbone
        (``keep_first_dense=True``, ``beta_target=10``): they are merged into
        its config, ``{"name": ..., **options}``. A ``backbone`` naming the
        method's own (a string or a mapping) keeps the options the method sets
        (GMP's first conv dense, SR-STE's decay, S-STE's β, one-shot's frozen
        mask); a mapping's options replace the ones they name.

        Args:
            **kwargs: Pruner arguments and backbone options; ``None`` leaves
                one to the method.

        Returns:
            The keyword arguments for :class:`~feather_sparse.pruner.Pruner`
            (after ``model``, ``sparsity`` and ``total_steps``).

        Raises:
            ValueError: if an override contradicts what defines the method (an
                operator object is compared by what it computes, not its name), a
                backbone object naming the method's own lacks an option the method
                sets (``NMBackbone("2:4")`` for ``sr-ste``: no decay), or backbone
                options come with a backbone object.
        """
        allowed = _pruner_arguments()
        kwargs = {k: v for k, v in kwargs.items() if v is not None}  # None: unset
        options = {k: v for k, v in kwargs.items() if k not in allowed}
        given = {k: v for k, v in kwargs.items() if k in allowed}
        for key, value in self.fixed.items():
            if key in given and not _same(key, given[key], value):
                raise ValueError(
                    f"method {self.name!r} fixes {key}={value!r} (got {given[key]!r}); "
                    "use method='feather' to choose it freely"
                )
        own = OPERATORS.get(self.fixed["operator"]) if "operator" in self.fixed else None
        if isinstance(own, ThresholdOperator) and "p" in given and float(given["p"]) != own.p:
            # said here: the operator's own message would suggest operator='feather',
            # which this method refuses
            raise ValueError(
                f"method {self.name!r} fixes operator={own.name!r}, whose p is {own.p:g} "
                f"(got p={given['p']!r}); use method='feather' to choose p"
            )
        if given.get("pattern") is not None:
            self._check_takes_pattern(given["pattern"])
        out: dict[str, Any] = {**self.fixed, **self.defaults, **given}
        default = self.defaults.get("backbone")
        chosen = given.get("backbone")
        if (
            isinstance(chosen, (str, Mapping, Backbone))
            and isinstance(default, Mapping)
            and _same("backbone", chosen, default["name"])
        ):  # the method's own backbone: it keeps the options that define the method
            if isinstance(chosen, Backbone):  # an object must carry them itself
                _backbone_object_misses(self.name, chosen, default)
            else:  # by name or mapping: the published options, the caller's win
                out["backbone"] = {**default, **(chosen if isinstance(chosen, Mapping) else {})}
        if options:
            backbone = out.get("backbone", "global")
            if isinstance(backbone, Backbone):
                raise ValueError(
                    f"backbone options {sorted(options)} given with a backbone object: pass them "
                    "to its constructor instead"
                )
            base = dict(backbone) if isinstance(backbone, Mapping) else {"name": backbone}
            if out.get("pattern") is not None and base["name"] == "global":
                base["name"] = "nm"  # the default backbone, which a pattern makes the N:M one
            cls = BACKBONES.get(base["name"])
            accepted = set(inspect.signature(cls).parameters)
            unknown = sorted(set(options) - accepted)
            if unknown:
                raise ValueError(
                    f"unknown {plural(len(unknown), 'argument')} {unknown}: neither Pruner "
                    "arguments "
                    f"({', '.join(sorted(allowed))}) nor options of backbone "
                    f"{base['name']!r} ({', '.join(sorted(accepted)) or 'none'})"
                )
            out["backbone"] = {**base, **options}
        return out

    def _pattern_obstacle(self) -> str | None:
        """What defines this method and has no N:M form, or None when it can take ``pattern=``.

        A backbone of its own other than the N:M one (GMP's uniform layers,
        Spartan's top-k) has none, nor an operator other than the thresholding
        ones (ST-3's rescaled soft threshold).
        """
        backbone = self.fixed.get("backbone")
        if backbone is not None and BACKBONES._normalize(_backbone_name(backbone)) != "nm":
            return f"backbone={backbone!r}"
        operator = self.fixed.get("operator")
        if operator is not None and not isinstance(OPERATORS.get(str(operator)), ThresholdOperator):
            return f"operator={operator!r}"
        return None

    def _check_takes_pattern(self, pattern: Any) -> None:
        obstacle = self._pattern_obstacle()
        if obstacle is None:
            return
        choices = ", ".join(
            n for n in METHODS.names() if METHODS.get(n)._pattern_obstacle() is None
        )
        raise ValueError(
            f"method {self.name!r} has no N:M form (it fixes {obstacle}), so pattern={pattern!r} "
            f"cannot apply; choose a method that trains one: {choices}"
        )

    def config(self, sparsity: float | None, **kwargs: Any) -> PrunerConfig:
        """This method's :class:`~feather_sparse.pruner_config.PrunerConfig`.

        Args:
            sparsity: final target sparsity (``None`` when a ``pattern`` implies it).
            **kwargs: as for :meth:`pruner_kwargs`, limited to the config's
                fields (not ``process_group``, which is no setting).
        """
        settings = self.pruner_kwargs(**kwargs)
        extra = sorted(set(settings) - _config_fields())
        if extra:
            raise ValueError(f"not PrunerConfig fields: {extra}; pass them to the Pruner instead")
        return PrunerConfig(sparsity, **settings)

    def build(
        self,
        model: nn.Module,
        sparsity: float | None = None,
        total_steps: int | None = None,
        **kwargs: Any,
    ) -> Pruner:
        """A :class:`~feather_sparse.pruner.Pruner` for ``model`` running this method.

        Args:
            model: the model to prune.
            sparsity: final target sparsity (implied by ``pattern=`` for N:M).
            total_steps: number of ``pruner.step()`` calls in the whole training.
            **kwargs: as for :meth:`pruner_kwargs`.

        Raises:
            ValueError: if an argument contradicts what defines the method.
        """
        return Pruner(model, sparsity, total_steps, **self.pruner_kwargs(**kwargs))


def _nm_method(
    name: str,
    summary: str,
    reference: str,
    *,
    operator: str,
    theta: float,
    backbone: dict[str, Any],
    **defaults: Any,
) -> Method:
    """A method defined by its operator and θ on the ``"nm"`` backbone.

    Its defaults are the 2:4 pattern, the backbone with the options
    ``backbone``, then ``defaults``.
    """
    return Method(
        name,
        summary,
        reference,
        fixed={"operator": operator, "theta": theta, "backbone": "nm"},
        defaults={"pattern": DEFAULT_PATTERN, "backbone": {"name": "nm", **backbone}, **defaults},
    )


METHODS: Registry[Method] = Registry("method")
METHODS.register(
    "feather",
    Method(
        "feather",
        "Feather: P_T with p = 3 and automatic θ; any operator, θ or backbone may be given",
        "Glentis Georgoulakis, Retsinas & Maragos, BMVC 2023",
    ),
)
METHODS.register(
    "feather-gmp",
    Method(
        "feather-gmp",
        "Feather (its operator and θ, any may be given) on GMP's backbone: uniform per-layer "
        "sparsity, first conv dense",
        "Glentis Georgoulakis et al. 2023, appendix (Feather with the GMP backbone)",
        fixed={"backbone": "uniform"},
        defaults={"backbone": {"name": "uniform", "keep_first_dense": True}},
    ),
)
METHODS.register(
    "hard",
    Method(
        "hard",
        "hard thresholding (p = inf) with the plain straight-through estimator (θ = 1)",
        "Bengio, Léonard & Courville 2013 (STE); the Feather paper's operator ablation (§4.1)",
        fixed={"operator": "hard", "theta": 1.0},
    ),
)
METHODS.register(
    "soft",
    Method(
        "soft",
        "soft thresholding (p = 1) with the plain straight-through estimator (θ = 1)",
        "Donoho 1995 (soft thresholding); the Feather paper's operator ablation (§4.1)",
        fixed={"operator": "soft", "theta": 1.0},
    ),
)
METHODS.register(
    "nonste",
    Method(
        "nonste",
        "Feather's operator with θ = 0: pruned weights receive no gradient",
        "Glentis Georgoulakis et al. 2023, §2.2.2 (gradient scaling, θ = 0)",
        fixed={"theta": 0.0},
    ),
)
METHODS.register(
    "gmp",
    Method(
        "gmp",
        "GMP: uniform per-layer sparsity, hard mask, zero gradient to pruned weights, "
        "first conv dense",
        "Zhu & Gupta 2017, 'To prune, or not to prune', arXiv:1710.01878",
        fixed={"operator": "hard", "theta": 0.0, "backbone": "uniform"},
        defaults={"backbone": {"name": "uniform", "keep_first_dense": True}},
    ),
)
METHODS.register(
    "st3",
    Method(
        "st3",
        "ST-3: soft thresholding, per-output-channel rescale, identity backward, global "
        "threshold every step (backbone='global-flops' gives ST-3σ)",
        "Vanderschueren & De Vleeschouwer, WACV 2023, arXiv:2212.01076",
        fixed={"operator": "st3", "theta": 1.0},
    ),
)
METHODS.register(
    "spartan",
    Method(
        "spartan",
        "Spartan: Sinkhorn soft top-k mask, linear density (first 20 %) and β schedules, "
        "mask frozen for the last 20 %",
        "Tai, Tian & Lim, NeurIPS 2022, arXiv:2205.14107",
        fixed={"backbone": "spartan", "operator": "hard", "theta": 1.0},
        defaults={"schedule": LinearSchedule(start=0.0, end=0.2)},
    ),
)
# The N:M methods: settings of the one N:M backbone (feather_sparse.nm.backbone);
# their formulas and references are in feather_sparse.nm.methods.
METHODS.register(
    "feather-nm",
    Method(
        "feather-nm",
        "Feather for N:M: per-group threshold, P_T with p = 3, θ-scaled STE",
        "Glentis Georgoulakis et al., BMVC 2023, applied per N:M group",
        defaults={"pattern": DEFAULT_PATTERN},
    ),
)
METHODS.register(
    "hard-nm",
    Method(
        "hard-nm",
        "hard N:M mask (p = inf) with the plain straight-through estimator (θ = 1)",
        "Bengio, Léonard & Courville 2013 (STE) with the N:M mask of Zhou et al. 2021",
        fixed={"operator": "hard", "theta": 1.0},
        defaults={"pattern": DEFAULT_PATTERN},
    ),
)
METHODS.register(
    "sr-ste",
    _nm_method(
        "sr-ste",
        "SR-STE: hard N:M mask, STE, sparse-refined decay λ·(1 − mask)⊙w added to the gradient",
        "Zhou et al., ICLR 2021, arXiv:2102.04010",
        operator="hard",
        theta=1.0,
        backbone={"decay": SR_STE_DECAY},
    ),
)
METHODS.register(
    "s-ste",
    _nm_method(
        "s-ste",
        "S-STE: per-group soft threshold (p = 1), fixed per-tensor rescaling β, plain STE",
        "Hu, Zhu & Chen, NeurIPS 2024, arXiv:2409.09099",
        operator="soft",
        theta=1.0,
        backbone={"rescale": True},
    ),
)
METHODS.register(
    "oneshot-nm",
    _nm_method(
        "oneshot-nm",
        "one-shot magnitude N:M at schedule.start (default half-way), then fine-tuning with "
        "the mask fixed",
        "Mishra et al. 2021, arXiv:2104.08378 (ASP: prune once, fine-tune with a fixed mask)",
        operator="hard",
        theta=0.0,
        backbone={"freeze": True},
        schedule={"name": "constant", "start": ONESHOT_START},
    ),
)


def make_pruner(
    model: nn.Module,
    method: str | Method = "feather",
    *,
    sparsity: float | None = None,
    total_steps: int | None = None,
    **kwargs: Any,
) -> Pruner:
    """A Pruner running ``method`` (a name in :data:`METHODS`, or a :class:`Method`).

    Args:
        model: the model to prune.
        method: ``"feather"`` (default), ``"feather-gmp"``, ``"hard"``, ``"soft"``,
            ``"nonste"``, ``"gmp"``, ``"st3"``, ``"spartan"``, the N:M methods
            ``"feather-nm"``, ``"hard-nm"``, ``"sr-ste"``, ``"s-ste"``,
            ``"oneshot-nm"``, or a :class:`Method`.
        sparsity: final target sparsity (implied by ``pattern=`` for N:M).
        total_steps: number of ``pruner.step()`` calls in the whole training
            (may be left out for an N:M pattern applied from the first step).
        **kwargs: any other :class:`~feather_sparse.pruner.Pruner` argument
            (``backbone``, ``schedule``, ``exclude``, ...; ``None`` leaves it to
            the method), and options of the method's backbone
            (``keep_first_dense``, ``beta_target``, ``lam``, ...).

    Returns:
        The attached :class:`~feather_sparse.pruner.Pruner`.

    Raises:
        ValueError: for an unknown method (listing the choices) or an argument
            that contradicts the method.

    Example:
        >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> pruner = make_pruner(model, "gmp", sparsity=0.5, total_steps=100)
        >>> pruner.backbone.config()
        {'name': 'uniform', 'keep_first_dense': True}
    """
    spec = METHODS.get(method)
    if not isinstance(spec, Method):
        raise ValueError(f"method must be one of {', '.join(METHODS.names())} or a Method")
    return spec.build(model, sparsity, total_steps, **kwargs)


# ---------------------------------------------------------- from a training config
def _method(config: TrainConfig) -> Method:
    if config.method not in METHODS:
        raise ValueError(
            f"method: unknown method {config.method!r}; choose one of: {', '.join(METHODS.names())}"
        )
    method: Method = METHODS.get(config.method)
    return method


def check_method(config: TrainConfig) -> None:
    """Raise unless ``config`` is dense or its pruning fields make a Pruner config.

    The same checks :func:`build_pruner` makes (through :func:`pruner_config`),
    before a model exists: a registered method, an N:M method given its
    pattern, no field the method fixes set otherwise.

    Args:
        config: the run's ``TrainConfig``.

    Raises:
        ValueError: naming the field and the choices, or the contradiction.
    """
    if not config.dense:
        pruner_config(config)


def _check_pattern(method: Method, config: TrainConfig) -> None:
    if config.pattern is None and "pattern" in method.defaults:
        raise ValueError(
            f"method {method.name!r} trains an N:M pattern: set pattern "
            f"(--pattern {method.defaults['pattern']}, or 4:8, 1:4)"
        )


def _schedule_unset(config: TrainConfig) -> bool:
    """Whether the config's schedule fields all hold their defaults (the method may decide)."""
    names = ("schedule", "schedule_start", "schedule_end")
    defaults = {f.name: f.default for f in dataclasses.fields(type(config)) if f.name in names}
    return all(getattr(config, name) == defaults[name] for name in names)


def pruner_config(config: TrainConfig) -> PrunerConfig:
    """The :class:`~feather_sparse.pruner_config.PrunerConfig` a training config asks for.

    ``config.method`` picks the :class:`Method`; ``operator``, ``p``,
    ``theta`` and ``backbone`` left unset (``None``) are the method's to
    decide, and one set to a value the method fixes otherwise is an error
    (``method=gmp, operator=soft``; ``method=hard, operator=feather``), while
    the same value is fine. The schedule fields are passed on unless they
    all hold their defaults and the method has its own schedule (Spartan's,
    one-shot N:M's) or ``pattern`` is set (then the N:M default: the full
    pattern from the first step). With ``pattern``, the sparsity is the
    pattern's; an N:M method without ``pattern`` is an error.

    Args:
        config: the run's ``TrainConfig``.

    Raises:
        ValueError: for an unknown method (naming the field and the choices),
            a field that contradicts the method, or a value outside its rule.
    """
    method = _method(config)
    _check_pattern(method, config)
    schedule: dict[str, Any] | None = {
        "name": config.schedule,
        "start": config.schedule_start,
        "end": config.schedule_end,
    }
    own = "schedule" in method.defaults or config.pattern is not None
    if own and _schedule_unset(config):
        schedule = None  # the method's own schedule (N:M: the full pattern from the first step)
    return method.config(
        None if config.pattern is not None else config.sparsity,  # a pattern implies it
        operator=config.operator,
        p=config.p,
        theta=config.theta,
        backbone=config.backbone,
        schedule=schedule,
        theta_rule=config.theta_rule,
        update_every=config.update_every,
        exclude=config.exclude,
        max_layer_sparsity=config.max_layer_sparsity,
        pattern=config.pattern,
        conv_order=config.conv_order,  # an option of the N:M backbone (None: its default)
    )


def build_pruner(config: TrainConfig, model: nn.Module, total_steps: int) -> Pruner | None:
    """The Pruner a training config asks for, attached to ``model``; ``None`` when dense.

    The one place that turns a ``TrainConfig`` into a Pruner: the settings
    come from :func:`pruner_config` (which says how a method's own settings
    and the config's combine). With an N:M ``pattern``, layers that cannot
    hold it (a reduction dimension not a multiple of M) are added to
    ``exclude`` and stay dense, with a warning naming them.

    Args:
        config: the run's ``TrainConfig``.
        model: the model to prune.
        total_steps: number of ``pruner.step()`` calls in the whole training.

    Raises:
        ValueError: for an unknown method, a field that contradicts it, or a
            model the Pruner cannot attach to.
    """
    if config.dense:
        return None
    settings = pruner_config(config)
    if settings.pattern is not None:
        settings = _leave_misfits_dense(model, settings)
    return Pruner.from_config(model, settings, total_steps)


def _leave_misfits_dense(model: nn.Module, settings: PrunerConfig) -> PrunerConfig:
    """``settings`` with the layers that cannot hold its N:M pattern added to ``exclude``.

    A training run asks for a pattern over a whole model, whose first layer
    (1 input channel, kernel 5 in the bundled CNN) often has a reduction
    dimension that is not a multiple of M: such layers stay dense, named in a
    warning and in the Pruner's recorded ``exclude``. (The library's Pruner,
    asked directly, raises instead, so nothing is skipped silently there.)

    Raises:
        ValueError: when no layer can hold the pattern (see :func:`_misfits`).
    """
    misfits = _misfits(model, settings)
    if not misfits:
        return settings
    pattern = NMPattern.parse(settings.pattern or "")
    logger.warning(
        "pattern %s: %s %s cannot be split into groups of %d along the reduction "
        "dimension; %s dense",
        pattern,
        plural(len(misfits), "layer"),
        ", ".join(misfits),
        pattern.m,
        plural(len(misfits), "it stays", "they stay"),
    )
    return dataclasses.replace(settings, exclude=(*settings.exclude, *misfits))


def _misfits(model: nn.Module, settings: PrunerConfig) -> list[str]:
    """The selected layers of ``model`` that cannot hold ``settings``' N:M pattern.

    Raises:
        ValueError: when that is every selected layer: the pattern would leave
            the model dense. The message names an M that fits some layer.
    """
    pattern = NMPattern.parse(settings.pattern or "")
    conv_order = getattr(settings.make_backbone(), "conv_order", "flat")
    targets = _find_targets(model, settings.include, settings.exclude, settings.min_params)
    laid = [(t, layer_order(t.module, t.weight, conv_order)) for t in targets]

    def fits(t: Any, order: str, nm: NMPattern) -> bool:
        try:
            check_layout(t.name, t.module, t.weight, nm, order)
        except ValueError:
            return False
        return True

    misfits = [t.name for t, order in laid if not fits(t, order, pattern)]
    if targets and len(misfits) == len(targets):
        others = [f"2:{m}" for m in (4, 8, 16, 2) if m != pattern.m]
        fitting = next(
            (o for o in others if any(fits(t, order, NMPattern.parse(o)) for t, order in laid)),
            None,
        )
        fix = (
            f"choose a pattern whose M divides them (e.g. {fitting})"
            if fitting
            else ("train unstructured (sparsity) instead")
        )
        raise ValueError(
            f"pattern {pattern} fits no prunable layer of the model: the reduction dimension "
            f"of every one ({', '.join(misfits)}) is not a multiple of M = {pattern.m}; {fix}"
        )
    return misfits


def check_layers(config: TrainConfig, model: nn.Module) -> None:
    """The checks of ``config`` that need ``model``'s layers, without a Pruner.

    The ``include``/``exclude`` names exist in the model, and an N:M pattern
    fits at least one layer. ``model`` may live on the meta device: only the
    layers' names, types and shapes are read.

    Args:
        config: the run's ``TrainConfig``.
        model: the model the run would build, on any device.

    Raises:
        ValueError: naming the field and the fix, as :func:`build_pruner` would.
    """
    if config.dense:
        return
    settings = pruner_config(config)
    if settings.pattern is not None:
        _misfits(model, settings)
    else:
        _find_targets(model, settings.include, settings.exclude, settings.min_params)
