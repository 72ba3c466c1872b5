"""How to reach an N:M pattern: from the first step, after a dense warm-up, or ramped.

Trains ``Pruner(pattern=...)`` (Feather, p = 3, θ automatic) on the bundled
MNIST-1D data with each way of reaching the pattern, over several seeds, and
prints test accuracy per run, the mean per way, and the paired difference of
each way against "from the first step" (same seed: same initialisation and
batches) with a 95 % t interval. Recipe: SGD, lr 0.1, momentum 0.9, weight
decay 5e-4 (not on biases and norms), cosine decay, batch 128, gradient
clipping at 3.

    python benchmarks/bench_nm_ramp.py --models mnist1d_cnn mnist1d_mlpmixer \
        --seeds 0 1 2 --epochs 12 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs
from _timing import machine
from feather_sparse.data import load_dataset

#: The ways of reaching the pattern, as schedules (see feather_sparse.nm.backbone).
WAYS: dict[str, Any] = {
    "first-step": "constant",
    "warm-up 10 %": {"name": "constant", "start": 0.1},
    "ramp (cubic, 0-50 %)": {"name": "cubic", "start": 0.0, "end": 0.5},
}
EXCLUDE = {"mnist1d_cnn": ["features.0"], "mnist1d_mlpmixer": []}
#: Two-sided 95 % Student t quantiles by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def param_groups(model: nn.Module) -> list[dict[str, Any]]:
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    return [{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0.0}]


def run(model_name: str, way: str | None, pattern: str, seed: int, epochs: int) -> float:
    """Test accuracy after training; ``way`` None trains the dense model."""
    torch.manual_seed(seed)
    model = fs.create_model(model_name)
    data = load_dataset("mnist1d", batch_size=128, seed=seed)
    steps = epochs * len(data.train)
    pruner = None
    if way is not None:
        pruner = fs.Pruner(
            model,
            pattern=pattern,
            schedule=WAYS[way],
            total_steps=steps,
            exclude=EXCLUDE[model_name],
        )
    opt = torch.optim.SGD(param_groups(model), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    for epoch in range(epochs):
        model.train()
        data.train.set_epoch(epoch)
        for x, y in data.train:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 3.0)
            opt.step()
            sched.step()
            if pruner is not None:
                pruner.step()
    if pruner is not None:
        pruner.finalize()
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in data.test:
            correct += int((model(x).argmax(1) == y).sum())
            total += y.numel()
    return correct / total


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean of ``a − b`` and the half-width of its 95 % t interval."""
    d = [x - y for x, y in zip(a, b)]
    if len(d) < 2:
        return d[0], math.nan
    return statistics.mean(d), T95.get(len(d) - 1, 1.96) * statistics.stdev(d) / math.sqrt(len(d))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mnist1d_cnn", "mnist1d_mlpmixer"])
    parser.add_argument("--pattern", default="2:4")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--json", help="also write the per-run accuracies here")
    args = parser.parse_args()
    print(machine())
    results: dict[str, dict[str, list[float]]] = {}
    start = time.perf_counter()
    for model_name in args.models:
        acc: dict[str, list[float]] = {"dense": []}
        acc.update({way: [] for way in WAYS})
        for seed in args.seeds:
            acc["dense"].append(run(model_name, None, args.pattern, seed, args.epochs))
            for way in WAYS:
                acc[way].append(run(model_name, way, args.pattern, seed, args.epochs))
            print(
                f"{model_name} seed {seed}: "
                + ", ".join(f"{k} {v[-1]:.3f}" for k, v in acc.items())
            )
        results[model_name] = acc
    print(
        f"\n{len(args.seeds)} seeds, {args.epochs} epochs, pattern {args.pattern}, "
        f"{time.perf_counter() - start:.0f} s\n"
    )
    print("| model | way | test accuracy (mean) | per seed | − first-step (95 % CI) |")
    print("|---|---|---:|---|---:|")
    for model_name, acc in results.items():
        base = acc["first-step"]
        for way, vals in acc.items():
            d, h = paired(vals, base)
            diff = "" if way == "first-step" else f"{d * 100:+.2f} ± {h * 100:.2f} pt"
            seeds = " ".join(f"{v:.3f}" for v in vals)
            print(f"| {model_name} | {way} | {statistics.mean(vals):.4f} | {seeds} | {diff} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "accuracy": results}, f, indent=1)


if __name__ == "__main__":
    main()
