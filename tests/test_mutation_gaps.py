"""Tests that close the gaps a mutation audit of the core numerics found.

Each test here fails on one hand-made mutant that the rest of the suite let
through (``docs/mutation-audit.md`` lists them: the mutant's id is in each
test's docstring) and asserts behaviour from the specification — eq. (3) and
§2.2.2 of the paper, ``ALGORITHMS.md`` and the docstrings — not a snapshot of
today's output.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import feather_sparse as fs
from _guards import guard
from feather_sparse.export import codec
from feather_sparse.nm import NMPattern, nm_threshold
from feather_sparse.ops import BLOCK, OutputCache


def eq3(w: torch.Tensor, t: float, p: float) -> torch.Tensor:
    """``P_T(w)`` of eq. (3) in float64, written as the paper writes it."""
    w = w.double()
    kept = w.abs() > t
    mag = (w.abs().pow(p) - t**p).clamp_min(0).pow(1 / p)
    return torch.where(kept, torch.sign(w) * mag, torch.zeros_like(w))


# ------------------------------------------------------------------- ops.py: P_T and its STE
@pytest.mark.parametrize("p", [1.5, 2.5, 4.5, 7.25])
def test_non_integer_p_follows_eq3(p: float) -> None:
    """ops07: a non-integer ``p`` must not take the integer-``p`` (Horner) path.

    The other value tests use integer ``p`` (2, 3, 7) or only check bounds,
    which a wrong bracket ``(1 − (T/|w|)^⌊p⌋)^(1/p)`` still satisfies.
    """
    w = torch.tensor([2.0, -3.0, 1.25, -0.5, 1.0, 40.0], dtype=torch.float64)
    out = fs.threshold(w, torch.tensor(1.0, dtype=torch.float64), p=p)
    assert torch.allclose(out, eq3(w, 1.0, p), rtol=1e-12, atol=0)
    out32 = fs.threshold(w.float(), torch.tensor(1.0), p=p)
    assert torch.allclose(out32.double(), eq3(w.float(), 1.0, p), rtol=1e-6, atol=0)


def test_a_last_block_of_one_element_is_computed() -> None:
    """ops18: a weight of ``k·BLOCK + 1`` entries has a last block of one element.

    Its output (and only its) was left as uninitialised memory when the block
    loop stopped one element early; the blockwise tests use sizes whose last
    block is longer.
    """
    n = BLOCK + 1
    w = torch.linspace(-3.0, 3.0, n, dtype=torch.float32)
    w[-1] = 2.0  # the lone last element, kept: P_1(2) = 7^(1/3)
    out = fs.threshold(w, torch.tensor(1.0), p=3.0)
    assert out[-1].item() == pytest.approx(7 ** (1 / 3), rel=1e-6)
    assert torch.allclose(out.double(), eq3(w, 1.0, 3.0), rtol=1e-5, atol=0)


def test_output_cache_follows_a_change_of_the_weights_dtype() -> None:
    """ops21: after ``model.half()`` the cached float32 output must not be reused.

    ``threshold`` returns ``P_T(w)`` in ``w``'s dtype; a cache that ignored the
    dtype handed the float32 buffer to the float16 weight.
    """
    cache = OutputCache()
    w = torch.randn(300, 300)  # over one block: the cached CPU path
    out = fs.threshold(w.requires_grad_(), torch.tensor(0.5), cache=cache)
    assert out.dtype == torch.float32
    del out  # nothing holds the cached memory: it would be reused
    w16 = w.detach().half().requires_grad_()
    out16 = fs.threshold(w16, torch.tensor(0.5), cache=cache)
    assert out16.dtype == torch.float16
    assert torch.equal(out16, fs.threshold(w16.detach(), torch.tensor(0.5)))


def test_python_float_threshold_is_not_rounded_to_half() -> None:
    """ops22: ``T`` given as a Python float is the number given, also for half weights.

    float16(0.7) = 0.70019…, above 0.7: that weight must be kept. Rounding
    ``T`` to the weights' half dtype prunes it (``|w| <= T``), and a float
    ``T`` then disagrees with the 0-d float32 tensor of the same value.
    """
    w = torch.tensor([0.7, -0.7, 0.69, 2.0], dtype=torch.float16)
    assert float(w[0]) > 0.7
    out = fs.threshold(w, 0.7)
    assert torch.equal(out != 0, w.double().abs() > 0.7)
    assert torch.equal(out, fs.threshold(w, torch.tensor(0.7)))


def test_float64_threshold_on_float32_weights_is_compared_in_float64() -> None:
    """ops25: a float64 ``T`` (the global backbone's, when any weight is float64)
    is not rounded to the float32 weights' dtype.

    float32(0.1) = 0.1000000015 > 0.1, so ``P_T`` keeps it, as the selection's
    float64 count (``|w| <= T`` pruned) assumes; rounding ``T`` to float32
    makes the two equal and prunes it.
    """
    w = torch.tensor([0.1, -0.1, 0.05, 1.0], dtype=torch.float32)
    t = torch.tensor(0.1, dtype=torch.float64)
    for p in (1.0, 3.0, math.inf):
        out = fs.threshold(w, t, p=p)
        assert out.dtype == torch.float32
        assert torch.equal(out != 0, w.double().abs() > t), p


def test_zero_threshold_is_the_identity_on_subnormal_weights_over_one_block() -> None:
    """ops24: ``P_0(w) = w`` for every ``p`` (the ``_forward`` docstring), subnormal
    weights included, on the CPU blockwise path (over ``BLOCK`` entries).

    That path takes ``T = 0`` as the hard operator, which is exact; computed
    with ``p = 3`` instead, a magnitude below the smallest normal float is
    divided as if it were that float and comes out shrunk (1e-40 -> 2e-41).
    """
    w = torch.full((BLOCK + 10,), 1e-40)
    w[1::2] = -3e-39
    w[-1] = 0.5
    assert torch.equal(fs.threshold(w, torch.tensor(0.0), p=3.0), w)


# ------------------------------------------------------------------- nm/operator.py: N:M
def _ranked_keep(group: list[float], n: int) -> list[bool]:
    """The kept positions by the documented total order: magnitude, then the lower position."""
    order = sorted(range(len(group)), key=lambda i: (-abs(group[i]), i))
    kept = set(order[:n])
    return [i in kept for i in range(len(group))]


@pytest.mark.parametrize("pattern", ["2:4", "1:4", "3:4", "4:8"])
def test_nm_keep_mask_orders_adjacent_float32_magnitudes(pattern: str) -> None:
    """nm03: magnitudes one float32 ulp apart are ordered by magnitude before position.

    Every group of four (eight) drawn from 1.0 and its two float32 successors,
    with signs: the keys ``bits·M + (M − 1 − position)`` keep them apart, a key
    built with ``M − 1`` instead of ``M`` lets a lower position overtake the
    next larger magnitude (and collide with it, keeping too few).
    """
    import itertools

    from feather_sparse.nm import nm_keep_mask

    pat = NMPattern.parse(pattern)
    one = torch.tensor(1.0)
    up1 = torch.nextafter(one, torch.tensor(2.0))  # 1 + 2^-23
    up2 = torch.nextafter(up1, torch.tensor(2.0))  # 1 + 2^-22
    values = [1.0, -float(up1), float(up2), 0.5]
    if pat.m == 4:
        groups = [list(g) for g in itertools.product(values, repeat=4)]
    else:
        gen = torch.Generator().manual_seed(0)
        idx = torch.randint(0, len(values), (2000, 8), generator=gen).tolist()
        groups = [[values[i] for i in row] for row in idx]
    w = torch.tensor(groups, dtype=torch.float32)
    assert len({abs(v) for v in values}) == 4 and w.abs().unique().numel() == 4
    keep, _ = nm_keep_mask(w, pat)
    expected = [_ranked_keep(g, pat.n) for g in groups]
    assert keep.tolist() == expected


def test_nm_fixed_mask_prunes_to_positive_zero() -> None:
    """nm16: the fixed-mask (one-shot) forward leaves ``+0.0`` where it prunes, like
    the hard forward, so that the N:M encoding (which needs the ``M − N``
    dropped entries to be ``+0.0``) stores the result bit for bit."""
    from feather_sparse.nm import decode_nm, encode_nm

    w = torch.tensor([[-2.0, -1.0, 0.5, -3.0], [-0.1, 0.2, -0.3, -0.4]])
    mask = torch.tensor([[True, False, False, True], [False, False, True, True]])
    out = nm_threshold(w, "2:4", mask=mask)
    assert torch.equal(out, torch.where(mask, w, torch.zeros_like(w)))
    assert not torch.signbit(out[~mask]).any()
    values, indices = encode_nm(out, "2:4")
    back = decode_nm(values, indices, tuple(out.shape), "2:4")
    assert torch.equal(back.view(torch.int32), out.view(torch.int32))


@pytest.mark.parametrize("theta", [0.0, 0.25, 1.0])
def test_nm_decay_reaches_every_pruned_weight_with_finite_p(theta: float) -> None:
    """nm19: with finite ``p`` the decay ``λ·(1 − mask)⊙w`` reaches all ``M − N``
    pruned weights, the largest of them (``|w| = T_g``) included.

    Group [2, −1, 0.5, −3] at 2:4: ``T_g = 1``; −1 and 0.5 are pruned, so
    their gradient is ``θ·g + λ·w``, the kept ones get ``g``.
    """
    lam = 0.1
    w = torch.tensor([[2.0, -1.0, 0.5, -3.0]], dtype=torch.float64, requires_grad=True)
    g = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    nm_threshold(w, "2:4", p=3.0, theta=theta, decay=lam).backward(g)
    expected = [1.0, theta * 2.0 + lam * -1.0, theta * 3.0 + lam * 0.5, 4.0]
    assert w.grad is not None
    assert w.grad.squeeze(0).tolist() == pytest.approx(expected, abs=1e-12)


# ------------------------------------------------------------------- selection.py: exact k-th
def test_counts_past_two_to_the_24_stay_exact() -> None:
    """sel15: the count of magnitudes ``<= lo`` is exact past 2^24 weights.

    Counted in float32, 2^24 + 1 rounds to 2^24 and the k-th magnitude comes
    out one rank off (2.0 instead of 1.0 here); ResNet-50 alone has 25 M
    prunable weights. 2^24 + 1 ties at 0.5, then 1.0 and 2.0: the
    (2^24 + 2)-th smallest magnitude is 1.0 (one pass, about 0.1 s).
    """
    from feather_sparse.selection import kth_magnitude

    n_ties = (1 << 24) + 1
    w = torch.full((n_ties + 2,), 0.5)
    w[-2], w[-1] = 1.0, -2.0
    assert float(kth_magnitude([w], n_ties + 1)) == 1.0


@pytest.mark.parametrize("hint", [None, 0.5])
def test_zeros_next_to_the_least_subnormal_keep_their_rank(
    monkeypatch: pytest.MonkeyPatch, hint: float | None
) -> None:
    """sel21 (0 no longer split off from a window that starts below 0): the k-th
    magnitude is exact when zeros and the least subnormal (the float next to 0)
    are too many to gather.

    Without a part of its own for 0, a window holding both values has no
    boundary left inside it, and the search answered the subnormal for the
    rank of a zero (ranks 9 to 14 here). Tiny gather caps force the
    histogramming path, as on a large model.
    """
    from feather_sparse import selection

    monkeypatch.setattr(selection, "CHUNK", 37)
    monkeypatch.setattr(selection, "GATHER_CAP", 5)
    monkeypatch.setattr(selection, "GATHER_DIVISOR", 1 << 62)  # the cap is GATHER_CAP
    least = float(torch.nextafter(torch.tensor(0.0), torch.tensor(1.0)))  # 2^-149
    g = torch.Generator().manual_seed(0)
    for zeros, subnormals in ((20, 20), (3, 30)):
        w = [torch.zeros(zeros), torch.full((subnormals,), -least), torch.randn(40, generator=g)]
        ranked = torch.cat([x.abs() for x in w]).sort().values
        for k in range(1, ranked.numel() + 1):
            got = float(selection.kth_magnitude(w, k, hint=hint))
            assert got == float(ranked[k - 1]), (zeros, subnormals, k)


# ------------------------------------------------------------- export/codec.py: .fsp encodings
# The decoders run behind each record's CRC-32, so they see corrupt bytes only
# when the checksum was recomputed over them (an edited file, a faulty writer);
# the module's contract is still a ValueError for any corrupt input.
@guard(
    "a `.fsp` pattern stream corrupted under a valid CRC: a position past the tensor, "
    "a dangling run byte, bytes after the stream's end",
    "`ValueError`: compressed pattern is corrupted",
)
def test_pattern_decoders_refuse_corrupt_streams() -> None:
    """cod05, cod06, cod22: each corruption is a ValueError, never a mask.

    cod05 let a last position equal to ``numel`` through (an IndexError);
    cod06 accepted a run that never ends (a trailing 255); cod22 accepted
    bytes after the end of the LZMA2 stream.
    """
    gaps = codec.PATTERN_CODECS.get("gaps+lzma")
    bitmask = codec.PATTERN_CODECS.get("bitmask+lzma")
    lzma = codec._lzma_compress
    with pytest.raises(ValueError, match="pattern is corrupted"):
        gaps.decode(lzma(bytes([4])), 4, 1)  # 4 zeros, then the non-zero at position 4 of 4
    with pytest.raises(ValueError, match="pattern is corrupted"):
        gaps.decode(lzma(bytes([0, 255])), 300, 1)  # the second run never terminates
    mask = np.array([1, 0, 1, 0, 0, 0, 0, 1], dtype=bool)
    for name, good in (("bitmask", bitmask), ("gaps", gaps)):
        data = good.encode(mask)
        assert np.array_equal(good.decode(data, 8, 3), mask), name
        with pytest.raises(ValueError, match="pattern is corrupted"):
            good.decode(data + b"\x00junk", 8, 3)


@guard(
    "`.fsp` value planes that disagree with their header record under a valid CRC "
    "(a plane missing, a plane cut short, a length over the count)",
    "`ValueError`: stored values are corrupted / do not match their header record",
)
def test_value_decoder_refuses_corrupt_planes() -> None:
    """cod13, cod14, cod24: ``planes+zlib`` refuses, with its own message, a plane
    cut before its checksum (cod13 accepted it), a header with too few planes
    (cod14 returned uninitialised memory) and a stored length over the value
    count (cod24 let numpy's broadcasting error through)."""
    values = torch.linspace(-1.0, 1.0, 1000).half()
    lengths, data = codec._encode_values(values)
    assert all(length < 1000 for length in lengths)  # both planes compressed
    assert torch.equal(codec._decode_values(data, lengths, 1000, torch.float16), values)
    cut = data[: lengths[0] - 4] + data[lengths[0] :]  # plane 0 without its Adler-32
    with pytest.raises(ValueError, match="stored values are corrupted"):
        codec._decode_values(cut, (lengths[0] - 4, lengths[1]), 1000, torch.float16)
    with pytest.raises(ValueError, match="do not match their header"):
        codec._decode_values(data[: lengths[0]], lengths[:1], 1000, torch.float16)
    longer = (1001, len(data) - 1001)
    with pytest.raises(ValueError, match="stored values are corrupted"):
        codec._decode_values(data, longer, 1000, torch.float16)


@guard(
    "an `nm+lzma` record whose shape is 1-d under a valid CRC",
    "`ValueError`: shape does not split into groups of M",
)
def test_nm_decoder_refuses_a_shape_the_writer_never_writes() -> None:
    """cod20: N:M groups need a ``(out, …)`` weight; a 1-d or 0-d shape is refused (the
    mutant decoded a 1-d one as a column; since ``decode_nm`` checks that rows are whole
    groups, it refuses that one too, so the 0-d shape, which has no rows, tells them apart)."""
    pattern = NMPattern(2, 4)
    w = torch.tensor([[1.0, 0.0, 2.0, 0.0, 0.0, -2.0, 0.0, 3.0]])
    encoded = codec._encode_nm(w, pattern)
    assert encoded is not None
    data, values = encoded
    assert torch.equal(codec._decode_nm(data, values, (1, 8), pattern, torch.float32), w)
    for shape in [(8,), ()]:
        with pytest.raises(ValueError, match="does not split into groups of 4"):
            codec._decode_nm(data, values, shape, pattern, torch.float32)


def _encodings(mask: np.ndarray) -> dict[str, int]:
    """Bytes of every registered codec whose density range (bounds included) holds the mask's."""
    density = float(mask.mean())
    out = {}
    for name in codec.PATTERN_CODECS.names():
        c = codec.PATTERN_CODECS.get(name)
        if c.min_density <= density <= c.max_density:
            out[name] = len(c.encode(mask))
    return out


def test_the_smallest_pattern_encoding_is_kept_bounds_included() -> None:
    """cod09, cod10: the stored pattern is the smallest encoding among the codecs
    whose density range holds the mask's density, its bounds included
    (``PatternCodec``: "at or above" / "at or below").

    At density 0.15 both codecs compete (cod09 kept the larger one); at
    exactly 0.25, the gaps codec's upper bound, runs of 1 or 5 zeros encode
    smaller as gaps (cod10 no longer tried them there).
    """
    rng = np.random.default_rng(0)
    iid = rng.random(20_000) < 0.15
    runs = np.array([1] * 2000 + [5] * 2000)
    rng.shuffle(runs)
    at_bound = np.zeros(int(runs.sum() + runs.size), dtype=bool)
    at_bound[np.cumsum(runs + 1) - 1] = True
    assert at_bound.mean() == codec._GAPS_MAX_DENSITY
    for mask in (iid, at_bound):
        sizes = _encodings(mask)
        assert len(sizes) == 2  # both codecs claim these densities
        name, data = codec._encode_pattern(mask)
        assert len(data) == min(sizes.values()) and sizes[name] == len(data)
        decoded = codec.PATTERN_CODECS.get(name).decode(data, mask.size, int(mask.sum()))
        assert np.array_equal(decoded, mask)
    assert codec._encode_pattern(at_bound)[0] == "gaps+lzma"


def test_nm_encoding_round_trips_when_positions_do_not_fill_a_byte() -> None:
    """cod17: three 1:4 groups hold 6 bits of positions, stored in one byte
    (``ceil``); a length rounded down (0 bytes) refuses the writer's own output."""
    pattern = NMPattern(1, 4)
    w = nm_threshold(torch.randn(3, 4), pattern, p=math.inf)
    encoded = codec._encode_nm(w, pattern)
    assert encoded is not None
    back = codec._decode_nm(encoded[0], encoded[1], (3, 4), pattern, torch.float32)
    assert torch.equal(back.view(torch.int32), w.view(torch.int32))


def test_nm_encoding_keeps_a_nan_among_the_kept_values() -> None:
    """cod18: a NaN among the kept values is restored bit for bit, so the tensor is
    stored as N:M (``_encode_nm`` leaves only a ``-0.0`` or NaN among the
    *dropped* entries to the unstructured codecs); comparing by value
    (NaN != NaN) rejected it."""
    pattern = NMPattern(2, 4)
    w = torch.tensor([[math.nan, 0.0, 1.0, 0.0, 0.0, -2.0, 0.0, 3.0]])
    encoded = codec._encode_nm(w, pattern)
    assert encoded is not None
    back = codec._decode_nm(encoded[0], encoded[1], (1, 8), pattern, torch.float32)
    assert torch.equal(back.view(torch.int32), w.view(torch.int32))
