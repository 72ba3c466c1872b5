"""``feather-sparse bench`` slips: a grid value given twice, a run folder under another
run's name, a damaged page that ``bench claims`` reads, a page write cut short, and a
worker process killed during a sweep."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import pytest

import feather_sparse.integrity
import feather_sparse.train
from _guards import guard
from feather_sparse import cli
from feather_sparse.bench import BenchOptions, RunOutcome, RunSpec
from feather_sparse.bench.driver import plan_experiments
from feather_sparse.bench.pages import Context, write_page
from feather_sparse.bench.runner import load_outcome, plan_runs, run_name
from feather_sparse.integrity import write_sealed_json
from test_bench_sweeps import SMALL, SMALL_FLAGS

pytest.importorskip("matplotlib")


# ------------------------------------------------------------ repeated grid values
@pytest.mark.parametrize(
    ("flag", "values", "field", "message"),
    [
        ("--sparsities", "0.95,0.95", "sparsities", "sparsities: 0.95 given more than once"),
        ("--thetas", "0,0,0.5", "thetas", "thetas: 0 given more than once (0,0,0.5)"),
        ("--ps", "3,inf,inf", "ps", "ps: inf given more than once (3,inf,inf)"),
        ("--methods", "GMP,ST-3,GMP", "methods", "methods: GMP given more than once"),
    ],
)
@guard(
    "a `bench` grid value given twice (`--sparsities 0.95,0.95`, `--thetas 0,0,0.5`, "
    "`--ps`, `--methods`)",
    "CLI exit 1, one line naming the value (as for a repeated seed); nothing trained",
)
def test_a_repeated_grid_value_is_refused(
    flag: str,
    values: str,
    field: str,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Each run of a repeated value would count twice in its cell's mean ± std.
    python = {
        "sparsities": (0.95, 0.95),
        "thetas": (0.0, 0.0, 0.5),
        "ps": (3.0, float("inf"), float("inf")),
        "methods": ("GMP", "ST-3", "GMP"),
    }[field]
    with pytest.raises(ValueError, match="given more than once") as info:
        BenchOptions(**{field: python})
    assert str(info.value).startswith(message) and str(info.value).endswith("give each once")
    experiment = {"sparsities": "theta", "thetas": "theta", "ps": "p", "methods": "compare"}
    argv = ["bench", experiment[field], "--quick", flag, values, "--out", str(tmp_path)]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_the_quick_case_of_repeated_values_is_refused_too() -> None:
    # --quick --sparsities 0.95,0.95 --thetas 0.5,0.5 showed 0.00 ± 0.00 for a single run
    with pytest.raises(ValueError, match=r"sparsities: 0\.95 given more than once"):
        BenchOptions(quick=True, sparsities=(0.95, 0.95), thetas=(0.5, 0.5))
    with pytest.raises(ValueError, match=r"thetas: 0\.5 given more than once"):
        BenchOptions(quick=True, thetas=(0.5, 0.5))
    ok = BenchOptions(quick=True, sparsities=(0.9, 0.95), thetas=(0.0, 0.5), ps=(2.0, 3.0))
    assert ok.sparsities == (0.9, 0.95)


# ------------------------------------------------- a run under another run's folder
def _store(folder: Path, key: str, config: dict[str, Any], accuracy: float) -> None:
    outcome = RunOutcome(key=key, config=config, ok=True, test_accuracy=accuracy, sparsity=0.95)
    folder.mkdir(parents=True)
    write_sealed_json(folder / "result.json", outcome.to_json(), indent=1)  # as the runner does


@guard(
    "two bench run folders swapped (renamed) by hand, so a `result.json` records another "
    "run's key than its folder's",
    "warning naming both keys; each run is repeated, never reused as the other",
)
def test_a_run_stored_under_another_runs_folder_is_not_reused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    opts = BenchOptions(quick=True, thetas=(0.0, 1.0), overrides=SMALL, out=tmp_path)
    specs = plan_experiments(["theta"], opts)
    plan = plan_runs(opts, specs)
    assert len(plan.todo) == 2
    (a, config_a), (b, config_b) = plan.todo.items()
    _store(opts.runs_path / a, a, config_a, 0.324)
    _store(opts.runs_path / b, b, config_b, 0.355)
    assert set(plan_runs(opts, specs).stored) == {a, b}  # stored as they are: reused
    # the two folders swapped by hand
    (opts.runs_path / a).rename(tmp_path / "aside")
    (opts.runs_path / b).rename(opts.runs_path / a)
    (tmp_path / "aside").rename(opts.runs_path / b)
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        again = plan_runs(opts, specs)
    assert not again.stored and set(again.todo) == {a, b}  # both repeated
    file = opts.runs_path / a / "result.json"
    assert f"ignoring {file}: it is the result of run {b}, not of {a}" in caplog.text
    assert "the run is repeated" in caplog.text
    assert load_outcome(opts.runs_path / a) is None
    assert load_outcome(opts.runs_path / b) is None


# ------------------------------------------------------- bench claims: a damaged page
_ROW = {"x": 0.95, "key": "k", "name": "n", "ok": True, "error": None, "test_accuracy": 0.5}
_ROWS = [{**_ROW, "group": g, "seed": s} for g in ("θ = 0.5", "θ = 1") for s in (0, 1)]
_TEXT = json.dumps(_ROWS, indent=1)


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (_TEXT[: len(_TEXT) // 2], "it is not readable JSON (Expecting"),  # a write cut short
        (json.dumps([{"ok": True, "test_accuracy": 0.5}]), "its run 1 has no 'group', 'x', 'seed'"),
        (json.dumps({"rows": _ROWS}), "it holds no list of runs"),
        (json.dumps([*_ROWS, "a row"]), "its run 5 is not a JSON object"),
        (json.dumps([{**_ROWS[0], "x": "ninety"}]), "its run 1 has a value that is not a number"),
        (json.dumps([{**_ROWS[0], "seed": None}]), "its run 1 has a value that is not a number"),
    ],
    ids=["cut-short", "no-group", "no-list", "not-an-object", "x-text", "seed-null"],
)
@guard(
    "`bench claims` on a damaged or hand-edited `OUT/<experiment>.json` (cut short, a row "
    "without a field, a value that is not a number)",
    "CLI exit 1, one line naming the file, what is wrong and the `bench` command that "
    "writes it again",
)
def test_claims_on_a_damaged_page_name_the_file_and_the_fix(
    content: str, what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "theta.json").write_text(content)
    assert cli.main(["bench", "claims", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{tmp_path / 'theta.json'} is damaged: {what}" in err
    assert "run `feather-sparse bench theta` with the flags that made it again" in err
    # with its page beside it, the fix is the page's own command
    command = f"feather-sparse bench theta --quick --out {tmp_path}"
    (tmp_path / "theta.md").write_text(f"# θ\n\n- command: `{command}`\n- library: x\n")
    assert cli.main(["bench", "claims", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"run `{command}` (the command on theta.md) again to write it again" in err


def test_claims_on_a_stability_page_without_run_keys_name_the_file(tmp_path: Path) -> None:
    rows = [{k: v for k, v in row.items() if k != "key"} for row in _ROWS]
    (tmp_path / "stability.json").write_text(json.dumps(rows))
    with pytest.raises(ValueError, match=r"stability.json is damaged: its run 1 has no 'key'"):
        cli.main(["-vv", "bench", "claims", "--out", str(tmp_path)])


# ------------------------------------------------------------- a page write cut short
def _context(out: Path, accuracy: float) -> Context:
    spec = RunSpec(group="θ = 0.5", x=0.95, seed=0, settings={}, experiment="theta")
    config = {"method": "feather", "sparsity": 0.95, "seed": 0, "model": "m", "dataset": "d"}
    outcome = RunOutcome(key="k", config=config, ok=True, test_accuracy=accuracy, sparsity=0.95)
    opts = BenchOptions(quick=True, out=out)
    return Context(
        name="theta", opts=opts, pairs=[(spec, outcome)], executed=1, elapsed=1.0, workers=1
    )


@guard(
    "the disk fills (or the process is killed) while `bench` writes a page or its JSON",
    "the old `OUT/<experiment>.md` and `.json` stay whole (written atomically); "
    "the error names the file",
)
def test_a_page_write_cut_short_leaves_the_old_page_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = write_page(_context(tmp_path, 0.5), "θ", "| table |")
    old_page, old_json = page.read_text(), (tmp_path / "theta.json").read_text()
    assert json.loads(old_json)[0]["test_accuracy"] == 0.5

    def half_then_full(fd: int, data: bytes) -> None:
        with os.fdopen(fd, "wb") as f:
            f.write(data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(feather_sparse.integrity, "_write_file", half_then_full)
    with pytest.raises(OSError, match=r"theta\.md"):
        write_page(_context(tmp_path, 0.25), "θ", "| another table |")
    assert page.read_text() == old_page
    assert (tmp_path / "theta.json").read_text() == old_json
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theta.json", "theta.md"]  # no temp


# -------------------------------------------------------- a worker process killed
@guard(
    "a `bench --jobs 2` worker process killed (the out-of-memory killer, `kill -9`)",
    "CLI exit 1, one line naming the runs it was training, that the finished runs are "
    "stored, and to run the same command again (fewer `--jobs` if memory ran out)",
)
def test_a_killed_worker_names_its_run_and_how_to_continue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Forked workers (not spawned: quick, and they keep this fake training): the run
    # at θ = 0 kills its process, as the out-of-memory killer would; the others fail.
    fork = multiprocessing.get_context("fork")
    monkeypatch.setattr(multiprocessing, "get_context", lambda method=None: fork)

    def train(config: Any, *args: Any, **kwargs: Any) -> Any:
        if config.theta == 0.0:
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("a fake run")

    monkeypatch.setattr(feather_sparse.train, "train", train)
    opts = BenchOptions(quick=True, thetas=(0.0, 1.0), overrides=SMALL, out=tmp_path, jobs=2)
    todo = plan_runs(opts, plan_experiments(["theta"], opts)).todo.values()
    (victim,) = [c for c in todo if c.get("theta") == 0.0]
    argv = ["bench", "theta", "--quick", "--thetas", "0,1", "--jobs", "2", *SMALL_FLAGS]
    assert cli.main([*argv, "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    line = err[-1]
    assert line.startswith("feather-sparse bench: error: a training process was killed while ")
    assert run_name(victim) in line
    assert f"the runs that finished are stored in {tmp_path / 'runs'}" in line
    assert "run the same command again to continue (with fewer --jobs" in line
    (session,) = [json.loads(s) for s in (tmp_path / "sweep.jsonl").read_text().splitlines()]
    assert session["interrupted"] is True and session["error"].startswith("BrokenProcessPool: ")
