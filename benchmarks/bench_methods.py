"""Cost per training step of every backbone and method, side by side with Feather-Global.

Model: ``create_model("resnet20")``, ResNet-20 at 2× width (the paper's
CIFAR model, 1.096M parameters, 1,092,960 prunable weights), batch 128 of
32×32 images, 100 classes, SGD with momentum, on the CPU. One step =
forward, backward, optimizer step, ``pruner.step()`` (plus the ASL+ sparsity
loss for ASL+). Every variant runs at its final sparsity from the first step
(a constant schedule), so each step does its full work; Spartan is measured
in its Sinkhorn phase (the soft mask recomputed every step) at the first and
the last β of its schedule, and in its final frozen-mask phase.

Two measurements, in one run:

1. the whole training step: median time, ratio to the dense step and to
   Feather-Global, extra milliseconds over Feather-Global;
2. the pruning work alone — the same step minus what every variant shares
   (convolutions, batch norm, SGD): computing every pruned weight from the
   stored one (the parametrization's forward), its backward for a fixed
   upstream gradient, and ``pruner.step()`` (thresholds, masks). This is the
   method's extra cost per step, measured without the seconds of
   convolution whose noise on a shared machine hides it in (1).

Variants run interleaved round-robin so that noise hits all alike.

    python benchmarks/bench_methods.py [--repeats 5] [--work-repeats 30] [--threads 1]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import feather_sparse as fs
from _timing import compare, machine

# (label, method, extra make_pruner arguments); "dense" has no pruner.
VARIANTS: list[tuple[str, str | None, dict[str, Any]]] = [
    ("dense", None, {}),
    ("Feather-Global", "feather", {}),
    ("Feather-Uniform (GMP backbone)", "feather", {"backbone": "uniform"}),
    ("Feather-Global-FLOPs (ST-3σ backbone)", "feather", {"backbone": "global-flops"}),
    ("Feather-ASL+", "feather", {"backbone": "asl+"}),
    ("hard STE", "hard", {}),
    ("soft STE", "soft", {}),
    ("non-STE (θ = 0)", "nonste", {}),
    ("GMP", "gmp", {}),
    ("ST-3", "st3", {}),
    ("ST-3σ", "st3", {"backbone": "global-flops"}),
    ("Spartan (Sinkhorn phase, β = 1)", "spartan", {}),
    ("Spartan (Sinkhorn phase, β = 20)", "spartan", {"beta_init": 20.0}),
    ("Spartan (frozen mask)", "spartan", {"freeze_at": 0.0}),
]
BASELINE = "Feather-Global"


def make_step(
    method: str | None,
    kwargs: dict[str, Any],
    sparsity: float,
    x: torch.Tensor,
    y: torch.Tensor,
    update_times: list[float],
    pruners: dict[str, fs.Pruner],
    label: str,
) -> Callable[[], None]:
    """One training step of a fresh model with ``method``; appends pruner.step() times."""
    torch.manual_seed(0)
    model = fs.create_model("resnet20", num_classes=100)
    pruner = None
    if method is not None:
        pruner = fs.make_pruner(
            model,
            method,
            sparsity=sparsity,
            total_steps=10**6,
            schedule=fs.ConstantSchedule(),
            **kwargs,
        )
        pruners[label] = pruner
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    if pruner is not None and pruner.parameters():
        opt.add_param_group({"params": pruner.parameters(), "lr": 1e-5, "weight_decay": 0.0})

    def step() -> None:
        loss = F.cross_entropy(model(x), y)
        if pruner is not None:
            loss = loss + pruner.regularizer()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if pruner is not None:
            start = time.perf_counter()
            pruner.step()
            update_times.append(time.perf_counter() - start)

    return step


def make_work(pruner: fs.Pruner) -> Callable[[], None]:
    """The pruning work of one step: weights forward and backward, then ``pruner.step()``."""
    g = torch.Generator().manual_seed(1)
    upstream = [torch.randn(w.shape, generator=g) * 1e-3 for w in pruner.weights()]
    params = pruner.parameters()

    def work() -> None:
        for w in [*pruner.weights(), *params]:
            w.grad = None
        pruned = [t.module.weight for t in pruner.targets]  # the parametrizations' forward
        outputs, grads = [*pruned], [*upstream]
        reg = pruner.regularizer()
        if reg.requires_grad:  # ASL+'s sparsity loss
            outputs.append(reg)
            grads.append(torch.ones_like(reg))
        torch.autograd.backward(outputs, grads)
        pruner.step()

    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--work-repeats", type=int, default=30)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    # At 90 % from the first step, global pruning of a freshly initialised
    # ResNet-20 empties its last, widest layers: expected, and not timed here.
    logging.getLogger("feather_sparse").setLevel(logging.ERROR)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, 3, 32, 32, generator=g)
    y = torch.randint(0, 100, (args.batch,), generator=g)
    updates: dict[str, list[float]] = {label: [] for label, _, _ in VARIANTS}
    pruners: dict[str, fs.Pruner] = {}
    steps = {
        label: make_step(method, kw, args.sparsity, x, y, updates[label], pruners, label)
        for label, method, kw in VARIANTS
    }
    times = compare(steps, repeats=args.repeats, warmup=args.warmup)
    n_updates = {label: len(ts) for label, ts in updates.items()}
    work = compare(
        {label: make_work(p) for label, p in pruners.items()}, repeats=args.work_repeats, warmup=2
    )

    print(f"ResNet-20 (2× width), batch {args.batch}, CPU, sparsity {args.sparsity}; {machine()}\n")
    print(f"**Whole training step**, medians of {args.repeats} interleaved steps:\n")
    print(
        "| variant | step (ms) | × dense | × Feather-Global | extra over Feather-Global (ms) "
        "| pruner.step() (ms) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    dense, base = times["dense"], times[BASELINE]
    for label, _, _ in VARIANTS:
        t = times[label]
        # the update times of the timed repeats only (the first ones were warm-up)
        measured = updates[label][args.warmup : n_updates[label]]
        update = f"{statistics.median(measured) * 1e3:.1f}" if measured else "—"
        print(
            f"| {label} | {t * 1e3:.0f} | {t / dense:.3f}× | {t / base:.3f}× "
            f"| {(t - base) * 1e3:+.0f} | {update} |"
        )
    print(
        "\n**Pruning work per step** (weights forward + backward + `pruner.step()`), "
        f"medians of {args.work_repeats}:\n"
    )
    print("| variant | pruning work (ms) | × Feather-Global | extra over Feather-Global (ms) |")
    print("|---|---:|---:|---:|")
    base_work = work[BASELINE]
    for label, t in work.items():
        print(f"| {label} | {t * 1e3:.1f} | {t / base_work:.2f}× | {(t - base_work) * 1e3:+.1f} |")
    print()
    for label, pruner in pruners.items():
        last = getattr(pruner.backbone, "last", None)
        spartan = isinstance(pruner.backbone, fs.SpartanBackbone)
        if spartan and last is not None and not pruner.backbone.frozen:
            print(
                f"{label}: last solve {last.iterations} Sinkhorn iterations + "
                f"{last.newton_steps} budget-polishing steps, budget error {last.budget_error:.1e}"
            )


if __name__ == "__main__":
    main()
