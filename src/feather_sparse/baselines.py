"""The operators and backbones of the methods the paper compares Feather against.

ST-3's operator (``st3`` in the operator registry) and Spartan's backbone
(``spartan`` in the backbone registry); the methods themselves — which
operator, θ, backbone and schedule each one is — are in
:mod:`feather_sparse.methods` (``Method``, ``METHODS`` and ``make_pruner``
stay importable from here).

References:

- Zhu & Gupta, "To prune, or not to prune: exploring the efficacy of
  pruning for model compression", arXiv:1710.01878 (2017).
- Vanderschueren & De Vleeschouwer, "Are Straight-Through gradients and
  Soft-Thresholding all you need for Sparse Training?", WACV 2023,
  arXiv:2212.01076.
- Tai, Tian & Lim, "Spartan: Differentiable Sparsity via Regularized
  Transportation", NeurIPS 2022, arXiv:2205.14107.
- Bengio, Léonard & Courville, "Estimating or Propagating Gradients Through
  Stochastic Neurons for Conditional Computation", arXiv:1308.3432 (2013).

Every method uses the library's exact global selection (no sort, no
concatenation) where the originals take a sorted quantile; with distinct
magnitudes both prune the same weights.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from feather_sparse.backbones import (
    BACKBONES,
    Backbone,
    PruneTarget,
    _WarmStart,
    damaged_state,
    on_device,
    other_model_state,
    outside_inference_mode,
)
from feather_sparse.ops import OPERATORS, Operator, compute_dtype
from feather_sparse.selection import select_threshold

if TYPE_CHECKING:  # defined in feather_sparse.methods; see __getattr__ at the bottom
    from feather_sparse.methods import METHODS, Method, make_pruner

__all__ = [
    "METHODS",
    "Method",
    "ST3Operator",
    "SinkhornResult",
    "SpartanBackbone",
    "make_pruner",
    "sinkhorn_topk",
    "soft_topk_mask",
    "st3_rescale",
]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------- ST-3
#: ST-3's smoothing constants:
#: ρ_c = (mean(|w|·m) + EPS) / (mean(|w|) + EPS) and s_c = (1 + C) / (ρ_c + C).
ST3_EPS = 1e-6
ST3_C = 0.01


def st3_rescale(w: Tensor, t: Tensor | float) -> Tensor:
    """ST-3's per-output-channel scale ``s_c`` (shape ``(C_out, 1, ...)``), without gradient.

    ``ρ_c = (mean(|w|·m) + 1e-6) / (mean(|w|) + 1e-6)`` over each output
    channel (dim 0; the whole tensor for a 1-d weight), ``m = 1[|w| > t]``,
    and ``s_c = 1.01 / (ρ_c + 0.01)``: a channel that keeps a fraction ``ρ_c``
    of its magnitude is scaled up by about ``1/ρ_c``, like dropout's rescaling.
    ``1.01`` is written ``1 + 0.01`` so that ``ρ_c = 1`` gives exactly 1.

    Args:
        w: the weight.
        t: the threshold.
    """
    dtype = compute_dtype(w.dtype)
    a = w.detach().to(dtype).abs()
    t = torch.as_tensor(t, dtype=dtype, device=w.device)
    dims = tuple(range(1, a.dim())) if a.dim() >= 2 else tuple(range(a.dim()))
    kept = torch.where(a > t, a, 0.0).mean(dims, keepdim=True)
    rho = (kept + ST3_EPS) / (a.mean(dims, keepdim=True) + ST3_EPS)
    one = torch.ones((), dtype=dtype, device=w.device)
    return (one + ST3_C) / (rho + ST3_C)


class _ST3Function(torch.autograd.Function):
    """ST-3's forward ``s_c·(w − sign(w)·T)·1[|w| > T]`` with the identity as backward."""

    generate_vmap_rule = True  # torch.func.vmap: per-sample gradients (tests/test_higher_order.py)

    @staticmethod
    def forward(w: Tensor, t: Tensor) -> Tensor:
        dtype = compute_dtype(torch.promote_types(w.dtype, t.dtype))
        x = w.to(dtype)
        tc = t.to(dtype)
        soft = torch.where(x.abs() > tc, x - torch.sign(x) * tc, 0.0)  # pruned: +0.0
        return soft.mul_(st3_rescale(w, tc)).to(w.dtype)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None  # straight-through for every weight, pruned or kept


@dataclass(frozen=True)
class ST3Operator(Operator):
    """ST-3 (Vanderschueren & De Vleeschouwer 2023) as a Pruner operator.

    Forward ``ŵ = s_c·(w − sign(w)·T)·1[|w| > T]`` (soft thresholding and the
    per-output-channel rescale of :func:`st3_rescale`, computed from the
    current weights at every forward, i.e. after every optimizer step); the
    backward is the identity for all weights, so θ is ignored. With the
    global backbone the threshold is the global quantile recomputed every
    step (ST-3); with ``backbone="global-flops"`` it is ST-3σ.

    Args:
        name: the registry name this operator came from.
    """

    name: str = "st3"

    def __call__(self, w: Tensor, t: Tensor, theta: float) -> Tensor:
        out: Tensor = _ST3Function.apply(w, t.detach())
        return out


OPERATORS.register("st3", ST3Operator())


# ------------------------------------------------------------------ Spartan
@dataclass(frozen=True)
class SinkhornResult:
    """What :func:`sinkhorn_topk` returns.

    Attributes:
        masks: the soft mask ``m`` of each value tensor, entries in (0, 1).
        mu: the dual variable ``μ`` at the solution, ``m = sigmoid(β(u − τ) + μ)``.
        tau: the shift ``τ`` used.
        iterations: Sinkhorn iterations run.
        newton_steps: budget-polishing steps run after them.
        budget_error: ``|Σ m − k| / k`` at the end.
    """

    masks: list[Tensor]
    mu: float
    tau: float
    iterations: int
    newton_steps: int
    budget_error: float


def _logsumexp_all(tensors: Sequence[Tensor]) -> float:
    """``log Σ exp`` over every element of every tensor, without concatenating."""
    parts = torch.stack([torch.logsumexp(t.reshape(-1), 0).double() for t in tensors])
    return float(torch.logsumexp(parts, 0))


def _sum_all(tensors: Sequence[Tensor]) -> float:
    return float(sum(t.sum(dtype=torch.float64) for t in tensors))


def sinkhorn_topk(
    values: Sequence[Tensor],
    k: float,
    beta: float,
    tau: float | None = None,
    max_iters: int = 100,
    tol: float = 0.01,
    budget_tol: float = 1e-6,
    max_newton: int = 50,
) -> SinkhornResult:
    """Spartan's soft top-k mask of ``values`` with unit costs, solved by Sinkhorn.

    The entropic optimal-transport problem of Tai et al. (2022) in its dual:
    with ``u = v`` (unit costs ``c = 1``), ``z = β(u − τ)``, ``μ = 0`` and
    ``ν = −softplus(z)``, repeat until the relative change of ``Σ m·v`` is
    below ``tol`` (at most ``max_iters`` times)::

        μ = log k − logsumexp(z + ν)
        ν = −softplus(z + μ)
        m = exp(z + μ + ν) = sigmoid(z + μ)

    At the fixed point ``m_i = sigmoid(β(u_i − τ) + μ)`` and ``Σ m = k``.
    Sinkhorn's stopping rule does not by itself make the budget hold, so the
    same fixed point is then polished by a safeguarded Newton iteration on
    the scalar ``μ`` (``f(μ) = Σ sigmoid(z + μ) − k`` is increasing, with
    ``f' = Σ m(1 − m)``) until ``|Σ m − k| <= budget_tol·k``. Sums over all
    tensors are taken tensor by tensor (no concatenation), in float64.

    Args:
        values: non-negative tensors (``|w|``), on one device.
        k: the budget, ``0 < k < N``.
        beta: the sharpness ``β > 0`` (the inverse entropic regularisation).
        tau: the shift; default the magnitude below which ``N − round(k)``
            values lie. Any shift gives the same mask (``μ`` absorbs it);
            it only sets where the iteration starts.
        max_iters: Sinkhorn iterations at most (Spartan: 100).
        tol: Sinkhorn's relative stopping tolerance on ``Σ m·v`` (Spartan: 0.01).
        budget_tol: relative tolerance of the budget ``Σ m = k``.
        max_newton: polishing steps at most.

    Returns:
        A :class:`SinkhornResult`.

    Raises:
        ValueError: for ``k`` outside ``(0, N)`` or ``beta <= 0``.
    """
    n = sum(v.numel() for v in values)
    if not 0 < k < n:
        raise ValueError(f"the budget k must be in (0, {n}), got {k}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    with torch.no_grad():
        if tau is None:
            tau = float(select_threshold(values, 1.0 - round(k) / n)) if round(k) < n else 0.0
        z = [(v.to(compute_dtype(v.dtype)) - tau).mul_(beta) for v in values]
        log_k = math.log(k)

        # --- Sinkhorn, as published ------------------------------------------
        mu = 0.0
        z_nu = [zi - F.softplus(zi) for zi in z]  # z + ν with ν = log c − softplus(z + μ)
        prev = _sum_all([torch.sigmoid(zi) * v for zi, v in zip(z, values)])
        iterations = 0
        for iterations in range(1, max_iters + 1):  # noqa: B007 (the count is reported)
            mu = log_k - _logsumexp_all(z_nu)
            z_nu = [zi - F.softplus(zi + mu) for zi in z]
            obj = _sum_all([torch.sigmoid(zi + mu) * v for zi, v in zip(z, values)])
            if abs(obj - prev) <= tol * abs(prev):
                break
            prev = obj
        del z_nu

        # --- budget polish: safeguarded Newton on μ --------------------------
        lo, hi = -math.inf, math.inf  # f(lo) < 0 < f(hi)
        steps = 0
        while True:
            masks = [torch.sigmoid(zi + mu) for zi in z]
            f = _sum_all(masks) - k
            if abs(f) <= budget_tol * k or steps >= max_newton:
                break
            slope = _sum_all([m * (1.0 - m) for m in masks])
            if f > 0:
                hi = min(hi, mu)
            else:
                lo = max(lo, mu)
            nxt = mu - f / slope if slope > 0 else math.nan
            if not lo < nxt < hi:  # Newton left the bracket: bisect, or widen it
                if math.isfinite(lo) and math.isfinite(hi):
                    nxt = 0.5 * (lo + hi)
                else:
                    nxt = mu - math.copysign(max(1.0, abs(mu)), f)
            mu = nxt
            steps += 1
        error = abs(f) / k
        if error > budget_tol:
            logger.warning("Spartan: budget error %.3g after %d polishing steps", error, steps)
    return SinkhornResult(masks, mu, float(tau), iterations, steps, error)


class _SoftTopKMask(torch.autograd.Function):
    """Soft top-k masks of ``|w|`` for all tensors, with the implicit-gradient backward.

    Backward (Tai et al. 2022, implicit differentiation of ``Σ c·m = k`` at
    the fixed point ``m = sigmoid(β(u − τ) + μ)``)::

        ∂L/∂v = β·m(1 − m)·(g/c − Σ g·m(1 − m) / Σ c·m(1 − m))

    and ``∂L/∂w = ∂L/∂v·sign(w)``. The published denominator ``k − Σ c·m²``
    equals ``Σ c·m(1 − m)`` when the budget holds; the latter is used because
    it does not cancel when the mask is nearly binary.

    The forward takes the masks already solved (:func:`sinkhorn_topk`) and
    only ties them to the weights. What backward needs is kept as plain
    (detached) attributes rather than saved tensors, so that several backward
    passes through the same masks (gradient accumulation over micro-batches)
    work.
    """

    @staticmethod
    def forward(ctx: Any, beta: float, masks: list[Tensor], *weights: Tensor) -> tuple[Tensor, ...]:
        ctx.beta = beta
        ctx.masks = [m.detach() for m in masks]
        ctx.signs = [torch.sign(w.detach()) for w in weights]
        # New tensor objects (same storage) become the outputs, so the solver's
        # own masks stay plain tensors without a graph.
        return tuple(m.detach() for m in masks)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        slopes = [m * (1.0 - m) for m in ctx.masks]  # m(1 − m)
        num = sum((g * s).sum(dtype=torch.float64) for g, s in zip(grads, slopes))
        den = sum(s.sum(dtype=torch.float64) for s in slopes)
        # a 0-d tensor, never read back: no wait for the device in every backward. Its
        # float64 value is rounded to the gradients' dtype as the Python float was.
        coef = torch.where(den > 0, num / den, torch.zeros_like(den))
        out = [
            (g - coef).mul_(s).mul_(ctx.beta).mul_(sign).to(sign.dtype)
            for g, s, sign in zip(grads, slopes, ctx.signs)
        ]
        return (None, None, *out)


def soft_topk_mask(
    weights: Sequence[Tensor],
    k: float,
    beta: float,
    tau: float | None = None,
    max_iters: int = 100,
    tol: float = 0.01,
    budget_tol: float = 1e-6,
) -> list[Tensor]:
    """Differentiable Spartan masks of ``|w|`` (see :func:`sinkhorn_topk` and ``_SoftTopKMask``).

    Returns one mask per weight tensor, connected to the weights' autograd
    graph by the implicit-gradient backward.

    Args:
        weights: the weight tensors, on one device.
        k: the budget of kept weights, ``0 < k < N``.
        beta: the sharpness ``β > 0``.
        tau: the shift where the iteration starts (see :func:`sinkhorn_topk`).
        max_iters: Sinkhorn iterations at most.
        tol: Sinkhorn's relative stopping tolerance.
        budget_tol: relative tolerance of the budget ``Σ m = k``.
    """
    values = [w.detach().abs() for w in weights]
    result = sinkhorn_topk(values, k, beta, tau, max_iters, tol, budget_tol)
    masks: tuple[Tensor, ...] = _SoftTopKMask.apply(float(beta), result.masks, *weights)
    return list(masks)


class _HardMaskSTE(torch.autograd.Function):
    """``x·1[keep]`` forward, identity backward (Spartan's straight-through hard projection)."""

    generate_vmap_rule = True  # torch.func.vmap: per-sample gradients (tests/test_higher_order.py)

    @staticmethod
    def forward(x: Tensor, keep: Tensor) -> Tensor:
        return torch.where(keep, x, 0.0)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class SpartanBackbone(Backbone):
    """Spartan (Tai, Tian & Lim, NeurIPS 2022) as a backbone of the Pruner.

    At every update (after each optimizer step), with ``k`` the number of
    weights to keep (``N − round(s·N)`` at the schedule's sparsity ``s``):

    - ``T``: the exact global threshold that keeps ``k`` weights;
    - ``m``: the soft top-k mask of all ``|w|`` at sharpness ``β``
      (:func:`sinkhorn_topk`), connected to the weights' graph;
    - the forward weight is ``w·m·1[|w| > T]``, the hard part straight-through
      (identity in backward), so the gradient is ``g·m`` directly plus the
      implicit gradient through ``m``.

    Schedules (published defaults): the density goes linearly from 1 to the
    target over the first 20 % of training — that is the Pruner's schedule,
    :func:`make_pruner` sets ``LinearSchedule(0, 0.2)`` — and ``β`` linearly
    from ``beta_init`` to ``beta_target`` up to ``floor(freeze_at·total)``
    steps; at that step the mask is updated one last time and frozen:
    afterwards the forward is ``w·M`` with the fixed ``M = m·1[|w| > T]``
    (gradient ``g·M``: pruned weights get none), as in the authors' code.
    The hard part uses ``|w| > T`` rather than comparing mask values (the
    same set, immune to ties in rounded sigmoids).

    Operator and θ of the Pruner are not used.

    Args:
        beta_init: ``β`` at step 0 (Spartan: 1).
        beta_target: ``β`` at the freeze (Spartan: 20; 10 to 20 in the paper).
        freeze_at: fraction of training after which the mask is frozen (0.8).
        max_iters: Sinkhorn iterations at most (100).
        tol: Sinkhorn's relative stopping tolerance (0.01).
        budget_tol: relative tolerance of ``Σ m = k`` (polished, see
            :func:`sinkhorn_topk`).
    """

    name = "spartan"

    def __init__(
        self,
        beta_init: float = 1.0,
        beta_target: float = 20.0,
        freeze_at: float = 0.8,
        max_iters: int = 100,
        tol: float = 0.01,
        budget_tol: float = 1e-6,
    ) -> None:
        if not 0 < beta_init <= beta_target:
            raise ValueError(
                f"need 0 < beta_init <= beta_target, got beta_init={beta_init}, "
                f"beta_target={beta_target}"
            )
        if not 0.0 <= freeze_at <= 1.0:
            raise ValueError(f"freeze_at must be in [0, 1], got {freeze_at}")
        if max_iters < 1 or not tol > 0 or not budget_tol > 0:
            raise ValueError("max_iters must be >= 1, tol and budget_tol > 0")
        self.beta_init = float(beta_init)
        self.beta_target = float(beta_target)
        self.freeze_at = float(freeze_at)
        self.max_iters = int(max_iters)
        self.tol = float(tol)
        self.budget_tol = float(budget_tol)
        self.beta = self.beta_init
        self.frozen = False
        self.last: SinkhornResult | None = None
        self._step = 0
        self._total = 1
        self._sparsity = 0.0
        self._masks: list[Tensor] | None = None
        self._tied_beta = self.beta  # the β the soft masks were tied to the weights with
        self._frozen_masks: list[Tensor] = []
        self._threshold: Tensor | None = None
        self._warm = _WarmStart()

    def setup(self, targets: Sequence[PruneTarget]) -> None:
        super().setup(targets)
        self.frozen = False
        self._masks = None
        self._frozen_masks = []

    def __getstate__(self) -> dict[str, Any]:
        # The soft masks carry the autograd graph to the weights, which
        # cannot be copied or pickled: a copy (deepcopy of a model, EMA)
        # gets them detached.
        state = self.__dict__.copy()
        if self._masks is not None:
            state["_masks"] = [m.detach() for m in self._masks]
        return state

    def freeze_step(self, total_steps: int) -> int:
        """The step at which the mask is updated one last time and frozen.

        Args:
            total_steps: the length of training.
        """
        return math.floor(self.freeze_at * total_steps)

    def beta_at(self, step: int, total_steps: int) -> float:
        """``β`` at ``step``: linear from ``beta_init`` at 0 to ``beta_target`` at the freeze.

        Args:
            step: the Pruner's step.
            total_steps: the length of training.
        """
        end = self.freeze_step(total_steps)
        ratio = 1.0 if step >= end else max(0.0, step / end)
        return self.beta_init + ratio * (self.beta_target - self.beta_init)

    def advance(self, step: int, total_steps: int, final_sparsity: float) -> None:
        self._step, self._total = step, total_steps
        if not self.frozen:
            self.beta = self.beta_at(step, total_steps)

    def _solve(self, sparsity: float) -> Tensor:
        """Threshold and soft masks at ``sparsity`` and the current ``β``, from the live weights."""
        weights = [t.weight for t in self.targets]
        detached = [w.detach() for w in weights]
        t = select_threshold(detached, sparsity, hint=self._warm.hint, hint_width=self._warm.width)
        self._warm.update(float(t))
        n = sum(w.numel() for w in weights)
        keep = n - round(sparsity * n)
        if 0 < keep < n:
            values = [w.abs() for w in detached]
            self.last = sinkhorn_topk(
                values, keep, self.beta, float(t), self.max_iters, self.tol, self.budget_tol
            )
            masks: tuple[Tensor, ...] = _SoftTopKMask.apply(self.beta, self.last.masks, *weights)
            self._tied_beta = self.beta  # to tie them again after a device move
            self._masks = list(masks)
        else:  # nothing (or everything) pruned: a plain hard mask, as Spartan does
            self._masks = None
        self._sparsity = sparsity
        self._threshold = t
        return t

    def thresholds(self, weights: Sequence[Tensor], sparsity: float) -> list[Tensor]:
        if self.frozen:
            assert self._threshold is not None
            return [self._threshold] * len(weights)
        t = self._solve(sparsity)
        if self._step >= self.freeze_step(self._total):
            self._freeze(t)
        return [t] * len(weights)

    @torch.no_grad()
    def _freeze(self, t: Tensor) -> None:
        frozen = []
        for i, target in enumerate(self.targets):
            w = target.weight
            hard = (w.abs() > t).to(w.dtype)
            soft = None if self._masks is None else on_device(self._masks, i, w.device)
            frozen.append(hard if soft is None else hard * soft.to(w.dtype))
        self._frozen_masks = frozen
        self._masks = None
        self.frozen = True

    def forward_weight(
        self, index: int, weight: Tensor, threshold: Tensor, operator: Operator, theta: float
    ) -> Tensor:
        if self.frozen:
            return weight * on_device(self._frozen_masks, index, weight.device)
        keep = weight.abs() > threshold
        if self._masks is not None:
            weight = weight * self._soft_mask(index, weight.device).to(weight.dtype)
        x = weight
        out: Tensor = _HardMaskSTE.apply(x, keep)
        return out

    def _soft_mask(self, index: int, device: torch.device) -> Tensor:
        """Soft mask ``index`` on ``device``, where the model's weights now are.

        A model moved after an update (``model.to("cuda")``) meets masks made on
        the old device, tied by :class:`_SoftTopKMask` to the weights there: they
        are moved and tied again to the (moved) weights, with the same values and
        ``β``, so that the backward runs on the new device. Masks restored from a
        state, which carry no graph until the next update, are only moved.
        """
        assert self._masks is not None
        if self._masks[index].device != device:
            values = [m.detach().to(device) for m in self._masks]
            if self._masks[0].grad_fn is None:
                self._masks = values
            else:
                with outside_inference_mode(), torch.enable_grad():
                    weights = [t.weight for t in self.targets]
                    tied = _SoftTopKMask.apply(self._tied_beta, values, *weights)
                self._masks = list(tied)
        return self._masks[index]

    def pruned_mask(
        self, index: int, weight: Tensor, threshold: Tensor, operator: Operator | None = None
    ) -> Tensor:
        if self.frozen:
            return on_device(self._frozen_masks, index, weight.device) == 0
        return weight.abs() <= threshold

    def state_dict(self) -> dict[str, Any]:
        """β, the phase, the sparsity, the threshold and the frozen masks.

        The structure is fixed from :meth:`setup` on: ``"frozen_masks"`` holds
        one tensor per layer, shaped like its weight and in its dtype, on the CPU,
        before the freeze too (zeros then: ``"frozen"`` says they are not taken),
        so that ``torch.distributed.checkpoint`` loads a state saved after the
        freeze into a fresh Pruner's state.
        """
        if self.frozen:
            masks = [m.detach().cpu().clone() for m in self._frozen_masks]
        else:
            masks = [torch.zeros(t.weight.shape, dtype=t.weight.dtype) for t in self.targets]
        threshold = self._threshold
        return {
            "beta": self.beta,
            "frozen": self.frozen,
            "sparsity": self._sparsity,
            "threshold": torch.zeros(()) if threshold is None else threshold.detach().cpu().clone(),
            "frozen_masks": masks,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore; the soft masks are recomputed from the (restored) weights, as at that step.

        Reads what :meth:`state_dict` writes and the states of earlier versions
        (no masks before the freeze, no threshold before the first update). The
        whole state is checked before anything is changed.

        Args:
            state: a dict :meth:`state_dict` returned.

        Raises:
            ValueError: naming the layer, when the frozen masks do not fit the layers
                (their number or shapes: a state saved from another model), or when
                the state is not what :meth:`state_dict` writes (an entry missing; β
                not finite and > 0; ``frozen`` not a bool; the sparsity outside
                [0, 1); the threshold not a finite float >= 0; a mask not a float
                tensor with values in [0, 1]): the state is damaged. Nothing is
                changed then.
        """
        keys = ("beta", "frozen", "sparsity", "threshold", "frozen_masks")
        missing = [key for key in keys if key not in state]
        if missing:
            raise damaged_state(
                f"the Spartan backbone's state lacks {', '.join(map(repr, missing))}"
            )
        beta, frozen, sparsity, threshold, masks = (state[key] for key in keys)
        if (
            isinstance(beta, bool)
            or not isinstance(beta, (int, float))
            or not (math.isfinite(beta) and beta > 0)
        ):
            raise damaged_state(
                f"the Spartan backbone's 'beta' must be a finite number > 0, got {beta!r}"
            )
        if not isinstance(frozen, bool):
            raise damaged_state(f"the Spartan backbone's 'frozen' must be a bool, got {frozen!r}")
        if (
            isinstance(sparsity, bool)
            or not isinstance(sparsity, (int, float))
            or not 0.0 <= sparsity < 1.0
        ):
            raise damaged_state(
                f"the Spartan backbone's 'sparsity' must be a number in [0, 1), got {sparsity!r}"
            )
        if threshold is not None or frozen:  # None: an earlier version, before any update
            if (
                not isinstance(threshold, Tensor)
                or threshold.numel() != 1
                or not threshold.is_floating_point()
            ):
                raise damaged_state(
                    "the Spartan backbone's 'threshold' must be a one-element float tensor, "
                    f"got {threshold!r}"
                )
            if not (math.isfinite(float(threshold)) and float(threshold) >= 0):
                raise damaged_state(
                    "the Spartan backbone's 'threshold' must be finite and >= 0, "
                    f"got {float(threshold)!r}"
                )
        if not isinstance(masks, (list, tuple)):
            raise damaged_state(
                "the Spartan backbone's 'frozen_masks' must be a list of tensors, "
                f"got {type(masks).__name__}"
            )
        if masks or frozen:  # empty: an earlier version, before the freeze
            self._check_masks(masks)
        self.beta = float(state["beta"])
        self.frozen = frozen
        self._sparsity = float(sparsity)
        if self.frozen:
            assert threshold is not None
            devices = [t.weight.device for t in self.targets]
            self._frozen_masks = [m.to(d) for m, d in zip(masks, devices)]
            self._threshold = threshold.reshape(()).to(devices[0])
            self._masks = None
        else:
            self._solve(self._sparsity)

    def _check_masks(self, masks: Sequence[Any]) -> None:
        """Raise unless ``masks`` are what :meth:`state_dict` writes for these layers.

        Raises:
            ValueError: for another number of masks or another shape (a state saved
                from another model), or a mask that is not a float tensor with values
                in [0, 1] (a frozen mask is the soft mask times the hard one).
        """
        if len(masks) != len(self.targets):
            raise other_model_state(
                f"the Spartan backbone's 'frozen_masks' holds {len(masks)} masks for "
                f"{len(self.targets)} layers"
            )
        for m, t in zip(masks, self.targets):
            want = tuple(t.weight.shape)
            if not isinstance(m, Tensor) or tuple(m.shape) != want:
                got = tuple(m.shape) if isinstance(m, Tensor) else type(m).__name__
                raise other_model_state(
                    f"the Spartan backbone's 'frozen_masks' entry of layer {t.name!r} has "
                    f"shape {got}, the layer needs {want}"
                )
            if not m.is_floating_point():
                raise damaged_state(
                    f"the Spartan backbone's 'frozen_masks' entry of layer {t.name!r} is "
                    f"{m.dtype}, where state_dict() writes the layer's float dtype"
                )
            if not bool(((m >= 0) & (m <= 1)).all()):  # NaN fails both
                raise damaged_state(
                    f"the Spartan backbone's 'frozen_masks' entry of layer {t.name!r} holds "
                    "values outside [0, 1] (or NaN), where state_dict() writes a mask in [0, 1]"
                )

    def config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "beta_init": self.beta_init,
            "beta_target": self.beta_target,
            "freeze_at": self.freeze_at,
            "max_iters": self.max_iters,
            "tol": self.tol,
            "budget_tol": self.budget_tol,
        }


BACKBONES.register("spartan", SpartanBackbone)


def __getattr__(name: str) -> Any:
    # Method, METHODS and make_pruner lived here before feather_sparse.methods
    # existed; methods imports this module (through the Pruner), so the names
    # are looked up when asked for rather than imported at the top.
    if name in ("METHODS", "Method", "make_pruner"):
        from feather_sparse import methods

        return getattr(methods, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
