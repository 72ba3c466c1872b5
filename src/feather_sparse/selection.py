"""Exact k-th smallest magnitude over many tensors, without sorting or concatenating.

The global backbone of Feather (§3 of the paper) needs, at every iteration, the
threshold ``T`` below which a fraction ``s`` of all prunable weights lies. The
authors' released code concatenates every weight and sorts them (``O(N log N)``
time, a full-size copy). Here ``T`` is the exact k-th smallest ``|w|``,
``k = round(s·N)``, found by *bucket narrowing* (a sample-select):

1. Pick a window ``(lo, hi]`` expected to hold the answer: around the
   previous threshold when one is given (during training ``T`` moves little
   between steps), else around the quantile of a small strided sample of the
   magnitudes.
2. One pass over the tensors, chunk by chunk, counts the magnitudes
   ``<= lo`` and gathers the few inside the window ``(lo, hi]``. Only
   per-chunk temporaries are allocated, so extra memory is bounded by the
   chunk size and the window, not by ``N``.
3. If the k-th magnitude falls inside the window, ``torch.kthvalue`` on the
   gathered few gives ``T`` exactly. If not, the counts say on which side it
   is; that side becomes the search interval, and is gathered whole if small,
   else split evenly in the float bit pattern and counted with
   ``torch.bucketize`` until a part is small (so the search always ends after
   a few passes, even on adversarial inputs).

Typically one pass suffices. The result is the same value a full sort would
give, to the bit.

Scaled magnitudes: every function takes an optional per-tensor ``scales``;
element ``w`` of tensor ``i`` then counts as ``|w|·scales[i]`` (computed chunk
by chunk, never as a scaled copy of the weights). The FLOPs-biased global
backbone ranks ``|w| / s_l`` this way (ST-3σ, Vanderschueren & De
Vleeschouwer 2023).

Ties: ``T`` is the k-th smallest magnitude *value*. When several weights share
that magnitude, all of them satisfy ``|w| <= T``, so more than ``k`` weights
are pruned (by the number of extra ties); exact zeros always count as pruned.
With continuous-valued trained weights ties are rare, and with distinct
magnitudes exactly ``k`` weights satisfy ``|w| <= T``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["count_at_most", "kth_magnitude", "scaled_magnitudes", "select_threshold"]

# Elements processed at once: bounds the temporaries (magnitudes, bucket
# indices) to a few tens of MB whatever the size of the tensors.
CHUNK = 1 << 22
# Strided sample used to place the first boundaries when no hint is given.
SAMPLE = 1 << 16
# Most elements kept from a window; a window that would hold more is dropped
# and the next pass narrows further instead.
GATHER_CAP = 1 << 22


def _work_dtype(tensors: Sequence[Tensor]) -> torch.dtype:
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


# A chunk: a flat view of part of one tensor, and that tensor's scale (1.0 = none).
_Chunk = tuple[Tensor, float]


def _chunks(
    tensors: Sequence[Tensor], dtype: torch.dtype, scales: Sequence[float] | None = None
) -> list[_Chunk]:
    """Flat views of the tensors, cut into pieces of at most ``CHUNK`` elements (no copies)."""
    if scales is not None and len(scales) != len(tensors):
        raise ValueError(f"got {len(scales)} scales for {len(tensors)} tensors")
    out = []
    for i, t in enumerate(tensors):
        scale = 1.0 if scales is None else float(scales[i])
        if not (scale > 0 and math.isfinite(scale)):
            raise ValueError(f"scales must be positive and finite, got {scale} for tensor {i}")
        flat = t.detach().reshape(-1)
        for start in range(0, flat.numel(), CHUNK):
            out.append((flat[start : start + CHUNK], scale))
    return out


def _magnitudes(chunk: _Chunk, dtype: torch.dtype) -> Tensor:
    """``|w|·scale`` of one chunk in ``dtype`` (one new temporary)."""
    values, scale = chunk
    a = values.abs() if values.dtype == dtype else values.to(dtype).abs_()
    return a if scale == 1.0 else a.mul_(scale)


def scaled_magnitudes(w: Tensor, scale: float = 1.0, dtype: torch.dtype | None = None) -> Tensor:
    """``|w|·scale`` exactly as the selection functions compute it (same rounding).

    Args:
        w: one tensor.
        scale: its positive factor.
        dtype: the dtype the selection worked in (float32, or float64 when any
            of its tensors was float64); default: the one for ``w`` alone.
    """
    return _magnitudes((w.detach(), float(scale)), dtype or _work_dtype([w]))


def count_at_most(
    tensors: Sequence[Tensor], value: Tensor | float, *, scales: Sequence[float] | None = None
) -> int:
    """How many elements over all tensors have ``|w|·scale <= value`` (a reference helper)."""
    dtype = _work_dtype(tensors)
    total = 0
    for chunk in _chunks(tensors, dtype, scales):
        total += int((_magnitudes(chunk, dtype) <= value).sum())
    return total


def _sample_window(chunks: list[_Chunk], dtype: torch.dtype, q: float) -> tuple[float, float]:
    """A window ``(lo, hi]`` likely to hold the ``q``-quantile of all magnitudes.

    Taken from a strided sample of about ``SAMPLE`` magnitudes (no full copy):
    the sample quantile's standard error is ``sqrt(q(1-q)/m)``, and the window
    spans four of them on each side.
    """
    n = sum(c.numel() for c, _ in chunks)
    parts = []
    for c, scale in chunks:
        want = max(1, round(SAMPLE * c.numel() / n))
        step = max(1, c.numel() // want)
        parts.append(_magnitudes((c[::step], scale), dtype))
    sample = torch.sort(torch.cat(parts)).values  # small: about SAMPLE elements
    m = sample.numel()
    se = math.sqrt(max(q * (1 - q), 1.0 / m) / m)
    i_lo = round((q - 4 * se) * (m - 1)) - 1
    i_hi = round((q + 4 * se) * (m - 1)) + 1
    lo = float(sample[i_lo]) if i_lo >= 0 else -1.0
    hi = float(sample[i_hi]) if i_hi < m else math.inf
    return lo, hi


def _split_evenly(lo: float, hi: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Up to 64 boundaries strictly inside ``(lo, hi)``, evenly spaced in the float bit pattern.

    For non-negative IEEE floats the bit pattern, read as an integer, is
    monotone in the value, so each split divides the number of representable
    values left by 64: the search cannot stall, even on ties. Empty when
    ``lo`` and ``hi`` are adjacent floats (``lo < 0`` stands for "below 0").
    """
    int_dtype = torch.int64 if dtype == torch.float64 else torch.int32
    lo_i = int(torch.tensor(max(lo, 0.0), dtype=dtype).view(int_dtype))
    hi_i = int(torch.tensor(hi, dtype=dtype).view(int_dtype))
    step = max(1, (hi_i - lo_i) // 64)
    ints = torch.arange(lo_i + step, max(hi_i, lo_i + step), step, dtype=int_dtype)
    if lo < 0.0 < hi:  # the interval (-1, hi] also holds 0 itself: split there first
        ints = torch.cat([torch.zeros(1, dtype=int_dtype), ints])
    return ints.view(dtype).to(device)


def _window_pass(
    chunks: list[_Chunk], dtype: torch.dtype, lo: float, hi: float
) -> tuple[int, int, Tensor | None]:
    """One pass: ``#{|w| <= lo}``, ``#{lo < |w| <= hi}`` and those magnitudes.

    The magnitudes are None when there are more than ``GATHER_CAP``. A
    handful of cheap elementwise kernels per chunk (abs, two compares, a
    count, a masked select); ``torch.bucketize`` would cost several times more.
    """
    at_most_lo = torch.zeros((), dtype=torch.long, device=chunks[0][0].device)
    in_window = torch.zeros((), dtype=torch.long, device=chunks[0][0].device)
    inside: list[Tensor] | None = []
    size = 0
    for chunk in chunks:
        a = _magnitudes(chunk, dtype)
        low = a <= lo
        at_most_lo += torch.count_nonzero(low)
        mask = (a <= hi).logical_and_(low.logical_not_())
        if inside is None:
            in_window += torch.count_nonzero(mask)
            continue
        sel = a[mask]
        size += sel.numel()
        inside.append(sel)
        if size > GATHER_CAP:  # too many to keep: count the rest, the caller narrows
            in_window += size
            inside = None
    if inside is not None:
        in_window += size
    return int(at_most_lo), int(in_window), (None if inside is None else torch.cat(inside))


def _bucket_pass(chunks: list[_Chunk], dtype: torch.dtype, bounds: Tensor) -> list[int]:
    """Cumulative counts ``#{|w| <= bounds[j]}`` for sorted ``bounds`` (the slow fallback)."""
    counts = torch.zeros(bounds.numel() + 1, dtype=torch.long, device=bounds.device)
    for chunk in chunks:
        idx = torch.bucketize(_magnitudes(chunk, dtype), bounds, out_int32=True)
        counts += torch.bincount(idx, minlength=bounds.numel() + 1)
    cum: list[int] = torch.cumsum(counts, 0).tolist()
    return cum[:-1]


def kth_magnitude(
    tensors: Sequence[Tensor],
    k: int,
    *,
    hint: Tensor | float | None = None,
    hint_width: float = 0.01,
    scales: Sequence[float] | None = None,
) -> Tensor:
    """The exact k-th smallest ``|w|`` over all elements of ``tensors`` (1-based ``k``).

    Args:
        tensors: any number of floating tensors, all on one device; they are
            read, never copied whole or modified.
        k: rank in ``[0, N]``; ``k = 0`` returns 0.
        hint: a value expected to be close to the answer (the previous
            threshold, during training). Affects speed only, never the result.
        hint_width: relative half-width of the first window around ``hint``.
        scales: optional positive factor per tensor: rank ``|w|·scales[i]``
            instead of ``|w|`` (no scaled copy is made).

    Returns:
        A 0-d tensor on the tensors' device, of dtype float32 (float64 if any
        tensor is float64), equal to the k-th smallest (scaled) magnitude.

    Raises:
        ValueError: if ``k`` is outside ``[0, N]``, no tensor is given, a scale
            is not positive, or the k-th magnitude would be NaN.
    """
    if not tensors:
        raise ValueError("kth_magnitude needs at least one tensor")
    dtype = _work_dtype(tensors)
    device = tensors[0].device
    n = sum(t.numel() for t in tensors)
    if not 0 <= k <= n:
        raise ValueError(f"k must be in [0, {n}], got {k}")
    chunks = _chunks(tensors, dtype, scales)
    if k == 0:
        return torch.zeros((), dtype=dtype, device=device)

    # Invariant: the answer lies in (lo, hi]; `below` = #{|w| <= lo}, `upto` = #{|w| <= hi}.
    # lo = -1 stands for "nothing below"; NaN is never <= anything, so it is never counted.
    lo, hi, below, upto = -1.0, math.inf, 0, n
    h = float(hint) if hint is not None else 0.0
    if 0.0 < h < math.inf:
        # Boundaries are held as values of the working dtype, so that every
        # comparison in every pass sees exactly the same number.
        w_lo, w_hi = (
            float(torch.tensor(h * (1 + f), dtype=dtype)) for f in (-hint_width, hint_width)
        )
    else:
        w_lo, w_hi = _sample_window(chunks, dtype, k / n)
    while True:
        exact = w_lo <= lo and w_hi >= hi  # the window is the whole interval
        at_most_lo, in_window, inside = _window_pass(chunks, dtype, w_lo, w_hi)
        count = at_most_lo + in_window
        if at_most_lo < k <= count:
            if inside is not None:
                return torch.kthvalue(inside, k - at_most_lo).values
            lo, hi, below, upto = w_lo, w_hi, at_most_lo, count  # too many to keep
        elif exact:  # k beyond every comparable magnitude
            raise ValueError("the k-th magnitude is NaN: the weights contain NaN")
        elif k <= at_most_lo:  # narrow to the side of the window that holds the answer
            hi, upto = w_lo, at_most_lo
        else:
            lo, below = w_hi, count
        if upto - below <= GATHER_CAP:  # small enough: take the whole interval next pass
            w_lo, w_hi = lo, hi
            continue
        # Still too many (rare): split evenly and count until a part is small enough.
        while upto - below > GATHER_CAP:
            bounds = _split_evenly(lo, min(hi, torch.finfo(dtype).max), dtype, device)
            if bounds.numel() == 0:  # lo and hi are adjacent floats: the answer is hi
                return torch.tensor(hi, dtype=dtype, device=device)
            cum = _bucket_pass(chunks, dtype, bounds)
            j = next((i for i, c in enumerate(cum) if c >= k), None)
            if j is None:  # in (bounds[-1], hi]
                lo, below = float(bounds[-1]), cum[-1]
            else:
                hi, upto = float(bounds[j]), cum[j]
                if j > 0:
                    lo, below = float(bounds[j - 1]), cum[j - 1]
        w_lo, w_hi = lo, hi


def select_threshold(
    tensors: Sequence[Tensor],
    sparsity: float,
    *,
    hint: Tensor | float | None = None,
    hint_width: float = 0.01,
    scales: Sequence[float] | None = None,
) -> Tensor:
    """The threshold ``T`` that prunes a fraction ``sparsity`` of all weights.

    ``T`` is the k-th smallest magnitude with ``k = round(sparsity·N)`` over
    every element of ``tensors``, so that exactly ``k`` weights satisfy
    ``|w| <= T`` when magnitudes are distinct (ties: see the module docstring).

    Args:
        tensors: the weights, all on one device.
        sparsity: fraction in ``[0, 1]``.
        hint: the previous threshold, for speed (see :func:`kth_magnitude`).
        hint_width: relative half-width of the first window around ``hint``.
        scales: optional positive factor per tensor; the threshold is then on
            ``|w|·scales[i]`` (see :func:`kth_magnitude`).

    Returns:
        A 0-d tensor (float32, or float64 for float64 weights) on the weights' device.

    Raises:
        ValueError: if ``sparsity`` is outside ``[0, 1]``.

    Example:
        >>> w = [torch.tensor([0.3, -0.1]), torch.tensor([[0.5, -0.2], [0.4, 0.0]])]
        >>> select_threshold(w, 0.5)  # k = 3 of 6: magnitudes 0, 0.1, 0.2
        tensor(0.2000)
    """
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity must be in [0, 1], got {sparsity}")
    n = sum(t.numel() for t in tensors)
    return kth_magnitude(
        tensors, round(sparsity * n), hint=hint, hint_width=hint_width, scales=scales
    )
