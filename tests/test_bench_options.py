"""``feather-sparse bench`` options: each is honoured or refused, never accepted and then
ignored; an interrupted session is logged; ``bench all`` pages say which runs it trained."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import feather_sparse.bench.runner
import feather_sparse.cli.bench
import feather_sparse.train
from _guards import guard
from feather_sparse import cli
from feather_sparse.bench import EXPERIMENTS, BenchOptions, RunSpec, run_experiment
from feather_sparse.bench.driver import plan_experiments
from feather_sparse.bench.pages import _rebuild_command
from feather_sparse.bench.suites import SUITES, Suite
from feather_sparse.cli.bench import options_from_args
from test_bench_audit import _count_trainings
from test_bench_sweeps import SMALL, SMALL_FLAGS

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.usefixtures("one_thread")


def _opts(*argv: str) -> BenchOptions:
    return options_from_args(cli.build_parser().parse_args(["bench", *argv]))


def _plan(name: str, *argv: str) -> set[tuple[str, float, int, str]]:
    opts = _opts(name, *argv)
    specs: list[RunSpec] = plan_experiments([name], opts)
    return {(s.group, s.x, s.seed, json.dumps(dict(s.settings), sort_keys=True)) for s in specs}


# ------------------------------------------------------------- the grid options
#: Each grid flag with a value and a larger one (the methods are each experiment's own).
_VALUES = {
    "--sparsities": ("0.5", "0.5,0.6"),
    "--thetas": ("0.3", "0.3,0.4"),
    "--ps": ("1.5", "1.5,2.5"),
    "--ablation-pattern": ("4:8", "1:4"),
    "--methods": ("GMP", "GMP,ST-3"),
}
_NM_METHODS = ("sr-ste", "sr-ste,s-ste")


@pytest.mark.parametrize("flag", list(_VALUES))
@pytest.mark.parametrize("name", EXPERIMENTS.names())
def test_every_grid_flag_changes_the_plan_or_is_refused(name: str, flag: str) -> None:
    # Registry-wide: a flag an experiment takes plans other runs with each value;
    # one it does not take is refused, naming the flag and the experiment.
    small, large = _NM_METHODS if (name, flag) == ("nm", "--methods") else _VALUES[flag]
    try:
        one = _plan(name, flag, small)
    except ValueError as err:
        assert flag in str(err) and name in str(err) and "ignore" in str(err)
        with pytest.raises(ValueError, match="ignore"):
            _plan(name, flag, large)
        return
    assert one != _plan(name), f"{flag} {small} changes nothing in bench {name}"
    assert _plan(name, flag, large) != one, f"bench {name} ignores part of {flag} {large}"


@guard(
    "`bench` with a grid flag the experiment has no use for (`nm --sparsities`, "
    "`operator --thetas`, `compare --ps`, ...)",
    "CLI exit 1, one line naming the flag, the experiment and the experiments that take it; "
    "no run started",
)
@pytest.mark.parametrize(
    ("name", "argv", "takers"),
    [
        ("nm", ("--sparsities", "0.9"), "compare"),
        ("operator", ("--thetas", "0.5"), "theta-operator"),
        ("p", ("--thetas", "0.5"), "stability"),
        ("compare", ("--ps", "2"), "nm, p"),
        ("flops", ("--methods", "GMP"), "compare, nm"),
        ("theta", ("--ablation-pattern", "4:8"), "nm"),
    ],
)
def test_a_grid_flag_the_experiment_would_ignore_is_refused(
    name: str,
    argv: tuple[str, ...],
    takers: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls = _count_trainings(monkeypatch)
    out = tmp_path / "out"
    code = cli.main(["bench", name, "--quick", *argv, "--jobs", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and calls == [] and not out.exists()
    assert len(err.strip().splitlines()) == 1
    assert f"{argv[0]}: experiment {name} has no " in err and "would ignore" in err
    assert takers in err
    if name == "nm":  # why: its patterns set the sparsity
        assert "N:M patterns 2:4, 4:8, 1:4 set the sparsity" in err


def test_stability_runs_every_sparsity_given(tmp_path: Path) -> None:
    opts = BenchOptions(
        quick=True,
        overrides={**SMALL, "epochs": 1},
        out=tmp_path,
        jobs=1,
        sparsities=(0.9, 0.95),
        thetas=(0.5, 1.0),
    )
    result = run_experiment("stability", opts)
    assert (result.runs, result.failed) == (4, 0)
    text = result.page.read_text()
    assert "### Sparsity 90 %" in text and "### Sparsity 95 %" in text
    for section in text.split("### Sparsity ")[1:]:
        assert "| θ = 0.5 |" in section and "| θ = 1 |" in section
    assert "at each sparsity below" in text
    assert "--sparsities 0.9,0.95" in text  # the page's command
    assert all(f.is_file() for f in result.figures)
    # one sparsity: the page as before
    single = run_experiment("stability", replace(opts, sparsities=(0.9,)))
    assert "### Sparsity" not in single.page.read_text()
    assert "global backbone, sparsity 90 %," in single.page.read_text()


def test_the_suites_stability_page_stays_at_its_sparsity() -> None:
    # paper-regime's stability page was made at 90 %: the same command plans the same runs
    opts = _opts("stability", "--suite", "paper-regime").for_experiment("stability")
    assert opts.sparsities == (0.9,)
    assert {s.x for s in plan_experiments(["stability"], opts)} == {0.9}
    mine = _opts("stability", "--suite", "paper-regime", "--sparsities", "0.98,0.99")
    assert mine.for_experiment("stability").sparsities == (0.98, 0.99)


# --------------------------------------------------------------- other flags
@guard(
    "`bench --quick --suite NAME` (a smoke run of a fixed sweep, into the suite's results)",
    "CLI exit 1 naming both flags and the suite's folder; no run started, no page replaced",
)
def test_quick_with_a_suite_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _count_trainings(monkeypatch)
    out = tmp_path / "out"
    argv = ["bench", "compare", "--quick", "--suite", "paper-regime", "--methods", "GMP"]
    code = cli.main([*argv, "--jobs", "1", "--out", str(out), *SMALL_FLAGS])
    err = capsys.readouterr().err
    assert code == 1 and calls == [] and not out.exists()
    assert "--quick with --suite paper-regime" in err
    assert "docs/results/mnist1d-regime" in err and "--quick --recipe mnist1d-regime" in err


@guard(
    "`bench --quick --seeds 0,1,2` (a smoke run runs one seed)",
    "CLI exit 1: give one seed or drop `--quick`",
)
def test_quick_with_several_seeds_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _count_trainings(monkeypatch)
    argv = ["bench", "theta", "--quick", "--seeds", "3,4", "--out", str(tmp_path)]
    assert cli.main([*argv, *SMALL_FLAGS]) == 1
    assert calls == []
    assert "--quick runs one seed, and --seeds gives 2 (3,4)" in capsys.readouterr().err
    assert _opts("theta", "--quick", "--seeds", "3").run_seeds == (3,)


@guard(
    "`bench claims` with a flag that trains (`--quick`, `--seeds`, `--recipe`, `--force`, ...)",
    "CLI exit 1 naming the flags: claims reads `--out`, `--runs-dir` and `--suite` only",
)
def test_claims_refuses_the_flags_it_would_ignore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "claims", "--out", str(tmp_path), "--seeds", "0,1", "--force"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "--seeds, --force: `bench claims` reads the stored results" in err
    assert not (tmp_path / "claims.md").exists()
    assert cli.main(["bench", "claims", "--out", str(tmp_path)]) == 0


@guard(
    "`bench --sparsities ,` or `--methods ,` (an empty list)",
    "CLI exit 1 or 2: give at least one value (an empty list is not read as the default grid)",
)
def test_empty_lists_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _count_trainings(monkeypatch)
    small = ["--quick", "--out", str(tmp_path), *SMALL_FLAGS]
    with pytest.raises(SystemExit):
        cli.main(["bench", "theta", "--thetas", ",", *small])
    assert "expected at least one number" in capsys.readouterr().err
    assert cli.main(["bench", "compare", "--methods", " , ", *small]) == 1
    assert calls == []
    assert "--methods: give at least one method" in capsys.readouterr().err


# ------------------------------------------------------------------ bench all
def test_bench_all_gives_each_experiment_the_flags_it_takes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ("all", "--sparsities", "0.9", "--thetas", "0.5", "--methods", "GMP,sr-ste")
    opts = _opts(*argv)
    assert opts.for_experiment("compare").methods == ("GMP",)
    assert opts.for_experiment("nm").methods == ("sr-ste",)
    assert opts.for_experiment("nm").sparsities is None
    assert opts.for_experiment("p").thetas is None and opts.for_experiment("p").methods is None
    assert opts.for_experiment("stability").thetas == (0.5,)
    # each page's command is one the CLI takes, and plans that page's runs
    for name in EXPERIMENTS.names():
        mine = opts.for_experiment(name)
        command = shlex.split(_rebuild_command(name, mine))[2:]
        again = _opts(*command).for_experiment(name)
        assert plan_experiments([name], again) == plan_experiments([name], mine), name
    # the command says where a flag does not apply
    monkeypatch.setattr(feather_sparse.cli.bench, "_run", lambda names, opts: 0)
    assert cli.main(["bench", *argv]) == 0
    err = capsys.readouterr().err
    assert "note: --sparsities applies to" in err and "(nm: no sparsity columns)" in err
    assert "note: --methods applies to compare, nm only" in err


@guard(
    "`bench all --methods` naming only one experiment's methods (compare's, not nm's)",
    "CLI exit 1: name some of each experiment's methods, or run them one at a time",
)
def test_bench_all_with_the_methods_of_one_experiment_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--out", str(tmp_path)]
    assert cli.main(["bench", "all", "--methods", "GMP", *where]) == 1
    err = capsys.readouterr().err
    assert "--methods GMP names none of nm's methods" in err and "feather-nm" in err
    assert cli.main(["bench", "all", "--methods", "GMP,nope,feather-nm", *where]) == 1
    assert "--methods nope: not a method of compare (" in capsys.readouterr().err
    # a suite without nm: compare's methods are enough
    assert _opts("all", "--suite", "paper-regime", "--methods", "GMP").for_experiment(
        "compare"
    ).methods == ("GMP",)


# --------------------------------------------------------- the sweep's log
@guard(
    "a `bench all` session stopped by an exception (a full disk while storing a result)",
    "the error goes on (CLI exit 1, one line); the session is logged in `OUT/sweep.jsonl` "
    "marked interrupted, with the runs it finished",
)
def test_a_session_stopped_by_an_error_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _count_trainings(monkeypatch)
    real = feather_sparse.bench.runner.write_sealed_json
    stored: list[int] = []

    def disk_full_at_the_second(*args: Any, **kwargs: Any) -> None:
        stored.append(1)
        if len(stored) == 2:
            raise OSError(28, "No space left on device")
        real(*args, **kwargs)

    monkeypatch.setattr(feather_sparse.bench.runner, "write_sealed_json", disk_full_at_the_second)
    argv = ["bench", "all", "--quick", "--jobs", "1", "--out", str(tmp_path), *SMALL_FLAGS]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err.splitlines()[-1]
    assert len(calls) == 2  # the second run's result could not be stored
    (session,) = [json.loads(line) for line in (tmp_path / "sweep.jsonl").read_text().splitlines()]
    assert session["interrupted"] is True and session["trained"] == 1
    assert session["error"] == "OSError: [Errno 28] No space left on device"
    assert session["experiments"] == EXPERIMENTS.names()


# ------------------------------------------------------ bench all page footers
def test_bench_all_footer_says_which_runs_it_trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = Suite(
        name="pair",
        summary="a test suite",
        rule="two experiments (test)",
        experiments=("operator", "theta"),
        fields={"recipe": "mnist1d", "seeds": (0,), "sparsities": (0.95,), "out": tmp_path},
    )
    monkeypatch.setitem(SUITES._items, "pair", suite)
    monkeypatch.setitem(SUITES._display, "pair", "pair")
    flags = ["--suite", "pair", "--jobs", "1", "--set", "epochs=1", *SMALL_FLAGS]
    assert cli.main(["bench", "operator", *flags]) == 0  # operator's 3 runs, first
    argv = ["bench", "all", *flags, "--thetas", "0.5"]
    assert cli.main(argv) == 0  # the pool trains theta's one run only
    out = capsys.readouterr().out
    assert "all: 1 run trained in one pool" in out
    assert "operator: 3 runs (0 trained, 0 failed)" in out
    assert "theta: 1 run (1 trained, 0 failed)" in out
    operator = (tmp_path / "operator.md").read_text()
    assert "- runs: 3 (0 trained by this command, 3 reused from earlier results)" in operator
    assert "in one pool" not in operator
    theta = (tmp_path / "theta.md").read_text()
    assert "- runs: 1 (1 trained by this command, 0 reused from earlier results); 1 of them " in (
        theta
    )
    assert "in one pool (`bench all`: 1 run trained in " in theta
    # again: nothing to train
    assert cli.main(argv) == 0
    assert "all: nothing to train, every run was stored already" in capsys.readouterr().out
    theta = (tmp_path / "theta.md").read_text()
    assert "- runs: 1 (0 trained by this command, 1 reused from earlier results)" in theta
    assert "in one pool" not in theta


def test_a_stopped_pool_of_processes_is_logged(tmp_path: Path) -> None:
    # Ctrl-C while two worker processes train: the session is logged, the interrupt goes on
    opts = BenchOptions(
        quick=True, overrides={**SMALL, "epochs": 1}, out=tmp_path, jobs=2, sparsities=(0.9,)
    )

    def stop(done: int, total: int, spec: RunSpec, outcome: Any) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment("operator", opts, stop)
    (session,) = [json.loads(line) for line in (tmp_path / "sweep.jsonl").read_text().splitlines()]
    assert session["interrupted"] is True and session["error"] == "KeyboardInterrupt"
    assert (session["experiments"], session["trained"]) == (["operator"], 1)
