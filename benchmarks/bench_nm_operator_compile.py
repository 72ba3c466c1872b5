"""The N:M operator's forward alone, eager against ``torch.compile`` (inductor), on one weight.

Asks whether a compiled kernel of the operator would make the CPU step
cheaper without compiling the user's model (docs/benchmarks-nm.md, "The
CNN's layers fused"): the 2:4 forward of Feather (p = 3) on a 256×384
weight (the bundled CNN's widest layer), eager
(:func:`feather_sparse.nm.operator._nm_forward`) and the same function
compiled with static and with dynamic shapes, interleaved, hot (the same
weight every call), medians; then how many of the outputs' bits differ
from the eager ones.

    OMP_NUM_THREADS=1 python benchmarks/bench_nm_operator_compile.py [--repeats 300]
"""

from __future__ import annotations

import argparse

import torch

from _timing import compare, machine
from feather_sparse.nm.operator import NMPattern, _nm_forward

PATTERN = NMPattern(2, 4)


def forward(w: torch.Tensor, ramp: torch.Tensor) -> torch.Tensor:
    """``P_T(w)`` of the 2:4 pattern, Feather's p = 3."""
    return _nm_forward(w, PATTERN, ramp, 3.0, None, None)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    torch.manual_seed(0)
    w = torch.randn(256, 384) * 0.05
    ramp = torch.ones(())
    variants = {
        "eager": forward,
        "compiled, static shapes": torch.compile(forward, dynamic=False),
        "compiled, dynamic shapes": torch.compile(forward, dynamic=True),
    }
    eager = forward(w, ramp)
    differ = {}
    for name, fn in variants.items():
        out = fn(w, ramp)  # compiles here, outside the timing
        differ[name] = int((out.view(torch.int32) != eager.view(torch.int32)).sum())
    times = compare(
        {name: (lambda fn=fn: fn(w, ramp)) for name, fn in variants.items()},
        repeats=args.repeats,
        warmup=20,
    )
    print(machine())
    print()
    print("| variant | median (µs) | × eager | outputs with other bits |")
    print("|---|---:|---:|---:|")
    for name, t in times.items():
        print(
            f"| {name} | {t * 1e6:.0f} | {t / times['eager']:.2f} "
            f"| {differ[name]:,} of {w.numel():,} |"
        )


if __name__ == "__main__":
    main()
