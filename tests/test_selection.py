"""Exact k-th magnitude selection: against a sort reference, ties, zeros, hints, fallbacks."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import feather_sparse.selection as selection
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
