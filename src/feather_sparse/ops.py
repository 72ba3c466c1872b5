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
import threading
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from feather_sparse.registry import Registry
from feather_sparse.rules import check_p, check_theta, check_threshold

__all__ = [
    "OPERATORS",
    "Operator",
    "OutputCache",
    "ThresholdOperator",
    "apply_threshold",
    "compute_dtype",
    "threshold",
]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the operator computes in: float32 for half types, else ``dtype``.

    float16/bfloat16 have 11/8 significant bits; ``1 − (T/|w|)^p`` loses most of
    them near the threshold, so the elementwise work is done in float32 and the
    result rounded once. Any half value is exactly representable in float32.

    Args:
        dtype: the dtype of the weight.
    """
    return torch.promote_types(dtype, torch.float32)


#: Elements per block of the eager forward: a block's temporaries (a few
#: float and bool buffers, about 1 MB) stay in the CPU cache and are reused
#: from block to block, instead of being allocated at the weight's full size
#: (fresh multi-megabyte buffers cost page faults on every step).
BLOCK = 1 << 16


def _block(
    x: Tensor, t: Tensor, p: float, out: Tensor, scratch: list[Tensor], t_positive: bool = False
) -> None:
    """Write ``P_T(x)`` into ``out`` (1-d, like ``x``), using four ``scratch`` buffers.

    Written with arithmetic only — no boolean masks, no ``torch.where`` —
    because on CPU those run several times slower than the vectorised
    arithmetic kernels. Pruned entries come out as +0.0 (see the last step
    below; hard thresholding writes ``0 + w·[|w| > T]``, which keeps an
    infinite weight), so "exactly zero" also holds bit for bit and sparse
    formats round-trip exactly. Each line is one kernel over the block:
    fewer kernels, less time.

    The bracket ``(1 − (T/|w|)^p)^(1/p)`` is evaluated without cancellation:
    the naive ``1 − r^p`` loses most digits of an fp32 weight just above the
    threshold. Here ``1 − r = (|w| − T)/|w|`` with ``|w| − T`` exact
    (Sterbenz), and

    * integer ``p`` (3, Feather's default): ``1 − r^p = (1 − r)·(1 + r + … + r^(p−1))``,
      a well-conditioned sum by Horner's rule;
    * other ``p``: ``1 − r^p = −expm1(p·log1p(−(1 − r)))``;

    then raised to ``1/p`` as ``exp(log(·)/p)`` into ``v = w·(·)^(1/p)``, and
    written as ``v − v·[|w| <= T]``: exactly ``v`` where kept, exactly +0.0
    where pruned (``v`` is finite there). All of it is accurate to a few
    ulps, subnormal weights included: each is divided by its own magnitude,
    so ``T = 0`` gives ``w`` bit for bit. A zero weight would give ``0/0``
    when ``T = 0``, so unless the caller knows ``T > 0`` (``t_positive``) the
    pruned magnitudes are raised by 1 first: one kernel, no subnormal
    operand for a zero weight, the kept magnitudes (``> T >= 0``) untouched.
    With ``T > 0`` a zero weight only divides a nonzero number by zero, and
    the infinities that gives end as a clamped, then zeroed, entry.
    """
    a, d, r, u = scratch
    torch.abs(x, out=a)
    if math.isinf(p):  # hard thresholding: w·[|w| > T]
        torch.gt(a, t, out=u)  # the keep indicator [|w| > T] as 0/1 floats
        # 0 + w·[|w| > T]: +0.0, never −0.0, where pruned
        torch.addcmul(constant(0.0, x), x, u, out=out)
        return
    torch.sub(a, t, out=d)  # |w| − T, exact near the threshold
    if p == 1.0:  # soft thresholding: sign(w)·max(|w| − T, 0)
        torch.copysign(d.clamp_min_(0.0), x, out=out).add_(0.0)
        return
    torch.le(a, t, out=u)  # the prune indicator [|w| <= T] as 0/1 floats
    if not t_positive:
        a.add_(u)  # |w| + 1 where pruned: never 0/0; the kept |w| (> 0) exact
    d.div_(a)  # 1 − r
    if p == int(p) and p <= 16:
        torch.div(t, a, out=r)  # r = T/|w|
        h = a  # |w| is no longer needed: reuse its buffer for the Horner sum
        torch.add(r, 1.0, out=h)  # 1 + r
        one = constant(1.0, x)
        for _ in range(int(p) - 2):
            torch.addcmul(one, h, r, out=h)  # 1 + r(1 + r(…)), one kernel per term
        d.mul_(h)
    else:
        d.neg_().log1p_().mul_(p).expm1_().neg_()
    # (·)^(1/p) as exp(log(·)/p), on values kept >= tiny: log and exp take
    # their fast vectorised paths (zeros and infinities fall off them, ~15×
    # slower); then v − v·[|w| <= T] is +0.0 where pruned (v − v) and v where
    # kept (v − 0, which also turns a −0.0 from underflow into +0.0).
    d.clamp_min_(torch.finfo(d.dtype).tiny).log_().mul_(1.0 / p).exp_().mul_(x)
    torch.addcmul(d, d, u, value=-1.0, out=out)


#: 0-d constants for the fused ``addcmul`` kernels above (``input + t1·t2``):
#: float32 so that they never promote the block's dtype.
_ZERO = torch.zeros((), dtype=torch.float32)
_ONE = torch.ones((), dtype=torch.float32)


def constant(value: float, like: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """A 0-d ``value`` on ``like``'s device, for the tensor operands of the kernels above.

    A ternary kernel such as ``addcmul`` refuses a 0-d CPU operand beside GPU
    tensors ("Expected all tensors to be on the same device"; only binary
    kernels take one), so off the CPU the constant is made on the device: one
    fill kernel, where ``torch.tensor(value, device=...)`` would copy from the
    host and wait for the device. On the CPU, :data:`_ZERO`/:data:`_ONE` or a
    new CPU tensor. The result may be shared: read it, never write into it.

    Args:
        value: the constant.
        like: a tensor on the device the constant is for.
        dtype: the constant's dtype.
    """
    if like.device.type != "cpu":
        return torch.full((), value, dtype=dtype, device=like.device)
    if dtype == torch.float32 and value in (0.0, 1.0):
        return _ZERO if value == 0.0 else _ONE
    return torch.tensor(value, dtype=dtype)


def _one_block(w: Tensor, n: int) -> bool:
    """Whether to process ``w`` whole rather than in cache-sized blocks.

    Blocks pay off on CPU only. On GPUs the caching allocator makes full-size
    temporaries cheap and each block would cost kernel launches; under
    torch.compile inductor fuses the elementwise chain into one loop itself.
    """
    return n <= BLOCK or w.device.type != "cpu" or torch.compiler.is_compiling()


class OutputCache:
    """Reuses the memory of the previous output of ``P_T`` for one weight.

    On CPU a fresh weight-sized output costs one page fault per 4 KiB page
    when first written, because the allocator hands large blocks back to the
    operating system when they are freed: for 50M float32 weights, a fifth
    of the operator's time in ``benchmarks/bench_train_step.py``. The Pruner keeps one cache per
    weight; the previous output's memory is written again only when nothing
    references it any more (the autograd graph that saved it is gone), so a
    tensor a caller still holds is never overwritten — otherwise a fresh
    output is allocated and cached instead.

    Only used while training on CPU (autograd recording, a weight that
    requires grad): there the outputs of all layers are alive at once in the
    backward anyway, so keeping them between steps adds nothing to the peak
    memory. Under ``torch.no_grad()`` the cache lets go of its memory.
    """

    def __init__(self) -> None:
        self._out: Tensor | None = None

    def get(self, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """A 1-d tensor of ``n`` elements that nothing outside the cache references.

        Args:
            n: the number of elements.
            dtype: its dtype.
            device: its device.
        """
        out = self._out
        if (
            out is None
            or out.numel() != n
            or out.dtype != dtype
            or out.device != device
            or not _unreferenced(out)
        ):
            out = self._out = torch.empty(n, dtype=dtype, device=device)
        return out

    def clear(self) -> None:
        """Drop the cached memory (the next call allocates afresh)."""
        self._out = None


def _unreferenced(t: Tensor) -> bool:
    """Whether only ``t`` itself holds its storage (no views, no saved copies).

    ``torch._C._storage_Use_Count`` counts the references to the storage:
    ``t`` and the temporary ``untyped_storage()`` object make 2. Where the
    function is missing, the answer is "referenced", i.e. never reuse.
    """
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return False
    return bool(use_count(t.untyped_storage()._cdata) <= 2)


def _forward(w: Tensor, t: Tensor, p: float, cache: OutputCache | None = None) -> Tensor:
    """``P_T(w)`` for one tensor (no autograd); ``t`` is a 0-d tensor.

    With ``cache`` (CPU blockwise path only), the output is written into the
    cache's memory and returned as a view of it.
    """
    dtype = compute_dtype(torch.promote_types(w.dtype, t.dtype))
    t = t.to(dtype)
    flat = w.reshape(-1)
    n = flat.numel()
    if _one_block(w, n):
        x = flat.to(dtype)
        out = torch.empty_like(x)
        _block(x, t, p, out, _scratch(n, dtype, w.device))
        return out.to(w.dtype).reshape(w.shape)
    if cache is not None:
        out = cache.get(n, w.dtype, w.device)
    else:
        out = torch.empty(n, dtype=w.dtype, device=w.device)
    # The threshold is on the CPU here, so reading it costs no synchronisation.
    t_value = float(t)
    if t_value == 0.0:  # P_0(w) = w for every p: the hard path is exact and cheapest
        p = math.inf
    scratch = _scratch(BLOCK, dtype, w.device)
    convert = w.dtype != dtype
    x_buf = torch.empty(BLOCK, dtype=dtype, device=w.device) if convert else None
    o_buf = torch.empty(BLOCK, dtype=dtype, device=w.device) if convert else None
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        m = stop - start
        parts = scratch if m == BLOCK else [b[:m] for b in scratch]
        if x_buf is not None and o_buf is not None:  # half weights: compute in float32
            x = x_buf[:m].copy_(flat[start:stop])
            _block(x, t, p, o_buf[:m], parts, t_positive=t_value > 0)
            out[start:stop].copy_(o_buf[:m])
        else:
            _block(flat[start:stop], t, p, out[start:stop], parts, t_positive=t_value > 0)
    return out.view(w.shape)  # always a new view: never the cached tensor itself


def _scratch(n: int, dtype: torch.dtype, device: torch.device) -> list[Tensor]:
    """Four float buffers for :func:`_block`."""
    return [torch.empty(n, dtype=dtype, device=device) for _ in range(4)]


_POOL = threading.local()


def pooled_scratch(n: int, dtype: torch.dtype, device: torch.device, count: int) -> list[Tensor]:
    """``count`` 1-d buffers of ``n`` elements for temporaries that never leave a call.

    On CPU (eager) the buffers are kept per thread and handed out again on the
    next call of the same size and dtype: allocating a few hundred kilobytes
    afresh per layer and step lets the C allocator return the memory to the
    system and fault it back in, which made the same N:M forward run 1× or
    3× as long from one process to the next. Elsewhere they are fresh. The
    caller must not let a buffer escape (return it, save it for backward).
    """
    if device.type != "cpu" or torch.compiler.is_compiling():
        return [torch.empty(n, dtype=dtype, device=device) for _ in range(count)]
    pool: dict[tuple[int, torch.dtype, int], list[Tensor]] = getattr(_POOL, "buffers", None) or {}
    _POOL.buffers = pool
    key = (n, dtype, count)
    buffers = pool.get(key)
    if buffers is None:
        if len(pool) >= 8:  # a handful of sizes per thread; never grows without bound
            pool.clear()
        buffers = pool[key] = [torch.empty(n, dtype=dtype) for _ in range(count)]
    return buffers


_is_batched = getattr(torch._C._functorch, "is_batchedtensor", lambda t: False)


def refuse_batched_weights(*tensors: Tensor | None) -> None:
    """Raise a clear error for weights batched by ``torch.func.vmap`` (a stacked ensemble).

    The operators' forwards write into buffers (``out=``), which vmap cannot
    batch; vmap over the data with the weights unbatched (per-sample
    gradients) never reaches this. Checked only while a ``torch.func``
    transform is active.

    Raises:
        NotImplementedError: naming what works instead.
    """
    if torch._C._are_functorch_transforms_active() and any(
        isinstance(t, Tensor) and _is_batched(t) for t in tensors
    ):
        raise NotImplementedError(
            "torch.func.vmap over the pruned weights themselves (a stacked ensemble of "
            "models) is not supported by feather-sparse's operators; vmap over the data "
            "(per-sample gradients, in_dims=None for the parameters) is"
        )


def apply_function(fn: type[torch.autograd.Function], *args: Any) -> Any:
    """``fn.apply(*args)``, without the signature binding it does on every call.

    ``Function.apply`` of a Function with ``setup_context`` binds the
    arguments to ``forward``'s signature with :mod:`inspect` on each call,
    about 20 µs of Python — on a model of many small layers a few percent of
    a training step. Eagerly, outside functorch transforms, this calls the
    C++ ``apply`` directly; ``args`` must then be complete (defaults are not
    filled in). Under ``torch.compile`` or functorch it is ``fn.apply``.
    """
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return fn.apply(*args)
    return super(torch.autograd.Function, fn).apply(*args)  # type: ignore[misc]


class _ThresholdSTE(torch.autograd.Function):
    """``P_T`` forward, gradient-scaled straight-through backward.

    Saves only ``w`` (the caller's own tensor, usually the parameter itself, so
    no extra memory) and the 0-d ``T``; the keep-mask is recomputed in
    backward, and not at all when ``θ = 1``.
    """

    generate_vmap_rule = True  # torch.func.vmap: per-sample gradients (tests/test_higher_order.py)

    @staticmethod
    def forward(
        w: Tensor, t: Tensor, p: float, theta: float, cache: OutputCache | None = None
    ) -> Tensor:
        refuse_batched_weights(w, t)
        return _forward(w, t, p, cache)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        w, t, _, theta = inputs[:4]
        ctx.theta = theta
        if theta != 1.0:
            ctx.save_for_backward(w, t)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None, None]:
        theta = ctx.theta
        if theta == 1.0:  # plain STE: the identity
            return grad, None, None, None, None
        w, t = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True or torch.func: a differentiable product
            dtype = compute_dtype(torch.promote_types(w.dtype, t.dtype))
            factor = _grad_factor(w, t.to(dtype), theta, dtype)
            return (grad * factor).to(grad.dtype), None, None, None, None
        return _scaled_grad(w, t, grad, theta), None, None, None, None


def _scaled_grad(w: Tensor, t: Tensor, grad: Tensor, theta: float) -> Tensor:
    """``g`` where ``|w| > T``, ``θ·g`` elsewhere; blockwise like the forward.

    The factor is ``c = clamp(θ + 2·sign(|w| − T), θ, 1)``: exactly 1 where
    ``|w| > T`` and exactly ``θ`` elsewhere (``|w| = T`` included), so
    ``g·c`` is the scaled gradient with one rounding, from four cheap
    arithmetic kernels and no boolean ones.
    """
    dtype = compute_dtype(torch.promote_types(w.dtype, t.dtype))
    t = t.to(dtype)
    th = constant(theta, w, dtype)  # 0-d on w's device (no CPU operand on a GPU)
    low = float(theta)  # the same θ for the clamp, without reading th back (.item())
    g = grad.reshape(-1)
    flat = w.reshape(-1)
    n = flat.numel()
    out = torch.empty_like(g)
    if _one_block(w, n):
        _grad_block(flat, g, t, th, out, torch.empty(n, dtype=dtype, device=w.device), low)
        return out.reshape(grad.shape)
    buf = torch.empty(BLOCK, dtype=dtype, device=w.device)
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        _grad_block(
            flat[start:stop], g[start:stop], t, th, out[start:stop], buf[: stop - start], low
        )
    return out.reshape(grad.shape)


@torch.no_grad()
def _grad_factor(w: Tensor, t: Tensor, theta: float, dtype: torch.dtype) -> Tensor:
    """The factor ``c`` of :func:`_scaled_grad` as a new tensor (``dtype``), from ``w`` and ``T``.

    For a backward that must itself be differentiable (``create_graph=True``,
    ``torch.func``) and for the N:M backward: ``c`` is piecewise constant in
    ``w`` (zero derivative wherever it has one), so ``g·c`` with ``c``
    computed apart is the product to differentiate; the values are those of
    :func:`_grad_block`, by the same kernels (:func:`_factor_into`).
    """
    w = w.detach()
    c = torch.empty(w.shape, dtype=dtype, device=w.device)
    return _factor_into(w, t.detach(), constant(theta, w, dtype), c, float(theta))


def _factor_into(w: Tensor, t: Tensor, theta: Tensor, c: Tensor, low: float) -> Tensor:
    """Write the factor ``clamp(θ + 2·sign(|w| − T), θ, 1)`` into ``c`` and return it.

    ``theta`` is θ as a 0-d tensor of ``c``'s dtype, ``low`` the same θ as a
    Python float (the clamp rounds it to ``c``'s dtype, as ``theta`` was): no
    ``.item()``, which ``torch.compile`` would break its graph at.
    """
    a = torch.abs(w, out=c) if w.dtype == c.dtype else c.copy_(w).abs_()
    a.sub_(t).sign_()  # -1 pruned, 0 at the threshold (pruned), 1 kept
    return torch.add(theta, a, alpha=2.0, out=a).clamp_(low, 1.0)  # θ, θ, 1


def _grad_block(
    w: Tensor, g: Tensor, t: Tensor, theta: Tensor, out: Tensor, c: Tensor, low: float
) -> None:
    """``out = g·c`` with the factor ``c`` of :func:`_scaled_grad` built in ``c``."""
    # half gradients: in float32, rounded once
    torch.mul(g, _factor_into(w, t, theta, c, low), out=out)


def threshold(
    w: Tensor,
    t: Tensor | float,
    p: float = 3.0,
    theta: float = 1.0,
    *,
    cache: OutputCache | None = None,
) -> Tensor:
    """Apply the Feather operator ``P_T`` with a gradient-scaled STE backward.

    Every argument is checked here, once (the rules are in
    :mod:`feather_sparse.rules`); a tensor ``t`` is read for that, which is one
    host synchronisation on a GPU, except under ``torch.compile``, where reading
    it would break the graph (its value is not checked there). The Pruner's
    operators skip these checks: their settings were checked when the Pruner
    was configured.

    Args:
        w: weights of any shape and floating dtype (float16, bfloat16, float32,
            float64), on any device.
        t: the threshold ``T >= 0``; a 0-d tensor (kept on ``w``'s device) or
            a Python float. It receives no gradient.
        p: the operator's power in ``[1, inf]``: 1 soft, 3 Feather (default),
            ``math.inf`` hard.
        theta: gradient scale for pruned weights (``|w| <= T``) in ``[0, 1]``:
            1 plain STE, 0 non-STE.
        cache: an :class:`OutputCache` kept with ``w`` across calls (the
            Pruner keeps one per weight): while training on CPU the output
            reuses the previous output's memory when nothing references it.

    Returns:
        ``P_T(w)``, same shape, dtype and device as ``w``, exactly zero where
        ``|w| <= T``.

    Raises:
        TypeError: if ``w`` is not a floating-point tensor (an integer tensor
            would be truncated).
        ValueError: if ``T`` is negative, NaN, infinite or not 0-d, ``p < 1``
            or ``theta`` is outside [0, 1].

    Example:
        >>> w = torch.tensor([2.0, -0.5, -3.0], requires_grad=True)
        >>> threshold(w, torch.tensor(1.0), p=3.0)  # 7^(1/3) = 1.9129...
        tensor([ 1.9129,  0.0000, -2.9625], grad_fn=<_ThresholdSTEBackward>)
    """
    if not isinstance(w, Tensor) or not w.is_floating_point():
        kind = w.dtype if isinstance(w, Tensor) else type(w).__name__
        raise TypeError(
            f"threshold needs a floating-point tensor, got {kind}: the result would be "
            "truncated to whole numbers; convert it first, e.g. w.float()"
        )
    if isinstance(t, Tensor):
        if t.dim() != 0:
            raise ValueError(f"the threshold must be a 0-d tensor, got shape {tuple(t.shape)}")
        # Read only in eager mode: under torch.compile the read would break the graph
        # and make each new value of T a recompilation (T is then the caller's to check).
        if not torch.compiler.is_compiling():
            check_threshold(float(t.detach()))
    else:
        check_threshold(float(t))
        # filled on w's device: torch.tensor(..., device=) would copy from the host and wait
        t = torch.full((), float(t), dtype=compute_dtype(w.dtype), device=w.device)
    return apply_threshold(w, t, check_p(p), check_theta(theta), cache=cache)


def apply_threshold(
    w: Tensor, t: Tensor, p: float, theta: float, *, cache: OutputCache | None = None
) -> Tensor:
    """:func:`threshold` without the argument checks, for callers that checked them once.

    ``t`` is a 0-d tensor ``>= 0``, ``p`` in ``[1, inf]``, ``theta`` in ``[0, 1]``
    (see :mod:`feather_sparse.rules`); nothing here verifies it.

    Args:
        w: the weight.
        t: the 0-d threshold.
        p: the operator's exponent.
        theta: the gradient scale for the pruned entries.
        cache: where to keep the output buffer between calls (training only), or None.
    """
    if cache is not None and not (
        torch.is_grad_enabled() and w.requires_grad and not torch.compiler.is_compiling()
    ):
        cache.clear()  # evaluation: give the memory back; compiled graphs allocate their own
        cache = None
    out: Tensor = apply_function(_ThresholdSTE, w, t.detach(), float(p), float(theta), cache)
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
        p: 1 soft, 3 Feather, ``math.inf`` hard; any ``p`` in ``[1, inf]``
            (:func:`feather_sparse.rules.check_p` says why not below 1).
        name: the registry name this operator came from.
    """

    p: float = 3.0
    name: str = "feather"

    def __post_init__(self) -> None:
        check_p(self.p)

    def __call__(
        self, w: Tensor, t: Tensor, theta: float, cache: OutputCache | None = None
    ) -> Tensor:
        # θ and T come from the Pruner, which checked its settings once.
        return apply_threshold(w, t, self.p, theta, cache=cache)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "p": self.p}


OPERATORS: Registry[Operator] = Registry("operator")
OPERATORS.register("feather", ThresholdOperator(p=3.0, name="feather"))
OPERATORS.register("soft", ThresholdOperator(p=1.0, name="soft"))
OPERATORS.register("hard", ThresholdOperator(p=math.inf, name="hard"))
