"""The GPU runbook (``benchmarks/gpu_runbook.sh``) and the benchmarks' ``--device`` option.

No session has had a GPU yet, so the runbook's plumbing is checked here with a
stand-in Python that pretends a CUDA device is present and records what it
was asked to run: every part runs, each with its own exit status, one
failing part fails the whole without stopping the others, and one that
ignores SIGTERM at its limit is killed. The limits, added up, fit in the one
ten-minute command a lent GPU runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from _guards import guard
from _helpers import script_module

ROOT = Path(__file__).resolve().parents[1]
RUNBOOK = ROOT / "benchmarks" / "gpu_runbook.sh"
PARTS = ["gpu-tests.log", "nm-linear.md", "train-step.md", "selection.md", "nm-step.md"]


def run_runbook(out: Path, python: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(RUNBOOK)],
        env={**os.environ, "OUT": str(out), "PYTHON": python, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the message shown without CUDA")
def test_without_cuda_the_runbook_says_so_and_fails(tmp_path: Path) -> None:
    done = run_runbook(tmp_path, sys.executable)
    assert done.returncode == 1
    assert "sees no CUDA device" in done.stderr
    env = (tmp_path / "env.txt").read_text()
    assert f"torch {torch.__version__}, CUDA None" in env
    assert "packages the gpu tests need: all present" in env
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.txt"]


def stand_in_python(tmp_path: Path, fail: str = "") -> Path:
    """An executable that exits 0 (a CUDA device "present"), logs its arguments, and
    exits 3 when they contain ``fail``."""
    script = tmp_path / "python3"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> "{tmp_path}/calls"\n'
        f'if [ -n "{fail}" ] && [[ "$*" == *"{fail}"* ]]; then echo broken; exit 3; fi\n'
        "echo ok\n"
    )
    script.chmod(0o755)
    return script


def test_every_part_runs_with_its_own_status(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_runbook(out, str(stand_in_python(tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted([*PARTS, "env.txt", "summary.txt"])
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == PARTS
    assert all(": exit 0 in " in line for line in summary)
    calls = (tmp_path / "calls").read_text()
    assert "-m pytest -p no:cacheprovider -q -m gpu -ra" in calls  # failures listed at the end
    assert "tests/test_nm_devices.py" in calls  # the gpu-marked files are found, not listed
    for script in ("bench_train_step.py", "bench_selection.py", "bench_nm_step.py"):
        assert f"benchmarks/{script} --device cuda" in calls


def test_a_failing_part_fails_the_runbook_and_the_rest_still_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_runbook(out, str(stand_in_python(tmp_path, fail="bench_train_step")))
    assert done.returncode == 1
    summary = (out / "summary.txt").read_text()
    assert "train-step.md: exit 3 in" in summary
    assert "nm-step.md: exit 0 in" in summary  # the parts after it ran
    assert (out / "train-step.md").read_text().strip() == "broken"


@pytest.fixture(scope="module")
def timing() -> Iterator[ModuleType]:
    with script_module(ROOT / "benchmarks" / "_timing.py", "_timing_under_test") as module:
        yield module


def test_device_argument_errors_name_the_fix(timing: ModuleType) -> None:
    with pytest.raises(SystemExit, match=r"'tpu' is not a device; use cpu, cuda"):
        timing.resolve_device("tpu")
    with pytest.raises(SystemExit, match=r"only cpu and cuda are timed"):
        timing.resolve_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match=r"sees no CUDA device.*--device cpu"):
            timing.resolve_device("cuda")
    assert timing.resolve_device("cpu") == torch.device("cpu")


def test_compare_times_each_function_on_the_device(timing: ModuleType) -> None:
    calls = {"a": 0, "b": 0}

    def bump(name: str) -> None:
        calls[name] += 1

    times = timing.compare(
        {"a": lambda: bump("a"), "b": lambda: bump("b")},
        repeats=3,
        warmup=1,
        device=torch.device("cpu"),
    )
    assert set(times) == {"a", "b"} and all(t >= 0 for t in times.values())
    assert calls == {"a": 4, "b": 4}
    assert "threads" in timing.machine(torch.device("cpu"))


def test_paired_difference_pairs_rounds_and_its_interval_brackets_the_median(
    timing: ModuleType,
) -> None:
    slow = [1.0, 5.0, 2.0, 9.0, 3.0, 4.0, 8.0, 2.5]  # drifting rounds, a constant 0.5 apart
    mid, lo, hi = timing.paired_median_difference([t - 0.5 for t in slow], slow)
    assert mid == lo == hi == pytest.approx(-0.5)  # the drift cancels within a round
    mixed = [0.1, -0.3, 0.2, -0.1, 0.4, -0.2, 0.0, 0.3, -0.4, 0.1]
    mid, lo, hi = timing.paired_median_difference(mixed, [0.0] * len(mixed))
    assert lo < 0 < hi and lo <= mid <= hi  # no claim either way
    with pytest.raises(ValueError, match="equally long"):
        timing.paired_median_difference([1.0, 2.0], [1.0])


def test_selection_benchmark_runs_on_the_named_device(tmp_path: Path) -> None:
    script = ROOT / "benchmarks" / "bench_selection.py"
    done = subprocess.run(
        [sys.executable, str(script), "--sizes", "0.02", "--repeats", "1", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    row = done.stdout.strip().splitlines()[-1]
    assert row.startswith("| 0.02M |")
    ours, sort_k = row.rsplit("|", 2)[-2].split("/")
    assert ours.strip() == sort_k.strip()  # the selected threshold prunes exactly k


PARSE_ONLY = """
import argparse, runpy, sys

parse_args = argparse.ArgumentParser.parse_args


def parse_only(self, *args, **kwargs):
    parse_args(self, *args, **kwargs)  # exits 2, naming the flag, on a command line it refuses
    print("parsed:", " ".join(sys.argv))
    raise SystemExit(0)


argparse.ArgumentParser.parse_args = parse_only
sys.argv = sys.argv[1:]
sys.path.insert(0, sys.argv[0].rsplit("/", 1)[0])
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def checking_python(tmp_path: Path) -> Path:
    """A Python for the runbook that pretends a CUDA device is present, parses each
    benchmark's command line with the script's own parser (then stops: nothing is
    timed) and collects the gpu-marked tests without running them."""
    wrapper = tmp_path / "parse_only.py"
    wrapper.write_text(PARSE_ONLY)
    script = tmp_path / "python3"
    script.write_text(
        "#!/usr/bin/env bash\n"
        'case "$1" in\n'
        "  -c) exit 0 ;;\n"  # the runbook's CUDA check
        "  -) cat >/dev/null; exit 0 ;;\n"  # the environment report
        '  -m) [ "$2" = pytest ] || exit 0\n'  # wheels carried in .whl/: nothing to install
        f'      shift 2; exec "{sys.executable}" -m pytest --collect-only "$@" ;;\n'
        f'  *) exec "{sys.executable}" "{wrapper}" "$@" ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    return script


@guard(
    "the GPU runbook's command lines drift from the scripts (a renamed or removed flag, "
    "a gpu-marked test file that no longer imports)",
    "caught on the CPU: each benchmark's own parser reads the runbook's arguments and "
    "`pytest --collect-only` collects the gpu tests, before a GPU's time is spent",
)
def test_the_runbook_command_lines_parse_and_its_tests_collect(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_runbook(
        out, str(checking_python(tmp_path)), OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1"
    )
    assert done.returncode == 0, (
        done.stdout
        + done.stderr
        + "".join(f"\n--- {p.name}\n{p.read_text()}" for p in sorted(out.iterdir()))
    )
    for part in PARTS[1:]:
        assert (out / part).read_text().startswith("parsed: benchmarks/"), part
    collected = (out / "gpu-tests.log").read_text()
    assert "test_nm_devices.py::" in collected, collected
    # a module that fails to import: "ERROR collecting ...", "1 error" in the last line
    assert not re.search(r"^ERROR|\berrors?\b.* in [\d.]+s", collected, re.MULTILINE), collected


def test_every_limit_fits_in_one_ten_minute_command() -> None:
    """A lent GPU runs one command of at most 600 s (the machine's start is not counted
    in it): every limit in the runbook, each with the delay before its SIGKILL, must fit
    in it with time to spare for the shell and the transfers, as the header says."""
    text = RUNBOOK.read_text()
    limits = {
        line.split()[1]: int(line.split()[2])
        for line in text.splitlines()
        if line.startswith("part ")
    }
    assert list(limits) == PARTS
    kill_after = re.search(r"^KILL_AFTER=(\d+)", text, re.MULTILINE)
    assert kill_after is not None, "the runbook names no KILL_AFTER"
    # nvidia-smi, the environment report and the CUDA check have limits of their own
    setup = [int(n) for n in re.findall(r'timeout -k "\$KILL_AFTER" (\d+) ', text)]
    assert len(setup) == 3, setup
    total = sum(limits.values()) + sum(setup) + int(kill_after[1]) * (len(limits) + len(setup))
    assert total <= 570, (limits, setup)
    assert f"added up, is {total} s at most" in " ".join(text.split())
    # one hung gpu test fails alone, well before its part's limit
    per_test = re.search(r"-o timeout=(\d+)", text)
    assert per_test is not None and int(per_test[1]) <= limits["gpu-tests.log"] - 30


@guard(
    "a part of the GPU runbook that ignores SIGTERM at its time limit (a process stuck in a "
    "CUDA call, a child that traps the signal)",
    "killed KILL_AFTER (5) seconds later with SIGKILL, exit 137 in summary.txt; the parts "
    "after it still run inside the device call's ten minutes",
)
def test_a_part_that_ignores_sigterm_is_killed_and_the_rest_run(tmp_path: Path) -> None:
    tree = tmp_path / "repo"
    (tree / "benchmarks").mkdir(parents=True)
    quick = re.sub(r"^(part \S+) \d+ ", r"\1 2 ", RUNBOOK.read_text(), flags=re.MULTILINE)
    (tree / "benchmarks" / "gpu_runbook.sh").write_text(quick)  # every part's limit 2 s
    python = tmp_path / "python3"
    python.write_text(
        "#!/usr/bin/env bash\n"
        'case "$1" in -c|-) exit 0 ;; esac\n'  # the CUDA check, the environment report
        'if [[ "$*" == *bench_train_step* ]]; then trap "" TERM; sleep 60; fi\n'
        "echo ok\n"
    )
    python.chmod(0o755)
    out = tmp_path / "out"
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(tree / "benchmarks" / "gpu_runbook.sh")],
        env={**os.environ, "OUT": str(out), "PYTHON": str(python), "COMMIT": "0123abc"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert time.monotonic() - started < 30, "the part ran on past its limit"
    assert done.returncode == 1
    summary = (out / "summary.txt").read_text()
    assert "train-step.md: exit 137 in" in summary  # 128 + SIGKILL
    assert "nm-step.md: exit 0 in" in summary
    # a copy without .git (as a lent GPU gets it) names the commit it was given
    assert "commit: 0123abc" in (out / "env.txt").read_text()
