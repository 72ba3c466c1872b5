"""The Feather thresholding operator and its straight-through backward.

Implements eq. (3) of Glentis Georgoulakis, Retsinas & Maragos, "Feather: An
Elegant Solution to Effective DNN Sparsification" (BMVC 2023)::

    P_T(w) = sign(w) · (|w|^p − T^p)^(1/p)   if |w| > T
             0                               otherwise

and its gradient-scaled straight-through estimator (§2.2.2)::

    dL/dw = g       where |w| > T
            θ · g   elsewhere

The derivative of ``P_T`` itself is never used. ``p = 1`` is soft
thresholding and ``p = inf`` hard thresholding; ``θ = 1`` is the plain STE and
``θ = 0`` the non-STE variant (pruned weights get no gradient). Following the
tinygrad habit, these are settings of one implementation, not separate code.

Overflow-free form. ``|w|^p`` overflows float16 for ``|w| > 65504^(1/p)`` and
any float for large ``p``; writing ``|w|^p − T^p = |w|^p (1 − (T/|w|)^p)`` gives::

    P_T(w) = w · (1 − (T/|w|)^p)^(1/p)

where ``T/|w| ∈ [0, 1)`` on the kept weights, so every intermediate lies in
``[0, 1]`` for any ``p``. The bracket is evaluated as
``−expm1(p·log1p(−(|w| − T)/|w|))`` to avoid cancellation just above the
threshold. ``p = 1`` and ``p = inf`` take exact special paths so that they
equal soft and hard thresholding bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from feather_sparse.registry import Registry

__all__ = [
    "OPERATORS",
    "Operator",
    "ThresholdOperator",
    "compute_dtype",
    "threshold",
]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the operator computes in: float32 for half types, else ``dtype``.

    float16/bfloat16 have 11/8 significant bits; ``1 − (T/|w|)^p`` loses most of
    them near the threshold, so the elementwise work is done in float32 and the
    result rounded once. Any half value is exactly representable in float32.
    """
    return torch.promote_types(dtype, torch.float32)


def _forward(w: Tensor, t: Tensor, p: float) -> Tensor:
    """``P_T(w)`` for one tensor (no autograd); ``t`` is a 0-d tensor."""
    dtype = compute_dtype(torch.promote_types(w.dtype, t.dtype))
    x = w.to(dtype)
    t = t.to(dtype)
    a = x.abs()
    keep = a > t
    # Pruned entries are written as +0.0 (never -0.0), so that "exactly zero"
    # also holds bit for bit and sparse formats round-trip exactly.
    if math.isinf(p):  # hard thresholding: keep w exactly where |w| > T
        out = torch.where(keep, x, 0.0)
    elif p == 1.0:  # soft thresholding: sign(w)·(|w| − T) where |w| > T
        out = torch.where(keep, torch.sign(x).mul_(a.sub_(t)), 0.0)
    else:
        # 1 − (T/|w|)^p = −expm1(p·log1p(−(|w| − T)/|w|)). Near the threshold
        # the naive 1 − r^p cancels catastrophically (an fp32 weight just above
        # T lost most of its digits); here |w| − T is exact (Sterbenz) and
        # log1p/expm1 keep full relative precision, so P_T(w) is accurate to a
        # few ulps everywhere. Entries with |w| <= T may produce NaN or inf in
        # `factor`; the final `where` discards them.
        d = (a - t).div_(a)
        factor = d.neg_().log1p_().mul_(p).expm1_().neg_().pow_(1.0 / p)
        out = torch.where(keep, factor.mul_(x), 0.0)
    return out.to(w.dtype)


class _ThresholdSTE(torch.autograd.Function):
    """``P_T`` forward, gradient-scaled straight-through backward.

    Saves only ``w`` (the caller's own tensor, usually the parameter itself, so
    no extra memory) and the 0-d ``T``; the keep-mask is recomputed in
    backward, and not at all when ``θ = 1``.
    """

    @staticmethod
    def forward(w: Tensor, t: Tensor, p: float, theta: float) -> Tensor:
        return _forward(w, t, p)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        w, t, _, theta = inputs
        ctx.theta = theta
        if theta != 1.0:
            ctx.save_for_backward(w, t)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None]:
        theta = ctx.theta
        if theta == 1.0:  # plain STE: the identity
            return grad, None, None, None
        w, t = ctx.saved_tensors
        keep = w.abs() > t
        if theta == 0.0:  # non-STE: pruned weights receive no gradient
            return torch.where(keep, grad, 0.0), None, None, None
        return torch.where(keep, grad, grad * theta), None, None, None


def _check_args(t: Tensor | float, p: float, theta: float) -> None:
    if not p > 0:  # also rejects NaN
        raise ValueError(f"p must be > 0 (1 = soft, 3 = Feather, inf = hard), got {p}")
    if not 0.0 <= theta <= 1.0:
        raise ValueError(f"theta must be in [0, 1] (1 = plain STE, 0 = non-STE), got {theta}")
    if isinstance(t, Tensor) and t.dim() != 0:
        raise ValueError(f"the threshold must be a 0-d tensor, got shape {tuple(t.shape)}")


def threshold(w: Tensor, t: Tensor | float, p: float = 3.0, theta: float = 1.0) -> Tensor:
    """Apply the Feather operator ``P_T`` with a gradient-scaled STE backward.

    Args:
        w: weights of any shape and floating dtype (float16, bfloat16, float32,
            float64), on any device.
        t: the threshold ``T >= 0``; a 0-d tensor (kept on ``w``'s device so
            no host synchronisation happens) or a Python float. It receives no
            gradient.
        p: the operator's power: 1 soft, 3 Feather (default), ``math.inf`` hard.
        theta: gradient scale for pruned weights (``|w| <= T``): 1 plain STE,
            0 non-STE.

    Returns:
        ``P_T(w)``, same shape, dtype and device as ``w``, exactly zero where
        ``|w| <= T``.

    Raises:
        ValueError: if ``p <= 0``, ``theta`` is outside [0, 1] or ``t`` is not 0-d.

    Example:
        >>> w = torch.tensor([2.0, -0.5, -3.0], requires_grad=True)
        >>> threshold(w, torch.tensor(1.0), p=3.0)  # 7^(1/3) = 1.9129...
        tensor([ 1.9129,  0.0000, -2.9625], grad_fn=<_ThresholdSTEBackward>)
    """
    _check_args(t, p, theta)
    if not isinstance(t, Tensor):
        t = torch.tensor(float(t), dtype=compute_dtype(w.dtype), device=w.device)
    out: Tensor = _ThresholdSTE.apply(w, t.detach(), float(p), float(theta))
    return out


class Operator:
    """A forward mapping ``(w, T) -> w̃`` with its backward, as used by the Pruner.

    Subclasses implement :meth:`__call__`; baselines with different forward
    rules (e.g. channel rescaling) subclass this too.
    """

    name: str = "operator"

    def __call__(self, w: Tensor, t: Tensor, theta: float) -> Tensor:
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """A JSON-able description, stored in checkpoints."""
        return {"name": self.name}


@dataclass(frozen=True)
class ThresholdOperator(Operator):
    """The ``P_T`` family at power ``p`` (see the module docstring).

    Args:
        p: 1 soft, 3 Feather, ``math.inf`` hard; any ``p > 0`` is allowed.
        name: the registry name this operator came from.
    """

    p: float = 3.0
    name: str = "feather"

    def __post_init__(self) -> None:
        _check_args(0.0, self.p, 1.0)

    def __call__(self, w: Tensor, t: Tensor, theta: float) -> Tensor:
        return threshold(w, t, p=self.p, theta=theta)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "p": self.p}


OPERATORS: Registry[Operator] = Registry("operator")
OPERATORS.register("feather", ThresholdOperator(p=3.0, name="feather"))
OPERATORS.register("soft", ThresholdOperator(p=1.0, name="soft"))
OPERATORS.register("hard", ThresholdOperator(p=math.inf, name="hard"))
