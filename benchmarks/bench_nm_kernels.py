"""The N:M operator's parts on a bundled model's 2:4 weights, and bit-exact alternatives.

Times (best of 5 × 200 calls, hot caches) the fused pass's arithmetic on all
of a bundled model's 2:4 layers at once, its per-group threshold selection,
and the two parts of it that run on strided or repeated data: the selection
of each group's threshold (seven min/max kernels over strided columns) and
the copy that widens each 65,536-weight block's thresholds to one per weight.
Beside each part, other ways to compute it that give the same bits (checked
with ``torch.equal`` before timing): what a bit-exact rewrite could save.

    OMP_NUM_THREADS=1 python benchmarks/bench_nm_kernels.py [--model mnist1d_mlpmixer]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F

import feather_sparse as fs
from _timing import best_us, machine
from bench_nm_step import EXCLUDE, fresh
from feather_sparse.nm import operator
from feather_sparse.ops import BLOCK


def pooled_second_smallest(a: torch.Tensor) -> torch.Tensor:
    """The second smallest of each row of four, with pooling over contiguous pairs."""
    pairs = a.reshape(1, 1, -1)
    lo = F.max_pool1d(-pairs, 2).neg_()  # min of each pair
    hi = F.max_pool1d(pairs, 2)  # max of each pair
    lows = F.max_pool1d(lo, 2)  # max of the two minima
    highs = F.max_pool1d(-hi, 2).neg_()  # min of the two maxima
    return torch.minimum(lows, highs).reshape(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mnist1d_mlpmixer")
    args = parser.parse_args()
    model = fresh(args.model)
    pruner = fs.Pruner(model, pattern="2:4", exclude=EXCLUDE[args.model])
    with torch.no_grad():
        flat = torch.cat([w.reshape(-1) for w in pruner.weights()])
    pattern = operator.NMPattern.parse("2:4")
    x = flat.view(-1, 4)
    ramp = torch.ones(())
    a = x.abs()
    columns = a.unbind(1)
    rows = BLOCK // 4
    t = operator.group_thresholds(x, pattern)[:rows, 0].contiguous()
    wide = torch.empty(rows, 4)
    ones = torch.ones(1, 4)
    index = torch.arange(rows).repeat_interleave(4)

    reference_t = operator._kth_of_four(columns, 1)
    reference_wide = wide.copy_(t.view(-1, 1).expand(-1, 4)).clone()
    parts: list[tuple[str, Callable[[], torch.Tensor], torch.Tensor | None]] = [
        (
            "fused pass: P_T of every 2:4 weight",
            lambda: operator._nm_forward(x, pattern, ramp, 3.0, None, None)[0],
            None,
        ),
        (
            "per-group thresholds (abs + selection)",
            lambda: operator.group_thresholds(x, pattern),
            None,
        ),
        (
            "selection: 7 min/max over strided columns",
            lambda: operator._kth_of_four(columns, 1),
            reference_t,
        ),
        (
            "selection: pooling over contiguous pairs",
            lambda: pooled_second_smallest(a),
            reference_t,
        ),
        (
            "widen one block's thresholds: expand + copy (used)",
            lambda: wide.copy_(t.view(-1, 1).expand(-1, 4)),
            reference_wide,
        ),
        ("widen: repeat_interleave", lambda: t.repeat_interleave(4).view(-1, 4), reference_wide),
        ("widen: mm against ones", lambda: torch.mm(t.view(-1, 1), ones), reference_wide),
        ("widen: index_select", lambda: t.index_select(0, index).view(-1, 4), reference_wide),
        (
            "widen: interpolate (nearest)",
            lambda: F.interpolate(t.view(1, 1, -1), scale_factor=4, mode="nearest").view(-1, 4),
            reference_wide,
        ),
    ]
    print(machine())
    print(
        f"\n{args.model}: {flat.numel():,} weights in its 2:4 layers, "
        f"{x.shape[0]:,} groups; a block is {BLOCK:,} weights\n"
    )
    print("| part | µs | same bits as the one used |")
    print("|---|---:|---|")
    for label, fn, reference in parts:
        same = "—" if reference is None else str(torch.equal(fn(), reference))
        print(f"| {label} | {best_us(fn):.1f} | {same} |")


if __name__ == "__main__":
    main()
