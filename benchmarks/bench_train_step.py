"""One training step with the Pruner vs the dense model, side by side.

Models: ResNet-20 at 2× width (the paper's CIFAR model, batch 128 of 32×32
images) and a 50M-parameter MLP (batch 256). Variants: dense; Feather-Global
(this library, θ = 1, also with the forward and backward inside
``pruner.swapped()`` as the training CLI runs them, and θ = 0.5); and the
same Pruner with a backbone that sorts all weights every step, as the
authors' released code does (the reference cost this library avoids). All
at the final sparsity, so every step does the full work.

    python benchmarks/bench_train_step.py [--models resnet20 mlp50m] [--repeats 5]
        [--device cuda] [--swap-max-numel N]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import torch
from torch import nn

import feather_sparse as fs
from _timing import add_device_argument, compare, machine, resolve_device, train_step
from feather_sparse import swap as fs_swap


class SortEveryStep(fs.Backbone):
    """The released code's rule: concatenate and sort all |w| every step."""

    name = "sort-reference"

    def thresholds(self, weights: Sequence[torch.Tensor], sparsity: float) -> list[torch.Tensor]:
        mags = torch.sort(torch.cat([w.reshape(-1).abs() for w in weights])).values
        pos = sparsity * (mags.numel() - 1)
        lo = int(pos)
        hi = min(lo + 1, mags.numel() - 1)
        t = mags[lo] + (pos - lo) * (mags[hi] - mags[lo])
        return [t] * len(weights)


def mlp50m() -> nn.Module:
    # 4 × 3536² ≈ 50.0M weights
    width = 3536
    return nn.Sequential(
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
    )


def setup(name: str) -> tuple[Callable[[], nn.Module], torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    if name == "resnet20":
        x = torch.randn(128, 3, 32, 32, generator=g)
        y = torch.randint(0, 100, (128,), generator=g)
        return (lambda: fs.create_model("resnet20", num_classes=100)), x, y
    if name == "mlp50m":
        x = torch.randn(256, 3536, generator=g)
        y = torch.randint(0, 3536, (256,), generator=g)
        return mlp50m, x, y
    raise ValueError(f"unknown model {name!r}; choose resnet20 or mlp50m")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["resnet20", "mlp50m"])
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-sort-reference", action="store_true", help="skip the slow reference")
    parser.add_argument(
        "--swap-max-numel",
        type=int,
        default=None,
        help="the swapped() column swaps layers of up to this many weights "
        "(feather_sparse.swap.SWAP_MAX_NUMEL; default: the library's line)",
    )
    add_device_argument(parser)
    args = parser.parse_args()
    if args.swap_max_numel is not None:
        fs_swap.SWAP_MAX_NUMEL = args.swap_max_numel
    device = resolve_device(args.device)
    print(
        "# one training step (forward, backward, SGD, pruner.step) "
        f"at sparsity {args.sparsity}; {machine(device)}\n"
    )
    print(
        "| model | weights | dense (ms) | Feather θ=1 | θ=1, swapped() | Feather θ=0.5 "
        "| sort every step |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in args.models:
        build, x, y = setup(name)
        x, y = x.to(device), y.to(device)
        steps: dict[str, Callable[[], None]] = {}
        torch.manual_seed(0)
        steps["dense"] = train_step(build().to(device), None, x, y)
        for label, theta, backbone in (
            ("theta1", 1.0, "global"),
            ("swapped", 1.0, "global"),
            ("theta05", 0.5, "global"),
            ("sort", 1.0, SortEveryStep()),
        ):
            if label == "sort" and args.no_sort_reference:
                continue
            torch.manual_seed(0)
            model = build().to(device)
            pruner = fs.Pruner(
                model,
                args.sparsity,
                total_steps=10**6,
                theta=theta,
                backbone=backbone,
                schedule="constant",
            )
            steps[label] = train_step(model, pruner, x, y, swap=label == "swapped")
        times = compare(steps, repeats=args.repeats, warmup=1, device=device)
        n = sum(
            p.numel()
            for m in [build()]
            for mod in m.modules()
            if isinstance(mod, (nn.Conv2d, nn.Linear))
            for p in [mod.weight]
        )
        dense = times["dense"]
        sort = f"{times['sort'] / dense:.2f}×" if "sort" in times else "—"
        print(
            f"| {name} | {n / 1e6:.2f}M | {dense * 1e3:.0f} | {times['theta1'] / dense:.3f}× "
            f"| {times['swapped'] / dense:.3f}× | {times['theta05'] / dense:.3f}× | {sort} |"
        )


if __name__ == "__main__":
    main()
