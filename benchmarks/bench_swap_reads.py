"""What parametrize's property costs a layer inside ``pruner.swapped()``.

Inside the block every swapped layer reads its stored weight (``P_T(w)`` then)
straight from its own dictionary (``feather_sparse.swap``). This times one
forward and backward of a bundled model (batch 128, the 2:4 Pruner attached)
three ways, interleaved round by round: the dense model; inside the block as
the library runs it; and inside the block with the direct reads turned off,
so that each layer reads through ``torch.nn.utils.parametrize`` and the
Pruner's pass-through. Only the forward and backward are timed (the block is
entered before and left after). The script first checks that both blocks
give the same loss and gradients, bit for bit.

    OMP_NUM_THREADS=1 python benchmarks/bench_swap_reads.py [--models ...] [--rounds 450]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs
from _timing import machine, paired_median_difference
from bench_nm_step import EXCLUDE, batch, fresh
from feather_sparse import swap


@contextlib.contextmanager
def through_parametrize() -> Iterator[None]:
    """Blocks entered inside read every weight through parametrize's property."""
    saved = swap._read_directly
    swap._read_directly = lambda *args: None
    try:
        yield
    finally:
        swap._read_directly = saved


def forward_backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    for p in model.parameters():
        p.grad = None
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach()


def timed(
    model: nn.Module, pruner: fs.Pruner | None, direct: bool
) -> Callable[[], tuple[float, torch.Tensor, list[torch.Tensor]]]:
    """One round: the block entered (unless dense), forward and backward timed, left."""
    x, y = batch()

    def run() -> tuple[float, torch.Tensor, list[torch.Tensor]]:
        reads = contextlib.nullcontext() if direct else through_parametrize()
        with reads, pruner.swapped() if pruner is not None else contextlib.nullcontext():
            start = time.perf_counter()
            loss = forward_backward(model, x, y)
            seconds = time.perf_counter() - start
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return seconds, loss, grads

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mnist1d_mlpmixer", "mnist1d_cnn"])
    parser.add_argument("--rounds", type=int, default=450)
    args = parser.parse_args()
    print(machine())
    print()
    print("| model | variant | median forward+backward (ms) | minus dense (ms; 95 % interval) |")
    print("|---|---|---:|---|")
    checks = []
    for name in args.models:
        models = {label: fresh(name) for label in ("dense", "direct", "through")}
        pruners = {
            label: fs.Pruner(models[label], pattern="2:4", exclude=EXCLUDE[name])
            for label in ("direct", "through")
        }
        runs = {
            "dense": timed(models["dense"], None, True),
            "direct": timed(models["direct"], pruners["direct"], True),
            "through": timed(models["through"], pruners["through"], False),
        }
        _, loss_a, grads_a = runs["direct"]()
        _, loss_b, grads_b = runs["through"]()
        same = torch.equal(loss_a, loss_b) and all(
            torch.equal(a, b) for a, b in zip(grads_a, grads_b)
        )
        checks.append(f"- {name}: both blocks give the same loss and gradients: {same}")
        times: dict[str, list[float]] = {label: [] for label in runs}
        for i in range(args.rounds + 10):
            for label, run in runs.items():
                seconds = run()[0]
                if i >= 10:  # warm-up rounds
                    times[label].append(seconds * 1e3)
        labels = {
            "dense": "dense",
            "direct": "2:4, swapped(): direct reads (as the library runs it)",
            "through": "2:4, swapped(): reads through parametrize",
        }
        for label, text in labels.items():
            ms = sorted(times[label])[len(times[label]) // 2]
            if label == "dense":
                diff = "—"
            else:
                med, lo, hi = paired_median_difference(times[label], times["dense"])
                diff = f"{med:+.2f} ({lo:+.2f} to {hi:+.2f})"
            print(f"| {name} | {text} | {ms:.2f} | {diff} |")
    print()
    print("\n".join(checks))


if __name__ == "__main__":
    main()
