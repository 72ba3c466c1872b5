"""Where in a CPU training step the N:M overhead lands: forward, backward, optimizer, pruner.step().

``bench_nm_step.py`` times whole steps; this script times each phase of the
same step separately — the forward (with ``zero_grad`` and the loss), the
backward, the SGD step and ``pruner.step()`` — for the dense model, a
``w · 1`` parametrization on the pruned layers, the 2:4 Pruner with its
operator replaced by a copy (all the machinery, no arithmetic) and the 2:4
Pruner (Feather, p = 3, θ = 1), the same with every layer's forward computed
alone (``nm.fused`` off), interleaved round-robin, medians per phase; then
the forward phase of the default 2:4 step minus the layer-by-layer one, per
round, with a 95 % bootstrap interval.
A last column calls ``pruner.step()`` a second time right after the first:
the same work, with the code and data it touches still in the caches, so
the difference between the two columns is what a step's cold caches add.

    python benchmarks/bench_nm_phases.py [--models mnist1d_cnn mnist1d_mlpmixer] [--repeats 61]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

import feather_sparse as fs
from _timing import machine, paired_median_difference
from bench_nm_step import EXCLUDE, TimesOne, batch, copying, fresh, layer_by_layer

COPY = "2:4, operator replaced by a copy"
ALONE = "2:4 feather θ=1, layer by layer"
PHASES = ("forward", "backward", "optimizer", "pruner.step()", "pruner.step() again")


def timed_step(name: str, variant: str) -> Callable[[], tuple[float, ...]]:
    """One training step of ``variant`` that returns the seconds of each phase."""
    model = fresh(name)
    pruner = None
    if variant == "parametrization w·1":
        for t in fs.Pruner(fresh(name), pattern="2:4", exclude=EXCLUDE[name]).targets:
            parametrize.register_parametrization(model.get_submodule(t.name), "weight", TimesOne())
    elif variant == ALONE:
        with layer_by_layer():
            pruner = fs.Pruner(model, pattern="2:4", exclude=EXCLUDE[name])
    elif variant != "dense":
        pruner = fs.Pruner(model, pattern="2:4", exclude=EXCLUDE[name])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x, y = batch()

    def step() -> tuple[float, ...]:
        return _phases(model, pruner, opt, x, y)

    return copying(step) if variant == COPY else step


def _phases(
    model: nn.Module,
    pruner: fs.Pruner | None,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
) -> tuple[float, ...]:
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    t3 = time.perf_counter()
    if pruner is not None:
        pruner.step()
    t4 = time.perf_counter()
    if pruner is not None:
        pruner.step()
    t5 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mnist1d_cnn", "mnist1d_mlpmixer"])
    parser.add_argument("--repeats", type=int, default=61)
    args = parser.parse_args()
    variants = ["dense", "parametrization w·1", COPY, "2:4 feather θ=1", ALONE]
    forward_gain = []
    print(machine())
    print()
    print("median ms per phase (in brackets: minus dense)")
    print()
    print("| model | variant | " + " | ".join(PHASES) + " |")
    print("|---|---|" + "---:|" * len(PHASES))
    for name in args.models:
        steps = {v: timed_step(name, v) for v in variants}
        for _ in range(3):  # warm-up
            for step in steps.values():
                step()
        times: dict[str, list[tuple[float, ...]]] = {v: [] for v in variants}
        for _ in range(args.repeats):
            for v, step in steps.items():
                times[v].append(step())
        med = {v: [statistics.median(col) for col in zip(*ts)] for v, ts in times.items()}
        for v in variants:
            cells = [f"{m * 1e3:.3f} ({(m - d) * 1e3:+.3f})" for m, d in zip(med[v], med["dense"])]
            print(f"| {name} | {v} | " + " | ".join(cells) + " |")
        forward = {v: [t[0] for t in ts] for v, ts in times.items()}
        forward_gain.append(
            (name, *paired_median_difference(forward["2:4 feather θ=1"], forward[ALONE]))
        )
    print()
    print("forward phase, 2:4 feather θ=1 minus layer by layer, per round (ms; 95 % bootstrap):")
    print()
    for name, mid, lo, hi in forward_gain:
        print(f"- {name}: {mid * 1e3:+.3f} ({lo * 1e3:+.3f} to {hi * 1e3:+.3f})")


if __name__ == "__main__":
    main()
