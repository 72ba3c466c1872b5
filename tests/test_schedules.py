"""Sparsity schedules: the cubic ramp of Zhu & Gupta, linear, constant, callables."""

from __future__ import annotations

import math

import pytest

import feather_sparse as fs
from _hypothesis import given, st
from feather_sparse.schedules import SCHEDULES


def test_cubic_golden_values() -> None:
    sched = fs.CubicSchedule()  # start 0, end 0.5: the paper's default
    total, s = 1000, 0.9
    assert sched(0, total, s) == 0.0
    # halfway through the ramp (t = 250 of t2 = 500): S·(1 − 0.5^3) = 0.9·0.875
    assert sched(250, total, s) == pytest.approx(0.7875)
    assert sched(499, total, s) == pytest.approx(0.9 * (1 - (1 / 500) ** 3))
    assert sched(500, total, s) == s
    assert sched(999, total, s) == s
    assert sched(5000, total, s) == s


def test_cubic_window_uses_floor() -> None:
    sched = fs.CubicSchedule(start=0.1, end=0.55)
    # t1 = floor(0.1·33) = 3, t2 = floor(0.55·33) = 18
    assert sched(2, 33, 0.5) == 0.0
    assert sched(3, 33, 0.5) == 0.0
    assert sched(4, 33, 0.5) == pytest.approx(0.5 * (1 - (1 - 1 / 15) ** 3))
    assert sched(18, 33, 0.5) == 0.5


@given(st.integers(1, 10_000), st.floats(0, 0.999), st.floats(0, 1), st.floats(0, 1))
def test_monotone_and_bounded(total: int, s: float, a: float, b: float) -> None:
    start, end = sorted((a, b))
    for cls in (fs.CubicSchedule, fs.LinearSchedule):
        sched = cls(start=start, end=end)
        values = [sched(t, total, s) for t in range(0, total + 1, max(1, total // 50))]
        assert all(0.0 <= v <= s for v in values)
        assert values == sorted(values)
        assert sched(total, total, s) == s


def test_linear_and_constant() -> None:
    assert fs.LinearSchedule(0.0, 0.5)(25, 100, 0.8) == pytest.approx(0.4)
    const = fs.ConstantSchedule()
    assert const(0, 100, 0.7) == 0.7
    late = fs.ConstantSchedule(start=0.5)
    assert late(49, 100, 0.7) == 0.0
    assert late(50, 100, 0.7) == 0.7


def test_validation_and_registry() -> None:
    with pytest.raises(ValueError, match="0 <= start <= end <= 1"):
        fs.CubicSchedule(start=0.6, end=0.5)
    with pytest.raises(ValueError, match="0 <= start <= end <= 1"):
        fs.LinearSchedule(end=1.5)
    assert SCHEDULES.get("cubic") is fs.CubicSchedule
    with pytest.raises(ValueError, match="choose one of: constant, cubic, linear"):
        SCHEDULES.get("exponential")


def test_config_round_trip() -> None:
    sched = fs.CubicSchedule(start=0.1, end=0.7)
    cfg = sched.config()
    assert cfg == {"name": "cubic", "start": 0.1, "end": 0.7}
    rebuilt = SCHEDULES.get(cfg["name"])(start=cfg["start"], end=cfg["end"])
    assert rebuilt == sched
    assert not math.isnan(rebuilt(3, 10, 0.5))
