"""``bench.stats``: Student-t quantiles against published values, paired intervals."""

from __future__ import annotations

import math

import pytest

from feather_sparse.bench.pages import Grid
from feather_sparse.bench.runner import RunOutcome, RunSpec
from feather_sparse.bench.stats import (
    paired_difference,
    student_t_cdf,
    student_t_quantile,
)

# Two-sided 95 % critical values t(0.975, df), as printed (4 decimals) in the
# NIST/SEMATECH e-Handbook of Statistical Methods, table 1.3.6.7.2.
T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    15: 2.131,
    20: 2.086,
    30: 2.042,
    40: 2.021,
    60: 2.000,
    100: 1.984,
}


@pytest.mark.parametrize(("df", "expected"), sorted(T975.items()))
def test_t_quantile_matches_the_published_table(df: int, expected: float) -> None:
    assert student_t_quantile(0.975, df) == pytest.approx(expected, abs=6e-4)


@pytest.mark.parametrize("q", [0.6, 0.9, 0.975, 0.995, 0.9995])
def test_t_quantile_matches_the_closed_forms_of_df_1_and_2(q: float) -> None:
    # df = 1 is the Cauchy distribution; df = 2 has F^-1(q) = (2q - 1) / sqrt(2 q (1 - q)).
    assert student_t_quantile(q, 1) == pytest.approx(math.tan(math.pi * (q - 0.5)), rel=1e-9)
    assert student_t_quantile(q, 2) == pytest.approx(
        (2 * q - 1) / math.sqrt(2 * q * (1 - q)), rel=1e-9
    )


def test_t_tends_to_the_normal_and_is_symmetric() -> None:
    assert student_t_quantile(0.975, 1e6) == pytest.approx(1.959964, abs=1e-4)
    assert student_t_quantile(0.025, 7) == pytest.approx(-student_t_quantile(0.975, 7))
    assert student_t_cdf(0.0, 3) == pytest.approx(0.5)
    assert student_t_cdf(student_t_quantile(0.9, 4), 4) == pytest.approx(0.9, abs=1e-12)
    with pytest.raises(ValueError, match="q must be in"):
        student_t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="df must be"):
        student_t_quantile(0.5, 0)


def test_paired_difference_by_hand() -> None:
    # differences 2, 3, 4: mean 3, sd 1, half width t(0.975, 2) / sqrt(3) = 2.4841
    d = paired_difference({0: 12.0, 1: 13.0, 2: 14.0, 3: 99.0}, {0: 10.0, 1: 10.0, 2: 10.0})
    assert d.n == 3 and d.mean == pytest.approx(3.0)
    assert (d.low, d.high) == pytest.approx((3 - 2.484138, 3 + 2.484138), abs=1e-5)
    assert d.verdict == "win"
    # differences 1, 2, 3: the interval contains 0
    assert paired_difference({0: 1.0, 1: 2.0, 2: 3.0}, {0: 0, 1: 0, 2: 0}).verdict == "n.s."
    assert paired_difference({0: 0.0, 1: 0.0, 2: 0.0}, {0: 2, 1: 3, 2: 4}).verdict == "loss"
    one = paired_difference({0: 5.0}, {0: 4.0})
    assert one.n == 1 and one.mean == 1.0 and one.verdict == "—"
    assert paired_difference({0: 5.0}, {1: 4.0}).n == 0


def _outcome(acc: float) -> RunOutcome:
    return RunOutcome(key="k", config={}, ok=True, test_accuracy=acc)


def test_paired_table_pairs_by_seed_and_marks_only_separable_cells() -> None:
    pairs = [
        (RunSpec(row, 0.9, seed, {}), _outcome(acc / 100))
        for row, accs in {"ref": (10, 10, 10), "a": (12, 13, 14), "b": (11, 12, 13)}.items()
        for seed, acc in enumerate(accs)
    ]
    lines = Grid(pairs, lambda o: 100 * o.test_accuracy).paired_table("m", str, "ref").splitlines()
    assert lines[2] == "| ref | reference |"
    assert lines[3] == "| a | +3.00 [+0.52, +5.48] **win** |"
    assert lines[4] == "| b | +2.00 [-0.48, +4.48] n.s. |"
