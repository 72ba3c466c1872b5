"""What the native N:M forward (``nm.native``) buys the CPU step, and that it keeps the bits.

The library computes Feather's finite-``p`` N:M forward either with some
twenty torch kernels or, where a C compiler and torch's MKL functions are
there, with one native function that must give the same bits
(:mod:`feather_sparse.nm.native`). The script, on a bundled model's 2:4
weights,

1. compares the two forwards of all of them at once (as the fused pass
   computes them): the same bits, output and thresholds;
2. times both (best of 5 × 200 calls, hot caches);
3. times the training step inside ``pruner.swapped()`` as the CLI runs it,
   with the native forward and with the torch kernels, beside the dense
   step, interleaved round-robin (paired differences with 95 % bootstrap
   intervals).

    OMP_NUM_THREADS=1 python benchmarks/bench_nm_native.py [--model mnist1d_mlpmixer] [--rounds 41]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

import feather_sparse as fs
from _timing import best_us, machine, paired_median_difference, timings, train_step
from bench_nm_step import EXCLUDE, batch, fresh
from feather_sparse.nm import native, operator


@contextmanager
def torch_kernels() -> Iterator[None]:
    """The N:M forward computes with the torch kernels while the context is open (the
    native forward reports itself off: every entry to it then gives way)."""
    saved = native._get
    native._get = lambda: None  # type: ignore[assignment]
    try:
        yield
    finally:
        native._get = saved  # type: ignore[assignment]


def _with_torch_kernels(step: Callable[[], None]) -> None:
    with torch_kernels():
        step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mnist1d_mlpmixer")
    parser.add_argument("--rounds", type=int, default=41)
    args = parser.parse_args()
    print(machine())
    print(f"native N:M forward: {native.status()}")
    if not native.status().startswith("on"):
        return
    model = fresh(args.model)
    pruner = fs.Pruner(model, pattern="2:4", exclude=EXCLUDE[args.model])
    with torch.no_grad():
        flat = torch.cat([w.reshape(-1) for w in pruner.weights()]).view(-1, 4)
    pattern = operator.NMPattern.parse("2:4")
    one = torch.ones(())
    mine = native.forward(flat, 2, one, 3.0)
    assert mine is not None
    with torch_kernels():
        assert native.forward(flat, 2, one, 3.0) is None  # the context turns it off
    theirs = operator._torch_thresholded(flat, pattern, one, 3.0)
    same = all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(mine, theirs))
    print(f"\n{args.model}: {flat.numel():,} weights in its 2:4 layers")
    print(f"- the native forward gives the torch kernels' bits (output and thresholds): {same}")
    us_torch = best_us(lambda: operator._torch_thresholded(flat, pattern, one, 3.0))
    us_native = best_us(lambda: native.forward(flat, 2, one, 3.0))
    print(
        f"- the forward of all of them: {us_torch:.0f} µs (torch kernels) against "
        f"{us_native:.0f} µs (native)\n"
    )

    x, y = batch()
    steps: dict[str, Callable[[], None]] = {"dense": train_step(fresh(args.model), None, x, y)}
    for label in ("native", "torch"):
        m = fresh(args.model)
        p = fs.Pruner(m, pattern="2:4", exclude=EXCLUDE[args.model])
        steps[label] = train_step(m, p, x, y, swap=True)
    torch_step = steps["torch"]  # its own model, the torch kernels around it
    steps["torch"] = lambda: _with_torch_kernels(torch_step)
    seconds = timings(steps, repeats=args.rounds, warmup=3)
    times = {label: [t * 1e3 for t in ts] for label, ts in seconds.items()}
    dense = statistics.median(times["dense"])
    print("| variant | median step (ms) | × dense | minus torch kernels' (ms; 95 % interval) |")
    print("|---|---:|---:|---|")
    for label, text in (
        ("dense", "dense"),
        ("torch", "2:4, swapped(), torch kernels"),
        ("native", "2:4, swapped(), native forward"),
    ):
        median = statistics.median(times[label])
        diff_text = "—"
        if label == "native":
            d, lo, hi = paired_median_difference(times[label], times["torch"])
            diff_text = f"{d:+.2f} ({lo:+.2f} to {hi:+.2f})"
        print(f"| {text} | {median:.2f} | {median / dense:.3f} | {diff_text} |")


if __name__ == "__main__":
    main()
