"""``feather-sparse bench`` sweeps: suites, missing data, failed runs, resuming, paired tables."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import feather_sparse.train
from _guards import guard
from feather_sparse import cli
from feather_sparse.bench import EXPERIMENTS, BenchOptions, run_experiment
from feather_sparse.bench.driver import plan_experiments
from feather_sparse.bench.runner import plan_runs
from feather_sparse.bench.suites import PAPER_REGIME, SUITES, Suite
from feather_sparse.cli.bench import options_from_args

pytest.importorskip("matplotlib")

# Tiny synthetic runs, on the CPU also where a GPU is present (the pages' numerics
# lines and the runs' bits are the CPU's in these tests).
SMALL: dict[str, Any] = {
    "dataset": "synthetic-mnist1d",
    "data_options": {"train_size": 256, "test_size": 128},
    "batch_size": 64,
    "device": "cpu",
}
SMALL_FLAGS = [
    "--set",
    "dataset=synthetic-mnist1d",
    "--set",
    "data_options={train_size = 256, test_size = 128}",
    "--batch-size",
    "64",
    "--device",
    "cpu",
]


def _args(*argv: str) -> Any:
    return cli.build_parser().parse_args(["bench", *argv])


def test_paper_regime_suite_sets_the_sweep_and_flags_override_it() -> None:
    opts = options_from_args(_args("compare", "--suite", "paper-regime"))
    assert opts.recipe == "mnist1d-regime" and opts.suite == "paper-regime"
    assert opts.seeds == (0, 1, 2, 3, 4)
    assert opts.sparsities == (0.9, 0.95, 0.98, 0.99, 0.995)
    assert opts.out == Path("docs/results/mnist1d-regime")
    assert (opts.jobs, opts.threads) == (2, 1)
    for name in ("operator", "theta", "p"):
        assert opts.for_experiment(name).sparsities == (0.99, 0.995)
    assert opts.for_experiment("compare").sparsities == opts.sparsities

    mine = options_from_args(
        _args("theta", "--suite", "paper-regime", "--seeds", "0,1", "--sparsities", "0.9")
    )
    assert mine.seeds == (0, 1) and mine.recipe == "mnist1d-regime"
    assert mine.for_experiment("theta").sparsities == (0.9,)  # explicit beats the suite's rule
    assert options_from_args(_args("p", "--suite", "paper-regime", "--jobs", "1")).jobs == 1
    # without a suite: the defaults as before
    plain = options_from_args(_args("compare"))
    assert (plain.recipe, plain.seeds, plain.out, plain.jobs, plain.suite) == (
        "mnist1d",
        (0, 1, 2),
        Path("results"),
        0,
        None,
    )
    assert PAPER_REGIME.experiments == ("compare", "operator", "theta", "p")


def test_paper_regime_sweep_size(tmp_path: Path) -> None:
    # Counted on the bundled recipe: the grid, not the recipe, decides the count.
    fields = {"recipe": "mnist1d", "runs_dir": tmp_path}
    opts = BenchOptions(**PAPER_REGIME.options_fields(fields))
    plan = plan_runs(opts, plan_experiments(PAPER_REGIME.experiments, opts))
    # compare 8 x 5 x 5 + 5 dense; operator 3 x 2 x 5; theta 5 x 2 x 5 minus θ = 1
    # (operator's Feather row) and θ = 0.5 (the automatic θ at 99 and 99.5 %:
    # compare's Feather-Global); p 5 x 2 x 5 minus p = 3 (compare's Feather-Global)
    assert plan.distinct == len(plan.todo) == 205 + 30 + 30 + 40


@guard(
    "`bench` with missing data",
    "CLI exit 1, one line naming the data set and `--data-dir`; no run started",
)
def test_missing_data_is_one_line_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["bench", "compare", "--quick", "--data", "cifar100", "--out", str(out)]
    code = cli.main([*argv, "--data-dir", str(tmp_path / "nowhere")])
    _, err = capsys.readouterr()
    assert code == 1
    assert len(err.strip().splitlines()) == 1
    assert "cifar100" in err and "--data-dir" in err and "Traceback" not in err
    assert not out.exists()  # no run started, no folder made


def _fail_some(monkeypatch: pytest.MonkeyPatch, should_fail: Any) -> None:
    real = feather_sparse.train.train

    def train(config: Any, *args: Any, **kwargs: Any) -> Any:
        if should_fail(config):
            raise RuntimeError("diverged")
        return real(config, *args, **kwargs)

    monkeypatch.setattr(feather_sparse.train, "train", train)


@pytest.mark.parametrize("name", EXPERIMENTS.names())
def test_every_page_is_written_when_every_run_failed(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fail_some(monkeypatch, lambda config: True)
    opts = BenchOptions(quick=True, overrides=SMALL, out=tmp_path, jobs=1)
    result = run_experiment(name, opts)
    assert result.failed == result.runs > 0
    assert re.search(r"- \*\*(1 run|\d+ runs) failed\*\*: ", result.page.read_text())
    for fig in result.figures:
        assert fig.is_file()


def test_pages_survive_cells_that_failed_and_the_cli_lists_each_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GMP fails only at 95 %: its curve lacks a column the others have.
    _fail_some(monkeypatch, lambda c: c.method == "gmp" and c.sparsity == 0.95)
    argv = ["bench", "backbones", "--quick", "--sparsities", "0.9,0.95", "--jobs", "1"]
    code = cli.main([*argv, *SMALL_FLAGS, "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 1
    assert "backbones: 8 runs (8 trained, 1 failed)" in out
    failed = [line for line in err.splitlines() if line.startswith("failed run gmp s=0.95")]
    assert len(failed) == 1 and "RuntimeError: diverged" in failed[0]
    assert "Traceback" not in err
    trace = Path(failed[0].rsplit("(traceback: ", 1)[1].rstrip(")"))
    assert "RuntimeError: diverged" in trace.read_text()
    (gmp,) = [r for r in (tmp_path / "backbones.md").read_text().splitlines() if "| GMP |" in r]
    assert gmp.endswith(" | — (1/1 failed) |")
    assert (tmp_path / "backbones-accuracy.png").is_file()


@guard(
    "Ctrl-C in the middle of a `bench` sweep",
    "the interrupt goes on; the session is logged in `OUT/sweep.jsonl` marked interrupted, "
    "with the runs it finished; the next command continues from them",
)
def test_a_stopped_sweep_continues_with_the_runs_it_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = BenchOptions(quick=True, overrides=SMALL, out=tmp_path, jobs=1)
    real = feather_sparse.train.train
    calls = []

    def stopped_after_two(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C during the third run
        return real(*args, **kwargs)

    monkeypatch.setattr(feather_sparse.train, "train", stopped_after_two)
    with pytest.raises(KeyboardInterrupt):
        run_experiment("theta", opts)
    monkeypatch.undo()
    again = run_experiment("theta", opts)
    assert (again.runs, again.trained, again.failed) == (5, 3, 0)
    sessions = [json.loads(line) for line in (tmp_path / "sweep.jsonl").read_text().splitlines()]
    # the stopped session wrote no page, but its time and its two finished runs are logged
    assert [s["trained"] for s in sessions] == [2, 3]
    assert sessions[0]["interrupted"] is True and sessions[0]["error"] == "KeyboardInterrupt"
    assert sessions[0]["experiments"] == ["theta"] and sessions[0]["seconds"] >= 0
    assert "interrupted" not in sessions[1]
    assert "5 runs trained in 2 sessions (1 interrupted)" in again.page.read_text()


def test_suite_pages_name_the_suite_its_rule_and_rank_against_the_auto_theta(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = Suite(
        name="tiny",
        summary="a test suite",
        rule="theta at 95 % only (test)",
        experiments=("theta",),
        fields={
            "recipe": "mnist1d",
            "seeds": (0, 1),
            "sparsities": (0.9, 0.95),
            "out": tmp_path,
            "jobs": 1,
        },
        per_experiment={"theta": {"sparsities": (0.95,)}},
    )
    monkeypatch.setitem(SUITES._items, "tiny", suite)
    monkeypatch.setitem(SUITES._display, "tiny", "tiny")
    argv = ["bench", "all", "--suite", "tiny", "--thetas", "0.5,1", "--set", "epochs=1"]
    assert cli.main([*argv, *SMALL_FLAGS]) == 0
    _, err = capsys.readouterr()
    assert "suite tiny: theta: 4 distinct runs, 0 stored, 4 to train" in err
    progress = [line for line in err.splitlines() if line.startswith("[")]
    assert len(progress) == 4 and progress[0].startswith("[1/4] theta θ = ")
    assert " s=0.95 seed " in progress[0]
    text = (tmp_path / "theta.md").read_text()
    assert "- command: `feather-sparse bench theta --suite tiny --set epochs=1" in text
    assert "- suite `tiny`: theta at 95 % only (test)" in text
    assert "| θ = 0.5 | reference |" in text  # the automatic rule's θ at 95 %
    interval = r"\| θ = 1 \| [+-]\d+\.\d\d \[[+-]\d+\.\d\d, [+-]\d+\.\d\d\] "
    assert re.search(interval + r"(n\.s\.|\*\*win\*\*|\*\*loss\*\*) \|", text)
    assert "| 95 % |" in text and "| 90 % |" not in text


def test_ctrl_c_says_how_to_continue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(feather_sparse.train, "train", interrupted)
    argv = ["bench", "stability", "--quick", "--thetas", "0.5", "--jobs", "1"]
    assert cli.main([*argv, *SMALL_FLAGS, "--out", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert "run the same command again to continue" in err and "Traceback" not in err


def test_plan_prints_the_runs_and_trains_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--plan``: the sweep's first line (runs, stored, to train) on standard output, the
    data checked, nothing trained or written."""

    def no_training(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("--plan trained a run")

    monkeypatch.setattr(feather_sparse.train, "train", no_training)
    out = tmp_path / "out"
    argv = ["bench", "operator", "--quick", "--plan", "--jobs", "1", "--out", str(out)]
    assert cli.main([*argv, *SMALL_FLAGS]) == 0
    printed = capsys.readouterr().out
    assert (
        printed.strip() == "operator: 3 distinct runs, 0 stored, 3 to train in 1 process × 1 thread"
    )
    assert not out.exists()
