"""What a design without a parametrization per layer would cost: 2:4 by weight swapping (CPU).

A measured prototype, the floor of the design the library's
``Pruner.swapped()`` follows (docs/benchmarks-nm.md, "A design that would
meet the target"): it drops the parametrizations and ``pruner.step()``'s
work beyond the finite check, which ``swapped()`` keeps. The Pruner computes
``P_T(w)`` inside each layer's ``torch.nn.utils.parametrize`` access; the
prototype instead computes every 2:4 layer's ``P_T(w)`` in one pass before
the forward (the fused pass the Pruner uses: :func:`feather_sparse.nm.operator._nm_forward` over the
concatenated weights), writes it into the plain weights, runs forward and
backward on the unmodified model, and writes the dense weights back before
the optimizer step. With θ = 1 the gradient of the swapped-in weight *is*
the straight-through gradient of the dense one, so the training is the
Pruner's bit for bit (checked here over a few steps, then timed). What it
leaves out (why it is a prototype): θ ≠ 1 and SR-STE's decay (gradient
hooks), and every reader of ``model.state_dict()`` between the forward and
the optimizer step, which would see the pruned weights.

Each step: forward, cross-entropy, backward, SGD (momentum 0.9), and for
the N:M variants ``pruner.step()`` (the prototype: only the finiteness check
it makes); dense, the Pruner's 2:4 step, the same inside
``pruner.swapped()`` and the prototype's interleaved round-robin, medians,
and each of the last two minus the Pruner per round with a 95 % bootstrap
interval.

    OMP_NUM_THREADS=1 python benchmarks/bench_nm_swap.py [--models ...] [--repeats 61]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs
from _timing import machine, paired_median_difference, timings, train_step
from bench_nm_step import EXCLUDE, batch, fresh
from feather_sparse.nm.operator import NMPattern, _nm_forward
from feather_sparse.pruner import _abs_max_each

PATTERN = NMPattern(2, 4)


def pruned_weights(model: nn.Module, name: str) -> list[nn.Parameter]:
    """The weights the 2:4 Pruner would prune in ``model`` (its targets, in order)."""
    names = [t.name for t in fs.Pruner(fresh(name), pattern="2:4", exclude=EXCLUDE[name]).targets]
    return [model.get_submodule(n).weight for n in names]


def swapped_step(
    model: nn.Module, weights: list[nn.Parameter], opt: torch.optim.Optimizer
) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """One training step of ``model`` with ``P_T(w)`` swapped into ``weights``."""
    ramp = torch.ones(())
    sizes = [w.numel() for w in weights]

    def pieces(flat: torch.Tensor) -> list[torch.Tensor]:
        return [p.view_as(w) for p, w in zip(flat.split(sizes), weights)]

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            dense = torch.cat([w.reshape(-1) for w in weights])  # kept until the update
            pruned, _ = _nm_forward(dense.view(-1, PATTERN.m), PATTERN, ramp, 3.0, None, None)
            torch._foreach_copy_(weights, pieces(pruned.reshape(-1)))
        F.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            torch._foreach_copy_(weights, pieces(dense))
        opt.step()
        _abs_max_each([w.detach() for w in weights]).tolist()  # pruner.step()'s finite check

    return step


def same_training(name: str, steps: int = 6) -> bool:
    """Whether the prototype and the Pruner train ``name`` to the same bits in ``steps`` steps."""
    g = torch.Generator().manual_seed(0)
    data = [
        (torch.randn(128, 1, 40, generator=g), torch.randint(0, 10, (128,), generator=g))
        for _ in range(steps)
    ]
    model = fresh(name)
    pruner = fs.Pruner(model, pattern="2:4", exclude=EXCLUDE[name])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in data:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        pruner.step()
    plain = fresh(name)
    opt2 = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    step = swapped_step(plain, pruned_weights(plain, name), opt2)
    for x, y in data:
        step(x, y)
    ours, theirs = pruner.dense_state_dict(), plain.state_dict()
    return ours.keys() == theirs.keys() and all(
        torch.equal(ours[k], theirs[k]) and ours[k].dtype == theirs[k].dtype for k in ours
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mnist1d_cnn", "mnist1d_mlpmixer"])
    parser.add_argument("--repeats", type=int, default=61)
    args = parser.parse_args()
    print(machine())
    print()
    print("| model | variant | median step (ms) | × dense |")
    print("|---|---|---:|---:|")
    lines = []
    for name in args.models:
        same = same_training(name)
        x, y = batch()
        plain = fresh(name)
        opt = torch.optim.SGD(plain.parameters(), lr=1e-3, momentum=0.9)
        swap = swapped_step(plain, pruned_weights(plain, name), opt)
        usual, inside = fresh(name), fresh(name)
        steps = {
            "dense": train_step(fresh(name), None, x, y),
            "2:4 Pruner (parametrization)": train_step(
                usual, fs.Pruner(usual, pattern="2:4", exclude=EXCLUDE[name]), x, y
            ),
            "2:4 Pruner, swapped()": train_step(
                inside, fs.Pruner(inside, pattern="2:4", exclude=EXCLUDE[name]), x, y, swap=True
            ),
            "2:4 weight swap (prototype)": lambda: swap(x, y),
        }
        samples = timings(steps, repeats=args.repeats, warmup=5)
        times = {k: statistics.median(v) for k, v in samples.items()}
        for k, t in times.items():
            print(f"| {name} | {k} | {t * 1e3:.2f} | {t / times['dense']:.3f} |")
        for variant in ("2:4 weight swap (prototype)", "2:4 Pruner, swapped()"):
            mid, lo, hi = paired_median_difference(
                samples[variant], samples["2:4 Pruner (parametrization)"]
            )
            lines.append(
                f"- {name}: {variant} minus the Pruner {mid * 1e3:+.2f} ms per step "
                f"({lo * 1e3:+.2f} to {hi * 1e3:+.2f})"
            )
        lines.append(f"- {name}: the prototype trains the Pruner's bits over 6 steps: {same}")
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
