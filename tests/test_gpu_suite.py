"""benchmarks/gpu_suite.sh, the whole suite on a lent GPU, checked on the CPU with a
stand-in Python: what it writes, what it runs again, its exit status and its limits."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_suite.sh"

#: pass 1 as pytest -v under xdist writes it: two failures (one with brackets, one
#: a module fixture's error), one failure listed again in the summary, a pass
PASS_1 = """\
[gw0] [ 10%] PASSED tests/test_a.py::test_fine
[gw1] [ 20%] FAILED tests/test_a.py::test_broken[2:4-rescale]
[gw2] [ 30%] ERROR tests/test_b.py::test_needs_the_fixture
=========================== short test summary info ============================
FAILED tests/test_a.py::test_broken[2:4-rescale]
ERROR tests/test_b.py::test_needs_the_fixture
1 failed, 1 passed, 1 error in 3.00s
"""


def stand_in_python(tmp_path: Path, pass_1: str, exit_1: int) -> Path:
    """An executable that logs each call's arguments, line by line; prints ``pass_1`` and
    exits ``exit_1`` for the parallel pass (``-n``), and prints "rerun" for any other."""
    (tmp_path / "pass1.txt").write_text(pass_1)
    script = tmp_path / "python3"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f'printf "%s\\n" "$@" > "{tmp_path}/call-$(date +%s%N)"\n'
        'if [[ " $* " == *" -n "* ]]; then\n'
        f'  cat "{tmp_path}/pass1.txt"; exit {exit_1}\n'
        "fi\n"
        "echo rerun; exit 1\n"
    )
    script.chmod(0o755)
    return script


def run_suite(
    tmp_path: Path, pass_1: str, exit_1: int
) -> tuple[subprocess.CompletedProcess[str], Path, list[list[str]]]:
    out = tmp_path / "out"
    python = stand_in_python(tmp_path, pass_1, exit_1)
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, "OUT": str(out), "PYTHON": str(python), "WORKERS": "3"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = [p.read_text().splitlines() for p in sorted(tmp_path.glob("call-*"))]
    return done, out, calls


def test_failures_are_listed_and_run_again_with_their_tracebacks(tmp_path: Path) -> None:
    done, out, calls = run_suite(tmp_path, PASS_1, exit_1=1)
    assert done.returncode == 1, done.stdout + done.stderr
    failed = [
        "tests/test_a.py::test_broken[2:4-rescale]",
        "tests/test_b.py::test_needs_the_fixture",
    ]
    assert (out / "failed.txt").read_text().splitlines() == failed
    assert (out / "suite.log").read_text() == PASS_1
    assert (out / "rerun.log").read_text() == "rerun\n"
    assert len(calls) == 2
    first, second = calls
    assert first[:2] == ["-m", "pytest"] and first[first.index("-n") + 1] == "3"
    assert "-v" in first and "-rfE" in first  # each result as it comes, and a summary
    assert second[-2:] == failed and "--tb=short" in second and "-n" not in second
    assert "2 failed" in done.stdout and "pass 2" in done.stdout


def test_a_whole_pass_runs_nothing_again(tmp_path: Path) -> None:
    done, out, calls = run_suite(tmp_path, "[gw0] [100%] PASSED tests/test_a.py::test_fine\n", 0)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "failed.txt").read_text() == ""
    assert not (out / "rerun.log").exists() and len(calls) == 1


def test_a_pass_cut_off_by_its_limit_still_lists_what_failed(tmp_path: Path) -> None:
    cut = "[gw1] [ 20%] FAILED tests/test_a.py::test_broken\n[gw0] [ 30%] PASSED tests/x.py::t\n"
    done, out, _ = run_suite(tmp_path, cut, exit_1=124)
    assert done.returncode == 124
    assert (out / "failed.txt").read_text() == "tests/test_a.py::test_broken\n"
    assert "cut off by its 420 s limit" in done.stdout


def test_every_limit_fits_in_one_ten_minute_command() -> None:
    """A lent GPU runs one command of at most 600 s: both passes' limits, each with the
    delay before its SIGKILL, fit in it, as the header says."""
    text = SCRIPT.read_text()
    limits = [int(n) for n in re.findall(r'timeout -k "\$KILL_AFTER" (\d+) ', text)]
    kill_after = re.search(r"^KILL_AFTER=(\d+)", text, re.MULTILINE)
    assert len(limits) == 2 and kill_after is not None
    total = sum(limits) + int(kill_after[1]) * len(limits)
    assert total <= 600
    assert f"added up, is {total} s at most" in " ".join(text.split())
    assert f"cut off by its {limits[0]} s limit" in text
