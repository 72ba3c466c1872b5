"""The Pruner: attaches Feather to a model and drives it during training.

Glentis Georgoulakis, Retsinas & Maragos, "Feather: An Elegant Solution to
Effective DNN Sparsification", BMVC 2023. Every prunable weight ``w`` is
replaced, in the layer's forward only, by ``P_T(w)`` (eq. 3) through
``torch.nn.utils.parametrize``; the optimizer keeps updating the dense ``w``
(the straight-through estimator, eq. 1-2) with the pruned weights' gradients
scaled by ``θ`` (eq. 4). The thresholds come from a backbone (§3) at the
sparsity a schedule requests, recomputed after every optimizer step.

Usage, like an LR scheduler::

    pruner = Pruner(model, sparsity=0.9, total_steps=epochs * len(loader))
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(); loss.backward(); optimizer.step()
        pruner.step()
    pruner.finalize()   # bakes P_T(w) into plain weights, exact zeros
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from feather_sparse._version import __version__
from feather_sparse.backbones import (
    BACKBONES,
    Backbone,
    PruneTarget,
    layer_thresholds_at_most,
)
from feather_sparse.nm import NMBackbone, NMPattern, nm_pruner_settings
from feather_sparse.ops import OPERATORS, Operator, OutputCache, ThresholdOperator, compute_dtype
from feather_sparse.schedules import SCHEDULES, CubicSchedule, Schedule

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "DEFAULT_INCLUDE",
    "LayerReport",
    "Pruner",
    "PrunerReport",
    "auto_theta",
]

logger = logging.getLogger(__name__)

#: Layer types pruned by default: every convolution and linear weight, as in
#: the authors' released code (first conv and classifier included; biases and
#: normalisation layers never).
DEFAULT_INCLUDE: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)

#: The automatic θ rule's boundary (§2.2.2): θ = 0.5 for final sparsity S at or
#: above it, 1.0 below.
AUTO_THETA_BOUNDARY = 0.95
AUTO_THETA_LOW = 0.5

STATE_FORMAT = "feather-sparse-pruner"


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
    raise ValueError(f"unknown theta rule {rule!r}; choose one of: paper, released")


class FeatherParametrization(nn.Module):
    """``weight -> operator(weight, threshold, θ)``, registered with ``parametrize``.

    The threshold is a 0-d buffer on the weight's device, written in place by
    the Pruner, so the forward never synchronises with the host and a compiled
    graph sees a tensor input, not a constant (no recompilation when it moves).
    It is not persistent: the Pruner's own ``state_dict`` holds it.

    With ``backbone`` given (backbones that override
    :meth:`~feather_sparse.backbones.Backbone.forward_weight`, e.g. ASL+ and
    Spartan), the forward is ``backbone.forward_weight(index, weight, ...)``.
    """

    threshold: Tensor

    def __init__(
        self,
        operator: Operator,
        theta: float,
        threshold: Tensor,
        backbone: Backbone | None = None,
        index: int = 0,
    ) -> None:
        super().__init__()
        self.operator = operator
        self.theta = theta
        self.backbone = backbone
        self.index = index
        self.register_buffer("threshold", threshold, persistent=False)
        # The operator's output memory, reused from step to step on CPU (see OutputCache).
        self.cache = OutputCache()

    def forward(self, weight: Tensor) -> Tensor:
        if self.backbone is not None:
            return self.backbone.forward_weight(
                self.index, weight, self.threshold, self.operator, self.theta
            )
        if isinstance(self.operator, ThresholdOperator):
            return self.operator(weight, self.threshold, self.theta, cache=self.cache)
        return self.operator(weight, self.threshold, self.theta)

    def extra_repr(self) -> str:
        return f"operator={self.operator!r}, theta={self.theta}"


@dataclass(frozen=True)
class LayerReport:
    """One prunable tensor's state."""

    name: str
    shape: tuple[int, ...]
    params: int
    threshold: float
    sparsity: float
    collapsed: bool  # every weight pruned: the layer outputs only its bias


@dataclass(frozen=True)
class PrunerReport:
    """Per-layer rows and totals, as returned by :meth:`Pruner.report`."""

    step: int
    target_sparsity: float
    scheduled_sparsity: float
    sparsity: float
    params: int
    layers: tuple[LayerReport, ...]
    pattern: str | None = None  # "2:4" for N:M pruning

    @property
    def collapsed(self) -> list[str]:
        """Names of the layers pruned to 100 %."""
        return [row.name for row in self.layers if row.collapsed]

    def table(self) -> str:
        """The rows as a Markdown table (for printing by the caller)."""
        lines = []
        if self.pattern:
            lines += [f"N:M pattern {self.pattern} (threshold: mean over groups)", ""]
        lines += [
            "| layer | shape | params | threshold | sparsity |",
            "|---|---|---:|---:|---:|",
        ]
        for r in self.layers:
            flag = " **collapsed**" if r.collapsed else ""
            shape = "×".join(map(str, r.shape))
            lines.append(
                f"| {r.name} | {shape} | {r.params:,} | {r.threshold:.4g} "
                f"| {r.sparsity:.2%}{flag} |"
            )
        lines.append(f"| **total** | | {self.params:,} | | {self.sparsity:.2%} |")
        return "\n".join(lines)


def _resolve_schedule(schedule: Any) -> Schedule | Callable[[int], float]:
    if schedule is None:
        return CubicSchedule()
    if isinstance(schedule, str):
        cls: type[Schedule] = SCHEDULES.get(schedule)
        return cls()
    if isinstance(schedule, dict):
        cfg = dict(schedule)
        cls = SCHEDULES.get(cfg.pop("name"))
        return cls(**cfg)
    if isinstance(schedule, Schedule) or callable(schedule):
        return schedule
    raise ValueError(
        f"schedule must be a name ({', '.join(SCHEDULES.names())}), a Schedule, "
        f"or a callable step -> sparsity; got {schedule!r}"
    )


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


def _resolve_backbone(backbone: str | Backbone | dict[str, Any]) -> Backbone:
    if isinstance(backbone, Backbone):
        return backbone
    if isinstance(backbone, dict):
        cfg = dict(backbone)
        cls = BACKBONES.get(cfg.pop("name"))
        return cls(**cfg)
    cls = BACKBONES.get(backbone)
    if not (isinstance(cls, type) and issubclass(cls, Backbone)):
        raise ValueError(
            f"backbone must be one of {', '.join(BACKBONES.names())} or a Backbone, "
            f"got {backbone!r}"
        )
    return cls()


def _matches(name: str, patterns: Iterable[str], children: bool) -> bool:
    """Whether ``name`` is one of ``patterns`` (a name, or ``"re:<regex>"`` matched in full).

    With ``children``, a plain name also matches every module below it.
    """
    for pat in patterns:
        if pat.startswith("re:"):
            if re.fullmatch(pat[3:], name):
                return True
        elif name == pat or (children and name.startswith(pat + ".")):
            return True
    return False


def _find_targets(
    model: nn.Module,
    include: Sequence[type[nn.Module] | str],
    exclude: Sequence[str],
    min_params: int,
) -> list[PruneTarget]:
    types = tuple(i for i in include if isinstance(i, type))
    names = [i for i in include if isinstance(i, str)]
    for pat in [*names, *exclude]:
        if pat.startswith("re:"):
            try:
                re.compile(pat[3:])
            except re.error as err:
                raise ValueError(f"invalid regular expression in {pat!r}: {err}") from None
    targets = []
    for name, module in model.named_modules():
        if not (isinstance(module, types) or (names and _matches(name, names, children=False))):
            continue
        if _matches(name, exclude, children=True):
            continue
        weight = getattr(module, "weight", None)
        if not isinstance(weight, Tensor) or not weight.is_floating_point():
            continue
        if weight.numel() < min_params:
            continue
        targets.append(PruneTarget(name, module))
    return targets


class Pruner:
    """Prune a model to an unstructured sparsity during training, with Feather.

    Args:
        model: any ``nn.Module``; its prunable weights get a parametrization,
            nothing else changes (the modules, their forward, the parameters the
            optimizer holds).
        sparsity: final target sparsity ``S`` in ``[0, 1)``, over all prunable weights
            (implied by ``pattern``; required otherwise).
        total_steps: number of :meth:`step` calls in the whole training
            (``epochs × batches per epoch``); the schedule is laid out on it.
        operator: ``"feather"`` (p = 3, default), ``"soft"`` (p = 1),
            ``"hard"`` (p = inf), or an :class:`~feather_sparse.ops.Operator`.
        p: the operator's power, overriding ``operator``'s (Feather family only).
        theta: gradient scale of pruned weights in ``[0, 1]``, or ``"auto"``
            (the paper's rule, see :func:`auto_theta`).
        theta_rule: boundary of the auto rule: ``"paper"`` (S ≥ 0.95) or
            ``"released"`` (S > 0.95, the authors' code).
        backbone: ``"global"`` (one threshold, the paper's main backbone), another
            registered name, or a :class:`~feather_sparse.backbones.Backbone`.
        schedule: a :class:`~feather_sparse.schedules.Schedule` (default
            ``CubicSchedule(start=0, end=0.5)``), a registered name, or any
            callable ``step -> sparsity``.
        update_every: recompute thresholds every this many steps (1 = every
            step, as in the paper).
        include: layer types to prune, and/or module names / ``"re:"`` patterns.
        exclude: module names (a name also excludes its children) or
            ``"re:<regex>"`` patterns (full match) never to prune.
        min_params: skip weights with fewer elements.
        max_layer_sparsity: layer-collapse guard, off (``None``) by default as in
            the paper: cap each layer's threshold so that at most this fraction of
            the layer is pruned. With the guard active the overall sparsity can
            fall below the target (the capped layers keep more weights).
        check_finite: raise at :meth:`step` if a weight holds NaN or inf.
        process_group: for *sharded* weights only — the ``torch.distributed``
            group the prunable weights are sharded over. When the weights are
            DTensors (FSDP2 ``fully_shard``) each rank selects
            on its local shard and the counts are all-reduced over this group,
            so every rank gets the exact global threshold without gathering the
            weights; ``None`` takes the group from the weights' device mesh.
            Plain (replicated) weights, as under DDP, never use it: every rank
            computes the identical threshold locally, with no communication.
        pattern: ``"N:M"`` (e.g. ``"2:4"``) for N:M sparsity with Feather's
            per-group thresholds (:mod:`feather_sparse.nm`): implies
            ``sparsity = (M − N)/M`` and the N:M backbone; ``schedule``
            decides how the pattern is reached (default: from the first
            step) and ``total_steps`` may then be left out.

    Raises:
        ValueError: for invalid arguments, a model with no prunable layer, or a
            model already pruned. Nothing in the model is modified then.
    """

    def __init__(
        self,
        model: nn.Module,
        sparsity: float | None = None,
        total_steps: int | None = None,
        operator: str | Operator = "feather",
        p: float | None = None,
        theta: float | str = "auto",
        backbone: str | Backbone | dict[str, Any] = "global",
        schedule: Schedule | Callable[[int], float] | str | dict[str, Any] | None = None,
        update_every: int = 1,
        include: Sequence[type[nn.Module] | str] = DEFAULT_INCLUDE,
        exclude: Sequence[str] = (),
        min_params: int = 0,
        max_layer_sparsity: float | None = None,
        theta_rule: str = "paper",
        check_finite: bool = True,
        process_group: ProcessGroup | None = None,
        pattern: str | NMPattern | None = None,
    ) -> None:
        # --- validate everything before touching the model -------------------
        if pattern is not None:  # N:M: the pattern fixes sparsity and backbone
            sparsity, backbone, schedule, total_steps = nm_pruner_settings(
                pattern, sparsity, backbone, schedule, total_steps, max_layer_sparsity
            )
        if sparsity is None:
            raise ValueError("sparsity is required (or pattern='N:M' for N:M sparsity)")
        if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)):
            raise ValueError(f"sparsity must be a number in [0, 1), got {sparsity!r}")
        if not 0.0 <= sparsity < 1.0:
            raise ValueError(
                f"sparsity must be in [0, 1) (e.g. 0.9 keeps 10 % of the weights), got {sparsity}"
            )
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps <= 0:
            raise ValueError(
                "total_steps must be a positive int (epochs × batches per epoch), "
                f"got {total_steps!r}"
            )
        if isinstance(update_every, bool) or not isinstance(update_every, int) or update_every < 1:
            raise ValueError(f"update_every must be an int >= 1, got {update_every!r}")
        if isinstance(min_params, bool) or not isinstance(min_params, int) or min_params < 0:
            raise ValueError(f"min_params must be an int >= 0, got {min_params!r}")
        if max_layer_sparsity is not None and not 0.0 <= max_layer_sparsity < 1.0:
            raise ValueError(
                f"max_layer_sparsity must be in [0, 1) or None, got {max_layer_sparsity}"
            )
        if isinstance(include, (str, type)):
            include = (include,)
        if isinstance(exclude, str):
            exclude = (exclude,)
        self._theta_spec = theta
        if theta == "auto":
            resolved_theta = auto_theta(float(sparsity), theta_rule)
        elif isinstance(theta, str):
            raise ValueError(f"theta must be a number in [0, 1] or 'auto', got {theta!r}")
        else:
            auto_theta(0.0, theta_rule)  # validates the rule name
            resolved_theta = float(theta)
        if not 0.0 <= resolved_theta <= 1.0:
            raise ValueError(
                f"theta must be in [0, 1] (1 = plain STE, 0 = non-STE) or 'auto', got {theta}"
            )
        self.operator = _resolve_operator(operator, p)
        self.backbone = _resolve_backbone(backbone)
        self.schedule = _resolve_schedule(schedule)
        targets = _find_targets(model, include, exclude, min_params)
        if not targets:
            raise ValueError(
                f"no prunable layer found in {type(model).__name__}: include={_names(include)}, "
                f"exclude={list(exclude)}, min_params={min_params} matched no module with a "
                "floating-point `weight`; widen `include` or relax `exclude`/`min_params`"
            )
        for t in targets:
            if parametrize.is_parametrized(t.module, "weight"):
                raise ValueError(
                    f"layer {t.name!r} already has a parametrization on its weight (a Pruner is "
                    "attached, or another parametrization is): call pruner.remove() or "
                    "pruner.finalize() on the earlier Pruner first"
                )
        if _fsdp_managed(model, targets):
            raise ValueError(
                "the model's prunable weights are already sharded by FSDP2 (fully_shard): attach "
                "the Pruner to the unsharded model first, then call fully_shard (FSDP2 tracks "
                "each parameter where it was registered, and the Pruner's parametrization moves it)"
            )
        ddp_indices = _ddp_reducer_indices(model)
        devices = {t.weight.device for t in targets}
        if len(devices) > 1 and self.backbone.name.startswith("global"):
            raise ValueError(
                f"prunable weights live on several devices ({sorted(map(str, devices))}); the "
                "global threshold needs them on one device"
            )

        self.model = model
        self.sparsity = float(sparsity)
        self.total_steps = total_steps
        self.theta = resolved_theta
        self.theta_rule = theta_rule
        self.update_every = update_every
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        self.min_params = min_params
        self.max_layer_sparsity = max_layer_sparsity
        self.check_finite = check_finite
        self.process_group = process_group
        self.targets = targets
        self._step = 0
        self._finished = False
        self._warned_collapse: set[str] = set()
        self.backbone.setup(targets)

        # --- attach: thresholds for step 0, then the parametrizations --------
        thresholds = self._compute_thresholds(self.scheduled_sparsity(0))
        # Route the forward through the backbone only when it changes it.
        hook = self.backbone if _overrides(self.backbone, "forward_weight") else None
        attached: list[PruneTarget] = []
        try:
            for index, (t, value) in enumerate(zip(targets, thresholds)):
                buf = (
                    value.detach()
                    .to(device=t.weight.device, dtype=compute_dtype(t.weight.dtype))
                    .clone()
                )
                param = FeatherParametrization(self.operator, self.theta, buf, hook, index)
                parametrize.register_parametrization(t.module, "weight", param)
                attached.append(t)
        except Exception:
            for t in attached:  # leave the model as we found it
                parametrize.remove_parametrizations(t.module, "weight", leave_parametrized=False)
            _reconnect_ddp(ddp_indices, [t.weight for t in attached])
            raise
        _reconnect_ddp(ddp_indices, [t.weight for t in targets])
        self._current = self.scheduled_sparsity(0)
        logger.info(
            "Feather pruner attached to %d tensors (%s weights), target sparsity %.4g, theta %.3g",
            len(targets),
            f"{self.num_params:,}",
            self.sparsity,
            self.theta,
        )

    # ------------------------------------------------------------------ queries
    @property
    def num_params(self) -> int:
        """Number of prunable weights ``N``."""
        return sum(t.numel for t in self.targets)

    @property
    def current_step(self) -> int:
        """Number of :meth:`step` calls so far."""
        return self._step

    def scheduled_sparsity(self, step: int | None = None) -> float:
        """The sparsity the schedule requests at ``step`` (default: the current step)."""
        step = self._step if step is None else step
        if isinstance(self.schedule, Schedule):
            s = self.schedule(step, self.total_steps, self.sparsity)
        else:
            s = float(self.schedule(step))
        if not 0.0 <= s <= 1.0:
            raise ValueError(
                f"the schedule returned sparsity {s} at step {step}; it must be in [0, 1]"
            )
        return s

    def _parametrization(self, target: PruneTarget) -> FeatherParametrization:
        parametrizations: Any = target.module.parametrizations
        plist: Any = parametrizations["weight"]
        p: FeatherParametrization = plist[0]
        return p

    def thresholds(self) -> list[Tensor]:
        """The current 0-d threshold of each prunable tensor (the live buffers)."""
        self._check_attached()
        return [self._parametrization(t).threshold for t in self.targets]

    def weights(self) -> list[Tensor]:
        """The stored dense weights (what the optimizer updates)."""
        return [t.weight for t in self.targets]

    def _local_weights(self) -> tuple[list[Tensor], ProcessGroup | None]:
        """This rank's part of each prunable weight (detached) and the group it is sharded over.

        Plain tensors are whole weights (replicated under DDP): group None.
        DTensors (FSDP2) give their local shard and
        ``process_group`` or their mesh's group. A replicated weight among
        sharded ones is counted on the group's rank 0 only (an empty view
        elsewhere), so every weight counts once.
        """
        weights = [w.detach() for w in self.weights()]
        dtensor = _dtensor_type()
        if dtensor is None or not any(isinstance(w, dtensor) for w in weights):
            return weights, None
        group = self.process_group
        if group is None:
            group = _common_shard_group([w for w in weights if isinstance(w, dtensor)])
        if group is None:  # DTensors replicated on every mesh dimension
            return [_to_local(w) if isinstance(w, dtensor) else w for w in weights], None
        import torch.distributed as dist

        first = dist.get_rank(group) == 0
        local = []
        for w in weights:
            if isinstance(w, dtensor) and _shard_group(w) is not None:
                local.append(_to_local(w))
            else:
                whole = _to_local(w) if isinstance(w, dtensor) else w
                local.append(whole if first else whole.reshape(-1)[:0])
        return local, group

    def _layer_zeros(self) -> list[int]:
        weights, group = self._local_weights()
        counts = torch.stack(
            [
                torch.count_nonzero(self.backbone.pruned_mask(i, w, th))
                for i, (w, th) in enumerate(zip(weights, self.thresholds()))
            ]
        )
        if group is not None:
            import torch.distributed as dist

            dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=group)
        return [int(c) for c in counts.tolist()]

    def sparsity_achieved(self) -> float:
        """The fraction of prunable weights the forward currently zeroes."""
        return sum(self._layer_zeros()) / self.num_params

    def report(self) -> PrunerReport:
        """Per-layer name, shape, params, threshold and sparsity; flags collapsed layers."""
        zeros = self._layer_zeros()
        rows = []
        weights, _ = self._local_weights()
        for i, (t, w, th, z) in enumerate(zip(self.targets, weights, self.thresholds(), zeros)):
            rows.append(
                LayerReport(
                    name=t.name,
                    shape=t.shape,
                    params=t.numel,
                    threshold=self.backbone.report_threshold(i, w, th),
                    sparsity=z / t.numel,
                    collapsed=z == t.numel,
                )
            )
        report = PrunerReport(
            step=self._step,
            target_sparsity=self.sparsity,
            scheduled_sparsity=self._current,
            sparsity=sum(zeros) / self.num_params,
            params=self.num_params,
            layers=tuple(rows),
            pattern=str(self.backbone.pattern) if isinstance(self.backbone, NMBackbone) else None,
        )
        self._warn_collapsed(report.collapsed)
        return report

    def _warn_collapsed(self, names: Iterable[str]) -> None:
        new = [n for n in names if n not in self._warned_collapse]
        if new:
            self._warned_collapse.update(new)
            logger.warning(
                "layer collapse: %s pruned to 100 %% (every weight below the global threshold); "
                "such a layer passes no signal. Consider max_layer_sparsity=0.99, gradient "
                "clipping, or excluding the layer.",
                ", ".join(new),
            )

    # ------------------------------------------------------------------ updates
    def _compute_thresholds(self, sparsity: float) -> list[Tensor]:
        weights, group = self._local_weights()
        if group is not None:
            if not self.backbone.supports_sharding:
                able = [n for n in BACKBONES.names() if BACKBONES.get(n).supports_sharding]
                raise ValueError(
                    f"backbone {self.backbone.name!r} does not support sharded (FSDP2/DTensor) "
                    f"weights; use one that does ({', '.join(able)})"
                )
            self.backbone.process_group = group
        # The global backbone's search measures max |w| per tensor on the way,
        # so its finite check comes after the search at no cost; any other
        # backbone is checked before, with one read-only pass per tensor.
        after = self.check_finite and self.backbone.measures_abs_max
        maxima = None
        if self.check_finite and not after:
            maxima = self._abs_maxima(weights, group, measured=None)
            self._check_finite(maxima)
        self.backbone.advance(self._step, self.total_steps, self.sparsity)
        try:
            thresholds = self.backbone.thresholds(weights, sparsity)
        except ValueError:
            if after:  # a NaN weight can make the search fail: name the layer instead
                self._check_finite(self._abs_maxima(weights, group, measured=None))
            raise
        if after:
            maxima = self._abs_maxima(weights, group, measured=self.backbone.abs_max())
            self._check_finite(maxima)
        if len(thresholds) != len(weights):
            raise RuntimeError(
                f"backbone {self.backbone.name!r} returned {len(thresholds)} thresholds for "
                f"{len(weights)} tensors"
            )
        if self.max_layer_sparsity is not None:
            caps = layer_thresholds_at_most(weights, self.max_layer_sparsity, group)
            thresholds = [torch.minimum(t, c.to(t)) for t, c in zip(thresholds, caps)]
        if maxima is not None and sparsity > 0 and self.backbone.thresholds_are_magnitudes:
            # Collapse check for free: a layer is fully pruned when T_l >= max |w_l|.
            ts = torch.stack([t.detach().float().reshape(()).to(maxima.device) for t in thresholds])
            if bool((ts >= maxima).any()):
                flags = (ts >= maxima).tolist()
                self._warn_collapsed(t.name for t, f in zip(self.targets, flags) if f)
        return thresholds

    @staticmethod
    def _abs_maxima(
        weights: Sequence[Tensor], group: ProcessGroup | None, measured: Tensor | None
    ) -> Tensor:
        """``max |w|`` per tensor (over all shards), NaN where a tensor holds a NaN.

        ``measured``: the backbone's own measurement of this rank's tensors,
        if it made one; else one read-only pass per tensor (``aminmax``
        propagates NaN and inf; ``|w|.amax()`` would also write a full-size
        temporary).
        """
        maxima = measured if measured is not None else torch.stack([_abs_max(w) for w in weights])
        if group is not None:
            maxima = _all_reduce_max(maxima, group)
        return maxima

    def _check_finite(self, maxima: Tensor) -> None:
        if not bool(torch.isfinite(maxima).all()):
            bad = [t.name for t, m in zip(self.targets, maxima.tolist()) if not math.isfinite(m)]
            raise RuntimeError(
                f"non-finite weights (NaN or inf) in layer(s) {', '.join(bad)} at step "
                f"{self._step}: training diverged; lower the learning rate or clip gradients"
            )

    @torch.no_grad()
    def _write_thresholds(self, thresholds: Sequence[Tensor]) -> None:
        for buf, value in zip(self.thresholds(), thresholds):
            buf.copy_(value)  # same device as the weight: no host round trip

    def step(self) -> None:
        """Advance one training step; call after ``optimizer.step()``.

        Recomputes the thresholds for the next forward from the current
        weights at the schedule's sparsity (every ``update_every`` steps).

        Raises:
            RuntimeError: if a weight is NaN or inf (naming the layer), or the
                Pruner was finalized or removed.
        """
        self._check_attached()
        self._step += 1
        if self._step % self.update_every == 0:
            self.update()

    def update(self, sparsity: float | None = None) -> None:
        """Recompute the thresholds now, at ``sparsity`` (default: the schedule's)."""
        self._check_attached()
        s = self.scheduled_sparsity() if sparsity is None else float(sparsity)
        self._write_thresholds(self._compute_thresholds(s))
        self._current = s

    # --------------------------------------------------------- extra training terms
    def parameters(self) -> list[nn.Parameter]:
        """Trainable parameters of the backbone (e.g. ASL+'s per-layer thresholds); may be empty."""
        return self.backbone.parameters()

    def regularizer(self) -> Tensor:
        """The backbone's extra loss term (0 for the global backbone); add it to the task loss."""
        reg = self.backbone.regularizer()
        if reg is None:
            return torch.zeros((), device=self.targets[0].weight.device)
        return reg

    # ------------------------------------------------------------------ ending
    @torch.no_grad()
    def finalize(self, sparsity: float | None = None) -> float:
        """Bake ``P_T(w)`` into the weights and detach; returns the achieved sparsity.

        The thresholds are recomputed from the final weights at the target
        sparsity (or ``sparsity``), the thresholded weights — shrunk values,
        not merely masked ones — are written into the same ``Parameter``
        objects, and the parametrizations are removed, leaving a plain model
        with exact zeros.

        Raises:
            RuntimeError: if the Pruner was already finalized or removed, or
                the weights are sharded by FSDP2 (its modules cannot drop the
                parametrization; see ``docs/distributed.md`` for the recipe).
        """
        self._check_attached()
        self._check_unshardable("finalize")
        target = self.sparsity if sparsity is None else float(sparsity)
        self.update(target)
        if _overrides(self.backbone, "check_final"):  # what will be baked, while undoable
            for i, t in enumerate(self.targets):
                self.backbone.check_final(i, self._parametrization(t)(t.weight))
        for t in self.targets:
            parametrize.remove_parametrizations(t.module, "weight", leave_parametrized=True)
        self._finished = True
        weights, group = self._local_weights()
        counts = torch.stack([torch.count_nonzero(w == 0) for w in weights])
        if group is not None:
            import torch.distributed as dist

            dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=group)
        zeros = int(counts.sum())
        achieved = zeros / self.num_params
        expected = round(target * self.num_params)
        if self.max_layer_sparsity is None and zeros < expected:
            raise RuntimeError(
                f"finalize left {zeros} zeros, fewer than the {expected} requested: "
                "please report this bug"
            )
        if self.max_layer_sparsity is None and zeros > expected + 1:
            logger.warning(
                "finalize: %d zeros where %d were requested (%+d): weights tied at the threshold "
                "magnitude or exact zeros are all pruned",
                zeros,
                expected,
                zeros - expected,
            )
        logger.info("finalized at sparsity %.6f (target %.6f)", achieved, target)
        return achieved

    @torch.no_grad()
    def remove(self) -> None:
        """Detach without baking: the model gets its dense weights back."""
        self._check_attached()
        self._check_unshardable("remove")
        for t in self.targets:
            parametrize.remove_parametrizations(t.module, "weight", leave_parametrized=False)
        self._finished = True

    def _check_unshardable(self, what: str) -> None:
        if _fsdp_managed(self.model, self.targets):
            raise RuntimeError(
                f"{what}() needs unsharded weights, but FSDP2 shards them: take "
                "pruner.dense_state_dict(pruned=True) (DTensors; .full_tensor() gathers one) and "
                "load it into an unsharded copy of the model (docs/distributed.md shows how)"
            )

    def _check_attached(self) -> None:
        if self._finished:
            raise RuntimeError(
                "this Pruner was finalized or removed; create a new one to prune again"
            )

    # ------------------------------------------------------------------ state
    @torch.no_grad()
    def dense_state_dict(self, pruned: bool = False) -> dict[str, Tensor]:
        """The model's ``state_dict`` with plain keys (``conv.weight``), for the dense model.

        Args:
            pruned: False gives the stored dense weights (what training
                continues from); True gives ``P_T(w)``, what the forward uses now.
        """
        self._check_attached()
        remap = {_join(t.name, "parametrizations.weight.original"): t for t in self.targets}
        out: dict[str, Tensor] = {}
        for key, value in self.model.state_dict().items():
            t = remap.get(key)
            if t is None:
                out[key] = value
                continue
            plain = _join(t.name, "weight")
            if pruned:
                out[plain] = _on_local_shard(self._parametrization(t), value).detach()
            else:
                out[plain] = value
        return out

    def config(self) -> dict[str, Any]:
        """The constructor's arguments, JSON-able, so a run can be rebuilt exactly."""
        schedule = (
            self.schedule.config()
            if isinstance(self.schedule, Schedule)
            else {"name": "<callable>"}
        )
        return {
            "sparsity": self.sparsity,
            "total_steps": self.total_steps,
            "operator": self.operator.config(),
            "theta": self._theta_spec,
            "theta_rule": self.theta_rule,
            "theta_resolved": self.theta,
            "backbone": self.backbone.config(),
            "schedule": schedule,
            "update_every": self.update_every,
            "exclude": list(self.exclude),
            "min_params": self.min_params,
            "max_layer_sparsity": self.max_layer_sparsity,
            "targets": [t.name for t in self.targets],
        }

    def state_dict(self) -> dict[str, Any]:
        """Step, thresholds, backbone state and config: everything to resume identically."""
        self._check_attached()
        return {
            "format": STATE_FORMAT,
            "version": __version__,
            "step": self._step,
            "current_sparsity": self._current,
            "thresholds": [t.detach().clone() for t in self.thresholds()],
            "backbone": self.backbone.state_dict(),
            "config": self.config(),
        }

    # Fields that must agree between a saved state and this Pruner.
    _MUST_MATCH = (
        "sparsity",
        "total_steps",
        "operator",
        "theta_resolved",
        "backbone",
        "schedule",
        "update_every",
        "max_layer_sparsity",
        "targets",
    )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; the next step continues identically.

        Raises:
            ValueError: if the state is not a Pruner state, or was saved with a
                different configuration (the message names the field).
        """
        self._check_attached()
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError("not a feather-sparse Pruner state_dict (missing format marker)")
        saved, mine = state["config"], self.config()
        for key in self._MUST_MATCH:
            if saved.get(key) != mine.get(key):
                raise ValueError(
                    f"Pruner state was saved with {key}={saved.get(key)!r}, but this Pruner has "
                    f"{key}={mine.get(key)!r}; construct the Pruner with the saved settings "
                    "(Pruner.from_state_dict does this)"
                )
        thresholds = state["thresholds"]
        if len(thresholds) != len(self.targets):
            raise ValueError(
                f"state holds {len(thresholds)} thresholds, this Pruner has {len(self.targets)}"
            )
        self._write_thresholds(thresholds)
        self._step = int(state["step"])
        self._current = float(state["current_sparsity"])
        self.backbone.load_state_dict(state["backbone"])

    @classmethod
    def from_state_dict(cls, model: nn.Module, state: dict[str, Any], **overrides: Any) -> Pruner:
        """Rebuild a Pruner on ``model`` from a saved state (config included), then load it.

        Args:
            model: the same architecture, with its dense weights loaded.
            state: what :meth:`state_dict` returned.
            **overrides: constructor arguments to use instead of the saved ones
                (needed for a custom callable schedule, which cannot be saved).
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError("not a feather-sparse Pruner state_dict (missing format marker)")
        cfg = state["config"]
        op = cfg["operator"]
        kwargs: dict[str, Any] = {
            "sparsity": cfg["sparsity"],
            "total_steps": cfg["total_steps"],
            "operator": op["name"],
            "p": op.get("p"),
            "theta": cfg["theta"],
            "theta_rule": cfg["theta_rule"],
            "backbone": cfg["backbone"],
            "schedule": cfg["schedule"],
            "update_every": cfg["update_every"],
            "include": cfg["targets"],
            "max_layer_sparsity": cfg["max_layer_sparsity"],
        }
        if cfg["schedule"].get("name") == "<callable>" and "schedule" not in overrides:
            raise ValueError("this Pruner used a custom schedule callable: pass schedule=... again")
        kwargs.update(overrides)
        pruner = cls(model, **kwargs)
        pruner.load_state_dict(state)
        return pruner

    def __repr__(self) -> str:
        return (
            f"Pruner(sparsity={self.sparsity}, step={self._step}/{self.total_steps}, "
            f"operator={self.operator!r}, theta={self.theta}, backbone={self.backbone.name!r}, "
            f"tensors={len(self.targets)}, params={self.num_params:,})"
        )


def _dtensor_type() -> type | None:
    """``torch.distributed.tensor.DTensor``, or None where torch has no distributed support."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - builds without torch.distributed
        return None
    return DTensor


def _to_local(w: Any) -> Tensor:
    """A DTensor's local shard (a plain tensor view, no communication)."""
    local: Tensor = w.to_local()
    return local


def _ddp_reducer_indices(model: nn.Module) -> list[tuple[Any, dict[int, int]]]:
    """Per ``DistributedDataParallel`` inside ``model``: where each parameter sits in its reducer.

    Needed when the Pruner is attached *after* DDP wrapping (see
    :func:`_reconnect_ddp`); taken before attaching, in DDP's own order (the
    trainable, non-ignored parameters, in ``named_parameters`` order).

    Raises:
        ValueError: for DDP options under which the reconnection is not sound.
    """
    from torch.nn.parallel import DistributedDataParallel

    out = []
    for ddp in model.modules():
        if not isinstance(ddp, DistributedDataParallel):
            continue
        if (
            ddp.find_unused_parameters
            or ddp.static_graph
            or getattr(ddp, "mixed_precision", None) is not None
            or not hasattr(ddp.reducer, "_autograd_hook")
        ):
            raise ValueError(
                "attach the Pruner before wrapping the model in DistributedDataParallel when DDP "
                "uses find_unused_parameters, static_graph or mixed_precision: "
                "pruner = Pruner(model, ...); model = DistributedDataParallel(model)"
            )
        ignore = ddp.parameters_to_ignore
        order = [p for n, p in ddp.module.named_parameters() if p.requires_grad and n not in ignore]
        out.append((ddp, {id(p): i for i, p in enumerate(order)}))
    return out


def _fire_ddp_hook(ddp: Any, index: int, param: Tensor) -> None:
    ddp.reducer._autograd_hook(index)


def _reconnect_ddp(indices: list[tuple[Any, dict[int, int]]], params: Sequence[Tensor]) -> None:
    """Reconnect DDP's gradient hooks to weights that a parametrization has re-set.

    ``register_parametrization`` keeps each weight's ``Parameter`` object but
    re-sets it in place (``Tensor.set_``), which gives it a fresh gradient
    accumulator. DDP hooked the old one at construction, so its all-reduce
    would never fire for these weights. Hooks registered on the tensor itself
    (``register_post_accumulate_grad_hook``) survive such resets; each tells
    the reducer that the weight's gradient is ready, as DDP does for its own
    mixed-precision parameters.
    """
    for ddp, index in indices:
        for p in params:
            i = index.get(id(p))
            if i is not None:
                p.register_post_accumulate_grad_hook(functools.partial(_fire_ddp_hook, ddp, i))


def _fsdp_managed(model: nn.Module, targets: Sequence[PruneTarget]) -> bool:
    """Whether FSDP2 (``fully_shard``) has sharded any of the prunable weights."""
    dtensor = _dtensor_type()
    if dtensor is None or not any(isinstance(t.weight, dtensor) for t in targets):
        return False
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return False
    return any(isinstance(m, FSDPModule) for m in model.modules())


def _on_local_shard(fn: Callable[[Tensor], Tensor], w: Tensor) -> Tensor:
    """``fn(w)`` for an elementwise ``fn``; a DTensor's shards are mapped where they lie."""
    dtensor = _dtensor_type()
    if dtensor is None or not isinstance(w, dtensor):
        return fn(w)
    d: Any = w
    local = fn(d.to_local())
    out: Tensor = dtensor.from_local(  # type: ignore[attr-defined]
        local, d.device_mesh, d.placements, run_check=False, shape=d.shape, stride=d.stride()
    )
    return out


def _shard_group(w: Any) -> ProcessGroup | None:
    """The group of the one mesh dimension a DTensor is sharded on (None: replicated)."""
    dims = [i for i, p in enumerate(w.placements) if p.is_shard()]
    if not dims:
        return None
    if len(dims) > 1:
        raise ValueError(
            f"a prunable weight is sharded on {len(dims)} mesh dimensions {tuple(w.placements)}; "
            "pass Pruner(process_group=...) with the group spanning them"
        )
    group: ProcessGroup = w.device_mesh.get_group(dims[0])
    return group


def _common_shard_group(weights: Sequence[Any]) -> ProcessGroup | None:
    import torch.distributed as dist

    groups = [g for g in (_shard_group(w) for w in weights) if g is not None]
    if not groups:
        return None
    ranks = {tuple(dist.get_process_group_ranks(g)) for g in groups}
    if len(ranks) > 1:
        raise ValueError(
            f"the prunable weights are sharded over different process groups {sorted(ranks)}; "
            "pass Pruner(process_group=...) with the one group to select over"
        )
    return groups[0]


def _abs_max(w: Tensor) -> Tensor:
    """``max |w|`` as float32 (0 for an empty shard), NaN if ``w`` holds a NaN.

    ``torch.aminmax`` reads ``w`` once and writes nothing of its size.
    """
    if w.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=w.device)
    lo, hi = torch.aminmax(w)
    return torch.maximum(-lo.float(), hi.float())


def _all_reduce_max(maxima: Tensor, group: ProcessGroup) -> Tensor:
    """Elementwise max over the group, keeping NaN (a max reduction may drop it)."""
    import torch.distributed as dist

    finite = torch.isfinite(maxima)
    both = torch.stack([torch.where(finite, maxima, 0.0), (~finite).float()])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    return torch.where(both[1] > 0, math.nan, both[0])


def _overrides(obj: object, method: str) -> bool:
    """Whether ``obj``'s class overrides ``Backbone.<method>``."""
    return getattr(type(obj), method) is not getattr(Backbone, method)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _names(include: Sequence[type[nn.Module] | str]) -> list[str]:
    return [i.__name__ if isinstance(i, type) else i for i in include]
