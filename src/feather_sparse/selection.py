"""Exact k-th smallest magnitude over many tensors, without sorting or concatenating (CPU).

Over 600 lines as one cohesive thing: a single algorithm (bucket narrowing),
its local and its multi-process (torch.distributed) form sharing every pass.

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
   is, and that side becomes the next window. A window holding too many to
   gather (over ``GATHER_CAP``, or 1/128 of all weights if more) is instead
   histogrammed, in the same pass, over 64 parts split evenly in the float
   bit pattern (``torch.bucketize`` on the in-window magnitudes only), with
   each part's least and greatest magnitude; the part holding the answer,
   shrunk to those two, is the next window: each such pass divides the
   representable values left by 64, so the search ends after a few passes
   even on adversarial inputs.

Typically one pass suffices (two at a billion weights). The result is the
same value a full sort would give, to the bit.

A tie too large to gather (a layer of one repeated value, a quantized model)
costs about what a selection without it costs: one or two passes (one more
after a hint that misses), never a bisection of the bit pattern down to one
float. A sample that shows one value ``v`` all around the quantile makes
the first window ``(v⁻, v]`` (``v⁻``: the float below ``v``), the tie
alone, which is only counted. A window that overflows the cap with more
than half of its magnitudes equal to one ``v`` is counted on either side of
``v`` for the rest of the pass instead of histogrammed: ``v`` is the answer,
or the next window leaves the tie out. Where windows are histogrammed
anyway (across processes), a part whose least and greatest magnitudes are
equal is the answer itself, and the lowest and highest value of every split
window get parts of their own, so a tie at either end of a window is found
in the next pass.

Scaled magnitudes: every function takes an optional per-tensor ``scales``;
element ``w`` of tensor ``i`` then counts as ``|w|·scales[i]`` (computed chunk
by chunk, never as a scaled copy of the weights). The FLOPs-biased global
backbone ranks ``|w| / s_l`` this way (ST-3σ, Vanderschueren & De
Vleeschouwer 2023).

On a GPU, one process instead writes all the magnitudes into one buffer
(:data:`SORT_DEVICES`, up to :data:`SORT_MAX_BYTES`): bucket narrowing waits
for the device once per chunk, and on an NVIDIA H200 it was ten times slower
than a sort (``docs/benchmarks.md``). A sorted sample of the buffer places a
narrow window around rank ``k``, two comparisons count the magnitudes below
and inside it (one wait for the device), and only the window is sorted; where
the window misses (never a wrong value, see :func:`_kth_in_window`), the
whole buffer is. Both paths give the same value to the bit.

Ties: ``T`` is the k-th smallest magnitude *value*. When several weights share
that magnitude, all of them satisfy ``|w| <= T``, so more than ``k`` weights
are pruned (by the number of extra ties); exact zeros always count as pruned.
With continuous-valued trained weights ties are rare, and with distinct
magnitudes exactly ``k`` weights satisfy ``|w| <= T``. A large tie is found
quickly too (see above).

Across processes (``process_group``): when each rank holds only a *shard* of
the weights (FSDP2 / DTensor, or layers split over ranks by hand), every rank
passes its own shard and the same group. The search above runs on every rank
in lock step, with each pass's *counts* all-reduced (SUM) over the group, so
all ranks narrow the same interval and stop at the same pass; ``N`` and hence
``k`` are global (an all-reduce of the local sizes). The weights are never
gathered: the last step all-gathers only a candidate window of at most
``CANDIDATE_CAP`` magnitudes *in total over all ranks* (it narrows further in
float-bit space until the window is that small). Every rank returns the same
value, bit for bit the one a single process gets on the concatenated weights.

When every rank holds the *same, full* weights (DDP, replicated), no group is
needed: each rank's local selection already gives the identical result, with
no communication. Passing a group there would be wrong (each weight counted
once per rank), so pass one only for sharded weights.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "PassStats",
    "count_at_most",
    "kth_magnitude",
    "scaled_magnitudes",
    "select_threshold",
]

# Elements processed at once: bounds the temporaries (magnitudes, bucket
# indices) to a few tens of MB whatever the size of the tensors.
CHUNK = 1 << 18
# Strided sample used to place the first boundaries when no hint is given
# (grown with the number of weights, up to SAMPLE_MAX; see _sample_size).
SAMPLE = 1 << 16
SAMPLE_MAX = 1 << 21
# Most elements kept from a window: GATHER_CAP, or one in GATHER_DIVISOR of
# all weights if that is more (0.8 % of their memory: a hinted window of a
# training step then fits at a billion weights too). A window that would hold
# more is dropped and the next pass narrows further instead.
GATHER_CAP = 1 << 22
GATHER_DIVISOR = 128
# Across processes: most magnitudes all-gathered in the final step, in total
# over all ranks (256 KiB of float32), so communication never scales with N.
CANDIDATE_CAP = 1 << 16
# Passes a selection may take before it is stopped as a bug. Each pass narrows
# the window to at most one of 64 parts of its float-bit span, so even a
# float64 window over every value ends within about 12 passes (plus one for a
# hint that missed); a search that did not shrink would otherwise run forever.
MAX_PASSES = 64
# Across processes, the first all-reduce also checks that every rank asked for
# the same selection (see _Comm.agreed_counts), in groups of up to this many ranks.
KEY_CHECK_MAX_RANKS = 1 << 15


# Devices on which a single process selects by sorting one buffer of the
# magnitudes (see _sort_select): a GPU, where bucket narrowing's per-chunk host
# synchronisations made it ten times slower than a sort (an H200, 2026-11-26).
# Up to SORT_MAX_BYTES of magnitudes (the sort then holds about four times
# that); above, and across processes, bucket narrowing as everywhere.
SORT_DEVICES = frozenset({"cuda"})
SORT_MAX_BYTES = 1 << 30
# The sort path sorts only a window around the k-th magnitude (see
# _kth_in_window) when there are at least WINDOW_MIN magnitudes: a sample of
# WINDOW_SAMPLE places it, and it holds at most one in WINDOW_MAX_SHARE of them.
# On an H100 the window took 1.1x the time of the whole sort at 1.1M
# magnitudes, 0.8-0.9x at 25.6M and 0.6-0.7x at 100M (two runs,
# docs/benchmarks.md).
WINDOW_SAMPLE = 1 << 16
WINDOW_MIN = 1 << 22
WINDOW_MAX_SHARE = 16


@dataclass
class PassStats:
    """What a selection's first pass learns about each tensor on the way.

    Pass one to :func:`kth_magnitude` / :func:`select_threshold` as ``stats``
    to have it filled. The Pruner uses it for its finite-weight and
    layer-collapse checks, which would otherwise read every weight once more.

    Attributes:
        abs_max: ``max |w|`` of each tensor (this rank's shard), a 1-d float
            tensor on the weights' device; NaN for a tensor holding a NaN.
            None when no pass ran (``k = 0``) or ``scales`` were given.
    """

    abs_max: Tensor | None = None


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


def _magnitudes(chunk: _Chunk, dtype: torch.dtype, out: Tensor | None = None) -> Tensor:
    """``|w|·scale`` of one chunk in ``dtype``: a new temporary, or written into ``out``."""
    values, scale = chunk
    if out is not None:
        a = torch.abs(values, out=out) if values.dtype == dtype else out.copy_(values).abs_()
    else:
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
    """How many elements over all tensors have ``|w|·scale <= value`` (a reference helper).

    Args:
        tensors: the tensors.
        value: the bound.
        scales: one positive factor per tensor (None: all 1).
    """
    dtype = _work_dtype(tensors)
    total = 0
    for chunk in _chunks(tensors, dtype, scales):
        total += int((_magnitudes(chunk, dtype) <= value).sum())
    return total


def _gather_cap(n: int) -> int:
    """Most magnitudes one pass gathers from ``n`` weights in a single process."""
    return max(GATHER_CAP, n // GATHER_DIVISOR)


def _sample_size(n: int, q: float) -> int:
    """Sample size for :func:`_sample_window`: ``SAMPLE``, more when ``n`` is large.

    The window of ±4 standard errors holds about ``8·sqrt(q(1-q)/m)·n``
    magnitudes. Past a few hundred million weights that can exceed what a
    pass gathers (:func:`_gather_cap`), and the pass would histogram instead,
    costing a second pass; a sample large enough to keep the window at half
    the cap avoids it (about 380 K magnitudes, 1.5 MB, at 10⁹ weights and
    q = 0.9), up to ``SAMPLE_MAX``.
    """
    spread = math.sqrt(max(q * (1 - q), 1.0 / n))
    needed = math.ceil((16 * spread * n / _gather_cap(n)) ** 2)
    return max(SAMPLE, min(needed, SAMPLE_MAX, n))


def _below(v: float, dtype: torch.dtype) -> float:
    """The greatest ``dtype`` value below ``v >= 0``; ``-1`` ("below 0") for ``v = 0``.

    ``(_below(v), v]`` is the window holding exactly the magnitudes equal to ``v``.
    """
    if v == 0.0:
        return -1.0
    x = torch.tensor(v, dtype=dtype)
    return float(torch.nextafter(x, torch.tensor(-math.inf, dtype=dtype)))


def _sample_window(chunks: list[_Chunk], dtype: torch.dtype, q: float) -> tuple[float, float]:
    """A window ``(lo, hi]`` likely to hold the ``q``-quantile of all magnitudes.

    Taken from a strided sample of ``m`` magnitudes (no full copy; ``m`` from
    :func:`_sample_size`): the sample quantile's standard error is
    ``sqrt(q(1-q)/m)``, and the window spans four of them on each side;
    when the sample holds one value ``v`` all across it (a tie), the window
    is exactly that value, ``(v⁻, v]``, not the empty ``(v, v]``. An empty
    shard gives the empty window ``(inf, -inf]``, which the union over ranks
    ignores.
    """
    n = sum(c.numel() for c, _ in chunks)
    if n == 0:
        return math.inf, -math.inf
    size = _sample_size(n, q)
    parts = []
    for c, scale in chunks:
        want = max(1, round(size * c.numel() / n))
        step = max(1, c.numel() // want)
        parts.append(_magnitudes((c[::step], scale), dtype))
    sample = torch.sort(torch.cat(parts)).values  # small: about SAMPLE elements
    m = sample.numel()
    se = math.sqrt(max(q * (1 - q), 1.0 / m) / m)
    i_lo = round((q - 4 * se) * (m - 1)) - 1
    i_hi = round((q + 4 * se) * (m - 1)) + 1
    lo = float(sample[i_lo]) if i_lo >= 0 else -1.0
    hi = float(sample[i_hi]) if i_hi < m else math.inf
    # NaN sorts last and is never <= anything: as a window's end it stands for inf.
    lo, hi = (math.inf if math.isnan(v) else v for v in (lo, hi))
    if lo == hi:  # a tie spans the window: take all of it
        lo = _below(hi, dtype)
    return lo, hi


def _split_evenly(lo: float, hi: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """About 64 boundaries strictly inside ``(lo, hi)``, evenly spaced in the float bit pattern.

    For non-negative IEEE floats the bit pattern, read as an integer, is
    monotone in the value, so each split divides the number of representable
    values left by 64: the search cannot stall, even on ties. Besides, the
    lowest and the highest value of the window get parts of their own
    (``(lo, lo⁺]`` and ``(hi⁻, hi]``), so that a tie at either end is
    isolated at once. Empty when ``lo`` and ``hi`` are adjacent floats
    (``lo < 0`` stands for "below 0").
    """
    int_dtype = torch.int64 if dtype == torch.float64 else torch.int32
    lo_i = int(torch.tensor(max(lo, 0.0), dtype=dtype).view(int_dtype))
    hi_i = int(torch.tensor(hi, dtype=dtype).view(int_dtype))
    step = max(1, (hi_i - lo_i) // 64)
    floor = -1 if lo < 0.0 else lo_i  # every boundary lies above it
    ints = set(range(lo_i + step, hi_i, step))
    ints.add(floor + 1)  # the lowest value alone: 0 itself when the window holds it
    ints.add(hi_i - 1)  # the highest value alone
    inside = sorted(i for i in ints if floor < i < hi_i)
    return torch.tensor(inside, dtype=int_dtype).view(dtype).to(device)


class _Comm:
    """The few collectives the search needs; the identity in a single process.

    Every rank calls each method at the same point of the search: the control
    flow depends only on reduced (hence identical) values, as collectives
    require.
    """

    def __init__(self, group: ProcessGroup | None, device: torch.device) -> None:
        self.group = group
        self.device = device

    def counts(self, *values: Tensor | int) -> list[int]:
        """Local counts summed over the group, as Python ints (one host sync)."""
        if self.group is None:
            return [int(v) for v in values]
        import torch.distributed as dist

        t = torch.stack([torch.as_tensor(v, dtype=torch.long, device=self.device) for v in values])
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        out: list[int] = t.tolist()
        return out

    def agreed_counts(self, key: int, *values: Tensor | int) -> tuple[bool, list[int]]:
        """:meth:`counts` of ``values``, and whether every rank passed the same ``key``.

        The key rides in the same all-reduce (no extra collective): it is cut
        into 16-bit limbs ``x``, and each limb's ``x`` and ``x²`` are summed;
        the ranks agree iff ``W·Σx² = (Σx)²`` for every limb (equality in the
        Cauchy–Schwarz inequality). The sums stay far below 2⁶³ for up to
        :data:`KEY_CHECK_MAX_RANKS` ranks; a larger group skips the check.
        The answer is computed from reduced values only, so it is the same on
        every rank.
        """
        if self.group is None:
            return True, [int(v) for v in values]
        import torch.distributed as dist

        world = dist.get_world_size(self.group)
        if world > KEY_CHECK_MAX_RANKS:
            return True, self.counts(*values)
        limbs = [(key >> shift) & 0xFFFF for shift in range(0, 64, 16)]
        packed = [x for limb in limbs for x in (limb, limb * limb)]
        out = self.counts(*values, *packed)
        sums = out[len(values) :]
        agree = all(world * sums[i + 1] == sums[i] * sums[i] for i in range(0, len(sums), 2))
        return agree, out[: len(values)]

    def union(self, lo: float, hi: float) -> tuple[float, float]:
        """The smallest window holding every rank's window, so all ranks start alike."""
        if self.group is None:
            return lo, hi
        import torch.distributed as dist

        t = torch.tensor([lo, -hi], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        u_lo, neg_hi = t.tolist()
        return u_lo, -neg_hi

    def gather(self, inside: Tensor, total: int) -> Tensor:
        """Every rank's candidates concatenated in rank order (``total`` in all, at most a cap).

        Each rank pads its part to ``total`` with ``+inf``: the pads sort after
        every candidate (or tie with an infinite one), so the k-th smallest
        candidate is unchanged, and one fixed-size all-gather suffices.
        """
        if self.group is None:
            return inside
        import torch.distributed as dist

        padded = torch.full((total,), math.inf, dtype=inside.dtype, device=inside.device)
        padded[: inside.numel()] = inside
        parts = [torch.empty_like(padded) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(parts, padded, group=self.group)
        return torch.cat(parts)


@dataclass
class _Parts:
    """A histogram over the parts ``(.., b0], (b0, b1], ..., (b_last, ..]`` of some bounds.

    Attributes:
        count: how many magnitudes fall in each part (int64).
        low: the least of them (``inf`` for an empty part).
        high: the greatest of them (``-inf`` for an empty part).
    """

    count: Tensor
    low: Tensor
    high: Tensor

    @classmethod
    def of(cls, x: Tensor, bounds: Tensor) -> _Parts:
        """The histogram of the magnitudes ``x``."""
        parts = bounds.numel() + 1
        idx = torch.bucketize(x, bounds)  # int64, the index dtype scatter_reduce_ always takes
        low = torch.full((parts,), math.inf, dtype=x.dtype, device=x.device)
        high = torch.full((parts,), -math.inf, dtype=x.dtype, device=x.device)
        return cls(
            torch.bincount(idx, minlength=parts),
            low.scatter_reduce_(0, idx, x, "amin"),
            high.scatter_reduce_(0, idx, x, "amax"),
        )

    def add(self, x: Tensor, bounds: Tensor) -> None:
        """Count the magnitudes ``x`` too."""
        other = _Parts.of(x, bounds)
        self.count += other.count
        torch.minimum(self.low, other.low, out=self.low)
        torch.maximum(self.high, other.high, out=self.high)


def _dominant(seen: Tensor, more: Tensor) -> float | None:
    """The value more than half of the magnitudes ``seen`` and ``more`` share, if any.

    The candidate is the most frequent of about 1024 of them (strided), then
    checked on all: a window too full to gather is most often so because of
    such a tie.
    """
    x = seen if seen.numel() else more
    if x.numel() == 0:
        return None
    values, counts = torch.unique(x[:: max(1, x.numel() // 1024)], return_counts=True)
    v = values[counts.argmax()]
    shared = int((seen == v).sum() + (more == v).sum())
    return float(v) if 2 * shared > seen.numel() + more.numel() else None


def _select_masked(a: Tensor, mask: Tensor) -> Tensor:
    """``a[mask]`` for a sparse ``mask``, about twice as fast on CPU.

    ``a[mask]`` finds the true entries with a scan of every flag. Here the
    flags are read eight at a time as the bytes of one int64, so the scan
    covers an eighth as many items; only the words holding a true flag are
    then unpacked. Same values, same order.
    """
    n = a.numel()
    full = n - n % 8
    words = torch.nonzero(mask[:full].view(torch.int64)).squeeze(1)
    sel = a[:full].view(-1, 8)[words][mask[:full].view(-1, 8)[words]]
    if full < n:
        sel = torch.cat([sel, a[full:][mask[full:]]])
    return sel


def _window_pass(
    chunks: list[_Chunk],
    dtype: torch.dtype,
    device: torch.device,
    lo: float,
    hi: float,
    cap: int,
    bounds: Tensor,
    always_histogram: bool,
    chunk_max: list[Tensor] | None = None,
) -> tuple[Tensor, int, Tensor | None, _Parts | None, tuple[float, int, int] | None]:
    """One pass over the weights for the window ``(lo, hi]``.

    A few cheap elementwise kernels per chunk (abs, two compares, a masked
    select) over the weights; anything more runs on the in-window few only.
    With ``chunk_max``, each chunk's ``max |w|·scale`` is appended to it
    (a reduction of the magnitudes already in cache: no second read).
    A window of one value (no ``bounds``) is only counted: its magnitudes
    are all ``hi``, however many tie there. Magnitudes too many to keep
    that are mostly one value ``v`` (a tie, :func:`_dominant`) are counted
    on either side of ``v`` from then on (two more compares per chunk)
    instead of histogrammed, far cheaper than histogramming the tie, unless
    ``always_histogram``.

    Returns:
        ``#{|w| <= lo}``; ``#{lo < |w| <= hi}``; those magnitudes, or None
        when more than ``cap`` or the window holds one value; their
        histogram over the parts ``bounds`` cut the window into
        (:class:`_Parts`) — computed once the magnitudes overflow the cap (or
        always, with ``always_histogram``, unless the window holds one
        value, or they were counted around a tie), else None; and
        ``(v, #{|w| < v}, #{|w| <= v})`` when they were, else None.
    """
    # Counted in float64: exact to 2^53 (each chunk's float count is exact,
    # chunks being far below 2^24 elements).
    at_most_lo = torch.zeros((), dtype=torch.float64, device=device)
    # Magnitudes in the window counted, not selected: all of them in a window
    # of one value, those after the cap overflowed when a tie fills it.
    counting = bounds.numel() == 0
    counted = torch.zeros((), dtype=torch.float64, device=device)
    pivot: float | None = None  # the tie
    pivot_below = 0.0  # the float below it
    below_pivot = at_most_pivot = counted  # #{|w| < pivot}, #{|w| <= pivot}
    hist: _Parts | None = None
    # Scratch buffers reused by every chunk: fresh multi-megabyte temporaries
    # cost page faults on every allocation, more than the kernels themselves.
    longest = max((c.numel() for c, _ in chunks), default=0)
    a_buf = torch.empty(longest, dtype=dtype, device=device)
    low_buf = torch.empty(longest, dtype=dtype, device=device)
    high_buf = torch.empty(longest, dtype=dtype, device=device)
    mask_buf = torch.empty(longest, dtype=torch.bool, device=device)
    # The magnitudes in the window are copied into one buffer as they are
    # found, so that nothing small and long-lived sits between the per-chunk
    # temporaries. Kept as hundreds of small tensors instead, they fragmented
    # the heap: at a billion weights the process grew by 1.4 GB in one pass
    # (benchmarks/bench_selection_1b.py).
    kept: Tensor | None = None
    keeping, size = True, 0
    for chunk in chunks:
        n = chunk[0].numel()
        a = _magnitudes(chunk, dtype, out=a_buf[:n])
        if chunk_max is not None:
            chunk_max.append(a.amax() if n else torch.zeros((), dtype=dtype, device=device))
        # The compares write 0/1 floats, not bools: on CPU a float-valued
        # compare runs about 3× faster, and so does the float -> bool copy
        # compared with a compare into bools. NaN is never <= anything.
        low = torch.le(a, lo, out=low_buf[:n])  # [|w| <= lo]
        at_most_lo += low.sum()
        high = torch.le(a, hi, out=high_buf[:n]).sub_(low)  # [lo < |w| <= hi]
        if counting:
            counted += high.sum()
            if pivot is not None:  # low_buf is free again
                below_pivot += torch.le(a, pivot_below, out=low_buf[:n]).sum()
                at_most_pivot += torch.le(a, pivot, out=low_buf[:n]).sum()
            continue
        mask = mask_buf[:n].copy_(high)
        sel = _select_masked(a, mask) if a.device.type == "cpu" else a[mask]
        if keeping and size + sel.numel() > cap:  # too many to keep
            keeping = False
            seen = kept[:size] if kept is not None else sel[:0]
            kept = None
            pivot = None if always_histogram else _dominant(seen, sel)
            if pivot is not None:  # a tie: count them around it from here on
                pivot_below = _below(pivot, dtype)
                counting = True
                counted = counted + size + sel.numel()
                below_pivot = at_most_lo + (seen <= pivot_below).sum() + (sel <= pivot_below).sum()
                at_most_pivot = at_most_lo + (seen <= pivot).sum() + (sel <= pivot).sum()
                continue
            hist = _Parts.of(seen, bounds)  # histogram them instead
        if not keeping:
            assert hist is not None
            hist.add(sel, bounds)
        elif sel.numel():
            if kept is None:
                total = sum(c.numel() for c, _ in chunks)
                kept = torch.empty(min(cap, total), dtype=dtype, device=device)
            kept[size : size + sel.numel()] = sel
        size += sel.numel()
    if counting:
        around = (pivot, int(below_pivot), int(at_most_pivot)) if pivot is not None else None
        return at_most_lo.long(), int(counted), None, None, around
    if not keeping:
        return at_most_lo.long(), size, None, hist, None
    inside = kept[:size] if kept is not None else torch.empty(0, dtype=dtype, device=device)
    if always_histogram:
        hist = _Parts.of(inside, bounds)
    return at_most_lo.long(), size, inside, hist, None


def _device(tensors: Sequence[Tensor], group: ProcessGroup | None) -> torch.device:
    if tensors:
        return tensors[0].device
    import torch.distributed as dist

    if group is not None and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_group(group: ProcessGroup | None) -> None:
    if group is None:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "process_group was given but torch.distributed is not initialized: call "
            "torch.distributed.init_process_group(...) first (torchrun sets the environment), "
            "or pass process_group=None for a single process"
        )


def _per_tensor_max(
    tensors: Sequence[Tensor], chunk_max: list[Tensor], dtype: torch.dtype, device: torch.device
) -> Tensor:
    """Each tensor's maximum from its chunks' maxima (0 for an empty tensor)."""
    out = []
    i = 0
    for t in tensors:
        c = math.ceil(t.numel() / CHUNK)
        if c:
            out.append(torch.stack(chunk_max[i : i + c]).max())
        else:
            out.append(torch.zeros((), dtype=dtype, device=device))
        i += c
    return torch.stack(out) if out else torch.zeros(0, dtype=dtype, device=device)


#: The request of a single-process selection: nothing to check.
_NO_REQUEST = (0, "")


def _select(
    tensors: Sequence[Tensor],
    rank_of: Callable[[int], int],
    hint: Tensor | float | None,
    hint_width: float,
    scales: Sequence[float] | None,
    group: ProcessGroup | None,
    stats: PassStats | None = None,
    request: tuple[int, str] = _NO_REQUEST,
) -> Tensor:
    """The search behind :func:`kth_magnitude`; ``rank_of(N)`` gives ``k`` from the global ``N``.

    ``request``: what this rank asked for, as a 64-bit key that determines ``k``
    given ``N`` and its description; across processes every rank must pass
    the same key (checked in the first all-reduce, at no extra collective).
    """
    if stats is not None:
        stats.abs_max = None  # never a previous call's
    if not (hint_width >= 0.0 and math.isfinite(hint_width)):
        # A negative width would make the first window (hi, lo], inverted.
        raise ValueError(f"hint_width must be a finite number >= 0, got {hint_width}")
    if not tensors and group is None:
        raise ValueError("kth_magnitude needs at least one tensor")
    _check_group(group)
    device = _device(tensors, group)
    comm = _Comm(group, device)
    dtype = _work_dtype(tensors)
    n = sum(t.numel() for t in tensors)
    if group is not None:  # global N, and float64 if any rank has float64 weights
        agree, (n, any64) = comm.agreed_counts(request[0], n, int(dtype == torch.float64))
        if not agree:  # k would differ: the ranks' searches would part ways and hang
            _refuse_different_requests(group, request[1])
        dtype = torch.float64 if any64 else torch.float32
    k = rank_of(n)
    if not 0 <= k <= n:
        raise ValueError(f"k must be in [0, {n}], got {k}")
    chunks = _chunks(tensors, dtype, scales)  # validates the scales
    if k == 0:
        return torch.zeros((), dtype=dtype, device=device)
    if (
        group is None
        and device.type in SORT_DEVICES
        and n * torch.finfo(dtype).bits // 8 <= SORT_MAX_BYTES
    ):
        return _sort_select(tensors, dtype, device, n, k, stats, scales)
    # A window holding more than `cap` magnitudes is narrowed, not gathered.
    cap = _gather_cap(n) if group is None else CANDIDATE_CAP

    # Invariant: the answer lies in (lo, hi]; lo = -1 stands for "nothing below".
    # NaN is never <= anything, so it is never counted.
    lo, hi = -1.0, math.inf
    h = float(hint) if hint is not None else 0.0
    sampled = not 0.0 < h < math.inf
    if not sampled:
        # Boundaries are held as values of the working dtype, so that every
        # comparison in every pass sees exactly the same number.
        w_lo, w_hi = (
            float(torch.tensor(h * (1 + f), dtype=dtype)) for f in (-hint_width, hint_width)
        )
    else:
        w_lo, w_hi = _sample_window(chunks, dtype, k / n)
    w_lo, w_hi = comm.union(w_lo, w_hi)
    # Per-chunk maxima of |w|, measured by the first pass only.
    chunk_max: list[Tensor] | None = [] if stats is not None and scales is None else None
    for _ in range(MAX_PASSES):
        exact = w_lo <= lo and w_hi >= hi  # the window is the whole interval
        bounds = _split_evenly(w_lo, min(w_hi, torch.finfo(dtype).max), dtype, device)
        at_most_lo, n_inside, inside, hist, around = _window_pass(
            chunks,
            dtype,
            device,
            w_lo,
            w_hi,
            cap,
            bounds,
            always_histogram=group is not None,
            chunk_max=chunk_max,
        )
        if stats is not None and chunk_max is not None:
            stats.abs_max = _per_tensor_max(tensors, chunk_max, dtype, device)
            chunk_max = None
        counts = hist.count if hist is not None else None
        if group is None:
            a, m = int(at_most_lo), n_inside
        else:  # one all-reduce: the two counts and the histogram
            a, m, *hist_counts = comm.counts(
                at_most_lo, n_inside, *(counts if counts is not None else [])
            )
            counts = torch.tensor(hist_counts)
        if a < k <= a + m:  # in the window
            if m <= cap and inside is not None:  # few enough to have been kept everywhere
                return torch.kthvalue(comm.gather(inside, m), k - a).values
            # Too many to gather: narrow to the part of the window that holds the answer.
            if bounds.numel() == 0:  # w_lo and w_hi are adjacent floats: the answer is w_hi
                return torch.tensor(w_hi, dtype=dtype, device=device)
            if around is not None:  # counted on either side of a tie at v
                v, below, at_most = around
                if below < k <= at_most:
                    return torch.tensor(v, dtype=dtype, device=device)
                lo, hi = (w_lo, _below(v, dtype)) if k <= below else (v, w_hi)
            else:
                assert hist is not None and counts is not None
                cum: list[int] = (a + torch.cumsum(counts, 0)).tolist()
                j = next(i for i, c in enumerate(cum) if c >= k)
                # That part's least and greatest magnitude (over all ranks): equal,
                # they are a tie holding the answer; else the next window's ends.
                least, greatest = comm.union(float(hist.low[j]), float(hist.high[j]))
                if least == greatest:
                    return torch.tensor(greatest, dtype=dtype, device=device)
                lo, hi = _below(least, dtype), greatest
        elif k <= a:
            hi = w_lo
        elif exact:  # k beyond every comparable magnitude
            raise ValueError("the k-th magnitude is NaN: the weights contain NaN")
        else:
            lo = w_hi
        w_lo, w_hi = lo, hi  # the next window is the whole interval left...
        if not sampled and not a < k <= a + m:
            # ...unless the hint missed: then a sample places a narrow window
            # in it, as without a hint (the whole side would take several
            # histogramming passes to narrow down).
            sampled = True
            s_lo, s_hi = comm.union(*_sample_window(chunks, dtype, k / n))
            if max(s_lo, lo) < min(s_hi, hi):
                w_lo, w_hi = max(s_lo, lo), min(s_hi, hi)
    raise RuntimeError(
        f"the exact threshold search did not end in {MAX_PASSES} passes (rank {k} of {n} "
        f"magnitudes, last window ({w_lo!r}, {w_hi!r}]): this is a bug in feather-sparse; "
        "please report it with the weights' dtype and size (selection.kth_magnitude)"
    )


def _refuse_different_requests(group: ProcessGroup, asked: str) -> None:
    """Raise, on every rank alike, that the ranks of ``group`` asked for different selections."""
    import torch.distributed as dist

    raise ValueError(
        "the ranks of the process group asked for different numbers of pruned weights (rank "
        f"{dist.get_rank(group)} of {dist.get_world_size(group)} asked for {asked}): every "
        "rank must ask for the same selection; under a Pruner, every rank must call step() "
        "the same number of times, with the same settings"
    )


def _sort_select(
    tensors: Sequence[Tensor],
    dtype: torch.dtype,
    device: torch.device,
    n: int,
    k: int,
    stats: PassStats | None,
    scales: Sequence[float] | None,
) -> Tensor:
    """The k-th smallest magnitude from one buffer of all the magnitudes.

    The magnitudes (``|w|·scale``, computed as every pass computes them) are
    written into one buffer, tensor by tensor; a window around rank ``k`` is
    sorted (:func:`_kth_in_window`), or the whole buffer where the window
    misses: on a GPU either costs a fraction of bucket narrowing's per-chunk
    kernels and host synchronisations. The same value as :func:`_select`'s
    other path, to the bit (NaN sorts last, above ``inf``: a ``k`` among NaNs
    is refused the same way).
    """
    mags = torch.empty(n, dtype=dtype, device=device)
    offset = 0
    maxima = []
    for i, t in enumerate(tensors):
        m = t.numel()
        scale = 1.0 if scales is None else float(scales[i])
        a = _magnitudes((t.detach().reshape(-1), scale), dtype, out=mags[offset : offset + m])
        maxima.append(a.amax() if m else torch.zeros((), dtype=dtype, device=device))
        offset += m
    if stats is not None and scales is None:
        stats.abs_max = (
            torch.stack(maxima) if maxima else torch.zeros(0, dtype=dtype, device=device)
        )
    value = _kth_in_window(mags, k)
    if value is not None:
        return value
    value = torch.sort(mags).values[k - 1]
    if torch.isnan(value):
        raise ValueError("the k-th magnitude is NaN: the weights contain NaN")
    return value


def _kth_in_window(mags: Tensor, k: int) -> Tensor | None:
    """The ``k``-th smallest of ``mags`` by sorting only a window around it, or
    ``None`` where the window misses it (then the caller sorts everything).

    A strided sample of :data:`WINDOW_SAMPLE` magnitudes, sorted, places the
    window ``[lo, hi]`` a few standard deviations of the sample's quantile
    either side of rank ``k``; two comparisons count the magnitudes below
    ``lo`` (``a``) and inside (``m``), read back together (one wait for the
    device), and if ``a < k <= a + m`` the answer is the ``(k − a)``-th of
    the window's magnitudes, which are few. Exact whatever the sample: every
    magnitude below ``lo`` is counted and every one in ``[lo, hi]`` kept, so
    a bad sample can only make the window miss (``None``), never give a
    wrong value. NaN compares false both ways: in neither count, as the sort
    puts it last. A window holding more than one in :data:`WINDOW_MAX_SHARE`
    of all magnitudes (a large tie) is left to the whole sort too.
    """
    n = mags.numel()
    if n < WINDOW_MIN:
        return None
    sample = torch.sort(mags[:: n // WINDOW_SAMPLE]).values
    s = sample.numel()
    q = k / n
    margin = 4.0 * math.sqrt(s * q * (1.0 - q)) + 16.0
    i_lo, i_hi = math.floor(q * s - margin), math.ceil(q * s + margin)
    if i_lo < 0 or i_hi >= s:  # the window would reach an end: no gain over one sort
        return None
    below = mags < sample[i_lo]
    at_most_hi = mags <= sample[i_hi]  # a superset of `below`, since lo <= hi
    a, b = torch.stack([below.sum(), at_most_hi.sum()]).tolist()
    m = b - a
    if not (a < k <= b and m * WINDOW_MAX_SHARE <= n):
        return None
    inside = mags[at_most_hi.logical_xor_(below)]
    return torch.sort(inside).values[k - a - 1]


def kth_magnitude(
    tensors: Sequence[Tensor],
    k: int,
    *,
    hint: Tensor | float | None = None,
    hint_width: float = 0.01,
    scales: Sequence[float] | None = None,
    process_group: ProcessGroup | None = None,
    stats: PassStats | None = None,
) -> Tensor:
    """The exact k-th smallest ``|w|`` over all elements of ``tensors`` (1-based ``k``).

    Args:
        tensors: any number of floating tensors, all on one device; they are
            read, never copied whole or modified. With ``process_group``, this
            rank's shard of the weights (may be empty).
        k: rank in ``[0, N]``; ``k = 0`` returns 0. With ``process_group``,
            ``N`` and ``k`` count the weights of all ranks together.
        hint: a value expected to be close to the answer (the previous
            threshold, during training). Affects speed only, never the result.
        hint_width: relative half-width of the first window around ``hint``.
        scales: optional positive factor per tensor: rank ``|w|·scales[i]``
            instead of ``|w|`` (no scaled copy is made).
        process_group: a ``torch.distributed`` group (e.g.
            ``torch.distributed.group.WORLD``) over which the weights are
            *sharded*: every rank of it must call this function with its own
            shard and the same ``k``, and all get the same result. ``None``
            (default): the tensors are all the weights. Do not pass a group
            for replicated weights (DDP): each weight would count once per rank.
        stats: a :class:`PassStats` to fill with what the first pass
            measured on the way (each tensor's ``max |w|``).

    Returns:
        A 0-d tensor on the tensors' device, of dtype float32 (float64 if any
        tensor is float64), equal to the k-th smallest (scaled) magnitude.

    Raises:
        ValueError: if ``k`` is outside ``[0, N]``, no tensor is given (without
            a group), a scale is not positive, ``hint_width`` is negative or not
            finite, the k-th magnitude would be NaN, or a group is given but
            ``torch.distributed`` is not initialized.
    """
    req = _request_k(k) if process_group is not None else _NO_REQUEST
    return _select(tensors, lambda n: k, hint, hint_width, scales, process_group, stats, req)


def select_threshold(
    tensors: Sequence[Tensor],
    sparsity: float,
    *,
    hint: Tensor | float | None = None,
    hint_width: float = 0.01,
    scales: Sequence[float] | None = None,
    process_group: ProcessGroup | None = None,
    stats: PassStats | None = None,
) -> Tensor:
    """The threshold ``T`` that prunes a fraction ``sparsity`` of all weights.

    ``T`` is the k-th smallest magnitude with ``k = round(sparsity·N)`` over
    every element of ``tensors``, so that exactly ``k`` weights satisfy
    ``|w| <= T`` when magnitudes are distinct (ties: see the module docstring).

    Args:
        tensors: the weights, all on one device (this rank's shard with a group).
        sparsity: fraction in ``[0, 1]``.
        hint: the previous threshold, for speed (see :func:`kth_magnitude`).
        hint_width: relative half-width of the first window around ``hint``.
        scales: optional positive factor per tensor; the threshold is then on
            ``|w|·scales[i]`` (see :func:`kth_magnitude`).
        process_group: the group over which the weights are sharded; ``N`` is
            then the total over all ranks (see :func:`kth_magnitude`).
        stats: filled with what the first pass measured (see :func:`kth_magnitude`).

    Returns:
        A 0-d tensor (float32, or float64 for float64 weights) on the weights' device.

    Raises:
        ValueError: if ``sparsity`` is outside ``[0, 1]``, or as :func:`kth_magnitude`.

    Example:
        >>> w = [torch.tensor([0.3, -0.1]), torch.tensor([[0.5, -0.2], [0.4, 0.0]])]
        >>> select_threshold(w, 0.5)  # k = 3 of 6: magnitudes 0, 0.1, 0.2
        tensor(0.2000)
    """
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity must be in [0, 1], got {sparsity}")
    req = _request_sparsity(sparsity) if process_group is not None else _NO_REQUEST
    return _select(
        tensors, lambda n: round(sparsity * n), hint, hint_width, scales, process_group, stats, req
    )


def _request_k(k: int) -> tuple[int, str]:
    """The request key of :func:`kth_magnitude` (see :func:`_select`): ``k`` itself."""
    try:
        key = int(k) & 0xFFFFFFFFFFFFFFFF
    except (TypeError, ValueError, OverflowError):  # refused later, as k outside [0, N]
        key = 0
    return key, f"k = {k!r}"


def _request_sparsity(sparsity: float) -> tuple[int, str]:
    """The request key of :func:`select_threshold`: the bits of ``sparsity`` as a float64
    (``k = round(sparsity·N)`` with the same global ``N`` on every rank)."""
    value = float(sparsity) + 0.0  # -0.0 as 0.0
    (key,) = struct.unpack("<Q", struct.pack("<d", value))
    return key, f"sparsity {value!r}"
