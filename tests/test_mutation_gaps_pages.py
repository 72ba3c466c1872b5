"""Tests that close the gaps a mutation audit of the results pages and the suites found.

Each test here fails on one or more hand-made mutants of ``bench/pages.py`` (the
Grid of mean ± std, the bold best per column, the paired table and its caption,
the page's footer and JSON, the command that reproduces the page) or
``bench/suites.py`` (what ``--suite paper-regime`` runs) that the rest of the
suite let through (``docs/mutation-audit.md``, "The results pages and the
suites"; the mutants' ids are in each test's docstring). The expected numbers
are worked out here from made-up outcomes (the sample standard deviation by
hand, the Student-t quantile of two degrees of freedom in closed form); the
suite's grid is the one ``docs/results/README.md`` and its pages describe.
Nothing trains.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from _guards import guard
from feather_sparse import cli
from feather_sparse.analysis import Curve
from feather_sparse.bench.driver import plan_experiments
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import (
    Context,
    Grid,
    _rebuild_command,
    finite_curve,
    img,
    paired_caption,
    pct,
    write_page,
)
from feather_sparse.bench.runner import RunOutcome, RunSpec
from feather_sparse.bench.suites import SUITES
from feather_sparse.cli.bench import options_from_args

ROOT = Path(__file__).resolve().parent.parent
NAN = math.nan


def outcome(key: str, value: float | None = None, **fields: Any) -> RunOutcome:
    """A finished run of accuracy ``value`` (NaN: finished, metric undefined); None: failed."""
    if value is None:
        return RunOutcome(key, {}, ok=False, error="RuntimeError: diverged", **fields)
    return RunOutcome(key, {}, ok=True, test_accuracy=value, **fields)


def cell(row: str, x: float, seed: int, value: float | None) -> tuple[RunSpec, RunOutcome]:
    return RunSpec(row, x, seed, {}), outcome(f"{row}-{x}-{seed}", value)


def t_975_df2() -> float:
    """The 0.975 quantile of Student's t with 2 degrees of freedom, in closed form."""
    p = 0.975
    return (2 * p - 1) / math.sqrt(2 * p * (1 - p))


# --------------------------------------------------------------- finite_curve
def test_finite_curve_keeps_each_points_mean_and_std() -> None:
    """pages02: the curve's band is each point's std (its mean is drawn apart)."""
    points = [(0.9, (80.0, 1.5)), (0.95, (NAN, NAN)), (0.99, (70.0, 0.0))]
    assert finite_curve("a", points) == Curve("a", (0.9, 0.99), (80.0, 70.0), (1.5, 0.0))
    assert finite_curve("a", [(0.9, (NAN, NAN))]) is None


# ----------------------------------------------------------------------- Grid
def test_grid_table_shows_each_cells_mean_std_failures_and_the_best() -> None:
    """pages03-pages11: the table's cells, worked out by hand.

    Rows B, A given (runs of group C are not a row: no column of theirs); the
    columns sorted whatever order the runs come in; mean ± sample std (ddof 1);
    one seed without a spread; a cell with no value "—"; failed and undefined
    (n/a) runs counted out of all the cell's runs; the best finite mean per
    column (the default: the highest) in bold, a NaN mean never the best.
    """
    pairs = [
        cell("C", 0.5, 0, 99.0),  # not a row: neither a row nor a column of the table
        cell("A", 0.99, 0, 70.0),
        cell("A", 0.99, 1, NAN),  # finished, metric undefined
        cell("B", 0.99, 0, None),  # failed, the cell's only run
        cell("A", 0.9, 0, 80.0),
        cell("A", 0.9, 1, 82.0),
        cell("A", 0.9, 2, 84.0),
        cell("B", 0.9, 0, 90.0),
        cell("B", 0.9, 1, None),
        cell("A", 0.95, 0, NAN),
        cell("B", 0.95, 0, 85.0),
        cell("B", 0.95, 1, 87.0),
    ]
    grid = Grid(pairs, lambda o: o.test_accuracy, rows=["B", "A"])
    assert grid.cols == [0.9, 0.95, 0.99]
    std_a = math.sqrt(((80 - 82) ** 2 + 0 + (84 - 82) ** 2) / 2)  # 2.0
    std_b = math.sqrt(((85 - 86) ** 2 + (87 - 86) ** 2) / 1)  # 1.414...
    assert grid.table("row", lambda c: f"{100 * c:g} %").splitlines() == [
        "| row | 90 % | 95 % | 99 % |",
        "|---|---:|---:|---:|",
        f"| B | **90.00** (1/2 failed) | **86.00 ± {std_b:.2f}** | — (1/1 failed) |",
        f"| A | 82.00 ± {std_a:.2f} | — (n/a) | **70.00** (1/2 n/a) |",
    ]


def test_paired_table_compares_each_column_with_its_own_reference() -> None:
    """pages12, pages13, pages15: the reference per column (a function of it); a column where the
    reference was not run has no cell; the reference's own cell says so; one common
    seed is a difference without an interval; three give the 95 % interval."""
    pairs = [
        *(cell("ref", 0.9, s, v) for s, v in enumerate([10.0, 12.0, 14.0])),
        *(cell("a", 0.9, s, v) for s, v in enumerate([11.0, 14.0, 14.0])),
        cell("a", 0.95, 0, 50.0),  # the reference was not run at 95 %
        cell("ref", 0.98, 0, 30.0),
        cell("ref", 0.98, 1, 31.0),
        cell("a", 0.98, 0, 33.0),  # one seed in common
        *(cell("ref", 0.99, s, v) for s, v in enumerate([5.0, 6.0, 7.0])),
        *(cell("a", 0.99, s, v) for s, v in enumerate([1.0, 2.0, 4.0])),
    ]
    grid = Grid(pairs, lambda o: o.test_accuracy)
    refs = {0.9: "ref", 0.95: "ref", 0.98: "ref", 0.99: "a"}  # at 99 % the row "a" is it
    lines = grid.paired_table("row", str, refs.__getitem__).splitlines()
    diffs = [1.0, 2.0, 0.0]  # a − ref at 90 %
    mean = sum(diffs) / 3
    half = t_975_df2() * math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2) / math.sqrt(3)
    back = [4.0, 4.0, 3.0]  # ref − a at 99 %
    mean2 = sum(back) / 3
    half2 = t_975_df2() * math.sqrt(sum((d - mean2) ** 2 for d in back) / 2) / math.sqrt(3)
    assert mean2 - half2 > 0  # ref above a on every seed: a win of ref
    assert lines[2] == (
        f"| ref | reference |  | reference | {mean2:+.2f} [{mean2 - half2:+.2f}, "
        f"{mean2 + half2:+.2f}] **win** |"
    )
    assert lines[3] == (
        f"| a | {mean:+.2f} [{mean - half:+.2f}, {mean + half:+.2f}] n.s. |  | "
        f"{33.0 - 30.0:+.2f} (one seed) | reference |"
    )


def test_the_paired_caption_says_a_win_is_an_interval_above_zero() -> None:
    """Row minus reference, so an interval above 0 (a win) is a better row (its mutant,
    pages16, was dropped before it ran)."""
    text = paired_caption("GMP")
    assert "(row minus reference," in text
    assert "**win** / **loss**: the interval lies above / below 0 (the row is better / worse" in (
        text
    )


# ----------------------------------------------------------- labels and links
def test_pct_img_figure_and_of_group() -> None:
    """A half percent is kept; a figure is linked by its name beside the page and is
    named after its experiment; a group's runs are its own only (the mutants pages17
    and pages18 were dropped before they ran)."""
    assert [pct(s) for s in (0.9, 0.995, 0.9995)] == ["90 %", "99.5 %", "99.95 %"]
    assert img(Path("/somewhere/out/compare-accuracy.png"), "acc") == (
        "![acc](compare-accuracy.png)\n"
    )
    hard, hard_ste = cell("hard", 0.9, 0, 1.0), cell("hard-STE", 0.9, 0, 2.0)
    ctx = Context("operator", BenchOptions(out=Path("o")), [hard, hard_ste], 0, 0.0, 1)
    assert ctx.figure("accuracy") == Path("o") / "operator-accuracy.png"
    assert ctx.of_group("hard") == [hard]


# --------------------------------------------------------------------- footer
def _footer_page(tmp_path: Path) -> tuple[str, list[dict[str, Any]]]:
    """A page of five cells over three runs: one finished run shown in two cells, one
    failed run shown in two, one finished run stored before numerics were recorded."""
    shared = outcome(
        "k1",
        0.5,
        wall_time=60.0,
        numerics="CPU A",
        started="2026-11-20T23:50:00Z",
        finished="2026-11-21T00:20:00Z",
    )
    failed = outcome(
        "k2",
        None,
        wall_time=30.0,
        started="2026-11-19T10:00:00Z",
        finished="2026-11-19T10:01:00Z",
    )
    late = outcome(  # over midnight: its last day is the day it finished
        "k3", 0.6, wall_time=90.0, started="2026-11-22T23:50:00Z", finished="2026-11-23T00:05:00Z"
    )
    pairs = [
        (RunSpec("A", 0.9, 0, {}), shared),
        (RunSpec("B", 0.9, 0, {}), shared),
        (RunSpec("C", 0.9, 0, {}), failed),
        (RunSpec("D", 0.9, 0, {}), failed),
        (RunSpec("E", 0.9, 0, {}), late),
    ]
    log = tmp_path / "sweep.jsonl"
    log.write_text(
        json.dumps({"experiments": ["compare"], "trained": 2, "seconds": 60.0}) + "\n"
        "not a JSON line\n"
        + json.dumps(
            {"experiments": ["compare"], "trained": 3, "seconds": 120.0, "interrupted": True}
        )
        + "\n"
    )
    opts = BenchOptions(
        out=tmp_path,
        seeds=(0, 1, 2),
        quick=True,
        command="feather-sparse bench compare --quick --set epochs=1",
    )
    ctx = Context("compare", opts, pairs, executed=1, elapsed=60.0, workers=1, pool=(7, 600.0))
    ctx = Context(**{**ctx.__dict__, "pooled": 2})
    text = write_page(ctx, "Title", "body").read_text()
    return text, json.loads((tmp_path / "compare.json").read_text())


def test_the_footer_counts_each_run_once_and_says_what_it_is(tmp_path: Path) -> None:
    """pages19-pages26, pages32: three distinct runs (1 failed), 1 trained
    alone + 2 in the pool of 7, 3.0 min of run time, the seed --quick ran, the command
    given, the span of the runs' days, one run on CPU A and one older, two sessions
    (one interrupted) around an unreadable line, and every cell in the JSON."""
    text, rows = _footer_page(tmp_path)
    lines = text.splitlines()
    assert "- command: `feather-sparse bench compare --quick --set epochs=1`" in lines
    assert any(line.startswith("- data and model:") and line.endswith("; seed 0") for line in lines)
    assert (
        "- runs: 3 (3 trained by this command, 0 reused from earlier results); 2 of them "
        "trained together with the other experiments' runs in one pool (`bench all`: 7 runs "
        "trained in 10.0 min of wall time); summed run time of this page's runs 3.0 min"
    ) in lines
    assert "- run dates (UTC): 2026-11-19 to 2026-11-23" in lines
    assert "- numerics: 1 run on CPU A; 1 run stored before feather-sparse recorded it" in lines
    assert "- **1 run failed**: k2 (`k2`): RuntimeError: diverged" in lines
    assert (
        "- sweep wall time: 3.0 min in all, 5 runs trained in 2 sessions (1 interrupted) that "
        "wrote to this folder (`sweep.jsonl`)"
    ) in lines
    assert [(r["group"], r["key"], r["ok"]) for r in rows] == [
        ("A", "k1", True),
        ("B", "k1", True),
        ("C", "k2", False),
        ("D", "k2", False),
        ("E", "k3", True),
    ]
    assert rows[2]["error"] == "RuntimeError: diverged"


# ------------------------------------------------------------ the page's command
def _opts(*argv: str) -> BenchOptions:
    return options_from_args(cli.build_parser().parse_args(["bench", *argv]))


def _reproduces(name: str, opts: BenchOptions) -> str:
    """The page's command, checked: parsed again it plans the same runs with the same
    base config, in the same places."""
    command = _rebuild_command(name, opts)
    words = shlex.split(command)
    assert words[:3] == ["feather-sparse", "bench", name]
    again = _opts(*words[2:]).for_experiment(name)
    assert plan_experiments([name], again) == plan_experiments([name], opts), command
    assert again.base_config() == opts.base_config(), command
    assert (again.out, again.runs_path, again.quick) == (opts.out, opts.runs_path, opts.quick)
    return command


def test_the_pages_command_reproduces_its_runs(tmp_path: Path) -> None:
    """pages27-pages30: seeds other than the default's (as many of them), --set values
    as given, sparsities of three decimals, --ps."""
    out = {"out": tmp_path, "runs_dir": tmp_path / "runs"}
    _reproduces("compare", _opts("compare", "--seeds", "3,4,5", "--out", str(tmp_path)))
    given = _opts("compare", "--set", "epochs=2", "--set", "lr=0.05", "--out", str(tmp_path))
    assert "--set epochs=2 --set lr=0.05" in _reproduces("compare", given)
    _reproduces("compare", BenchOptions(sparsities=(0.9, 0.995), **out))
    _reproduces("p", BenchOptions(ps=(1.0, 2.0), **out))


@guard(
    "a results page of runs whose `--set` values were given from Python "
    "(`BenchOptions(overrides={'exclude': ('fc',), 'model_kwargs': {...}})`)",
    "the page's command writes each value as the command line reads it back "
    "(a TOML array, JSON, `true`, `none`), not Python's `str()`",
)
def test_the_pages_command_writes_python_override_values_as_the_command_line_reads_them(
    tmp_path: Path,
) -> None:
    """Left by the audit (not a mutant): ``--set`` values were written with ``str()``,
    so a tuple ``('fc', 'features.0')`` came back as the names ``"('fc'"`` and
    ``"'features.0')"`` and a dict ``{'width': 2}`` could not be read at all."""
    overrides: dict[str, Any] = {
        "exclude": ("fc", "features.0"),
        "model_kwargs": {"width": 2},
        "nesterov": True,
        "grad_clip": None,
        "lr": 0.05,
    }
    opts = BenchOptions(overrides=overrides, out=tmp_path, runs_dir=tmp_path / "runs")
    command = _reproduces("compare", opts)
    config = opts.base_config()
    assert (config.exclude, config.model_kwargs, config.nesterov) == (
        ("fc", "features.0"),
        {"width": 2},
        True,
    )
    assert "--set nesterov=true --set grad_clip=none --set lr=0.05" in command


@guard(
    "a page of a suite whose threads were unset (`threads=None`: the recipe's), "
    "the recipe setting its own threads",
    "the page's command sets the recipe's threads (`--set threads=4`), not `threads=none` "
    "(torch's default: other runs than the page's)",
)
@pytest.mark.parametrize("threads", ["4", "none"])
def test_a_suite_page_with_the_recipes_threads_names_them(tmp_path: Path, threads: str) -> None:
    """pages31: a suite's runs with ``threads=None`` train with the recipe's threads; the
    page's command must give those (the suite's own would be 1)."""
    regime = ROOT / "src/feather_sparse/recipes/mnist1d-regime.toml"
    recipe = tmp_path / "mine.toml"
    line = f"threads = {threads} " if threads != "none" else "# no threads: the default "
    recipe.write_text(regime.read_text().replace("threads = 1 ", line, 1))
    out = {"out": tmp_path, "runs_dir": tmp_path / "runs", "recipe": str(recipe)}
    suite = BenchOptions(**SUITES.get("paper-regime").options_fields(out))
    opts = BenchOptions(**{**suite.__dict__, "threads": None})
    assert opts.base_config().threads == (None if threads == "none" else int(threads))
    assert f"--set threads={threads}" in _reproduces("compare", opts)


@guard(
    "`bench nm --seeds 0,1,2` (or `bench all --seeds 0,1,2`): the seeds of the bench default",
    "the nm page's command names them (`--seeds 0,1,2`); without them `bench nm` runs its own "
    "five seeds, other runs than the page's",
)
def test_the_nm_pages_command_names_the_default_seeds_it_ran(tmp_path: Path) -> None:
    """``bench nm`` without --seeds runs nm's own seeds (five): a page of the bench's
    default seeds (three) must say --seeds, or its command plans other runs."""
    for argv in (("nm",), ("all",)):
        opts = _opts(*argv, "--seeds", "0,1,2", "--out", str(tmp_path)).for_experiment("nm")
        assert opts.seeds == (0, 1, 2)
        assert "--seeds 0,1,2" in _reproduces("nm", opts)
    own = _opts("nm", "--out", str(tmp_path)).for_experiment("nm")  # nm's own five seeds
    assert "--seeds" not in _reproduces("nm", own)


# ------------------------------------------------------------------ the suite
#: docs/results/README.md: "Five seeds per cell, sparsities 90–99.5 %", "bench all
#: --suite paper-regime   # compare, operator, theta, p", "The ablations (operator, θ,
#: p) run only at 99 and 99.5 %", its pages in docs/results/mnist1d-regime; the suite's
#: summary: "(2 runs x 1 thread)"; its rule: "`stability` ... runs at the suite's
#: lowest sparsity (90 %)".
REGIME_SPARSITIES = (0.9, 0.95, 0.98, 0.99, 0.995)
REGIME = {
    "compare": REGIME_SPARSITIES,
    "operator": (0.99, 0.995),
    "theta": (0.99, 0.995),
    "p": (0.99, 0.995),
    "stability": (0.9,),
    "backbones": REGIME_SPARSITIES,
}


def test_the_paper_regime_suite_is_the_documented_sweep() -> None:
    """pages33-pages38: the suite's experiments, seeds, sparsities per experiment,
    threads, folders; an explicit flag wins over the suite's value."""
    suite = SUITES.get("paper-regime")
    assert suite.experiments == ("compare", "operator", "theta", "p")
    opts = BenchOptions(**suite.options_fields({}))
    assert opts.seeds == (0, 1, 2, 3, 4)
    assert (opts.jobs, opts.threads) == (2, 1)
    assert opts.out == Path("docs/results/mnist1d-regime")
    assert opts.runs_path == Path("runs/mnist1d-regime")
    for name, sparsities in REGIME.items():
        assert opts.for_experiment(name).sparsity_grid(()) == sparsities, name
    mine = BenchOptions(**suite.options_fields({"seeds": (7,), "out": Path("x"), "threads": 2}))
    assert (mine.seeds, mine.out, mine.threads) == ((7,), Path("x"), 2)


def test_the_paper_regime_pages_columns_are_the_suites_sparsities() -> None:
    """pages34, pages35, pages37: the committed pages of the suite (docs/results/
    mnist1d-regime) have the columns the suite gives each experiment."""
    suite = BenchOptions(**SUITES.get("paper-regime").options_fields({}))
    folder = ROOT / "docs/results/mnist1d-regime"
    stability = (folder / "stability.md").read_text(encoding="utf-8")
    assert suite.for_experiment("stability").sparsity_grid(()) == (0.9,)
    assert ", sparsity 90 %," in stability  # its one sparsity, in its caption
    for name in ("operator", "theta", "p", "compare"):
        page = (folder / f"{name}.md").read_text(encoding="utf-8")
        header = next(
            line for line in page.splitlines() if line.startswith("| ") and " % |" in line
        )
        shown = [float(v) / 100 for v in re.findall(r"([\d.]+) %", header)]
        planned = suite.for_experiment(name).sparsity_grid(())
        assert shown == pytest.approx(list(planned)), (name, header)
