"""Fault injection on ``.fsp`` files: every damaged file is refused, no good file overwritten.

Runs the functions of ``benchmarks/bench_faults_export.py`` (which prints the
figures for the docs) on few cases here and on many under ``-m slow``.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from _guards import guard
from _helpers import needs_safetensors, script_module
from feather_sparse import cli

ROOT = Path(__file__).resolve().parents[1]

pytestmark = needs_safetensors


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    with script_module(ROOT / "benchmarks" / "bench_faults_export.py", "bench_faults_export") as m:
        yield m


@pytest.fixture
def source(bench: ModuleType, tmp_path: Path, one_thread: None) -> Path:
    return bench.make_source(tmp_path)


def assert_all_detected(row: object) -> None:
    assert row.detected == row.cases, row  # type: ignore[attr-defined]
    assert row.overwritten == 0, row  # type: ignore[attr-defined]


@guard("a `.fsp` with a flipped bit", "`ValueError` naming the file; `model.fsp` never overwritten")
def test_single_bit_flips_are_detected(bench: ModuleType, source: Path) -> None:
    assert_all_detected(bench.bit_flips(source, 20, random.Random(0)))


def test_single_bit_flips_in_the_headers_are_detected(bench: ModuleType, source: Path) -> None:
    assert_all_detected(bench.bit_flips(source, 20, random.Random(1), headers_only=True))


@guard("a `.fsp` cut short", "`ValueError` naming the file; `model.fsp` never overwritten")
def test_truncations_are_detected(bench: ModuleType, source: Path) -> None:
    assert_all_detected(bench.truncations(source, 20, random.Random(2)))


def test_the_checks_can_fail(bench: ModuleType, source: Path, tmp_path: Path) -> None:
    """An undamaged copy counts as not detected, and an export over the good file as an
    overwrite: the measures above are not true by construction."""
    good = tmp_path / "model.fsp"
    shutil.copyfile(source, good)
    copy = tmp_path / "copy.fsp"  # a good file, but not the same bytes as model.fsp
    bench.save_sparse(bench.load_sparse(source), copy, values="fp16")
    assert bench.check_damaged(copy, good) == (False, True)


@guard(
    "SIGKILL during `export`",
    "the old `model.fsp` stays whole; the next export removes the temporaries",
)
def test_sigkill_during_export_keeps_model_fsp_whole(bench: ModuleType, source: Path) -> None:
    row = bench.sigkill_during_export(source, 1, random.Random(3))
    assert row.detected == 1 and row.overwritten == 0
    assert row.temp_left.endswith("0 after the next export")


@guard(
    "`export RUN -o RUN/model.fsp` from a cut `last.pt`", "CLI exit 1, one line; `model.fsp` kept"
)
def test_damaged_training_checkpoint_does_not_replace_model_fsp(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copyfile(source, run / "model.fsp")
    good = (run / "model.fsp").read_bytes()
    torch.save({"format": "feather-sparse-checkpoint", "model": {}}, run / "checkpoints/last.pt")
    data = (run / "checkpoints/last.pt").read_bytes()
    for cut in (len(data) // 2, 10):
        (run / "checkpoints/last.pt").write_bytes(data[:cut])
        assert cli.main(["export", str(run), "-o", str(run / "model.fsp")]) == 1
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
        assert (run / "model.fsp").read_bytes() == good
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "model.fsp"]


@pytest.mark.slow
def test_many_faults(bench: ModuleType, source: Path) -> None:
    rng = random.Random(10)
    for row in (
        bench.bit_flips(source, 300, rng),
        bench.bit_flips(source, 300, rng, headers_only=True),
        bench.truncations(source, 300, rng),
    ):
        assert_all_detected(row)
    row = bench.sigkill_during_export(source, 10, rng)
    assert row.detected == 10 and row.overwritten == 0
    assert row.temp_left.endswith("0 after the next export")


@pytest.mark.slow
@pytest.mark.parametrize("pattern", [None, "2:4"], ids=["unstructured", "nm"])
def test_every_flip_and_truncation_of_a_small_file(
    bench: ModuleType, tmp_path: Path, pattern: str | None
) -> None:
    for row in bench.every_fault(bench.make_small_source(tmp_path, pattern)):
        assert row.detected == row.cases, row
