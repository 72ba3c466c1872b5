"""Sparsity schedules: the requested sparsity as a pure function of the step.

The paper (§3, "Global Magnitude Pruning") raises the sparsity cubically, as
proposed by Zhu & Gupta (2017, "To prune, or not to prune", eq. 1), from 0 to
the final target ``S``, reaching it at 50 % of training with no dense warm-up;
the authors' released code evaluates it at every iteration::

    s(t) = 0                                    t < t1
    s(t) = S · (1 − (1 − (t − t1)/(t2 − t1))^3)  t1 <= t < t2
    s(t) = S                                    t >= t2

with ``t1 = start·total`` and ``t2 = floor(end·total)``. The cubic rises fast
at first, while the network has many redundant weights, and slowly near the
end, when every removed weight hurts.

A schedule here is an object with ``__call__(step, total_steps, sparsity)``;
nothing is precomputed into arrays. The Pruner also accepts any plain callable
``step -> sparsity``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from feather_sparse.registry import Registry

__all__ = [
    "SCHEDULES",
    "ConstantSchedule",
    "CubicSchedule",
    "LinearSchedule",
    "Schedule",
]


def _window(start: float, end: float, total_steps: int) -> tuple[int, int]:
    """The ramp's first and last step, ``t1 = floor(start·T)``, ``t2 = floor(end·T)``."""
    return math.floor(start * total_steps), math.floor(end * total_steps)


@dataclass(frozen=True)
class Schedule:
    """Base of the ramp schedules: the ramp runs over ``[start, end)`` of training.

    Args:
        start: fraction of ``total_steps`` at which the ramp begins (sparsity 0 before).
        end: fraction of ``total_steps`` at which the final sparsity is reached.

    Raises:
        ValueError: unless ``0 <= start <= end <= 1``.
    """

    start: float = 0.0
    end: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.start <= self.end <= 1.0:
            raise ValueError(
                f"{type(self).__name__} needs 0 <= start <= end <= 1, "
                f"got start={self.start}, end={self.end}"
            )

    def ramp(self, progress: float) -> float:
        """The fraction of the final sparsity reached at ``progress`` in [0, 1).

        Args:
            progress: how far through the ramp training is, ``(step - t1) / (t2 - t1)``.
        """
        raise NotImplementedError

    def __call__(self, step: int, total_steps: int, sparsity: float) -> float:
        """The sparsity requested at ``step`` (0-based) of ``total_steps``, final ``sparsity``."""
        t1, t2 = _window(self.start, self.end, total_steps)
        if step >= t2:  # includes t1 == t2: a jump straight to the target
            return sparsity
        if step < t1:
            return 0.0
        return sparsity * self.ramp((step - t1) / (t2 - t1))

    def config(self) -> dict[str, Any]:
        """A JSON-able description, stored in checkpoints."""
        return {"name": self.name, **asdict(self)}

    name = "schedule"


@dataclass(frozen=True)
class CubicSchedule(Schedule):
    """Zhu & Gupta's cubic ramp, the paper's default (``start=0``, ``end=0.5``).

    Args:
        start: fraction of ``total_steps`` at which the ramp begins (sparsity 0 before).
        end: fraction of ``total_steps`` at which the final sparsity is reached.

    Raises:
        ValueError: unless ``0 <= start <= end <= 1``.
    """

    name = "cubic"

    def ramp(self, progress: float) -> float:
        return 1.0 - (1.0 - progress) ** 3


@dataclass(frozen=True)
class LinearSchedule(Schedule):
    """A straight ramp from 0 at ``start`` to the target at ``end``.

    Args:
        start: fraction of ``total_steps`` at which the ramp begins (sparsity 0 before).
        end: fraction of ``total_steps`` at which the final sparsity is reached.

    Raises:
        ValueError: unless ``0 <= start <= end <= 1``.
    """

    name = "linear"

    def ramp(self, progress: float) -> float:
        return progress


@dataclass(frozen=True)
class ConstantSchedule(Schedule):
    """The final sparsity from ``start`` on (one-shot pruning at the start by default).

    Args:
        start: fraction of ``total_steps`` from which the final sparsity applies.
        end: ignored: a constant schedule has no ramp, so ``end`` is set to ``start``.

    Raises:
        ValueError: unless ``0 <= start <= 1``.
    """

    end: float = 0.0
    name = "constant"

    def __post_init__(self) -> None:
        # A constant schedule has no ramp: its end is its start.
        object.__setattr__(self, "end", self.start)
        super().__post_init__()

    def ramp(self, progress: float) -> float:
        return 1.0


SCHEDULES: Registry[type[Schedule]] = Registry("schedule")
SCHEDULES.register("cubic", CubicSchedule)
SCHEDULES.register("linear", LinearSchedule)
SCHEDULES.register("constant", ConstantSchedule)
