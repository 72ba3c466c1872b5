"""The Feather operator's forward+backward vs a reference-style implementation.

The reference is how research code commonly writes it: a float mask the size
of the weight saved for backward, ``sign(w)·(|w|^p − T^p)^(1/p)·mask`` forward
and ``g·(mask + θ(1 − mask))`` backward. Ours saves no new tensor (only the
weight it was given and the 0-d threshold) and skips the mask entirely when
θ = 1.

    python benchmarks/bench_operator.py [--numel 1.1 16.8]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

import feather_sparse as fs
from _timing import compare, machine


class ReferenceOperator(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, w: torch.Tensor, t: torch.Tensor, p: float, theta: float) -> torch.Tensor:
        mask = (w.abs() > t).float()
        ctx.save_for_backward(mask)
        ctx.theta = theta
        return torch.sign(w) * (w.abs().pow(p) - t.pow(p)).clamp(min=0).pow(1 / p) * mask

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        (mask,) = ctx.saved_tensors
        return g * (mask + ctx.theta * (1 - mask)), None, None, None


def saved_new_bytes(fn: Any, w: torch.Tensor, t: torch.Tensor) -> int:
    """Bytes saved for backward that are not the input weight or the threshold."""
    total = 0

    def pack(x: torch.Tensor) -> torch.Tensor:
        nonlocal total
        if x.data_ptr() not in (w.data_ptr(), t.data_ptr()):
            total += x.numel() * x.element_size()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        fn()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--numel", type=float, nargs="+", default=[1.1, 16.8], help="millions")
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    print(f"# operator forward+backward, p = 3, sparsity {args.sparsity}; {machine()}\n")
    print(
        "| weights | θ | reference (ms) | ours (ms) | ours / reference | saved bytes ref / ours |"
    )
    print("|---:|---:|---:|---:|---:|---|")
    for millions in args.numel:
        n = round(millions * 1e6)
        w = torch.randn(n, requires_grad=True)
        t = torch.kthvalue(w.detach().abs(), round(args.sparsity * n)).values
        g = torch.randn(n)
        for theta in (1.0, 0.5):

            def ours(theta: float = theta) -> None:
                fs.threshold(w, t, 3.0, theta).backward(g)

            def ref(theta: float = theta) -> None:
                ReferenceOperator.apply(w, t, 3.0, theta).backward(g)

            times = compare({"ref": ref, "ours": ours}, repeats=args.repeats)
            b_ref = saved_new_bytes(lambda th=theta: ReferenceOperator.apply(w, t, 3.0, th), w, t)
            b_ours = saved_new_bytes(lambda th=theta: fs.threshold(w, t, 3.0, th), w, t)
            print(
                f"| {millions}M | {theta} | {times['ref'] * 1e3:.1f} | {times['ours'] * 1e3:.1f} "
                f"| {times['ours'] / times['ref']:.2f}× | {b_ref:,} / {b_ours:,} |"
            )


if __name__ == "__main__":
    main()
