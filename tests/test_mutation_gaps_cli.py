"""Tests that close the gaps a mutation audit of the benchmark runner and the CLI found.

Each test here fails on one or more hand-made mutants of ``bench/options.py``,
``bench/suites.py``, ``bench/driver.py``, ``bench/runner.py`` or ``cli/``
that the rest of the suite let through (``docs/mutation-audit.md``, "The
benchmark runner and the command line"; the mutants' ids are in each test's
docstring). Each asserts the documented contract (the docstrings of
:class:`BenchOptions`, :func:`plan_runs`, :func:`execute_runs`, ``--help``),
worked out here, never the code's current output. None of them trains.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

import feather_sparse.bench.options as options_module
import feather_sparse.bench.runner as runner
from _guards import guard
from feather_sparse import cli
from feather_sparse.bench import BenchOptions, RunOutcome, RunSpec
from feather_sparse.bench.driver import plan_experiments
from feather_sparse.bench.suites import PAPER_REGIME
from feather_sparse.cli.bench import options_from_args
from feather_sparse.integrity import write_sealed_json

#: A spec of a plain Feather run (the settings an experiment sets for a cell).
_SPEC = RunSpec("Feather", 0.9, 0, {"method": "feather", "sparsity": 0.9})


def _opts(*argv: str) -> BenchOptions:
    return options_from_args(cli.build_parser().parse_args(["bench", *argv]))


# ------------------------------------------------------------ BenchOptions
@guard(
    "bench options with a negative or repeated seed, a sparsity of 1, or p < 1",
    "`ValueError` naming the option and its bounds, before any run",
)
@pytest.mark.parametrize(
    ("field", "value", "word"),
    [
        ("seeds", (0, -1), "seeds"),  # cl01: a seed is >= 0
        ("seeds", (1, 2, 1), "seeds"),  # cl02: a seed is one run, given once
        ("sparsities", (0.9, 1.0), "sparsities"),  # cl03: in (0, 1)
        ("ps", (0.5,), "ps"),  # cl04: p >= 1
    ],
)
def test_bad_grid_values_are_refused(field: str, value: Any, word: str) -> None:
    """cl01, cl02, cl03, cl04: each bound of the BenchOptions docstring, at its edge."""
    with pytest.raises(ValueError, match=word):
        BenchOptions(**{field: value})


def test_quick_runs_the_first_seed_only() -> None:
    """cl05: ``run_seeds`` is "the first one only with quick"."""
    assert BenchOptions(seeds=(4, 1, 2), quick=True).run_seeds == (4,)
    assert BenchOptions(seeds=(4, 1, 2)).run_seeds == (4, 1, 2)


def test_the_users_overrides_win_over_quick() -> None:
    """cl06: "bench settings < --quick < the user's"."""
    opts = BenchOptions(quick=True, overrides={"epochs": 5})
    assert opts.base_overrides()["epochs"] == 5
    assert opts.base_config().epochs == 5


def test_workers_are_the_cores_over_the_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """cl07, cl08: ``jobs`` if given, else the usable cores // each run's threads."""
    monkeypatch.setattr(options_module, "usable_cpus", lambda: 8)
    cpu = {"device": "cpu"}
    assert BenchOptions(threads=2, overrides=cpu).worker_count() == 8 // 2
    assert BenchOptions(threads=3, overrides=cpu).worker_count() == 8 // 3
    assert BenchOptions(threads=16, overrides=cpu).worker_count() == 1
    assert BenchOptions(jobs=3, threads=2, overrides=cpu).worker_count() == 3
    assert BenchOptions(jobs=5, overrides=cpu).worker_count() == 5


# ---------------------------------------------------------- suites, driver
def test_an_explicit_sparsity_replaces_the_suites_per_experiment_ones() -> None:
    """cl09: "an explicit sparsities applies to every experiment"."""
    fields = PAPER_REGIME.options_fields({"sparsities": (0.5,)})
    assert fields["sparsities"] == (0.5,)
    for name, changes in fields["per_experiment"].items():
        assert "sparsities" not in changes, name
    opts = BenchOptions(**fields)
    for name in ("compare", "operator", "theta", "p"):
        xs = {s.x for s in plan_experiments([name], opts) if s.group != "dense"}
        assert xs == {0.5}, name


def test_each_experiment_is_planned_with_its_own_options() -> None:
    """cl10: ``plan_experiments`` plans each experiment "with its own options"."""
    opts = BenchOptions(
        sparsities=(0.9,), seeds=(0,), per_experiment={"compare": {"sparsities": (0.5,)}}
    )
    compare = {s.x for s in plan_experiments(["compare"], opts) if s.group != "dense"}
    assert compare == {0.5}
    theta = {s.x for s in plan_experiments(["theta"], opts) if s.group != "dense"}
    assert 0.5 not in theta


# ------------------------------------------------------------- runner.py
def test_each_runs_config_has_its_seed_and_its_cells_settings() -> None:
    """cl14, cl15: "recipe < bench/quick settings < user overrides < cell", the seed the spec's."""
    opts = BenchOptions(quick=True, overrides={"batch_size": 32})
    spec = RunSpec("Feather", 0.9, 7, {"method": "feather", "sparsity": 0.9, "epochs": 4})
    cfg = runner._config_dict(opts, spec)
    assert cfg["seed"] == 7
    assert cfg["epochs"] == 4  # the cell's, over --quick's 2
    assert cfg["batch_size"] == 32
    assert cfg["eval_every"] == 0  # the bench setting, under nothing else


def test_an_override_of_a_field_the_experiment_varies_is_refused() -> None:
    """cl13: "Fields an experiment varies (its method, sparsity, θ, ...) may not be overridden"."""
    with pytest.raises(ValueError, match="sparsity: set by the experiment"):
        runner._config_dict(BenchOptions(overrides={"sparsity": 0.5}), _SPEC)


def test_the_run_key_does_not_depend_on_the_order_of_the_config() -> None:
    """cl16: the key is a hash of the config: the same config in another order, the same key."""
    config = runner._config_dict(BenchOptions(), _SPEC)
    reordered = dict(reversed(list(config.items())))
    assert list(reordered) != list(config)
    assert runner.run_key(reordered) == runner.run_key(config)


def _store(opts: BenchOptions, ok: bool) -> str:
    """Store a result for ``_SPEC`` under its key; return the key."""
    config = runner._config_dict(opts, _SPEC)
    key = runner.run_key(config)
    outcome = RunOutcome(key=key, config=config, ok=ok, error=None if ok else "boom")
    folder = opts.runs_path / key
    folder.mkdir(parents=True)
    write_sealed_json(folder / "result.json", outcome.to_json())
    return key


def test_a_stored_failed_run_is_trained_again(tmp_path: Path) -> None:
    """cl17: "A later command retries a failed run"."""
    opts = BenchOptions(out=tmp_path)
    key = _store(opts, ok=False)
    plan = runner.plan_runs(opts, [_SPEC])
    assert key in plan.todo and key not in plan.stored


def test_force_trains_a_stored_run_again(tmp_path: Path) -> None:
    """cl18: ``force``: "re-run runs that already have a result"."""
    key = _store(BenchOptions(out=tmp_path), ok=True)
    assert key in runner.plan_runs(BenchOptions(out=tmp_path), [_SPEC]).stored
    plan = runner.plan_runs(BenchOptions(out=tmp_path, force=True), [_SPEC])
    assert key in plan.todo and key not in plan.stored


def test_a_run_this_command_tried_is_not_trained_again(tmp_path: Path) -> None:
    """cl19: ``attempted`` outcomes are "taken as they are, failed or not (and with force too)"."""
    opts = BenchOptions(out=tmp_path, force=True)
    config = runner._config_dict(opts, _SPEC)
    key = runner.run_key(config)
    failed = RunOutcome(key=key, config=config, ok=False, error="boom")
    plan = runner.plan_runs(opts, [_SPEC], attempted={key: failed})
    assert plan.stored == {key: failed}
    assert not plan.todo


def test_runs_another_process_stored_meanwhile_are_not_counted_as_trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cl21: ``execute_runs`` returns the runs "trained here"; one reused meanwhile is not."""

    def reused(config: dict[str, Any], run_dir: str, reuse: bool = True) -> dict[str, Any]:
        outcome = RunOutcome(key=Path(run_dir).name, config=config, ok=True, test_accuracy=0.5)
        return {**outcome.to_json(), runner.REUSED: True}

    monkeypatch.setattr(runner, "_execute", reused)
    monkeypatch.setattr(runner, "check_data", lambda configs: None)
    specs = [_SPEC, RunSpec("Feather", 0.95, 0, {"method": "feather", "sparsity": 0.95})]
    pairs, trained, _ = runner.execute_runs(BenchOptions(out=tmp_path, jobs=1), specs)
    assert trained == 0
    assert [o.ok for _, o in pairs] == [True, True]


def test_a_failed_result_stored_meanwhile_is_trained_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cl22: ``_execute`` takes a result stored meanwhile only when it is a finished run."""
    opts = BenchOptions(out=tmp_path)
    key = _store(opts, ok=False)
    calls: list[Path] = []

    def train_it(config: dict[str, Any], path: Path) -> dict[str, Any]:
        calls.append(path)
        return RunOutcome(key=path.name, config=config, ok=True).to_json()

    monkeypatch.setattr(runner, "_execute_locked", train_it)
    config = runner._config_dict(opts, _SPEC)
    data = runner._execute(config, str(opts.runs_path / key), reuse=True)
    assert calls == [opts.runs_path / key]
    assert data["ok"] is True and runner.REUSED not in data


# ------------------------------------------------------------ cli/bench.py
@pytest.mark.parametrize("flag", ["--sparsities", "--seeds"])
def test_an_empty_grid_list_is_refused(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """cl23: an empty list would mean the default grid: argparse refuses it (exit 2)."""
    with pytest.raises(SystemExit) as stop:
        cli.build_parser().parse_args(["bench", "compare", flag, ","])
    assert stop.value.code == 2
    assert "at least one" in capsys.readouterr().err


def test_quick_with_two_seeds_is_refused() -> None:
    """cl24: ``--quick`` runs one seed, so ``--seeds 0,1`` with it is refused."""
    with pytest.raises(ValueError, match="--quick runs one seed"):
        _opts("compare", "--quick", "--seeds", "0,1")


def test_seeds_given_replace_every_experiments_own() -> None:
    """cl25: ``--seeds`` is the seeds of every experiment, nm's five included."""
    opts = _opts("nm", "--seeds", "7")
    assert {s.seed for s in plan_experiments(["nm"], opts)} == {7}


def test_data_with_a_recipe_of_its_name_uses_that_recipe() -> None:
    """cl26: ``--data``: "a recipe of that name is used if there is one"."""
    assert _opts("compare", "--data", "cifar100").recipe == "cifar100"
    assert _opts("compare", "--data", "synthetic").recipe == BenchOptions().recipe


def test_the_grid_is_every_cell_once() -> None:
    """The sweep grid: every method x sparsity x seed once (all mutants of the plan)."""
    opts = _opts("compare", "--sparsities", "0.8,0.9", "--seeds", "3,5", "--methods", "GMP,ST-3")
    specs = plan_experiments(["compare"], opts)
    cells = [(s.group, s.x, s.seed) for s in specs]
    assert len(cells) == len(set(cells))
    pruned = {c for c in cells if c[0] != "dense"}
    assert pruned == set(itertools.product(("GMP", "ST-3"), (0.8, 0.9), (3, 5)))
    assert json.dumps([s.seed for s in specs if s.group == "dense"]) in ("[]", "[3, 5]")


@pytest.mark.parametrize(
    ("settings", "overrides", "word"),
    [
        ({"method": "no-such-method"}, {}, "unknown method"),
        ({}, {"model": "no-such-model"}, "unknown model"),
        ({}, {"dataset": "no-such-data"}, "unknown dataset"),
    ],
)
def test_unknown_names_stop_the_plan_before_any_run(
    tmp_path: Path, settings: dict[str, Any], overrides: dict[str, Any], word: str
) -> None:
    """cl20: ``plan_runs`` raises for "an unknown method, model or data set"."""
    spec = RunSpec("x", 0.9, 0, {"method": "feather", "sparsity": 0.9, **settings})
    with pytest.raises(ValueError, match=word):
        runner.plan_runs(BenchOptions(out=tmp_path, overrides=overrides), [spec])


def test_a_failed_run_shared_by_two_cells_is_one_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cl12: ``failed`` counts the runs that raised (distinct runs, as ``runs`` does)."""
    pytest.importorskip("matplotlib")  # run_experiment draws the page's figures
    import feather_sparse.bench.driver as driver

    opts = BenchOptions(out=tmp_path, seeds=(0,), sparsities=(0.9,), methods=("GMP",))
    specs = plan_experiments(["compare"], opts)
    assert len(specs) >= 2

    def one_failed_run(opts_: BenchOptions, specs_: Any, *args: Any) -> Any:
        failed = RunOutcome(key="k", config={"method": "gmp"}, ok=False, error="boom")
        return [(s, failed) for s in specs_], 0, 0.0

    monkeypatch.setattr(driver, "execute_runs", one_failed_run)
    result = driver.run_experiment("compare", opts)
    assert result.runs == 1
    assert result.failed == len(result.failures) == 1


def test_sigterm_ends_train_with_143(monkeypatch: pytest.MonkeyPatch) -> None:
    """cl32: ``train`` stopped by SIGTERM exits 143 (Ctrl-C: 130), as ``run``'s docstring says."""
    import os
    import signal
    import time

    import feather_sparse.cli.train as train_cli

    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip("SIGTERM has a handler here; the command leaves it alone")

    def killed(command: str, args: Any) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # the handler interrupts this
        return 0

    monkeypatch.setattr(train_cli, "_run", killed)
    assert train_cli.run("train", cli.build_parser().parse_args(["train"])) == 143

    def interrupted(command: str, args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(train_cli, "_run", interrupted)
    assert train_cli.run("train", cli.build_parser().parse_args(["train"])) == 130


def test_a_fields_own_flag_wins_over_set(capsys: pytest.CaptureFixture[str]) -> None:
    """cl29: docs/training.md: a field's own flag wins over ``--set`` for the same field."""
    for argv in (
        ["--set", "epochs=3", "--epochs", "5"],
        ["--epochs", "5", "--set", "epochs=3"],
    ):
        assert cli.main(["train", *argv, "--print-config"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert "epochs = 5" in lines, argv
