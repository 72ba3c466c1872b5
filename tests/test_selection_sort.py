"""The sort path of the exact threshold (one process on a GPU) gives the bits of bucket
narrowing.

On CUDA a single process selects by sorting one buffer of the magnitudes
(``selection.SORT_DEVICES``): bucket narrowing synchronises with the host once per
chunk, which made it ten times slower than a sort on an H200. Both paths must give
the same value to the bit, and the same ``PassStats``; here the sort path is forced
on the CPU and compared with bucket narrowing on the same tensors.
"""

from __future__ import annotations

import pytest
import torch

from _guards import guard
from feather_sparse import selection
from feather_sparse.selection import PassStats, kth_magnitude, select_threshold


def _bits(t: torch.Tensor) -> list[int]:
    return t.reshape(-1).view(torch.uint8).tolist()


def both(
    monkeypatch: pytest.MonkeyPatch, tensors: list[torch.Tensor], k: int, **kwargs: object
) -> tuple[torch.Tensor, torch.Tensor, PassStats, PassStats]:
    """(sort, bucket narrowing) results and stats for the same call."""
    sort_stats, bucket_stats = PassStats(), PassStats()
    monkeypatch.setattr(selection, "SORT_DEVICES", frozenset({"cpu"}))
    by_sort = kth_magnitude(tensors, k, stats=sort_stats, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(selection, "SORT_DEVICES", frozenset())
    bucket = kth_magnitude(tensors, k, stats=bucket_stats, **kwargs)  # type: ignore[arg-type]
    return by_sort, bucket, sort_stats, bucket_stats


def _cases() -> dict[str, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    tiny = torch.tensor([1e-45, 2e-45, 1e-38, 0.0, -0.0, 3.0, float("inf"), -float("inf")])
    tie = torch.randn(5000, generator=g)
    tie[1000:4000] = -0.125
    return {
        "gaussian": [torch.randn(3000, generator=g), torch.randn(40, 50, generator=g)],
        "float64": [torch.randn(2000, generator=g, dtype=torch.float64), torch.randn(500)],
        "half": [torch.randn(3000, generator=g).half(), torch.randn(700, generator=g).bfloat16()],
        "half-only": [torch.randn(2000, generator=g).half(), torch.randn(50, generator=g).half()],
        "subnormals-zeros-inf": [tiny, torch.randn(100, generator=g) * 1e-40],
        "huge-tie": [tie],
        "empty-beside": [torch.empty(0), torch.randn(100, generator=g), torch.empty(3, 0)],
        "one-value": [torch.full((300,), 2.5)],
    }


CASES = _cases()


@guard(
    "the exact threshold on a GPU (one process): bucket narrowing synchronised with the "
    "host once per chunk, ten times a sort on an H200 (a 50M-weight step 11.7x dense)",
    "one sort of a buffer of all the magnitudes, the same "
    "value to the bit as bucket narrowing, ties, zeros, subnormals, inf and float64 "
    "included, and the same per-tensor maxima",
)
@pytest.mark.parametrize("name", sorted(CASES))
def test_sort_select_gives_the_bits_of_bucket_narrowing(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = sum(t.numel() for t in CASES[name])
    check_ranks(monkeypatch, name, {1, 2, n // 3, n // 2, n - 1, n})


def check_ranks(monkeypatch: pytest.MonkeyPatch, name: str, ranks: set[int]) -> None:
    """The sort path gives bucket narrowing's value and PassStats for each rank of a case."""
    for k in sorted(ranks - {0}):
        by_sort, bucket, rs, bs = both(monkeypatch, CASES[name], k)
        assert by_sort.dtype == bucket.dtype and by_sort.device == bucket.device
        assert _bits(by_sort) == _bits(bucket), (name, k, by_sort, bucket)
        assert rs.abs_max is not None and bs.abs_max is not None
        assert torch.equal(rs.abs_max, bs.abs_max)
        assert rs.abs_max.dtype == bs.abs_max.dtype  # the working dtype, as every pass


def test_sort_select_with_scales_and_a_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(1)
    tensors = [torch.randn(1000, generator=g), torch.randn(30, 30, generator=g)]
    for k in (1, 500, 1900):
        by_sort, bucket, rs, bs = both(monkeypatch, tensors, k, scales=[0.3, 7.0], hint=0.5)
        assert torch.equal(by_sort, bucket)
        assert rs.abs_max is None and bs.abs_max is None  # not measured with scales


def test_sort_select_refuses_a_rank_among_nans(monkeypatch: pytest.MonkeyPatch) -> None:
    w = torch.tensor([0.5, float("nan"), 1.0, float("nan")])
    monkeypatch.setattr(selection, "SORT_DEVICES", frozenset({"cpu"}))
    assert float(kth_magnitude([w], 2)) == 1.0
    with pytest.raises(ValueError, match="the k-th magnitude is NaN"):
        kth_magnitude([w], 3)


def test_a_selection_too_large_for_the_buffer_narrows_buckets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    real = selection._sort_select
    monkeypatch.setattr(selection, "SORT_DEVICES", frozenset({"cpu"}))
    monkeypatch.setattr(
        selection, "_sort_select", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    w = [torch.randn(1000)]
    select_threshold(w, 0.5)
    assert calls == [1]
    monkeypatch.setattr(selection, "SORT_MAX_BYTES", 3999)  # 1000 float32 = 4000 bytes
    select_threshold(w, 0.5)
    assert calls == [1]


@pytest.mark.gpu
def test_sort_select_on_cuda_equals_the_cpu() -> None:
    g = torch.Generator().manual_seed(2)
    cpu = [torch.randn(100_000, generator=g), torch.randn(300, 300, generator=g)]
    cpu[0][:50_000] = 0.0625  # a large tie
    cuda = [t.cuda() for t in cpu]
    for s in (0.1, 0.5, 0.9, 0.999):
        stats = PassStats()
        t = select_threshold(cuda, s, stats=stats)
        assert t.device.type == "cuda" and torch.equal(t.cpu(), select_threshold(cpu, s))
        assert stats.abs_max is not None and stats.abs_max.device.type == "cuda"


def _windowed(monkeypatch: pytest.MonkeyPatch, sample: int, max_share: int = 2) -> list[bool]:
    """Make the sort path use a window from ``4 * sample`` magnitudes on, holding at
    most one in ``max_share`` of them (a small sample places a wide window); the list
    records, call by call, whether the window held the answer (True) or missed."""
    monkeypatch.setattr(selection, "WINDOW_SAMPLE", sample)
    monkeypatch.setattr(selection, "WINDOW_MIN", 4 * sample)
    monkeypatch.setattr(selection, "WINDOW_MAX_SHARE", max_share)
    hits: list[bool] = []
    real = selection._kth_in_window

    def spy(mags: torch.Tensor, k: int) -> torch.Tensor | None:
        value = real(mags, k)
        hits.append(value is not None)
        return value

    monkeypatch.setattr(selection, "_kth_in_window", spy)
    return hits


@guard(
    "the exact threshold on a GPU sorted all the magnitudes: 0.5-0.8x the speed of one "
    "sort (an H100 and an H200), and 2.4 ms of a 50M-weight step's 4.5 ms pruner.step",
    "a sorted sample places a window around rank k and only the window is sorted; "
    "the same bits as bucket narrowing for every case and rank, the window's misses "
    "falling back to the whole sort",
)
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_window_gives_the_bits_of_bucket_narrowing(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hits = _windowed(monkeypatch, 256)  # a window from 1024 magnitudes on
    n = sum(t.numel() for t in CASES[name])
    check_ranks(monkeypatch, name, {1, 2, n // 10, n // 3, n // 2, 9 * n // 10, n - 1, n})
    if name in ("gaussian", "float64", "half"):  # spread values: the middle ranks hit
        assert any(hits), hits


def test_the_window_gives_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every k of a small tensor against a plain sort: the ranks at a window's edges
    (exactly k magnitudes below it, or the last one inside) included."""
    hits = _windowed(monkeypatch, 256, max_share=1)
    monkeypatch.setattr(selection, "SORT_DEVICES", frozenset({"cpu"}))
    w = torch.randn(1500, generator=torch.Generator().manual_seed(7))
    w[::11] = 0.5  # a tie across window edges
    expected = torch.sort(w.abs()).values
    got = [kth_magnitude([w], k) for k in range(1, 1501)]
    assert [_bits(v) for v in got] == [_bits(v) for v in expected]
    assert hits.count(True) > 1000


def test_the_window_holds_the_answer_at_training_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the real sample size (the window taken from 262,144 magnitudes on here), the
    ranks a training step asks for are found in the window, with the bits of bucket
    narrowing."""
    hits = _windowed(monkeypatch, selection.WINDOW_SAMPLE, selection.WINDOW_MAX_SHARE)
    g = torch.Generator().manual_seed(3)
    tensors = [torch.randn(200_000, generator=g), torch.randn(300, 400, generator=g) * 3]
    n = 320_000
    for sparsity in (0.5, 0.9, 0.98, 0.999):
        k = round(sparsity * n)
        by_sort, bucket, _, _ = both(monkeypatch, tensors, k)
        assert _bits(by_sort) == _bits(bucket), (sparsity, by_sort, bucket)
    assert hits == [True] * 4


def test_a_misleading_sample_only_costs_the_whole_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    """Magnitudes laid out so that the strided sample sees none of the small ones:
    the window [5, 5] misses the ranks below it (exactly k below it too) and the whole
    sort gives the exact value; a large tie inside the window is left to the whole
    sort as well."""
    hits = _windowed(monkeypatch, 256)
    w = torch.full((1600,), 5.0)
    w[1::2] = torch.linspace(0.0, 1.0, 800)  # the stride-6 sample reads only even places
    for k in (700, 799, 800, 801):
        by_sort, bucket, _, _ = both(monkeypatch, [w], k)
        assert _bits(by_sort) == _bits(bucket)
        assert float(by_sort) == float(torch.sort(w).values[k - 1])
    assert hits == [False, False, False, True]  # 801: the first of the 800 fives
    monkeypatch.setattr(selection, "WINDOW_MAX_SHARE", 16)
    tie = torch.randn(1600, generator=torch.Generator().manual_seed(4))
    tie[::3] = 0.75  # and the sample reads only these: a window of 534 of 1600
    by_sort, bucket, _, _ = both(monkeypatch, [tie], 800)
    assert _bits(by_sort) == _bits(bucket)
    assert hits == [False, False, False, True, False]


def test_the_window_skips_nans_and_refuses_a_rank_among_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hits = _windowed(monkeypatch, 256)
    w = torch.randn(2000, generator=torch.Generator().manual_seed(5))
    w[::5] = float("nan")  # 400 NaNs, in the sample too
    finite = torch.sort(w[~w.isnan()].abs()).values
    for k in (1, 800, finite.numel()):
        by_sort, bucket, _, _ = both(monkeypatch, [w], k)
        assert _bits(by_sort) == _bits(bucket) == _bits(finite[k - 1])
    assert hits == [False, True, False]  # the ranks at the ends: no window
    monkeypatch.setattr(selection, "SORT_DEVICES", frozenset({"cpu"}))
    with pytest.raises(ValueError, match="the k-th magnitude is NaN"):
        kth_magnitude([w], finite.numel() + 1)


@pytest.mark.gpu
def test_the_window_on_cuda_equals_bucket_narrowing_on_the_cpu() -> None:
    g = torch.Generator().manual_seed(6)
    cpu = [torch.randn(5_000_000, generator=g), torch.randn(700, 700, generator=g) * 0.1]
    assert sum(t.numel() for t in cpu) >= selection.WINDOW_MIN  # the window is used
    cpu[0][:100_000] = 0.0625  # a tie
    cpu[1][0, :5] = float("nan")
    cuda = [t.cuda() for t in cpu]
    for s in (0.1, 0.5, 0.9, 0.98, 0.999):
        t = select_threshold(cuda, s)
        assert t.device.type == "cuda" and _bits(t.cpu()) == _bits(select_threshold(cpu, s)), s


@pytest.mark.gpu
def test_bucket_narrowing_on_cuda_equals_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The multi-pass search that a GPU runs above SORT_MAX_BYTES of magnitudes (and under
    a process group), forced here at a small size: the same bits as on the CPU."""
    calls: list[int] = []
    real = selection._sort_select
    monkeypatch.setattr(selection, "_sort_select", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(selection, "SORT_MAX_BYTES", 1024)
    g = torch.Generator().manual_seed(7)
    cpu = [torch.randn(200_000, generator=g), torch.randn(300, 300, generator=g) * 0.1]
    cpu[0][:20_000] = 0.0625  # a tie
    cuda = [t.cuda() for t in cpu]
    for s in (0.1, 0.5, 0.9, 0.999):
        t = select_threshold(cuda, s)
        assert t.device.type == "cuda" and _bits(t.cpu()) == _bits(select_threshold(cpu, s)), s
    assert calls == []  # no sort: the buckets were narrowed on the device
