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
    tensors = CASES[name]
    n = sum(t.numel() for t in tensors)
    for k in sorted({1, 2, n // 3, n // 2, n - 1, n} - {0}):
        by_sort, bucket, rs, bs = both(monkeypatch, tensors, k)
        assert by_sort.dtype == bucket.dtype and by_sort.device == bucket.device
        assert (
            by_sort.view(-1).view(torch.uint8).tolist()
            == bucket.view(-1).view(torch.uint8).tolist()
        ), (name, k, by_sort, bucket)
        assert rs.abs_max is not None and bs.abs_max is not None
        assert torch.equal(rs.abs_max, bs.abs_max)


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
