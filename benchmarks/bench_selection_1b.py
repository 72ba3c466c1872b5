"""Memory-bounded global threshold over a billion float32 weights in many tensors.

Allocates ``--billions`` × 1e9 float32 weights (4 GB per billion) once, as
``--tensors`` tensors of a CNN-like range of sizes, then times the exact global
threshold (:func:`feather_sparse.select_threshold`) three ways:

* *cold*: no previous threshold (a strided sample places the first window);
* *warm*: hinted with a threshold 0.2 % off, as between two training steps,
  with the window width the global backbone then uses (4× the last move);
* *wrong hint*: hinted 10× too high, so the first window misses.

Each case runs ``--repeats`` times, interleaved with a plain counting pass over
all weights (the yardstick: absolute times on a shared machine drift). Peak
*extra* memory is the kernel's high-water mark of the resident set
(``VmHWM``, reset through ``/proc/self/clear_refs`` before each run, after
``malloc_trim`` returned the heap's free pages) minus the resident set before
the run; tracemalloc cannot see torch's allocations. The result is checked
exactly: ``#{|w| < T} < k <= #{|w| <= T}``. A sort-based reference (what the
paper's released code does: concatenate, sort) is not run: it would need
``16 B`` per weight more (a float32 copy, the sorted values and int64
indices), shown in the last line for comparison.

    python benchmarks/bench_selection_1b.py [--billions 1.0] [--tensors 400] [--repeats 3]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from _timing import machine
from feather_sparse import selection
from feather_sparse.selection import _gather_cap, count_at_most, select_threshold

STATUS = Path("/proc/self/status")
LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int:
    for line in STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in {STATUS}")


PASSES = {"all": 0, "histogram": 0}


def _counting(fn: Callable[..., tuple[object, ...]]) -> Callable[..., tuple[object, ...]]:
    """``selection._window_pass``, counting the passes and those that had to histogram."""

    def wrapper(*args: object, **kwargs: object) -> tuple[object, ...]:
        out = fn(*args, **kwargs)
        PASSES["all"] += 1
        PASSES["histogram"] += out[3] is not None
        return out

    return wrapper


def measure(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float, float]:
    """``(result, seconds, peak extra MiB)`` of calling ``fn``; counts its passes in PASSES."""
    gc.collect()
    # Hand the heap's free pages back first, so that memory freed by an earlier
    # call and reused by this one still counts as this call's.
    LIBC.malloc_trim(0)
    for key in PASSES:
        PASSES[key] = 0
    CLEAR_REFS.write_text("5")  # resets VmHWM to the current VmRSS
    before = _status_kib("VmRSS")
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM")
    return result, seconds, (peak - before) / 1024


def layer_sizes(total: int, n: int) -> list[int]:
    """``n`` tensor sizes summing to ``total``, growing with depth like a CNN's."""
    raw = torch.linspace(1.0, 8.0, n, dtype=torch.float64) ** 2
    sizes = (raw / raw.sum() * total).round().long().tolist()
    sizes[-1] += total - sum(sizes)
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--billions", type=float, default=1.0, help="weights, in units of 1e9")
    parser.add_argument("--tensors", type=int, default=400)
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not (STATUS.exists() and CLEAR_REFS.exists()):
        raise SystemExit("needs Linux /proc/self/{status,clear_refs} to measure peak memory")
    n = round(args.billions * 1e9)
    s = args.sparsity
    k = round(s * n)
    print(f"# exact global threshold over {n:,} float32 weights; {machine()}\n")

    g = torch.Generator().manual_seed(0)
    rss0 = _status_kib("VmRSS")
    start = time.perf_counter()
    weights = [
        torch.randn(size, generator=g).mul_(0.5 + i / args.tensors)
        for i, size in enumerate(layer_sizes(n, args.tensors))
    ]
    made = time.perf_counter() - start
    weight_mib = (_status_kib("VmRSS") - rss0) / 1024
    print(
        f"{len(weights)} tensors, {min(map(len, weights)):,} to {max(map(len, weights)):,} "
        f"weights each; {weight_mib:,.0f} MiB resident, generated in {made:.1f} s\n"
    )

    selection._window_pass = _counting(selection._window_pass)  # type: ignore[assignment]
    t = select_threshold(weights, s)
    value = float(t)
    # Exactness, with two counting passes: #{|w| < T} < k <= #{|w| <= T}.
    previous = torch.nextafter(t, torch.zeros_like(t))  # the float32 just below T
    below = count_at_most(weights, previous)
    at_most = count_at_most(weights, value)
    assert below < k <= at_most, (below, k, at_most)

    cases: dict[str, Callable[[], torch.Tensor]] = {
        "cold (no hint)": lambda: select_threshold(weights, s),
        "warm (hint 0.2 % off, width 0.8 %)": lambda: select_threshold(
            weights, s, hint=value * 1.002, hint_width=0.008
        ),
        "wrong hint (10× off)": lambda: select_threshold(weights, s, hint=value * 10),
        # the yardstick: one plain pass (abs, compare, count per chunk)
        "counting pass": lambda: torch.tensor(count_at_most(weights, value)),
    }
    # Interleaved repeats: the machine is shared, so a slow patch hits every case alike.
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    peaks: dict[str, float] = dict.fromkeys(cases, 0.0)
    passes: dict[str, dict[str, int]] = {}
    for _ in range(args.repeats):
        for name, fn in cases.items():
            result, sec, mib = measure(fn)
            if name != "counting pass":
                assert torch.equal(result, t)
            seconds[name].append(sec)
            peaks[name] = max(peaks[name], mib)
            passes[name] = dict(PASSES)
    median = {name: statistics.median(v) for name, v in seconds.items()}
    count_s = median.pop("counting pass")

    print(
        "| run | passes (histogrammed) | time (s) | time / counting pass "
        "| peak extra (MiB) | extra / weights |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, sec in median.items():
        p, mib = passes[name], peaks[name]
        print(
            f"| {name} | {p['all']} ({p['histogram']}) | {sec:.1f} "
            f"| {sec / count_s:.1f}× | {mib:,.1f} | {mib / weight_mib:.2%} |"
        )
    cap = _gather_cap(n)
    print(
        f"\nMedians of {args.repeats} interleaved repeats; peaks are the largest seen. One "
        f"counting pass (count_at_most: abs, compare, count per chunk) took {count_s:.1f} s, "
        "the floor of any pass over the weights.\n"
        f"T = {value!r}: {below:,} weights below it, {at_most:,} at most it, k = {k:,} "
        f"(exact). Window cap {cap:,} magnitudes = {cap * 4 / 2**20:.0f} MiB.\n"
        f"A concatenate-and-sort reference would need about {16 * n / 2**20:,.0f} MiB extra "
        f"({16 * n / 2**20 / weight_mib:.0%} of the weights)."
    )


if __name__ == "__main__":
    main()
