"""One CPU training step with the N:M Pruner vs the dense model, side by side.

Models: the bundled CNN (``mnist1d_cnn``, batch 128, its 5-wide first conv
left dense) and the Linear-heavy ``mnist1d_mlpmixer`` (batch 128). Variants:
dense; ``Pruner(pattern="2:4")`` (Feather, p = 3, θ = 1); the same with
every layer's forward computed alone (``nm.fused`` off); the same at
θ = 0.5; and unstructured Feather-Global at 50 % for reference. The ratio
to dense is what the issue's target (≤ 1.1×) refers to. ``--micro 1 4``
(default) times each step also as 4 micro-batches of 32 with accumulated
gradients, where the fused forward is computed once per step instead of once
per micro-batch.

    python benchmarks/bench_nm_step.py [--models mnist1d_cnn mnist1d_mlpmixer]
        [--micro 1 4] [--repeats 21]
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


def make_step(model: nn.Module, pruner: fs.Pruner | None, micro: int) -> Callable[[], None]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, 1, 40, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    return train_step(model, pruner, x, y, micro)


@contextlib.contextmanager
def layer_by_layer() -> Iterator[None]:
    """Pruners attached inside compute every layer's N:M forward alone (no fusion)."""
    saved = fused.FUSE_MAX_NUMEL
    fused.FUSE_MAX_NUMEL = 0
    try:
        yield
    finally:
        fused.FUSE_MAX_NUMEL = saved


def variants(name: str, micro: int) -> dict[str, Callable[[], None]]:
    def fresh() -> nn.Module:
        torch.manual_seed(0)
        return fs.create_model(name)

    def nm(**kwargs: object) -> Callable[[], None]:
        m = fresh()
        return make_step(m, fs.Pruner(m, pattern="2:4", exclude=EXCLUDE[name], **kwargs), micro)

    out = {"dense": make_step(fresh(), None, micro)}
    out["2:4 feather θ=1"] = nm()
    with layer_by_layer():
        out["2:4 feather θ=1, layer by layer"] = nm()
    out["2:4 feather θ=0.5"] = nm(theta=0.5)
    m = fresh()
    out["unstructured 50 %"] = make_step(
        m,
        fs.Pruner(m, sparsity=0.5, total_steps=1, schedule="constant", exclude=EXCLUDE[name]),
        micro,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mnist1d_cnn", "mnist1d_mlpmixer"])
    parser.add_argument("--micro", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    print(machine())
    print()
    print("| model | micro-batches | variant | median step (ms) | × dense |")
    print("|---|---:|---|---:|---:|")
    for name in args.models:
        for micro in args.micro:
            times = compare(variants(name, micro), repeats=args.repeats, warmup=3)
            base = times["dense"]
            for variant, t in times.items():
                print(f"| {name} | {micro} | {variant} | {t * 1e3:.2f} | {t / base:.2f} |")


if __name__ == "__main__":
    main()
