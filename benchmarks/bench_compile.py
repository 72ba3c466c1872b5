"""torch.compile (inductor) vs eager: the Feather operator alone, and a pruned model's train step.

Operator: ``P_T(w)`` forward, and forward+backward with θ = 0.5 (the backward
recomputes the mask), for p = 3 (Feather) and p = inf (hard), on one weight
tensor; a plain copy ``w.clone()`` is the memory-bound floor. Train step: a
small CNN, dense vs pruned (Feather-Global, threshold recomputed every step
outside the compiled graph, as in training). Every compiled function is
compiled once; the frame counter confirms that moving thresholds do not
recompile it. All numbers are medians of interleaved repeats in one run.

    python benchmarks/bench_compile.py [--numel 4.2] [--repeats 9]
        [--models cnn resnet20 mlp50m] [--device cuda]

The train-step models are the small CNN (default) and those of
``bench_train_step.py``; on a GPU every timing waits for the device.
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections.abc import Callable

import torch
import torch._dynamo
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import feather_sparse as fs
from _timing import add_device_argument, compare, machine, resolve_device
from bench_train_step import setup


def operator_rows(numel: int, repeats: int, device: torch.device) -> list[str]:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(numel, generator=g).to(device).requires_grad_(True)
    t = torch.tensor(1.0, device=device)
    grad = torch.randn(numel, generator=g).to(device)
    rows = []
    for label, p in [("feather p=3", 3.0), ("hard p=inf", math.inf)]:

        def op(w: torch.Tensor, t: torch.Tensor, p: float = p) -> torch.Tensor:
            return fs.threshold(w, t, p=p, theta=0.5)

        def fwd(f: Callable[..., torch.Tensor], t: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return f(w, t)

        def fwd_bwd(f: Callable[..., torch.Tensor], t: torch.Tensor) -> torch.Tensor:
            (g_w,) = torch.autograd.grad(f(w, t), w, grad)
            return g_w

        for what, run in [("forward", fwd), ("forward+backward", fwd_bwd)]:
            torch._dynamo.reset()  # a fresh graph per row, so the frame count is the row's
            counter = CompileCounterWithBackend("inductor")
            compiled = torch.compile(op, backend=counter)
            torch.testing.assert_close(run(compiled, t), run(op, t))
            # moving thresholds
            ts = itertools.cycle([torch.tensor(x, device=device) for x in (0.5, 1.0, 1.5)])
            times = compare(
                {
                    "copy": lambda: w.detach().clone(),
                    "eager": lambda run=run: run(op, next(ts)),
                    "compiled": lambda run=run, compiled=compiled: run(compiled, next(ts)),
                },
                repeats=repeats,
                device=device,
            )
            ms = {k: v * 1e3 for k, v in times.items()}
            rows.append(
                f"| {label} {what} | {ms['copy']:.1f} | {ms['eager']:.1f} | {ms['compiled']:.1f} "
                f"| {times['eager'] / times['compiled']:.2f}× | {counter.frame_count} |"
            )
    return rows


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv1d(1, 32, 5, padding=2),
        nn.ReLU(),
        nn.Conv1d(32, 64, 5, padding=2, stride=2),
        nn.ReLU(),
        nn.Conv1d(64, 64, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64 * 10, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    )


def train_step_rows(name: str, repeats: int, device: torch.device) -> list[str]:
    if name == "cnn":
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(256, 1, 40, generator=g), torch.randint(0, 10, (256,), generator=g)
        build = cnn
    else:
        build, x, y = setup(name)
    x, y = x.to(device), y.to(device)
    steps: dict[str, Callable[[], object]] = {}
    frames: dict[str, CompileCounterWithBackend] = {}
    torch._dynamo.reset()
    for variant in ("dense", "pruned"):
        for mode in ("eager", "compiled"):
            torch.manual_seed(0)
            model = build().to(device)
            pruner = fs.Pruner(model, 0.9, total_steps=1) if variant == "pruned" else None
            if pruner is not None:
                pruner.update(0.9)  # the final sparsity: every step does the full work
            opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
            forward: nn.Module | Callable[..., torch.Tensor] = model
            if mode == "compiled":
                counter = CompileCounterWithBackend("inductor")
                frames[variant] = counter
                forward = torch.compile(model, backend=counter)

            def step(
                forward: Callable[..., torch.Tensor] = forward,
                opt: torch.optim.Optimizer = opt,
                pruner: fs.Pruner | None = pruner,
            ) -> None:
                loss = nn.functional.cross_entropy(forward(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if pruner is not None:
                    pruner.update(0.9)  # a new threshold every step, as in training

            steps[f"{variant} {mode}"] = step
    times = compare(steps, repeats=repeats, device=device)
    ms = {k: v * 1e3 for k, v in times.items()}
    rows = []
    for variant in ("dense", "pruned"):
        e, c = times[f"{variant} eager"], times[f"{variant} compiled"]
        rows.append(
            f"| {name} train step, {variant} | | {ms[f'{variant} eager']:.1f} "
            f"| {ms[f'{variant} compiled']:.1f} | {e / c:.2f}× | {frames[variant].frame_count} |"
        )
    pruned_cost = (
        f"{name}: pruned / dense step: eager {times['pruned eager'] / times['dense eager']:.2f}×, "
        f"compiled {times['pruned compiled'] / times['dense compiled']:.2f}×"
    )
    return [*rows, "", pruned_cost]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--numel", type=float, default=4.2, help="operator tensor, millions")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--models", nargs="+", default=["cnn"], help="train-step models")
    add_device_argument(parser)
    args = parser.parse_args()
    device = resolve_device(args.device)
    print(f"# torch.compile (inductor) vs eager; {machine(device)}\n")
    print("| what | copy (ms) | eager (ms) | compiled (ms) | eager / compiled | frames compiled |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in operator_rows(round(args.numel * 1e6), args.repeats, device):
        print(row)
    notes = []
    for name in args.models:
        rows = train_step_rows(name, args.repeats, device)
        print("\n".join(rows[:-2]))
        notes.append(rows[-1])
    print("\n" + "\n".join(notes))


if __name__ == "__main__":
    main()
