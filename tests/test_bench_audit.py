"""``feather-sparse bench`` audit fixes: the page's command, one attempt per run and
command, checks before any run, duplicate seeds, undefined metrics, canonical θ."""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch

import feather_sparse.train
from feather_sparse import cli
from feather_sparse.bench import BenchOptions, RunOutcome, RunSpec
from feather_sparse.bench.driver import plan_experiments
from feather_sparse.bench.pages import Grid, _rebuild_command
from feather_sparse.bench.runner import plan_runs
from feather_sparse.cli.bench import options_from_args
from test_bench_sweeps import SMALL_FLAGS

pytest.importorskip("matplotlib")


def _opts(*argv: str) -> BenchOptions:
    return options_from_args(cli.build_parser().parse_args(["bench", *argv]))


def _keys(name: str, opts: BenchOptions) -> tuple[str, ...]:
    return plan_runs(opts, plan_experiments([name], opts)).keys


def _count_trainings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make every run fail at once; the list grows by one per training attempt."""
    calls: list[int] = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise RuntimeError("boom")

    monkeypatch.setattr(feather_sparse.train, "train", failing)
    return calls


# ------------------------------------------------------------------ the command
@pytest.mark.parametrize(
    "extra",
    [
        ("--quick", "--threads", "2", "--runs-dir", "elsewhere/runs"),
        ("--suite", "paper-regime", "--threads", "2", "--runs-dir", "elsewhere/runs"),
    ],
)
def test_page_command_plans_the_same_runs(extra: tuple[str, ...], tmp_path: Path) -> None:
    argv = ("compare", "--methods", "GMP", "--out", str(tmp_path), *extra)
    opts = _opts(*argv)
    command = _rebuild_command("compare", opts)
    assert "--threads 2" in command and "--runs-dir elsewhere/runs" in command
    again = _opts(*shlex.split(command)[2:])
    assert again.runs_path == opts.runs_path
    assert _keys("compare", again) == _keys("compare", opts)


def test_page_command_leaves_out_the_default_runs_folder(tmp_path: Path) -> None:
    opts = _opts("compare", "--quick", "--out", str(tmp_path), "--runs-dir", str(tmp_path / "runs"))
    assert "--runs-dir" not in _rebuild_command("compare", opts)
    assert "--threads" not in _rebuild_command("compare", opts)


# ------------------------------------------------------- one attempt per command
def test_bench_all_trains_a_failed_run_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _count_trainings(monkeypatch)
    argv = ["bench", "all", "--quick", "--jobs", "1", "--out", str(tmp_path)]
    assert cli.main([*argv, *SMALL_FLAGS]) == 1
    err = capsys.readouterr().err
    distinct = int(err.split(" distinct runs")[0].rsplit(" ", 1)[-1])
    assert len(calls) == distinct  # every run tried once, not once per experiment
    assert sum(1 for line in err.splitlines() if ": FAILED: " in line) == distinct
    # a later command retries them
    assert cli.main([*argv, *SMALL_FLAGS]) == 1
    assert len(calls) == 2 * distinct


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_that_is_not_here_is_one_error_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _count_trainings(monkeypatch)
    argv = ["bench", "all", "--quick", "--out", str(tmp_path)]
    assert cli.main([*argv, *SMALL_FLAGS, "--device", "cuda"]) == 1  # the last --device counts
    err = capsys.readouterr().err
    assert calls == []
    assert "no run started" in err and "CUDA is not available" in err
    assert len(err.strip().splitlines()) == 1


# ------------------------------------------------------------ data versus model
def test_model_that_does_not_take_the_data_is_one_error_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _count_trainings(monkeypatch)
    argv = ["bench", "compare", "--quick", "--methods", "GMP", "--model", "resnet20"]
    assert cli.main([*argv, "--jobs", "1", "--out", str(tmp_path), *SMALL_FLAGS]) == 1
    err = capsys.readouterr().err
    assert calls == []
    assert len(err.strip().splitlines()) == 1
    assert "no run started" in err and "'resnet20'" in err
    assert "does not take data set 'synthetic-mnist1d'" in err
    assert "--model" in err


# ---------------------------------------------------------------------- seeds
def test_duplicate_seeds_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="seeds: 0 given more than once"):
        BenchOptions(seeds=(0, 0, 0))
    with pytest.raises(ValueError, match="seeds: 1 given more than once"):
        _opts("compare", "--seeds", "0,1,1")
    assert cli.main(["bench", "compare", "--seeds", "0,0,0"]) == 1
    assert "given more than once" in capsys.readouterr().err


# ------------------------------------------------------------ undefined metric
def test_finished_run_without_a_metric_is_not_measured_not_failed() -> None:
    def pair(group: str, seed: int, value: float, ok: bool = True) -> tuple[RunSpec, RunOutcome]:
        spec = RunSpec(group=group, x=0.5, seed=seed, settings={})
        outcome = RunOutcome(key=f"{group}{seed}", config={}, ok=ok, test_accuracy=value)
        return spec, outcome

    pairs = [
        pair("a", 0, math.nan),
        pair("b", 0, math.nan),
        pair("b", 1, 0.5),
        pair("c", 0, math.nan, ok=False),
    ]
    table = Grid(pairs, lambda o: o.test_accuracy).table("method", str)
    rows = {line.split(" | ")[0]: line for line in table.splitlines()[2:]}
    assert rows["| a"] == "| a | — (n/a) |"
    assert "failed" not in rows["| a"] and "failed" not in rows["| b"]
    assert rows["| b"] == "| b | **0.50** (1/2 n/a) |"
    assert rows["| c"] == "| c | — (1/1 failed) |"


# ---------------------------------------------------------------------- theta
def test_explicit_theta_equal_to_the_automatic_one_is_the_same_run(tmp_path: Path) -> None:
    opts = _opts("compare", "--quick", "--methods", "Feather-Global", "--out", str(tmp_path))
    compare = set(_keys("compare", opts))
    same = _opts("theta", "--quick", "--thetas", "0.5", "--out", str(tmp_path))
    other = _opts("theta", "--quick", "--thetas", "1", "--out", str(tmp_path))
    assert opts.sparsity_grid(()) == (0.95,)  # the automatic θ is 0.5 there
    assert set(_keys("theta", same)) <= compare
    assert not set(_keys("theta", other)) & compare


# ------------------------------------------------------------------- folders
def test_folders_given_as_strings_are_paths(tmp_path: Path) -> None:
    """A notebook's ``BenchOptions(out="results")``: the same folders as with Paths, and a
    file in the way still refused by name (it failed with AttributeError: 'str' object has
    no attribute 'parents')."""
    opts = BenchOptions(out=str(tmp_path / "out"), runs_dir=str(tmp_path / "runs"))  # type: ignore[arg-type]
    assert opts.out == tmp_path / "out" and opts.runs_dir == tmp_path / "runs"
    assert opts == BenchOptions(out=tmp_path / "out", runs_dir=tmp_path / "runs")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"--out .* is an existing file, not a folder"):
        BenchOptions(out=str(tmp_path / "file"))  # type: ignore[arg-type]
