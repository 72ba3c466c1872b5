"""Feather for N:M sparsity: the pattern, the group layout and the per-group operator.

An N:M pattern keeps ``N`` of every ``M`` consecutive weights along the
reduction dimension of a layer's GEMM — a Linear's input features, a
convolution's ``in_channels/groups × k…`` (the weight reshaped to
``(out, -1)``) — the layout NVIDIA's sparse tensor cores accelerate for 2:4.

Within each group the threshold is the largest magnitude among the ``M − N``
weights to prune, and Feather's operator applies group by group::

    T_g = the (M − N)-th smallest |w| in group g
    forward:  P_T(w) = sign(w) · (|w|^p − T_g^p)^(1/p)  where w is kept, else 0
    backward: dL/dw = g on the N kept weights, θ · g on the M − N pruned ones

with ``p = 3`` by default; ``p = 1`` is the soft threshold of S-STE (Hu et
al., NeurIPS 2024) and ``p = inf`` the hard N:M mask of SR-STE (Zhou et al.,
ICLR 2021). The elementwise work reuses :func:`feather_sparse.ops._block`
with a per-group threshold broadcast over the group.

Ties. The kept set is decided by one exact total order: magnitude first, then
position, a lower position in the group winning a tie; so every group keeps
exactly ``N`` positions, deterministically, whatever the values (ties, zeros,
``+0`` and ``−0`` alike). The order is computed on integer keys — the bits of
``|w|`` (monotone for non-negative floats, and ``|−0| = +0``) times ``M`` plus
``M − 1 − position`` — sorted by a small sorting network along the group
(:func:`_kth_smallest`), without Python loops over the weights; ``T_g``
itself comes from the same network on the magnitudes. For finite ``p`` a
kept weight whose magnitude *equals* ``T_g`` maps to ``P_T(w) = 0`` (the
operator is continuous at the threshold), so such a group holds fewer than
``N`` nonzeros; a group never holds more than ``N``. With ``p = inf`` exactly ``N`` nonzeros remain
unless the group has fewer than ``N`` nonzero weights. The backward of the
finite-``p`` forward needs only ``T_g``: like the unstructured operator it
scales the gradient of every ``|w| <= T_g`` by ``θ`` (a kept weight tied
with ``T_g``, which the forward zeroes, included). float64 weights are
ranked on their top bits (the lowest ``ceil(log2 M)`` bits of the mantissa
are dropped to make room for the position), so magnitudes that close tie.

Ramp. ``ramp ∈ [0, 1]`` scales every group's threshold (``T_g → ramp · T_g``)
and keeps, besides the ``N`` ranked weights, every weight above it: ``ramp =
0`` is dense, ``ramp = 1`` the full pattern. The Pruner sets it to the
scheduled sparsity over the final one, which gives the three ways to reach
the pattern: from the first step (a constant schedule), after a dense warm-up
(a constant schedule starting later) or ramped (the cubic schedule).

Sharding. Groups lie inside one row of the ``(out, -1)`` view, so a dim-0
shard (FSDP2) never splits a group and every rank computes its groups alone,
with no communication.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from feather_sparse.nm import native
from feather_sparse.ops import (
    BLOCK,
    _block,
    _grad_factor,
    apply_function,
    compute_dtype,
    constant,
    pooled_scratch,
    refuse_batched_weights,
)

__all__ = [
    "NMPattern",
    "group_thresholds",
    "group_view",
    "nm_keep_mask",
    "nm_threshold",
    "nm_thresholds",
    "reduction_size",
]


@dataclass(frozen=True)
class NMPattern:
    """Keep ``n`` of every ``m`` consecutive weights along the reduction dimension.

    Args:
        n: weights kept per group, ``0 < n < m``.
        m: group size.

    Raises:
        ValueError: unless ``0 < n < m``.
    """

    n: int
    m: int

    def __post_init__(self) -> None:
        if not (isinstance(self.n, int) and isinstance(self.m, int) and 0 < self.n < self.m):
            raise ValueError(
                f"an N:M pattern needs integers 0 < N < M (e.g. 2:4), got {self.n}:{self.m}"
            )

    @classmethod
    def parse(cls, spec: str | NMPattern) -> NMPattern:
        """``"2:4"`` → ``NMPattern(2, 4)``; a pattern passes through.

        Args:
            spec: ``"N:M"``, or a pattern.

        Raises:
            ValueError: for anything but ``"N:M"`` with integers ``0 < N < M``.
        """
        if isinstance(spec, NMPattern):
            return spec
        match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", spec) if isinstance(spec, str) else None
        if match is None:
            raise ValueError(f"an N:M pattern is written 'N:M' (e.g. '2:4', '4:8'), got {spec!r}")
        return cls(int(match[1]), int(match[2]))

    @property
    def sparsity(self) -> float:
        """The fraction of weights pruned, ``(m − n) / m``."""
        return (self.m - self.n) / self.m

    @property
    def index_bits(self) -> int:
        """Bits for one in-group position, ``ceil(log2 m)``."""
        return max(1, math.ceil(math.log2(self.m)))

    def __str__(self) -> str:
        return f"{self.n}:{self.m}"


def reduction_size(weight: Tensor) -> int:
    """Length of a weight's GEMM reduction dimension: the product of ``shape[1:]``.

    Args:
        weight: a layer's weight.
    """
    return math.prod(weight.shape[1:])


def is_transposed_linear(module: nn.Module) -> bool:
    """Whether ``module`` is a Linear that stores its weight as ``(in, out)``: the
    ``Conv1D`` of Hugging Face's GPT-2 family (``x @ W + b``)."""
    return any(  # the class, or the one torch.nn.utils.parametrize derives from it
        c.__name__ == "Conv1D" and c.__module__.startswith("transformers.")
        for c in type(module).__mro__
    )


def layer_order(module: nn.Module, weight: Tensor, conv_order: str = "flat") -> str:
    """How a layer's N:M groups run through its weight.

    ``"transposed"`` for a Linear stored ``(in, out)`` (its rows are inputs: the
    groups run down its columns); ``"channels"`` for a convolution with a kernel
    of more than one element when ``conv_order`` is ``"channels"``; else ``"flat"``
    (``weight.reshape(out, -1)``, ``m`` consecutive entries per group).
    """
    if is_transposed_linear(module):
        return "transposed"
    if conv_order == "channels" and math.prod(weight.shape[2:]) > 1:
        return "channels"
    return "flat"


def check_layout(
    name: str, module: nn.Module, weight: Tensor, pattern: NMPattern, order: str = "flat"
) -> None:
    """Raise unless ``weight`` of layer ``name`` splits into groups of ``pattern.m``.

    ``order`` is the layer's :func:`layer_order`: with ``"channels"`` the groups
    run along the input channels at each kernel position, so those must be a
    multiple of ``m``; with ``"transposed"`` along the weight's first dimension.

    Args:
        name: the layer's name, for the error message.
        module: the layer.
        weight: its weight.
        pattern: the N:M pattern.
        order: the layer's :func:`layer_order`.

    Raises:
        ValueError: for a transposed convolution (its weight is ``(in, out, …)``,
            so rows are not output channels) or a reduction dimension that is
            not a multiple of ``m``; the message names the layer and the fix.
    """
    if isinstance(module, nn.modules.conv._ConvTransposeNd):
        raise ValueError(
            f"layer {name!r} is a transposed convolution, whose weight is laid out (in, out, …): "
            f"N:M groups are defined for Linear and ConvNd only; exclude it (exclude=[{name!r}])"
        )
    if weight.dim() < 2:
        raise ValueError(
            f"layer {name!r} has a {weight.dim()}-d weight; N:M needs a matrix or a conv "
            f"kernel: exclude it (exclude=[{name!r}])"
        )
    if order == "transposed" and weight.dim() == 2 and weight.shape[0] % pattern.m:
        raise ValueError(
            f"layer {name!r} (weight {tuple(weight.shape)}, stored (in, out)) has "
            f"{weight.shape[0]} inputs, not a multiple of M = {pattern.m} for the {pattern} "
            f"pattern: leave it dense with exclude=[{name!r}] or min_params"
        )
    if order == "channels" and weight.shape[1] % pattern.m:
        raise ValueError(
            f"layer {name!r} (weight {tuple(weight.shape)}) has {weight.shape[1]} input "
            f"channels per group, not a multiple of M = {pattern.m}: conv_order='channels' "
            f"groups them at each kernel position; leave it dense with exclude=[{name!r}], "
            "change its width, or use conv_order='flat'"
        )
    k = reduction_size(weight)
    if k % pattern.m:
        raise ValueError(
            f"layer {name!r} (weight {tuple(weight.shape)}) has a reduction dimension of {k}, "
            f"not a multiple of M = {pattern.m} for the {pattern} pattern: leave it dense with "
            f"exclude=[{name!r}] or min_params, or change the layer's width"
        )


def group_view(weight: Tensor, pattern: NMPattern) -> Tensor:
    """The weight as ``(groups, m)``: ``m`` consecutive weights of one row per group.

    The rows are the output channels (``weight.reshape(out, -1)``), so a group
    never crosses a row, and a dim-0 shard holds whole groups.

    Args:
        weight: a weight whose rows split into groups of ``pattern.m``.
        pattern: the N:M pattern.

    Raises:
        ValueError: if a row's length is not a multiple of ``m``.
    """
    if weight.dim() < 1 or (weight.numel() and reduction_size(weight) % pattern.m):
        raise ValueError(
            f"a weight of shape {tuple(weight.shape)} does not split into groups of "
            f"{pattern.m} along its reduction dimension"
        )
    return weight.reshape(-1, pattern.m)


def _keys(a: Tensor, m: int) -> Tensor:
    """Distinct int64 keys ordering ``a`` (``(G, m)``, ``|w| >= 0``) by magnitude, then position.

    A lower position gets the larger key, so it wins a tie. float32 bits times
    ``m`` keep every magnitude apart; float64 bits lose their lowest bits to
    fit (see the module docstring).
    """
    rank = torch.arange(m - 1, -1, -1, device=a.device, dtype=torch.int64)  # m−1 … 0
    if a.dtype == torch.float64:
        bits = a.view(torch.int64)
        return bits - bits.remainder(m) + rank
    return a.view(torch.int32).to(torch.int64).mul_(m).add_(rank)


def _kth_smallest(columns: Sequence[Tensor], k: int) -> Tensor:
    """The ``k``-th smallest (0-based) across ``columns`` (``m`` tensors of shape ``(G,)``).

    An odd-even transposition sorting network over the group's ``m``
    positions: ``m(m − 1)/2`` elementwise min/max pairs on ``(G,)`` vectors,
    taken as strided views of the ``(G, m)`` weight (no transposed copy).
    For the small ``m`` of N:M patterns this is several times faster than
    ``kthvalue``/``topk`` along a dimension of 4, which loop per row.
    """
    cols = list(columns)
    m = len(cols)
    if m == 4:  # a selection network: 3 or 7 min/max kernels instead of the sort's 12
        return _kth_of_four(cols, k)
    for r in range(m):
        for i in range(r % 2, m - 1, 2):
            lo, hi = cols[i], cols[i + 1]
            cols[i], cols[i + 1] = torch.minimum(lo, hi), torch.maximum(lo, hi)
    return cols[k]


def _kth_of_four(cols: Sequence[Tensor], k: int) -> Tensor:
    """The ``k``-th smallest of four columns: sort each pair, then pick across the pairs.

    With ``lo1 <= hi1`` and ``lo2 <= hi2`` the two pairs, the second smallest
    of the four is ``min(max(lo1, lo2), min(hi1, hi2))`` and the second
    largest ``max(min(hi1, hi2), max(lo1, lo2))``: the same value the full
    sort gives (``min``/``max`` are exact).
    """
    a, b, c, d = cols
    if k == 0:
        return torch.minimum(torch.minimum(a, b), torch.minimum(c, d))
    if k == 3:
        return torch.maximum(torch.maximum(a, b), torch.maximum(c, d))
    lows = torch.maximum(torch.minimum(a, b), torch.minimum(c, d))
    highs = torch.minimum(torch.maximum(a, b), torch.maximum(c, d))
    return torch.minimum(lows, highs) if k == 1 else torch.maximum(lows, highs)


def group_thresholds(weight: Tensor, pattern: NMPattern) -> Tensor:
    """Each group's ``T_g``, the ``(m − n)``-th smallest magnitude, as ``(G, 1)``.

    In the compute dtype (float32 for half weights). This is the largest
    magnitude among the weights :func:`nm_keep_mask` prunes.

    Args:
        weight: a weight whose rows split into groups of ``pattern.m``.
        pattern: the N:M pattern.
    """
    a = group_view(weight.detach(), pattern).to(compute_dtype(weight.dtype)).abs()
    return _kth_smallest(a.unbind(1), pattern.m - pattern.n - 1).unsqueeze(1)


def nm_keep_mask(weight: Tensor, pattern: NMPattern) -> tuple[Tensor, Tensor]:
    """The kept positions and the per-group threshold of ``weight``.

    Args:
        weight: a weight whose rows split into groups of ``pattern.m``.
        pattern: the N:M pattern.

    Returns:
        ``(keep, T)``: ``keep`` a bool ``(G, m)`` tensor with exactly ``n``
        True per group (ties: magnitude, then the lower position); ``T`` the
        largest magnitude among each group's pruned weights, ``(G, 1)``, in
        the compute dtype (float32 for half weights).
    """
    dtype = compute_dtype(weight.dtype)
    a = group_view(weight.detach(), pattern).to(dtype).abs()  # (G, m); |−0| = +0
    keys = _keys(a, pattern.m)
    cut = _kth_smallest(keys.unbind(1), pattern.m - pattern.n - 1).unsqueeze(1)  # (G, 1)
    return keys > cut, _kth_smallest(a.unbind(1), pattern.m - pattern.n - 1).unsqueeze(1)


def nm_thresholds(weight: Tensor, pattern: NMPattern) -> Tensor:
    """Each group's threshold ``T_g`` (the largest pruned magnitude), shape ``(G,)``.

    Args:
        weight: a weight whose rows split into groups of ``pattern.m``.
        pattern: the N:M pattern.
    """
    return group_thresholds(weight, pattern).squeeze(1)


def _nm_forward(
    w: Tensor,
    pattern: NMPattern,
    ramp: Tensor,
    p: float,
    mask: Tensor | None,
    scale: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """``(scale · P_T(w), aux)`` with ``T = ramp · T_g``.

    ``aux`` is what the backward needs: the kept positions as (G, m) floats
    0/1 for the hard and fixed-mask forwards, else the (G, 1) thresholds
    ``ramp · T_g`` (the backward then treats ``|w| <= T`` as pruned, as
    :mod:`feather_sparse.ops` does).
    """
    dtype = compute_dtype(w.dtype)
    x = group_view(w.detach(), pattern).to(dtype)
    if mask is not None:  # a fixed mask: plain masking
        aux = mask.reshape(x.shape).to(dtype)
        out = torch.addcmul(constant(0.0, x), x, aux)
    elif math.isinf(p):  # hard: exactly n kept, ties by position (0 + w·k: +0.0 where pruned)
        keep, t = nm_keep_mask(w, pattern)
        aux = keep.to(dtype)
        # ramp < 1 also keeps every weight above the lowered threshold; at ramp 1 the
        # ranking alone decides (float64 ranks on its top bits: a weight a few ulps
        # above T_g may rank below it, and must not be kept as well)
        lowered = torch.where(ramp < 1, t * ramp.to(dtype), torch.inf)
        torch.maximum(aux, (x.abs() > lowered).to(dtype), out=aux)
        out = torch.addcmul(constant(0.0, x), x, aux)
    else:  # P_T is zero wherever |w| <= T: the thresholds alone do the pruning
        done = native.forward(x, pattern.n, ramp, p)  # torch's bits, one pass (nm.native)
        out, aux = done if done is not None else _torch_thresholded(x, pattern, ramp, p)
    if scale is not None:
        out.mul_(scale.to(dtype))
    return out.to(w.dtype).reshape(w.shape), aux


def _torch_thresholded(
    x: Tensor, pattern: NMPattern, ramp: Tensor, p: float
) -> tuple[Tensor, Tensor]:
    """``(P_T(x), ramp · T_g)`` of the ``(G, m)`` groups ``x`` (compute dtype), by torch kernels."""
    aux = group_thresholds(x, pattern).mul_(ramp.to(x.dtype))
    out = torch.empty_like(x)
    _threshold_blocks(x, aux, p, out)
    return out, aux


def _threshold_blocks(x: Tensor, t: Tensor, p: float, out: Tensor) -> None:
    """Write ``P_T`` of the ``(G, m)`` groups ``x`` with ``(G, 1)`` thresholds ``t`` into ``out``.

    On CPU (eager), in blocks of about :data:`~feather_sparse.ops.BLOCK`
    elements, so that the temporaries (pooled per thread, see
    :func:`~feather_sparse.ops.pooled_scratch`) stay in the cache; elsewhere
    (GPUs, ``torch.compile``) in one pass. Each CPU block's thresholds are first widened to the
    block's ``(rows, m)`` shape: the three kernels of ``_block`` that read the
    threshold run several times slower broadcasting a ``(rows, 1)`` tensor
    along rows of ``m = 4`` than on a contiguous tensor of the same shape. The
    values (hence the bits) are those of the whole-tensor computation.
    """
    if x.device.type != "cpu" or torch.compiler.is_compiling():
        # GPUs broadcast cheaply and pay per kernel launch; inductor fuses the chain.
        _block(x, t, p, out, [torch.empty_like(x) for _ in range(4)])
        return
    g, m = x.shape
    rows = max(1, min(g, BLOCK // m))
    buffers = pooled_scratch(rows * m, x.dtype, x.device, 5)
    for start in range(0, g, rows):
        stop = min(start + rows, g)
        parts = [b[: (stop - start) * m].view(stop - start, m) for b in buffers]
        wide = parts[4].copy_(t[start:stop].expand(stop - start, m))
        _block(x[start:stop], wide, p, out[start:stop], parts[:4])


class _NMThresholdSTE(torch.autograd.Function):
    """N:M forward; backward ``g`` on kept weights, ``θ·g + λ·w`` on pruned ones.

    ``λ`` is SR-STE's sparse-refined decay (0 for Feather); the forward's
    ``scale`` (S-STE's β) does not enter the backward, a straight-through
    estimator like the rest.
    """

    generate_vmap_rule = True  # torch.func.vmap: per-sample gradients (tests/test_higher_order.py)

    @staticmethod
    def forward(
        w: Tensor,
        ramp: Tensor,
        pattern: NMPattern,
        p: float,
        theta: float,
        decay: float,
        mask: Tensor | None,
        scale: Tensor | None,
        pre: tuple[Tensor, Tensor] | None = None,
    ) -> Any:
        if pre is not None:  # computed already (nm.fused): fresh views, never the cached objects
            return pre[0].view_as(pre[0]), pre[1].view_as(pre[1])
        refuse_batched_weights(w, ramp, mask, scale)
        return _nm_forward(w, pattern, ramp, p, mask, scale)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        w, pattern, theta, decay = inputs[0], inputs[2], inputs[4], inputs[5]
        ctx.theta, ctx.decay, ctx.pattern = theta, decay, pattern
        ctx.mark_non_differentiable(output[1])
        if theta != 1.0 or decay != 0.0:
            ctx.save_for_backward(w, output[1])

    @staticmethod
    def backward(ctx: Any, grad: Tensor, _: Any) -> tuple[Tensor | None, ...]:
        theta, decay = ctx.theta, ctx.decay
        rest = (None,) * 8
        if theta == 1.0 and decay == 0.0:
            return grad, *rest
        w, aux = ctx.saved_tensors
        dtype = aux.dtype
        x = group_view(w.detach(), ctx.pattern)
        with torch.no_grad():  # constants of the backward: only g is differentiated through
            if aux.shape == x.shape:  # kept positions, 1/0: exactly 1 kept, θ pruned
                factor = aux.mul(1.0 - theta).add_(theta)
                pruned = torch.sub(1.0, aux) if decay != 0.0 else None
            else:  # thresholds: the factor of ops._grad_block, broadcast over each group
                factor = _grad_factor(x, aux, theta, dtype)
                pruned = (x.abs() <= aux).to(dtype) if decay != 0.0 else None
        # Out of place, so that the backward is itself differentiable (create_graph=True,
        # torch.func); half gradients are multiplied in float32 and rounded once.
        out = grad.reshape(x.shape) * factor
        if pruned is not None:  # SR-STE: + λ·(1 − mask)⊙w
            out = out.addcmul(pruned, x.to(dtype), value=decay)
        return out.to(grad.dtype).reshape(grad.shape), *rest


def nm_threshold(
    w: Tensor,
    pattern: NMPattern | str,
    ramp: Tensor | float = 1.0,
    p: float = 3.0,
    theta: float = 1.0,
    *,
    decay: float = 0.0,
    mask: Tensor | None = None,
    scale: Tensor | None = None,
) -> Tensor:
    """Apply Feather's operator group by group in an N:M pattern (see the module docstring).

    Args:
        w: a weight of shape ``(out, …)`` whose ``shape[1:]`` holds a multiple of ``m``.
        pattern: ``"2:4"``, ``"4:8"``, … or an :class:`NMPattern`.
        ramp: in ``[0, 1]``, scales every group's threshold (1: the full
            pattern); a 0-d tensor keeps compiled graphs free of recompiles.
        p: the operator's power: 1 soft (S-STE), 3 Feather, ``math.inf`` hard (SR-STE).
        theta: gradient scale of the pruned weights, in ``[0, 1]``.
        decay: SR-STE's sparse-refined decay ``λ``: the backward adds
            ``λ·(1 − mask)⊙w`` to the weight's gradient (0: off).
        mask: a fixed bool mask of ``w``'s shape (one-shot pruning): the
            forward is ``w`` masked by it, and ``ramp`` and ``p`` are unused.
        scale: a 0-d factor multiplying the forward's output (S-STE's β).

    Returns:
        ``P_T(w)``, same shape, dtype and device as ``w``, with at most ``n``
        nonzeros in every group when ``ramp = 1``.

    Raises:
        ValueError: for a bad pattern, ``p <= 0``, ``theta`` outside [0, 1], or
            a weight that does not split into groups of ``m``.

    Example:
        >>> w = torch.tensor([[4.0, -1.0, 2.0, 3.0]])
        >>> nm_threshold(w, "2:4", p=math.inf)
        tensor([[4., 0., 0., 3.]])
    """
    pattern = NMPattern.parse(pattern)
    if not p > 0:
        raise ValueError(f"p must be > 0 (1 = soft, 3 = Feather, inf = hard), got {p}")
    if not 0.0 <= theta <= 1.0:
        raise ValueError(f"theta must be in [0, 1] (1 = plain STE, 0 = non-STE), got {theta}")
    if not isinstance(ramp, Tensor):
        ramp = torch.full((), float(ramp), device=w.device)  # filled there: no host copy
    if decay < 0:
        raise ValueError(f"decay must be >= 0 (SR-STE uses 2e-4), got {decay}")
    if mask is not None and mask.shape != w.shape:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} differs from the weight's {tuple(w.shape)}"
        )
    out: Tensor = apply_function(
        _NMThresholdSTE,
        w,
        ramp.detach(),
        pattern,
        float(p),
        float(theta),
        float(decay),
        mask,
        scale,
        None,
    )[0]
    return out
