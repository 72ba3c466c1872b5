"""The benchmarks behind docs/benchmarks-nm.md's "swapped() without copies" section
check what their comparisons assume before they time, and say so. Run as a user runs
them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_direct_and_parametrized_reads_give_the_same_bits_and_are_timed() -> None:
    out = run("bench_swap_reads.py", "--models", "mnist1d_mlpmixer", "--rounds", "2")
    assert "mnist1d_mlpmixer: both blocks give the same loss and gradients: True" in out, out
    for variant in ("dense", "direct reads (as the library runs it)", "reads through parametrize"):
        assert variant in out


def test_every_alternative_computation_of_the_operators_parts_gives_its_bits() -> None:
    out = run("bench_nm_kernels.py", "--model", "mnist1d_cnn")
    rows = [
        line
        for line in out.splitlines()
        if line.startswith("| selection") or line.startswith("| widen")
    ]
    assert len(rows) == 7, out
    assert all(row.rstrip().endswith("| True |") for row in rows), out


@pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler"
)
def test_the_native_forward_benchmark_compares_the_same_bits() -> None:
    """docs/benchmarks-nm.md reads the native forward's step time as a speed-up of the
    same computation; that holds while the script finds the torch kernels' bits."""
    out = run("bench_nm_native.py", "--model", "mnist1d_mlpmixer", "--rounds", "2")
    assert "torch kernels' bits (output and thresholds): True" in out, out
    assert "| 2:4, swapped(), native forward |" in out
    assert "| 2:4, swapped(), torch kernels |" in out
