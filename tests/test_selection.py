"""Exact k-th magnitude selection: against a sort reference, ties, zeros, hints, fallbacks."""

from __future__ import annotations

import math

import pytest
import torch

import feather_sparse.selection as selection
from _guards import guard
from _hypothesis import given, settings, st
from feather_sparse.selection import count_at_most, kth_magnitude, select_threshold


def sort_reference(tensors: list[torch.Tensor], k: int) -> float:
    mags = torch.cat([t.reshape(-1).abs().double() for t in tensors])
    return 0.0 if k == 0 else float(torch.sort(mags).values[k - 1])


tensor_lists = st.lists(
    st.lists(
        st.one_of(
            st.floats(-10, 10, allow_nan=False, width=32),
            st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5]),  # ties and exact zeros
        ),
        min_size=1,
        max_size=40,
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(tensor_lists, st.floats(0, 1), st.one_of(st.none(), st.floats(1e-6, 20)))
def test_matches_sort_with_ties_and_zeros(
    values: list[list[float]], s: float, hint: float | None
) -> None:
    tensors = [torch.tensor(v) for v in values]
    n = sum(t.numel() for t in tensors)
    k = round(s * n)
    t = select_threshold(tensors, s, hint=hint)
    assert float(t) == sort_reference(tensors, k)
    # |w| <= T counts at least k weights, and exactly k when magnitudes are distinct
    count = count_at_most(tensors, t)
    assert count >= k
    mags = torch.cat([x.abs() for x in tensors])
    if k > 0 and mags.unique().numel() == n:
        assert count == k


@pytest.mark.parametrize("seed", range(5))
def test_exact_count_distinct_magnitudes(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(s, generator=g) for s in [(30, 4), (7, 3, 3, 3), (1000,), (1,)]]
    n = sum(t.numel() for t in tensors)
    for s in (0.0, 0.1, 0.5, 0.9, 0.95, 0.99, 1.0):
        t = select_threshold(tensors, s)
        assert count_at_most(tensors, t) == round(s * n)


def test_golden_rigl_style_count() -> None:
    # a (30, 4) tensor at 50 % keeps exactly 60
    w = torch.randn(30, 4)
    t = select_threshold([w], 0.5)
    assert int((w.abs() > t).sum()) == 60


def test_k_zero_gives_zero_and_bounds() -> None:
    w = [torch.randn(10)]
    assert float(kth_magnitude(w, 0)) == 0.0
    assert float(kth_magnitude(w, 10)) == float(w[0].abs().max())
    with pytest.raises(ValueError, match=r"k must be in \[0, 10\]"):
        kth_magnitude(w, 11)
    with pytest.raises(ValueError, match="sparsity must be in"):
        select_threshold(w, 1.5)
    with pytest.raises(ValueError, match="at least one tensor"):
        kth_magnitude([], 0)


def test_all_ties() -> None:
    w = [torch.full((100,), -0.25), torch.full((50,), 0.25)]
    assert float(select_threshold(w, 0.3)) == 0.25
    assert count_at_most(w, 0.25) == 150  # ties at T are all pruned (documented)


def test_dtypes_and_result_dtype() -> None:
    w16 = torch.randn(1000).half()
    t = select_threshold([w16], 0.7)
    assert t.dtype == torch.float32
    assert float(t) == sort_reference([w16], 700)
    mixed = [torch.randn(100, dtype=torch.float64), torch.randn(10)]
    t64 = select_threshold(mixed, 0.5)
    assert t64.dtype == torch.float64
    assert float(t64) == sort_reference(mixed, 55)


def test_float64_exact() -> None:
    w = [torch.randn(500, dtype=torch.float64), torch.randn(300, dtype=torch.float64)]
    for k in (1, 77, 400, 800):
        assert float(kth_magnitude(w, k)) == sort_reference(w, k)


def test_nan_detected() -> None:
    w = [torch.tensor([1.0, float("nan"), 2.0])]
    with pytest.raises(ValueError, match="NaN"):
        kth_magnitude(w, 3)


def test_infinite_values_are_ordered() -> None:
    w = [torch.tensor([1.0, math.inf, -2.0, 0.5])]
    assert float(kth_magnitude(w, 4)) == math.inf
    assert float(kth_magnitude(w, 3)) == 2.0


@pytest.mark.parametrize("cap", [None, 2])
@pytest.mark.parametrize("hint", [None, 0.5, 3.0])
def test_nan_at_the_end_of_the_sampled_window_stands_for_inf(
    monkeypatch: pytest.MonkeyPatch, cap: int | None, hint: float | None
) -> None:
    """Every rank below the NaNs is exact, the infinite ones too, with any gather cap.

    NaN sorts last, so a sampled window may end on one; as an end it means
    inf. Taken as NaN, no magnitude is ``<= hi``, and the window's "inside"
    held every magnitude ``<= lo`` instead: ``kthvalue`` on them returned
    0.11 for the 274th of 300 magnitudes, which is inf.
    """
    if cap is not None:
        monkeypatch.setattr(selection, "GATHER_CAP", cap)
        monkeypatch.setattr(selection, "GATHER_DIVISOR", 1 << 62)  # the cap is GATHER_CAP
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, generator=g)
    where = torch.randperm(300, generator=g)
    w[where[:20]] = math.inf * torch.sign(w[where[:20]])
    w[where[20:30]] = math.nan
    for k in range(1, 291):  # 290 magnitudes are not NaN
        assert float(kth_magnitude([w], k, hint=hint)) == sort_reference([w], k), k
    with pytest.raises(ValueError, match="NaN"):
        kth_magnitude([w], 291, hint=hint)


@guard(
    "`kth_magnitude` / `select_threshold` with `hint_width` negative, NaN or inf",
    "`ValueError`: hint_width must be a finite number >= 0 (a negative width inverted the "
    "first window and could return a wrong threshold)",
)
@pytest.mark.parametrize("width", [-0.01, math.nan, math.inf])
def test_bad_hint_width_is_refused(width: float) -> None:
    with pytest.raises(ValueError, match="hint_width must be a finite number >= 0"):
        select_threshold([torch.randn(10)], 0.5, hint=0.3, hint_width=width)
    assert float(kth_magnitude([torch.tensor([1.0, 2.0])], 1, hint=1.0, hint_width=0.0)) == 1.0


@pytest.mark.parametrize("hint", [None, 1e-9, 0.5, 3.0, 1e9])
def test_fallback_paths_small_caps(monkeypatch: pytest.MonkeyPatch, hint: float | None) -> None:
    # Tiny chunks and gather caps force the multi-pass and bit-split paths.
    monkeypatch.setattr(selection, "CHUNK", 37)
    monkeypatch.setattr(selection, "GATHER_CAP", 5)
    monkeypatch.setattr(selection, "GATHER_DIVISOR", 1 << 62)  # the cap is GATHER_CAP
    g = torch.Generator().manual_seed(1)
    w = [
        torch.randn(400, generator=g),
        torch.randint(-3, 4, (300,), generator=g).float(),
        torch.zeros(20),
    ]
    for k in (1, 20, 21, 150, 360, 500, 719, 720):
        assert float(kth_magnitude(w, k, hint=hint)) == sort_reference(w, k), k


def test_does_not_modify_inputs() -> None:
    w = [torch.randn(100), torch.randn(5, 5)]
    before = [x.clone() for x in w]
    select_threshold(w, 0.5)
    assert all(torch.equal(a, b) for a, b in zip(w, before))


@pytest.mark.gpu
def test_cuda() -> None:
    w = [torch.randn(10_000, device="cuda"), torch.randn(300, 30, device="cuda")]
    for s in (0.5, 0.99):
        t = select_threshold(w, s)
        assert t.device.type == "cuda"
        assert float(t) == sort_reference([x.cpu() for x in w], round(s * 19_000))


# ------------------------------------------------------------------- pass internals
@pytest.mark.parametrize("n", [1, 7, 8, 9, 64, 1001])
@pytest.mark.parametrize("density", [0.0, 0.01, 0.3, 1.0])
def test_select_masked_equals_boolean_index(n: int, density: float) -> None:
    g = torch.Generator().manual_seed(n)
    a = torch.rand(n, generator=g)
    mask = torch.rand(n, generator=g) < density
    assert torch.equal(selection._select_masked(a, mask), a[mask])


def test_pass_stats_give_each_tensors_max_magnitude(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selection, "CHUNK", 50)  # several chunks per tensor
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(7, 30, generator=g), torch.empty(0), torch.randn(120, generator=g) * 5]
    ws[0][3, 4] = -9.0  # the largest magnitude is negative
    stats = selection.PassStats()
    t = select_threshold(ws, 0.6, stats=stats)
    assert float(t) == sort_reference(ws, round(0.6 * 330))
    assert stats.abs_max is not None
    assert stats.abs_max.tolist() == [9.0, 0.0, float(ws[2].abs().max())]
    # No pass (k = 0): nothing measured, and nothing stale kept.
    select_threshold(ws, 0.0, stats=stats)
    assert stats.abs_max is None


def test_pass_stats_propagate_nan() -> None:
    ws = [torch.randn(100), torch.randn(100)]
    ws[1][17] = math.nan
    stats = selection.PassStats()
    with pytest.raises(ValueError):
        kth_magnitude(ws, 200, stats=stats)  # the 200th magnitude would be the NaN
    assert stats.abs_max is not None
    assert math.isfinite(stats.abs_max[0]) and math.isnan(stats.abs_max[1])


def test_sample_grows_with_n_to_keep_the_first_window_gatherable() -> None:
    assert selection._sample_size(10**6, 0.9) == selection.SAMPLE
    for n in (10**9, 3 * 10**9):
        m = selection._sample_size(n, 0.9)
        window = 8 * math.sqrt(0.9 * 0.1 / m) * n  # ±4 standard errors of the quantile
        assert m > selection.SAMPLE and window <= selection._gather_cap(n) / 2
    assert selection._gather_cap(10**9) == 10**9 // selection.GATHER_DIVISOR


def test_gather_cap_scales_with_n(monkeypatch: pytest.MonkeyPatch) -> None:
    passes = []
    original = selection._window_pass

    def counting(*args: object, **kwargs: object) -> object:
        passes.append(args[5])  # the cap
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(selection, "_window_pass", counting)
    monkeypatch.setattr(selection, "GATHER_CAP", 10)
    monkeypatch.setattr(selection, "GATHER_DIVISOR", 100)
    w = [torch.randn(100_000, generator=torch.Generator().manual_seed(0))]
    t = sort_reference(w, 90_000)
    # A ±1 % window around the answer holds a few hundred magnitudes: over
    # GATHER_CAP, under n / GATHER_DIVISOR = 1000, so one pass suffices.
    assert float(kth_magnitude(w, 90_000, hint=t)) == t
    assert passes == [1000]


# ------------------------------------------------------------------- ties too many to gather
def _count_passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gets one entry per pass over the weights."""
    passes: list[int] = []
    original = selection._window_pass

    def counting(*args: object, **kwargs: object) -> object:
        passes.append(1)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(selection, "_window_pass", counting)
    return passes


@guard(
    "a global threshold whose rank falls inside a tie of millions of equal magnitudes "
    "(a layer set to one value, a quantized model)",
    "the tied value, found in one pass over the weights as without the tie (it took seven "
    "passes, 16 s at 2^24 ties)",
)
def test_a_rank_inside_a_huge_tie_takes_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """2^24 + 1 magnitudes of 0.5 among 1000 others, far more than a pass may gather.

    The strided sample sees only 0.5 around the quantile, so the first window
    is exactly ``(0.5⁻, 0.5]``, whose count says the answer is 0.5. Bisecting
    the float bit pattern towards 0.5 read all of them seven times over. (The
    ends of a tie: :func:`test_a_tie_too_many_to_gather_costs_no_extra_pass`.)
    """
    passes = _count_passes(monkeypatch)
    n_ties = (1 << 24) + 1
    w = torch.full((n_ties + 1000,), 0.5)
    w[:1000] = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    assert float(kth_magnitude([w], n_ties // 2)) == 0.5
    assert len(passes) == 1


def _tie_counting(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """``"counted"``: as in one process; ``"histogrammed"``: a window too full to gather is
    always histogrammed, as across processes (where every pass histograms its window)."""
    if mode == "histogrammed":
        monkeypatch.setattr(selection, "_dominant", lambda seen, more: None, raising=False)


MODES = ["counted", "histogrammed"]


@pytest.mark.parametrize("chunk", [None, 512], ids=["one-chunk", "chunks-of-512"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("hint", [None, 0.5, 0.5005, 0.05, 5.0])
def test_a_tie_too_many_to_gather_costs_no_extra_pass(
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    dtype: torch.dtype,
    where: str,
    hint: float | None,
    chunk: int | None,
) -> None:
    """At most two passes for a rank anywhere in a tie over the gather cap (three after a
    hint that misses, as without a tie), from any first window; one from a hint near it
    when the tie is counted. Counted: a window that overflows with a tie is counted on
    either side of it. Histogrammed: the part holding the answer is the answer when its
    least and greatest magnitude are equal, and a window's highest and lowest value each
    get a part of their own. Bisecting the bit pattern took up to eight passes here.
    With small chunks the window overflows in a later chunk than the first (kept magnitudes
    before it), and the chunks after it
    are counted around the tie (with one chunk that code never runs).
    """
    if chunk is not None:
        monkeypatch.setattr(selection, "CHUNK", chunk)
    monkeypatch.setattr(selection, "GATHER_CAP", 1000)  # as if the model were large
    monkeypatch.setattr(selection, "GATHER_DIVISOR", 1 << 62)  # the cap is GATHER_CAP
    _tie_counting(monkeypatch, mode)
    passes = _count_passes(monkeypatch)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(100_000, generator=g, dtype=dtype)
    w[torch.rand(100_000, generator=g) < 0.9] = 0.5  # about 90 000 ties
    below, ties = int((w.abs() < 0.5).sum()), int((w.abs() == 0.5).sum())
    k = {"first": below + 1, "middle": below + ties // 2, "last": below + ties}[where]
    assert float(kth_magnitude([w], k, hint=hint)) == 0.5 == sort_reference([w], k)
    near = hint is not None and 0.49 < hint < 0.51
    missed = hint is not None and not near
    assert len(passes) <= (1 if near and mode == "counted" else 2 + missed)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("side", ["above", "below"])
@pytest.mark.parametrize("hint", [0.5, 0.501, 0.499])
def test_a_tie_next_to_a_run_of_adjacent_floats_takes_two_passes(
    monkeypatch: pytest.MonkeyPatch, mode: str, dtype: torch.dtype, side: str, hint: float
) -> None:
    """90 000 ties at 0.5 and the 5000 floats just above (or below) it, each once.

    Counted, the tie is found in the first pass. Histogrammed, the first
    window's histogram puts 0.5 and its neighbours in one part; shrunk to its
    least and greatest magnitude, that part has 0.5 at one end, and the next
    pass gives that end a part of its own, which holds the answer. Bisecting
    the bit pattern took four to twelve passes here.
    """
    monkeypatch.setattr(selection, "GATHER_CAP", 1000)
    monkeypatch.setattr(selection, "GATHER_DIVISOR", 1 << 62)
    _tie_counting(monkeypatch, mode)
    passes = _count_passes(monkeypatch)
    g = torch.Generator().manual_seed(0)
    bits = torch.int32 if dtype == torch.float32 else torch.int64
    steps = torch.arange(1, 5001, dtype=bits) * (1 if side == "above" else -1)
    near = (torch.tensor(0.5, dtype=dtype).view(bits) + steps).view(dtype)
    far = torch.rand(5000, generator=g, dtype=dtype) * 0.3 + (0.0 if side == "above" else 0.7)
    w = torch.cat([torch.full((90_000,), 0.5, dtype=dtype), near, -far])
    w = w[torch.randperm(w.numel(), generator=g)]
    k = 5000 + 45_000  # inside the tie: 5000 magnitudes lie below it on either side
    assert float(kth_magnitude([w], k, hint=hint)) == 0.5 == sort_reference([w], k)
    assert len(passes) <= (1 if mode == "counted" else 2)


@guard(
    "a bug that keeps the exact threshold search from narrowing its window",
    "a RuntimeError after MAX_PASSES passes that says it is a bug and what to report, "
    "where the search ran forever",
)
def test_a_search_that_does_not_end_stops_with_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three passes are needed here (a hint that misses, then a narrowing); allowed one, the
    search stops with a message instead of running on (the loop was ``while True``)."""
    monkeypatch.setattr(selection, "GATHER_CAP", 1000)
    monkeypatch.setattr(selection, "GATHER_DIVISOR", 1 << 62)
    passes = _count_passes(monkeypatch)
    w = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    expected = sort_reference([w], 50_000)
    assert float(kth_magnitude([w], 50_000, hint=5.0)) == expected
    needed = len(passes)
    assert needed >= 2
    monkeypatch.setattr(selection, "MAX_PASSES", needed - 1)
    with pytest.raises(RuntimeError, match=rf"did not end in {needed - 1} passes.*a bug"):
        kth_magnitude([w], 50_000, hint=5.0)
