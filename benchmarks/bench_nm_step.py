"""One CPU training step with the N:M Pruner vs the dense model, side by side.

Models: the bundled CNN (``mnist1d_cnn``, batch 128, its 5-wide first conv
left dense) and the Linear-heavy ``mnist1d_mlpmixer`` (batch 128). Variants:
dense; ``Pruner(pattern="2:4")`` (Feather, p = 3, θ = 1); the same with
every layer's forward computed alone (``nm.fused`` off); the same at
θ = 0.5; and unstructured Feather-Global at 50 % for reference. The ratio
to dense is what the issue's target (≤ 1.1×) refers to.

    python benchmarks/bench_nm_step.py [--models mnist1d_cnn mnist1d_mlpmixer] [--repeats 21]
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

import feather_sparse as fs
from _timing import compare, machine, train_step
from feather_sparse.nm import fused

BATCH = 128
#: Layers of each model that an N:M pattern cannot take (reduction dim not a multiple of 4).
EXCLUDE = {"mnist1d_cnn": ["features.0"], "mnist1d_mlpmixer": []}


def make_step(model: nn.Module, pruner: fs.Pruner | None) -> Callable[[], None]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, 1, 40, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    return train_step(model, pruner, x, y)


@contextlib.contextmanager
def layer_by_layer() -> Iterator[None]:
    """Pruners attached inside compute every layer's N:M forward alone (no fusion)."""
    saved = fused.FUSE_MAX_NUMEL
    fused.FUSE_MAX_NUMEL = 0
    try:
        yield
    finally:
        fused.FUSE_MAX_NUMEL = saved


def variants(name: str) -> dict[str, Callable[[], None]]:
    def fresh() -> nn.Module:
        torch.manual_seed(0)
        return fs.create_model(name)

    exclude = EXCLUDE[name]
    out = {"dense": make_step(fresh(), None)}
    m = fresh()
    out["2:4 feather θ=1"] = make_step(m, fs.Pruner(m, pattern="2:4", exclude=exclude))
    m = fresh()
    with layer_by_layer():
        out["2:4 feather θ=1, layer by layer"] = make_step(
            m, fs.Pruner(m, pattern="2:4", exclude=exclude)
        )
    m = fresh()
    out["2:4 feather θ=0.5"] = make_step(m, fs.Pruner(m, pattern="2:4", theta=0.5, exclude=exclude))
    m = fresh()
    out["unstructured 50 %"] = make_step(
        m, fs.Pruner(m, sparsity=0.5, total_steps=1, schedule="constant", exclude=exclude)
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mnist1d_cnn", "mnist1d_mlpmixer"])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    print(machine())
    print()
    print("| model | variant | median step (ms) | × dense |")
    print("|---|---|---:|---:|")
    for name in args.models:
        times = compare(variants(name), repeats=args.repeats, warmup=3)
        base = times["dense"]
        for variant, t in times.items():
            print(f"| {name} | {variant} | {t * 1e3:.2f} | {t / base:.2f} |")


if __name__ == "__main__":
    main()
