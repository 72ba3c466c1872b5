"""What ``feather-sparse bench`` writes for people: counts in their number, runs by their name."""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

import feather_sparse.train
from feather_sparse import cli
from feather_sparse._text import count, plural
from feather_sparse.bench import BenchOptions
from feather_sparse.bench import pages as bench_pages
from feather_sparse.bench.pages import Context, machine_description, record_session, write_page
from feather_sparse.bench.runner import TIME_FORMAT, RunOutcome, RunSpec, load_outcome, run_key

SMALL_FLAGS = [
    "--set",
    "dataset=synthetic-mnist1d",
    "--set",
    "data_options={train_size = 128, test_size = 64}",
    "--batch-size",
    "64",
    "--jobs",
    "1",
    "--threads",
    "1",
    "--device",
    "cpu",
]

#: A count of 1 before a noun in the plural, or a count with "(s)": what no page may say.
WRONG = re.compile(r"(?<![\d.,])1 (?:[\w-]+ )?(?:runs|epochs|seeds|sessions|threads|cores)\b|\(s\)")


def test_count_and_plural() -> None:
    assert [count(n, "run") for n in (0, 1, 2)] == ["0 runs", "1 run", "2 runs"]
    assert count(1, "process") == "1 process" and count(3, "process") == "3 processes"
    assert count(2, "parallel run") == "2 parallel runs" and count(2, "epoch") == "2 epochs"
    assert count("default", "torch thread") == "default torch threads"
    assert plural(1, "was", "were") == "was" and plural(2, "was", "were") == "were"


def _failing_training(monkeypatch: pytest.MonkeyPatch) -> None:
    def diverged(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("diverged")

    monkeypatch.setattr(feather_sparse.train, "train", diverged)


# ------------------------------------------------------------------ plurals
@pytest.mark.parametrize("n", [1, 2])
def test_a_page_counts_in_the_singular_and_the_plural(
    n: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every count of the footer, at 1 and at 2: ``1 run``, ``2 runs``, never ``1 runs``."""
    monkeypatch.setattr(bench_pages, "usable_cpus", lambda: n)
    seeds = tuple(range(n))
    config = {
        "dataset": "mnist1d",
        "model": "mnist1d_cnn",
        "recipe": "mnist1d",
        "epochs": n,
        "threads": n,
        "method": "feather",
        "dense": False,
        "operator": "hard",
        "sparsity": 0.9,
    }
    pairs = []
    for seed in seeds:
        cfg = {**config, "seed": seed}
        spec = RunSpec("hard", 0.9, seed, {})
        pairs += [
            (spec, RunOutcome(f"ok{seed}", cfg, ok=True, test_accuracy=0.5, numerics="CPU A")),
            (spec, RunOutcome(f"old{seed}", cfg, ok=True, test_accuracy=0.5)),
            (spec, RunOutcome(f"bad{seed}", cfg, ok=False, error="RuntimeError: diverged")),
        ]
    for _ in range(n):
        record_session(tmp_path, ["operator"], n, 60.0)
    opts = BenchOptions(out=tmp_path, seeds=seeds)
    ctx = Context(
        "operator", opts, pairs, executed=0, elapsed=1.0, workers=n, pool=(n, 60.0), pooled=n
    )
    text = write_page(ctx, "Thresholding operator", "body").read_text()
    runs = "run" if n == 1 else "runs"
    expected = [
        f"{n} usable core{'s' * (n > 1)}",
        f"{n} parallel {runs} × {n} torch thread{'s' * (n > 1)}",
        f"recipe mnist1d: {n} epoch{'s' * (n > 1)}, batch",
        "; seed 0\n" if n == 1 else "; seeds 0, 1\n",
        f"- **{n} {runs} failed**: feather operator=hard s=0.9 seed 0 (`bad0`): RuntimeError",
        f"{n * n} {runs} trained in {n} session{'s' * (n > 1)} that wrote",
        f"(`bench all`: {n} {runs} trained in 1.0 min",
        f"- numerics: {n} {runs} on CPU A; {n} {runs} stored before feather-sparse recorded it",
    ]
    for phrase in expected:
        assert phrase in text
    assert not WRONG.search(text), WRONG.search(text)
    assert machine_description(1, "default").endswith("1 parallel run × default torch threads")


@pytest.mark.parametrize("thetas", ["1", "0.5,1"])
def test_cli_lines_count_in_the_singular_and_the_plural(
    thetas: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``bench theta --quick`` over one θ plans 1 run, over two 2: every line says so."""
    pytest.importorskip("matplotlib")  # the command draws its page's figures first
    _failing_training(monkeypatch)
    argv = ["bench", "theta", "--quick", "--thetas", thetas, *SMALL_FLAGS, "--out", str(tmp_path)]
    with caplog.at_level(logging.INFO, logger="feather_sparse.bench"):
        assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    n = len(thetas.split(","))
    runs = "run" if n == 1 else "runs"
    assert f"theta: {n} distinct {runs}, 0 stored, {n} to train in 1 process × 1 thread" in err
    assert f"theta: {n} {runs} ({n} trained, {n} failed)" in out
    assert f"{n} {runs} to train (0 reused), 1 process" in caplog.text
    page = (tmp_path / "theta.md").read_text()
    assert f"- **{n} {runs} failed**" in page
    for text in (out, err, caplog.text, page):
        assert not WRONG.search(text), WRONG.search(text)


# ----------------------------------------------------------------- run names
def test_operator_runs_are_named_by_their_operator_and_keep_their_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``bench operator`` trains hard, soft and Feather: each failure line, the page and
    its JSON say which is which; the run folders keep their keys (stored runs are reused)."""
    pytest.importorskip("matplotlib")  # the command draws its page's figures first
    _failing_training(monkeypatch)
    argv = ["bench", "operator", "--quick", *SMALL_FLAGS, "--out", str(tmp_path)]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    failed = sorted(line.split(":")[0] for line in err.splitlines() if line.startswith("failed"))
    # θ = 1 departs from the automatic θ (0.5 from 95 %); Feather's operator is the method's own
    assert failed == [
        "failed run feather operator=hard theta=1 s=0.95 seed 0",
        "failed run feather operator=soft theta=1 s=0.95 seed 0",
        "failed run feather theta=1 s=0.95 seed 0",
    ]
    rows = json.loads((tmp_path / "operator.json").read_text())
    assert {r["group"]: r["name"] for r in rows} == {
        "hard": "feather operator=hard theta=1 s=0.95 seed 0",
        "soft": "feather operator=soft theta=1 s=0.95 seed 0",
        "Feather (p = 3)": "feather theta=1 s=0.95 seed 0",
    }
    page = (tmp_path / "operator.md").read_text()
    for row in rows:
        assert f"{row['name']} (`{row['key']}`): RuntimeError: diverged" in page
        # the folder is the key, as before: the readable prefix and the config hash
        assert row["key"].startswith("feather-s0.95-seed0-")
        assert (tmp_path / "runs" / row["key"] / "result.json").is_file()


def test_run_keys_are_unchanged_and_names_say_what_the_run_is() -> None:
    from feather_sparse.bench.runner import run_name

    base = {"dense": False, "method": "feather", "theta": 1.0, "sparsity": 0.99, "seed": 0}
    # Keys computed before runs had names: runs folders written then are found again.
    golden = {
        "hard": "feather-s0.99-seed0-089617e102",
        "soft": "feather-s0.99-seed0-504ef8bec5",
        None: "feather-s0.99-seed0-de053c39bf",
    }
    for operator, key in golden.items():
        config = {**base, "operator": operator, "conv_order": None}
        assert run_key(config) == key
    assert run_name({**base, "operator": "hard"}) == "feather operator=hard theta=1 s=0.99 seed 0"
    assert run_name({**base, "p": float("inf")}) == "feather p=inf theta=1 s=0.99 seed 0"
    nm = {"dense": False, "method": "sr-ste", "pattern": "2:4", "sparsity": 0.5, "seed": 3}
    assert run_name(nm) == "sr-ste pattern=2:4 seed 3"
    assert run_name({"dense": True, "method": "feather", "seed": 1}) == "dense seed 1"
    # an outcome whose config has no method (hand-made) is shown by its key
    assert RunOutcome(key="k", config={}, ok=True).name == "k"


# --------------------------------------------------------------------- dates
def _dated_page(out: Path, outcomes: list[RunOutcome]) -> str:
    spec = RunSpec("hard", 0.9, 0, {})
    ctx = Context(
        "operator",
        BenchOptions(out=out, seeds=(0,)),
        [(spec, o) for o in outcomes],
        executed=0,
        elapsed=1.0,
        workers=1,
    )
    return write_page(ctx, "Thresholding operator", "body").read_text()


def test_a_page_gives_the_dates_its_runs_recorded_and_is_the_same_when_made_again(
    tmp_path: Path,
) -> None:
    """The footer's dates are the span of the runs' own records (each run once, failed
    ones too), never the day the page is written: the same runs give the same bytes."""
    cfg = {"dataset": "mnist1d", "model": "mnist1d_cnn", "method": "feather", "seed": 0}
    first = RunOutcome(
        "a", cfg, ok=True, started="2026-11-21T23:50:00Z", finished="2026-11-22T00:10:00Z"
    )
    later = RunOutcome(
        "b",
        cfg,
        ok=False,
        error="RuntimeError: diverged",
        started="2026-11-23T08:00:00Z",
        finished="2026-11-23T08:01:00Z",
    )
    older = RunOutcome("c", cfg, ok=True)  # stored before runs recorded their times
    page = _dated_page(tmp_path, [first, later, later])
    assert "\n- run dates (UTC): 2026-11-21 to 2026-11-23\n" in page
    assert page == _dated_page(tmp_path, [first, later, later])  # no clock in the page
    assert (
        "- run dates (UTC): 2026-11-21 to 2026-11-22; 1 run stored before feather-sparse "
        "recorded dates\n" in _dated_page(tmp_path, [older, first])
    )
    same_day = RunOutcome(
        "d", cfg, ok=True, started="2026-11-21T09:00:00Z", finished="2026-11-21T09:30:00Z"
    )
    assert "\n- run dates (UTC): 2026-11-21\n" in _dated_page(tmp_path, [same_day])
    assert "\n- run dates: not recorded (2 runs stored before feather-sparse recorded dates)\n" in (
        _dated_page(tmp_path, [older, RunOutcome("e", cfg, ok=True)])
    )


def test_a_run_records_when_it_started_and_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``result.json`` holds the run's start and end (UTC), a failed run's too, and the
    page made from it shows their days."""
    pytest.importorskip("matplotlib")  # the command draws its page's figures first
    _failing_training(monkeypatch)
    before = datetime.now(timezone.utc).strftime(TIME_FORMAT)
    argv = ["bench", "theta", "--quick", "--thetas", "1", *SMALL_FLAGS, "--out", str(tmp_path)]
    assert cli.main(argv) == 1
    after = datetime.now(timezone.utc).strftime(TIME_FORMAT)
    capsys.readouterr()
    (result,) = (tmp_path / "runs").glob("*/result.json")
    stored = load_outcome(result.parent)
    assert stored is not None and not stored.ok
    assert before <= stored.started <= stored.finished <= after
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stored.started)
    days = sorted({stored.started[:10], stored.finished[:10]})
    span = " to ".join(days)
    assert f"\n- run dates (UTC): {span}\n" in (tmp_path / "theta.md").read_text()
