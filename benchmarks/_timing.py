"""Side-by-side timing for the benchmark scripts.

The machine is shared and noisy, so absolute times drift; what the scripts
report are ratios of medians measured in one run, with the candidates
interleaved round-robin so that a slow patch hits all of them alike.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable

import torch

import feather_sparse


def compare(
    fns: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 2
) -> dict[str, float]:
    """Median seconds of each function, measured interleaved."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def machine() -> str:
    """One line naming the software and hardware the numbers come from."""
    threads = torch.get_num_threads()
    cpu = platform.processor() or platform.machine()
    return (
        f"feather-sparse {feather_sparse.__version__}, torch {torch.__version__}, "
        f"Python {platform.python_version()}, {cpu}, {threads} threads"
    )
