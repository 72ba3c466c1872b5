"""benchmarks/_timing.py: the interleaved timing the speed pages rest on."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from tests._helpers import script_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def timing() -> Iterator[ModuleType]:
    with script_module(ROOT / "benchmarks" / "_timing.py", "_timing_rounds_under_test") as module:
        yield module


def test_each_round_runs_the_functions_in_an_order_of_its_own(timing: ModuleType) -> None:
    """In a fixed order the function timed right after another inherits its state: each
    round is shuffled (seeded), so every function runs in every place and after every
    other function, and the same seed gives the same orders."""
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abcd"}
    times = timing.timings(fns, repeats=60, warmup=0)
    assert {k: len(v) for k, v in times.items()} == {k: 60 for k in "abcd"}
    rounds = [calls[i : i + 4] for i in range(0, 240, 4)]
    assert all(sorted(r) == list("abcd") for r in rounds)  # each once a round
    places = {(r.index(name), name) for r in rounds for name in "abcd"}
    assert len(places) == 16  # every function in every place
    follows = {(a, b) for a, b in itertools.pairwise(calls) if a != b}
    assert len(follows) == 12  # every function right after every other one
    again: list[str] = []
    timing.timings({n: (lambda n=n: again.append(n)) for n in "abcd"}, repeats=60, warmup=0)
    assert again == calls
    assert timing.timings({}, repeats=3) == {}


def test_the_paired_ratio_and_its_interval(timing: ModuleType) -> None:
    mid, lo, hi = timing.paired_median_ratio([2.0, 2.2, 1.8, 2.0], [1.0, 1.1, 0.9, 1.0])
    assert (mid, lo, hi) == (2.0, 2.0, 2.0)  # every round twice as slow
    mid, lo, hi = timing.paired_median_ratio([1.0, 1.2, 1.1, 1.05, 1.3], [1.0] * 5)
    assert mid == pytest.approx(1.1) and lo <= mid <= hi and lo >= 1.0 and hi <= 1.3
    with pytest.raises(ValueError, match="equally long"):
        timing.paired_median_ratio([1.0, 2.0], [1.0])
