"""benchmarks/_timing.py: the interleaved timing the speed pages rest on."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _timing() -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_timing", ROOT / "benchmarks" / "_timing.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_each_round_starts_one_function_further_along() -> None:
    """In a fixed order the function timed right after another inherits its caches:
    rotated, every function runs after every other one equally often."""
    timing = _timing()
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = timing.timings(fns, repeats=6, warmup=0)
    assert {k: len(v) for k, v in times.items()} == {"a": 6, "b": 6, "c": 6}
    rounds = [calls[i : i + 3] for i in range(0, 18, 3)]
    assert rounds[:3] == [list("abc"), list("bca"), list("cab")]
    for name in "abc":  # in each position twice over six rounds
        assert [r.index(name) for r in rounds].count(0) == 2
    assert timing.timings({}, repeats=3) == {}


def test_the_paired_ratio_and_its_interval() -> None:
    timing = _timing()
    mid, lo, hi = timing.paired_median_ratio([2.0, 2.2, 1.8, 2.0], [1.0, 1.1, 0.9, 1.0])
    assert (mid, lo, hi) == (2.0, 2.0, 2.0)  # every round twice as slow
    mid, lo, hi = timing.paired_median_ratio([1.0, 1.2, 1.1, 1.05, 1.3], [1.0] * 5)
    assert mid == pytest.approx(1.1) and lo <= mid <= hi and lo >= 1.0 and hi <= 1.3
    with pytest.raises(ValueError, match="equally long"):
        timing.paired_median_ratio([1.0, 2.0], [1.0])
