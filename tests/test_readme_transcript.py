"""The README's ``feather-sparse train`` transcript is what the command prints.

Slow (a full main-job run, about 40 s on one CPU thread): ``pytest -m slow``.
Times, dates and run-folder names are masked. On the floating-point
environment the README names (its "numerics" line, see
:mod:`feather_sparse.provenance`), every number the model produces (losses,
accuracies, sparsities, thresholds, file size) must match; on another CPU
kernel set the same seed trains another model, so there every line must
match with its numbers masked.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from feather_sparse.provenance import numerics

README = Path(__file__).resolve().parents[1] / "README.md"
_MASKS = [
    (re.compile(r"\d+(\.\d+)?s$"), "<time>"),  # per-epoch wall time
    (re.compile(r"runs/\S+?(?=[:/\s]|$)"), "<run>"),
    (re.compile(r"wall time:\s+.*"), "wall time: <time>"),
]


_NUMBER = re.compile(r"\d[\d,]*(\.\d+)?")


def _mask(line: str) -> str:
    for pattern, repl in _MASKS:
        line = pattern.sub(repl, line)
    return line.rstrip()


def _readme_numerics() -> str:
    found = re.search(r"on numerics\n?`([^`]+)`", README.read_text())
    assert found is not None, "the README names the numerics its transcript was made on"
    return found.group(1)


def _transcript() -> list[str]:
    text = README.read_text()
    block = text.split("```text\n$ feather-sparse train\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    stop = next((i for i, line in enumerate(lines) if line.startswith("real\t")), len(lines))
    return [_mask(line) for line in lines[:stop] if line.strip()]


@pytest.mark.slow
def test_readme_transcript_matches_the_main_job(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "feather_sparse", "train", "--run-dir", str(tmp_path / "r")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # interleaved as on a terminal (unbuffered below)
        text=True,
        check=True,
        cwd=tmp_path,
        env={
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "PATH": "/usr/bin:/bin",
            **_python_env(),
        },
    )
    printed = [
        _mask(line.replace(str(tmp_path / "r"), "runs/x"))
        for line in out.stdout.splitlines()
        if line.strip() and not line.startswith("generating MNIST-1D")
    ]
    shown = _transcript()
    if numerics("cpu") != _readme_numerics():  # another kernel set: the same lines, other bits
        printed = [_NUMBER.sub("<n>", line) for line in printed]
        shown = [_NUMBER.sub("<n>", line) for line in shown]
    elided = shown.index("...")
    assert printed[:elided] == shown[:elided]
    assert printed[-(len(shown) - elided - 1) :] == shown[elided + 1 :]


def _python_env() -> dict[str, str]:
    keep = ("HOME", "PATH", "PYTHONPATH", "VIRTUAL_ENV", "XDG_CACHE_HOME")
    return {k: os.environ[k] for k in keep if k in os.environ}
