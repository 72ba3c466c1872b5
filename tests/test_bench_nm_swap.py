"""The weight-swap prototype of benchmarks/bench_nm_swap.py trains the Pruner's bits.

docs/benchmarks-nm.md cites the prototype's step time as what a design
without a parametrization per layer would cost; that reading holds only
while the prototype computes the same training as the Pruner (θ = 1, 2:4),
which the script checks before it times. Run as a user runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_swap_prototype_trains_the_pruners_bits_and_prints_its_ratios() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_nm_swap.py"),
            "--models",
            "mnist1d_mlpmixer",
            "--repeats",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "| mnist1d_mlpmixer | 2:4 weight swap (prototype) |" in out
    assert "| mnist1d_mlpmixer | 2:4 Pruner, swapped() |" in out
    assert "the prototype trains the Pruner's bits over 6 steps: True" in out, out
