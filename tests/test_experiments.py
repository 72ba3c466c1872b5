"""``feather-sparse bench``: every experiment's ``--quick`` run, tables, caching, failures.

The experiments run on a few hundred synthetic MNIST-1D-shaped samples (one
test runs the real bundled MNIST-1D through the command line), sharing one
runs folder so that runs common to several experiments train once.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from feather_sparse import cli
from feather_sparse.bench.pages import Context, _footer, _numerics_line, finite_curve
from feather_sparse.bench.runner import _warn_foreign, load_outcome
from feather_sparse.experiments import (
    COMPARE_METHODS,
    EXPERIMENTS,
    BenchOptions,
    Grid,
    RunOutcome,
    RunSpec,
    run_experiment,
    run_key,
)
from feather_sparse.integrity import read_sealed_json
from feather_sparse.provenance import numerics
from test_bench_sweeps import SMALL

pytest.importorskip("matplotlib")

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def shared_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


def small_options(out: Path, runs: Path, **kw: Any) -> BenchOptions:
    return BenchOptions(quick=True, overrides=SMALL, out=out, runs_dir=runs, jobs=1, **kw)


@pytest.mark.parametrize("name", EXPERIMENTS.names())
def test_quick_run_of_every_experiment(name: str, tmp_path: Path, shared_runs: Path) -> None:
    result = run_experiment(name, small_options(tmp_path, shared_runs))
    assert result.failed == 0
    text = result.page.read_text()
    assert text.startswith("# ")
    if name == "nm":  # columns are N:M patterns, not sparsities
        assert "| method | 2:4 |" in text
    else:
        assert "| 95 % |" in text or "sparsity 95 %" in text
    for field in ("- command: `feather-sparse bench " + name, "- library:", "- machine:"):
        assert field in text
    assert f"- numerics: every run on {numerics('cpu')}" in text
    runs = re.search(r"- runs: (\d+) \((\d+) trained by this command, (\d+) reused", text)
    assert runs is not None and int(runs[1]) == int(runs[2]) + int(runs[3])
    assert "--quick smoke run" in text
    assert result.figures
    for fig in result.figures:
        assert fig.read_bytes()[:8] == PNG
        assert f"]({fig.name})" in text  # the page shows every plot
    raw = json.loads((tmp_path / f"{name}.json").read_text())
    assert len(raw) >= result.runs and all(r["ok"] for r in raw)


def test_compare_lists_every_method_and_the_dense_model(tmp_path: Path, shared_runs: Path) -> None:
    result = run_experiment("compare", small_options(tmp_path, shared_runs))
    text = result.page.read_text()
    for label in COMPARE_METHODS:
        assert f"| {label} |" in text
    assert "Dense model (" in text
    assert result.runs == len(COMPARE_METHODS) + 1  # one sparsity, one seed, plus dense


def test_flops_page_validates_against_torch_flop_counter(tmp_path: Path, shared_runs: Path) -> None:
    text = run_experiment("flops", small_options(tmp_path, shared_runs)).page.read_text()
    assert "(agree with this count)" in text


def test_runs_are_cached_forced_and_failures_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = small_options(tmp_path, tmp_path / "runs", thetas=(0.5,))
    first = run_experiment("stability", opts)
    assert (first.runs, first.trained) == (1, 1)
    cached = run_experiment("stability", opts)
    assert cached.trained == 0
    assert "0 trained by this command" in cached.page.read_text()
    # After `bench all`'s shared pool, the page names that pool for the runs it trained
    # (those in `attempted`), and only for them.
    (row,) = json.loads((tmp_path / "stability.json").read_text())
    stored = {row["key"]: load_outcome(tmp_path / "runs" / row["key"])}
    pooled = run_experiment("stability", opts, pool=(7, 150.0), attempted=stored)
    assert "`bench all`: 7 runs trained in 2.5 min" in pooled.page.read_text()
    assert "1 trained by this command, 0 reused" in pooled.page.read_text()
    reused = run_experiment("stability", opts, pool=(7, 150.0), attempted={}).page.read_text()
    assert "0 trained by this command, 1 reused" in reused and "one pool" not in reused
    with pytest.raises(ValueError, match="attempted"):  # it could not tell which is which
        run_experiment("stability", opts, pool=(7, 150.0))
    # Bench runs test only the final model (eval_every=0): no per-epoch test rows.
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in rows if "test_acc" in r] == rows[-1:] and rows[-1]["final"]
    assert json.loads((run_dir / "result.json").read_text())["test_acc_history"] == []
    # The stored outcome is sealed; a changed one counts as not stored: the run is repeated.
    assert "sha256" in json.loads((run_dir / "result.json").read_text())
    assert read_sealed_json(run_dir / "result.json")["ok"] is True
    text = (run_dir / "result.json").read_text()
    edited = re.sub(r'"test_accuracy": [0-9.e-]+', '"test_accuracy": 0.999', text)
    assert edited != text
    (run_dir / "result.json").write_text(edited)
    assert run_experiment("stability", opts).trained == 1
    forced = replace(opts, force=True)
    assert run_experiment("stability", forced).trained == 1

    import feather_sparse.train

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("diverged")

    monkeypatch.setattr(feather_sparse.train, "train", broken)
    failed = run_experiment("stability", replace(opts, seeds=(1,)))
    assert failed.failed == 1
    assert "RuntimeError: diverged" in failed.page.read_text()
    monkeypatch.undo()
    # A failed run is tried again the next time.
    again = run_experiment("stability", replace(opts, seeds=(1,)))
    assert (again.trained, again.failed) == (1, 0)


def test_bad_options_raise_before_training(tmp_path: Path) -> None:
    def opts(**kw: Any) -> BenchOptions:
        return replace(small_options(tmp_path, tmp_path), **kw)

    with pytest.raises(ValueError, match="theta: set by the experiment"):
        run_experiment("theta", opts(overrides={**SMALL, "theta": 0.5}))
    with pytest.raises(ValueError, match="unknown compare method"):
        run_experiment("compare", opts(methods=("Feather",)))
    with pytest.raises(ValueError, match="unknown model"):
        run_experiment("operator", opts(overrides={**SMALL, "model": "nope"}))
    with pytest.raises(ValueError, match="unknown experiment"):
        run_experiment("table9", opts())
    with pytest.raises(ValueError, match="sparsities"):
        BenchOptions(sparsities=(1.5,))
    assert not list(tmp_path.iterdir())


def test_runs_in_parallel_processes(tmp_path: Path) -> None:
    opts = replace(small_options(tmp_path, tmp_path / "runs"), jobs=2, sparsities=(0.9,))
    result = run_experiment("operator", opts)
    assert (result.runs, result.trained, result.failed) == (3, 3, 0)
    assert "2 parallel runs" in result.page.read_text()


def test_cli_quick_on_the_bundled_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "stability", "--quick", "--thetas", "0.5", "--out", str(tmp_path)]
    code = cli.main([*args, "--jobs", "1", "--set", "epochs=1"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "stability: 1 run (1 trained, 0 failed)" in out
    assert [line[:5] for line in err.splitlines() if line.startswith("[")] == ["[1/1]"]
    text = (tmp_path / "stability.md").read_text()
    assert "mnist1d, mnist1d_cnn; recipe mnist1d: 1 epoch, batch" in text
    command = (
        f"`feather-sparse bench stability --quick --set epochs=1 --thetas 0.5 --out {tmp_path}`"
    )
    assert command in text


# ------------------------------------------------------------------ tables, keys


def _outcome(acc: float, ok: bool = True, key: str = "k") -> RunOutcome:
    return RunOutcome(key=key, config={}, ok=ok, test_accuracy=acc, error=None if ok else "E")


def test_grid_table_bold_best_mean_per_column_and_failures() -> None:
    pairs = [
        (RunSpec("a", 0.9, 0, {}), _outcome(0.80)),
        (RunSpec("a", 0.9, 1, {}), _outcome(0.82)),
        (RunSpec("b", 0.9, 0, {}), _outcome(0.70)),
        (RunSpec("b", 0.9, 1, {}), _outcome(math.nan, ok=False)),
        (RunSpec("a", 0.99, 0, {}), _outcome(0.40)),
        (RunSpec("b", 0.99, 0, {}), _outcome(0.50)),
    ]
    grid = Grid(pairs, lambda o: 100 * o.test_accuracy)
    assert grid.cols == [0.9, 0.99]
    lines = grid.table("method", lambda c: f"{c:g}").splitlines()
    assert lines[0] == "| method | 0.9 | 0.99 |"
    assert lines[2] == "| a | **81.00 ± 1.41** | 40.00 |"
    assert lines[3] == "| b | 70.00 (1/2 failed) | **50.00** |"
    low = grid.table("m", str, best="min").splitlines()
    assert "**70.00" in low[3] and "**40.00" in low[2]
    curve_a = grid.curves_by_row()[0]
    assert curve_a.x == (0.9, 0.99) and curve_a.mean == pytest.approx((81.0, 40.0))


def test_finite_curve_leaves_out_cells_without_a_value() -> None:
    curve = finite_curve("a", [(0.5, (80.0, 1.0)), (0.9, (math.nan, 0.0)), (0.99, (40.0, 0.0))])
    assert curve is not None and curve.label == "a"
    assert (curve.x, curve.mean, curve.std) == ((0.5, 0.99), (80.0, 40.0), (1.0, 0.0))
    assert finite_curve("b", [(0.9, (math.nan, 0.0))]) is None


def test_run_outcome_json_round_trip_with_non_finite_values() -> None:
    outcome = RunOutcome(
        key="k",
        config={"p": math.inf, "sparsity": 0.9},
        ok=True,
        test_accuracy=0.5,
        stability_pearson=(math.nan, 0.5, 1.0),
        layers=(("fc", 10, 3),),
        input_shape=(1, 40),
    )
    text = json.dumps(outcome.to_json())  # strict JSON: no NaN/Infinity tokens
    assert "NaN" not in text.replace('"nan"', "")
    back = RunOutcome.from_json(json.loads(text))
    assert back.layers == outcome.layers and back.input_shape == (1, 40)
    assert math.isnan(back.stability_pearson[0]) and back.stability_pearson[1:] == (0.5, 1.0)


def test_run_key_names_the_run_and_hashes_the_whole_config() -> None:
    base = {"dense": False, "method": "feather", "sparsity": 0.95, "seed": 0, "lr": 0.1}
    key = run_key(base)
    assert key.startswith("feather-s0.95-seed0-")
    assert run_key(dict(base)) == key
    assert run_key({**base, "lr": 0.05}) != key
    assert run_key({**base, "dense": True}).startswith("dense-s0-seed0-")


def test_footer_names_every_model_the_page_trained(tmp_path: Path) -> None:
    """A page over two models (``bench nm``) names both, not only the first run's."""

    def outcome(key: str, model: str) -> RunOutcome:
        config = {"dataset": "mnist1d", "model": model, "recipe": "mnist1d", "epochs": 2}
        return RunOutcome(key=key, config=config, ok=True, test_accuracy=0.5)

    pairs = [
        (RunSpec("a", 0.0, 0, {}), outcome("k1", "mnist1d_cnn")),
        (RunSpec("a", 0.0, 1, {}), outcome("k2", "mnist1d_cnn")),
        (RunSpec("a", 0.0, 0, {}), outcome("k3", "mnist1d_mlpmixer")),
    ]
    ctx = Context("nm", BenchOptions(out=tmp_path), pairs, executed=3, elapsed=1.0, workers=1)
    assert "- data and models: mnist1d, mnist1d_cnn, mnist1d_mlpmixer;" in _footer(ctx)
    one = Context("nm", BenchOptions(out=tmp_path), pairs[:2], executed=2, elapsed=1.0, workers=1)
    assert "- data and model: mnist1d, mnist1d_cnn;" in _footer(one)


def test_a_page_says_when_its_runs_come_from_several_kernel_sets() -> None:
    """Runs reused from another machine are not bit-comparable: the page names the mix."""
    here, there = numerics("cpu"), "torch 2.13.0+cpu, CPU Other, AVX2 kernels"
    runs = [RunOutcome(key=f"r{i}", config={}, ok=True, numerics=here) for i in range(3)]
    shown_twice = [*runs, runs[0]]  # one run in two cells counts once
    assert _numerics_line(shown_twice) == f"- numerics: every run on {here}"
    old = RunOutcome(key="old", config={}, ok=True)  # stored before the field existed
    assert _numerics_line([*runs, old]) == (
        f"- numerics: 3 runs on {here}; 1 run stored before feather-sparse recorded it"
    )
    assert _numerics_line([old]) == (
        "- numerics: not recorded (1 run stored before feather-sparse recorded it)"
    )
    assert _numerics_line([]) == "- numerics: no run finished"
    mixed = [*shown_twice, RunOutcome(key="b", config={}, ok=True, numerics=there), old]
    line = _numerics_line(mixed)
    assert line.startswith("- **numerics: the runs come from 2 floating-point environments**")
    assert f"(3 × {here}; 1 × {there}; 1 run stored before" in line
    assert "bit-comparable only within one" in line


def test_reusing_runs_of_another_kernel_set_is_said_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sweep warns, before training, that reused runs were trained elsewhere."""
    here, there = numerics("cpu"), "torch 2.13.0+cpu, CPU Other, AVX2 kernels"
    cpu = {"device": "cpu"}
    stored = [
        RunOutcome(key="a", config=cpu, ok=True, numerics=here),
        RunOutcome(key="b", config=cpu, ok=True, numerics=there),
        RunOutcome(key="c", config=cpu, ok=True, numerics=there),
        RunOutcome(key="d", config=cpu, ok=True),  # not recorded: nothing to say
    ]
    with caplog.at_level("WARNING", logger="feather_sparse"):
        _warn_foreign(stored)
    (record,) = caplog.records
    assert record.getMessage().startswith(
        f"2 reused runs were trained on {there}, not on this machine's {here}"
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="feather_sparse"):
        _warn_foreign(stored[:1] + stored[3:])
    assert not caplog.records
