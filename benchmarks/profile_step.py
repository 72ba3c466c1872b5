"""Where a Feather training step spends its time, phase by phase and kernel by kernel.

``bench_train_step.py`` times whole steps; this script splits the same step
(dense, and Feather-Global with θ = 1 at the final sparsity) into its phases
— forward with the loss, backward, the SGD step, ``pruner.step()`` — each
timed alone (the device idle before and after, medians of interleaved
repeats), and then profiles a few whole steps with ``torch.profiler``: how
many kernels (on a GPU) or operators (on a CPU) one step launches, and the
operators that take the most self time. On a GPU, a step made of many small
kernels is bound by their launches, not their arithmetic; the counts say
whether that is what the Pruner adds.

    python benchmarks/profile_step.py [--models resnet20 mlp50m] [--device cuda]
        [--repeats 11] [--top 12]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

import feather_sparse as fs
from _timing import add_device_argument, compare, machine, resolve_device
from bench_train_step import setup

PHASES = ("forward", "backward", "optimizer", "pruner.step")


def phases(
    model: nn.Module, pruner: fs.Pruner | None, x: torch.Tensor, y: torch.Tensor
) -> dict[str, Callable[[], object]]:
    """The four phases of one step, each a function of its own; run in order they are one step."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss: list[torch.Tensor] = []

    def forward() -> None:
        opt.zero_grad(set_to_none=True)
        loss[:] = [F.cross_entropy(model(x), y)]

    def pruner_step() -> None:
        if pruner is not None:
            pruner.step()

    return {
        "forward": forward,
        "backward": lambda: loss[0].backward(),
        "optimizer": opt.step,
        "pruner.step": pruner_step,
    }


def time_phases(
    variants: dict[str, dict[str, Callable[[], object]]], repeats: int, device: torch.device
) -> dict[str, dict[str, float]]:
    """Median seconds of each phase of each variant; the variants' steps interleave
    (``compare`` runs the functions in order, so each variant's phases make a step)."""
    flat = {f"{v}/{p}": fn for v, fns in variants.items() for p, fn in fns.items()}
    times = compare(flat, repeats=repeats, device=device)
    return {v: {p: times[f"{v}/{p}"] for p in PHASES} for v in variants}


def profile_rows(
    fns: dict[str, Callable[[], object]], device: torch.device, steps: int, top: int
) -> tuple[int, list[str]]:
    """Kernels (or CPU operators) one step launches, and the top operators by self time."""
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            for p in PHASES:
                fns[p]()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = prof.key_averages()
    on_gpu = device.type == "cuda"

    def self_time(e: object) -> float:
        return float(getattr(e, "self_device_time_total" if on_gpu else "self_cpu_time_total"))

    if on_gpu:
        launched = sum(
            e.count
            for e in prof.events()
            if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
        )
    else:
        launched = sum(e.count for e in events if e.key.startswith("aten::"))
    ranked = sorted((e for e in events if self_time(e) > 0), key=self_time, reverse=True)
    total = sum(self_time(e) for e in ranked) or 1.0
    rows = [
        f"| `{e.key[:70]}` | {e.count / steps:.0f} | {self_time(e) / steps / 1e3:.3f} "
        f"| {100 * self_time(e) / total:.1f} % |"
        for e in ranked[:top]
    ]
    return round(launched / steps), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["resnet20", "mlp50m"])
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=12)
    add_device_argument(parser)
    args = parser.parse_args()
    device = resolve_device(args.device)
    unit = "kernels" if device.type == "cuda" else "aten operators"
    print(f"# one training step by phase, and its busiest operators; {machine(device)}\n")
    for name in args.models:
        build, x, y = setup(name)
        x, y = x.to(device), y.to(device)
        variants: dict[str, dict[str, Callable[[], object]]] = {}
        for variant in ("dense", "feather"):
            torch.manual_seed(0)
            model = build().to(device)
            pruner = None
            if variant == "feather":
                pruner = fs.Pruner(model, args.sparsity, total_steps=1)
                pruner.update(args.sparsity)  # the final sparsity: every step does the full work
            variants[variant] = phases(model, pruner, x, y)
        med = time_phases(variants, args.repeats, device)
        print(f"## {name}\n")
        print("| phase | dense (ms) | Feather θ=1 (ms) | Feather − dense (ms) |")
        print("|---|---:|---:|---:|")
        for p in (*PHASES, "whole step"):
            d = sum(med["dense"].values()) if p == "whole step" else med["dense"][p]
            f = sum(med["feather"].values()) if p == "whole step" else med["feather"][p]
            print(f"| {p} | {d * 1e3:.2f} | {f * 1e3:.2f} | {(f - d) * 1e3:+.2f} |")
        print()
        for variant, fns in variants.items():
            launched, rows = profile_rows(fns, device, args.profile_steps, args.top)
            print(f"{variant}: {launched} {unit} per step; the top {len(rows)} by self time:\n")
            print("| operator | calls per step | self ms per step | share |")
            print("|---|---:|---:|---:|")
            print("\n".join(rows), end="\n\n")


if __name__ == "__main__":
    main()
