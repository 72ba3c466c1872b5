"""Paired comparisons over seeds: the difference of two rows and its 95 % Student-t interval.

Two runs with the same seed and sparsity share their initialisation and data
order, so a method is compared with the reference run by run: ``d_s = a_s -
b_s`` over the seeds ``s`` both finished. With ``n`` differences of mean
``d̄`` and sample standard deviation ``s_d``, the interval is

    d̄ ± t(0.975, n - 1) · s_d / √n

(Student 1908; any statistics text, e.g. Wasserman, *All of Statistics*,
§10.2). A cell is called a win or a loss only when that interval excludes 0.

The t quantile is computed here, not tabulated: the Student-t CDF through the
regularized incomplete beta function, ``F(t) = 1 - I_x(ν/2, 1/2) / 2`` with
``x = ν / (ν + t²)`` for ``t ≥ 0`` (Abramowitz & Stegun 26.7.1), ``I_x`` by its
continued fraction (DLMF 8.17.22), inverted by bisection. No SciPy needed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["PairedDifference", "paired_difference", "student_t_cdf", "student_t_quantile"]

#: Confidence level of every interval on the results pages.
CONFIDENCE = 0.95

_EPS = 1e-15
_TINY = 1e-300


def _beta_continued_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of ``I_x(a, b)`` (DLMF 8.17.22), by the modified Lentz method.

    Converges fast for ``x < (a + 1) / (a + b + 2)``; the caller swaps the
    arguments otherwise.
    """
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 1000):
        # even step: d_{2m} = m (b - m) x / ((a + 2m - 1)(a + 2m))
        num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1.0 + num * d
        c = 1.0 + num / c
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        # odd step: d_{2m+1} = -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1))
        num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        c = 1.0 + num / c
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = c if abs(c) > _TINY else _TINY
        step = d * c
        h *= step
        if abs(step - 1.0) < _EPS:
            break
    return h


def _regularized_beta(x: float, a: float, b: float) -> float:
    """``I_x(a, b)``, the regularized incomplete beta function, for ``0 <= x <= 1``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    # x^a (1-x)^b / (a B(a, b)), in logs to stay finite for large a, b
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(x, a, b) / a
    # symmetry I_x(a, b) = 1 - I_{1-x}(b, a)
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(1.0 - x, b, a) / b


def student_t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df`` degrees of freedom.

    Args:
        t: the value.
        df: the degrees of freedom, ``> 0``.

    Raises:
        ValueError: if ``df <= 0``.
    """
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df}")
    tail = 0.5 * _regularized_beta(df / (df + t * t), df / 2.0, 0.5)  # P(T > |t|)
    return 1.0 - tail if t >= 0 else tail


def student_t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (inverse CDF).

    Args:
        q: probability in (0, 1), e.g. 0.975 for a two-sided 95 % interval.
        df: degrees of freedom, > 0.

    Raises:
        ValueError: for ``q`` outside (0, 1) or ``df <= 0``.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df}")
    if q < 0.5:
        return -student_t_quantile(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < q:  # bracket: the CDF is increasing
        hi *= 2.0
    for _ in range(200):  # bisection to double precision
        mid = 0.5 * (lo + hi)
        if student_t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class PairedDifference:
    """A row minus the reference, paired over seeds.

    Attributes:
        n: seeds where both runs finished.
        mean: mean difference (NaN without pairs).
        low: lower end of the 95 % interval (NaN with fewer than two pairs).
        high: upper end.
    """

    n: int
    mean: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        """``"win"``/``"loss"`` when the interval excludes 0, else ``"n.s."``; ``"—"`` if n < 2."""
        if self.n < 2 or math.isnan(self.low):
            return "—"
        if self.low > 0:
            return "win"
        if self.high < 0:
            return "loss"
        return "n.s."


def paired_difference(
    values: Mapping[int, float], reference: Mapping[int, float]
) -> PairedDifference:
    """``values - reference`` over the seeds both have, with its 95 % Student-t interval.

    Args:
        values: seed -> the row's metric.
        reference: seed -> the reference's metric.
    """
    diffs: Sequence[float] = [
        values[s] - reference[s]
        for s in sorted(values)
        if s in reference and math.isfinite(values[s]) and math.isfinite(reference[s])
    ]
    n = len(diffs)
    if n == 0:
        return PairedDifference(0, math.nan, math.nan, math.nan)
    mean = sum(diffs) / n
    if n < 2:
        return PairedDifference(n, mean, math.nan, math.nan)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = student_t_quantile(0.5 + CONFIDENCE / 2.0, n - 1) * sd / math.sqrt(n)
    return PairedDifference(n, mean, mean - half, mean + half)
