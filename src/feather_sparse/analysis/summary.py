"""Summaries over seeds: mean ± std, and one line of a results plot (:class:`Curve`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Curve",
    "mean_std",
]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value); NaN for none.

    Args:
        values: the numbers.
    """
    vals = [float(v) for v in values]
    if not vals:
        return math.nan, math.nan
    if len(vals) == 1:
        return vals[0], 0.0
    return statistics.fmean(vals), statistics.stdev(vals)


@dataclass(frozen=True)
class Curve:
    """One line of a results plot: mean ± std of a metric against ``x``.

    Attributes:
        label: the legend entry.
        x: the x values (sparsity, θ, p, MFLOPs, ...).
        mean: the mean over seeds at each x.
        std: the standard deviation over seeds at each x (0 for one seed).
    """

    label: str
    x: tuple[float, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        if not len(self.x) == len(self.mean) == len(self.std):
            raise ValueError(
                f"curve {self.label!r}: x, mean and std differ in length "
                f"({len(self.x)}, {len(self.mean)}, {len(self.std)})"
            )
