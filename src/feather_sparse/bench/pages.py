"""The results pages: Markdown tables of mean ± std, the facts under every table, the files.

A page is ``OUT/<experiment>.md`` (title, the experiment's body, then the
command, library, machine and run facts, the days the runs were made among
them) beside ``OUT/<experiment>.json``
(one row per run of the page: its key, i.e. its folder, and its name) and the
experiment's PNG plots. Counts are written in their number (``1 run``,
``2 runs``: :func:`feather_sparse._text.count`).
"""

from __future__ import annotations

import json
import math
import platform
import re
import shlex
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from feather_sparse._text import count, plural
from feather_sparse._version import __version__
from feather_sparse.analysis import Curve, mean_std
from feather_sparse.bench.options import (
    DEFAULT_BENCH_RECIPE,
    DEFAULT_SEEDS,
    BenchOptions,
    usable_cpus,
)
from feather_sparse.bench.runner import RunOutcome, RunSpec, jsonable
from feather_sparse.bench.stats import CONFIDENCE, paired_difference
from feather_sparse.bench.suites import SUITES
from feather_sparse.integrity import write_atomic
from feather_sparse.provenance import cpu_model

__all__ = [
    "SWEEP_LOG",
    "Context",
    "Grid",
    "finite_curve",
    "img",
    "machine_description",
    "pct",
    "record_session",
    "write_page",
]

#: The results folder's log of training sessions (one JSON object a line).
SWEEP_LOG = "sweep.jsonl"


def machine_description(workers: int | None = None, threads: int | str | None = None) -> str:
    """One line naming the hardware (and Python); the library versions are listed apart.

    Args:
        workers: runs trained in parallel (``None``: not mentioned).
        threads: torch threads of each run, a number or a word such as
            ``"default"`` (``None``: 1).
    """
    parts = [
        f"Python {platform.python_version()}",
        f"{platform.system()} {platform.machine()}",
        f"{cpu_model()}, {count(usable_cpus(), 'usable core')}",
    ]
    if torch.cuda.is_available():
        parts.append(f"GPU {torch.cuda.get_device_name(0)}")
    else:
        parts.append("no GPU")
    if workers is not None:
        parts.append(f"{count(workers, 'parallel run')} × {count(threads or 1, 'torch thread')}")
    return ", ".join(parts)


def finite_curve(label: str, points: Sequence[tuple[float, tuple[float, float]]]) -> Curve | None:
    """The curve through the ``(x, (mean, std))`` points that have a value; ``None`` if none do.

    A cell without a value (no run, or only failed runs) has a NaN mean: it is
    left out, not drawn at 0.

    Args:
        label: the curve's legend label.
        points: ``(x, (mean, std))`` per column.
    """
    kept = [(x, mean, std) for x, (mean, std) in points if math.isfinite(mean)]
    if not kept:
        return None
    xs, means, stds = zip(*kept)
    return Curve(label, tuple(xs), tuple(means), tuple(stds))


# ====================================================================== tables
class Grid:
    """Values of a metric per ``(row, column)``, over seeds; failed runs counted apart.

    A run that finished but whose metric is undefined (not finite, e.g. the
    flip rate of a run too short to have one) is not a failure: it is counted
    in ``undefined`` and shown as not measured (``n/a``).

    Args:
        pairs: the runs and their outcomes; a run's ``(group, x)`` is its cell.
        metric: the value of a finished run.
        rows: the rows, in order (runs of other groups are left out);
            ``None``: every group, in order of appearance.
    """

    def __init__(
        self,
        pairs: Sequence[tuple[RunSpec, RunOutcome]],
        metric: Callable[[RunOutcome], float],
        rows: Sequence[str] | None = None,
    ) -> None:
        self.values: dict[tuple[str, float], list[float]] = {}
        self.by_seed: dict[tuple[str, float], dict[int, float]] = {}
        self.failed: dict[tuple[str, float], int] = {}
        self.undefined: dict[tuple[str, float], int] = {}
        self.rows: list[str] = list(rows) if rows is not None else []
        self.cols: list[float] = []
        for spec, outcome in pairs:
            cell = (spec.group, spec.x)
            if rows is None and spec.group not in self.rows:
                self.rows.append(spec.group)
            if spec.group not in self.rows:
                continue
            if spec.x not in self.cols:
                self.cols.append(spec.x)
            self.values.setdefault(cell, [])
            if not outcome.ok:
                self.failed[cell] = self.failed.get(cell, 0) + 1
                continue
            value = metric(outcome)
            if math.isfinite(value):
                self.values[cell].append(value)
                self.by_seed.setdefault(cell, {})[spec.seed] = value
            else:
                self.undefined[cell] = self.undefined.get(cell, 0) + 1
        self.cols.sort()

    def stat(self, row: str, col: float) -> tuple[float, float]:
        """The ``(mean, std)`` over seeds of one cell (NaN mean: no value).

        Args:
            row: the row (a run's group).
            col: the column (a run's x).
        """
        return mean_std(self.values.get((row, col), []))

    def table(
        self,
        row_title: str,
        col_label: Callable[[float], str],
        fmt: str = "{:.2f}",
        best: str | None = "max",
    ) -> str:
        """A Markdown table of mean ± std; the best mean per column in bold.

        Args:
            row_title: the first column's title.
            col_label: a column's title from its value.
            fmt: the number format of the means and standard deviations.
            best: ``"max"`` or ``"min"``: which mean per column is the best;
                ``None``: none in bold.
        """
        lines = [
            f"| {row_title} | " + " | ".join(col_label(c) for c in self.cols) + " |",
            "|---|" + "---:|" * len(self.cols),
        ]
        bests: dict[float, float] = {}
        if best is not None:
            for c in self.cols:
                means = [self.stat(r, c)[0] for r in self.rows]
                finite = [m for m in means if math.isfinite(m)]
                if finite:
                    bests[c] = max(finite) if best == "max" else min(finite)
        for r in self.rows:
            cells = []
            for c in self.cols:
                if (r, c) not in self.values:
                    cells.append("")
                    continue
                mean, std = self.stat(r, c)
                if math.isnan(mean):
                    text = "—"
                elif len(self.values[(r, c)]) == 1:  # one seed: no spread to show
                    text = fmt.format(mean)
                else:
                    text = f"{fmt.format(mean)} ± {fmt.format(std)}"
                if c in bests and math.isfinite(mean) and fmt.format(mean) == fmt.format(bests[c]):
                    text = f"**{text}**"
                failed = self.failed.get((r, c), 0)
                undefined = self.undefined.get((r, c), 0)
                total = failed + undefined + len(self.values[(r, c)])
                if undefined:  # finished, but the metric is not defined: not measured
                    text += " (n/a)" if undefined == total else f" ({undefined}/{total} n/a)"
                if failed:
                    text += f" ({failed}/{total} failed)"
                cells.append(text)
            lines.append(f"| {r} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def paired_table(
        self,
        row_title: str,
        col_label: Callable[[float], str],
        reference: str | Callable[[float], str | None],
        fmt: str = "{:+.2f}",
    ) -> str:
        """A Markdown table of each row minus the reference row, paired over seeds.

        Each cell is the mean difference, its 95 % Student-t interval and the
        verdict (``win``/``loss`` when the interval excludes 0, else ``n.s.``;
        see :mod:`feather_sparse.bench.stats`).

        Args:
            row_title: the first column's title.
            col_label: a column's title from its value.
            reference: the reference row, or a function giving it per column
                (``None`` where there is none).
            fmt: the number format of the differences.
        """
        lines = [
            f"| {row_title} | " + " | ".join(col_label(c) for c in self.cols) + " |",
            "|---|" + "---:|" * len(self.cols),
        ]
        for r in self.rows:
            cells = []
            for c in self.cols:
                ref = reference(c) if callable(reference) else reference
                if ref is None or (r, c) not in self.values or (ref, c) not in self.values:
                    cells.append("")
                    continue
                if r == ref:
                    cells.append("reference")
                    continue
                d = paired_difference(self.by_seed.get((r, c), {}), self.by_seed.get((ref, c), {}))
                if d.n == 0:
                    cells.append("—")
                elif d.n == 1:
                    cells.append(f"{fmt.format(d.mean)} (one seed)")
                else:
                    verdict = d.verdict if d.verdict == "n.s." else f"**{d.verdict}**"
                    cells.append(
                        f"{fmt.format(d.mean)} [{fmt.format(d.low)}, {fmt.format(d.high)}] "
                        f"{verdict}"
                    )
            lines.append(f"| {r} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def curves_by_row(self) -> list[Curve]:
        """One curve per row, x = the columns (cells without values left out)."""
        found = (finite_curve(r, [(c, self.stat(r, c)) for c in self.cols]) for r in self.rows)
        return [curve for curve in found if curve is not None]


def pct(x: float) -> str:
    """A fraction as a column label: ``0.95`` -> ``"95 %"``.

    Args:
        x: the fraction.
    """
    return f"{100 * x:g} %"


def img(path: Path, alt: str) -> str:
    """A Markdown image line for a figure written beside the page.

    Args:
        path: the figure's file (the line names it relative to the page).
        alt: the image's alternative text.
    """
    return f"![{alt}]({path.name})\n"


def paired_caption(reference: str, unit: str = "points of top-1 accuracy") -> str:
    """The sentence above a :meth:`Grid.paired_table`."""
    level = f"{100 * CONFIDENCE:g} %"
    return (
        f"Paired difference to {reference}, in {unit} (row minus reference, same seed and "
        f"sparsity): mean [{level} Student-t interval over the seeds both finished]. "
        f"**win** / **loss**: the interval lies above / below 0 (the row is better / worse "
        f"than {reference}); n.s.: it contains 0, not separable with these seeds.\n\n"
    )


# ======================================================================= pages
@dataclass(frozen=True)
class Context:
    """What a summary needs: the options, the runs and their outcomes, where to write.

    Attributes:
        name: the experiment's name (the page is ``OUT/<name>.md``).
        opts: the options it ran with.
        pairs: every run of the page and its outcome.
        executed: runs this command trained on its own for the page.
        elapsed: this command's wall time for the page's runs, in seconds.
        workers: runs trained in parallel.
        pool: ``(runs trained, seconds)`` of the pool that trained the runs of
            several experiments (``bench all``), or ``None``.
        pooled: the page's runs that pool trained.
    """

    name: str
    opts: BenchOptions
    pairs: list[tuple[RunSpec, RunOutcome]]
    executed: int
    elapsed: float
    workers: int
    pool: tuple[int, float] | None = None
    pooled: int = 0

    @property
    def out(self) -> Path:
        """The results folder the page is written to."""
        return self.opts.out

    def figure(self, suffix: str) -> Path:
        """The path of one of the page's figures: ``OUT/<name>-<suffix>.png``.

        Args:
            suffix: what tells the figure from the page's others.
        """
        return self.out / f"{self.name}-{suffix}.png"

    def of_group(self, group: str) -> list[tuple[RunSpec, RunOutcome]]:
        """The runs of one group (a row or line) and their outcomes.

        Args:
            group: the group's name.
        """
        return [(s, o) for s, o in self.pairs if s.group == group]


def _footer(ctx: Context) -> str:
    """Command, version, machine and run facts (their dates too) under every table."""
    ok = [o for _, o in ctx.pairs if o.ok]
    cfg = ok[0].config if ok else (ctx.pairs[0][1].config if ctx.pairs else {})
    unique = {o.key: o for _, o in ctx.pairs}
    failed = [o for o in unique.values() if not o.ok]
    run_time = sum(o.wall_time for o in unique.values())
    seeds = ctx.opts.run_seeds
    command = ctx.opts.command or _rebuild_command(ctx.name, ctx.opts)
    # every model the page's runs trained, in order of appearance (bench nm runs two)
    models = list(dict.fromkeys(str(o.config.get("model")) for o in ok)) or [str(cfg.get("model"))]
    lines = [
        "",
        f"- command: `{command}`",
        f"- library: feather-sparse {__version__}, torch {torch.__version__}",
        f"- machine: {machine_description(ctx.workers, cfg.get('threads') or 'default')}",
        f"- data and {plural(len(models), 'model')}: {cfg.get('dataset')}, "
        f"{', '.join(models)}; recipe "
        f"{cfg.get('recipe')}: {count(cfg.get('epochs'), 'epoch')}, batch {cfg.get('batch_size')}, "
        f"{cfg.get('optimizer')} lr {cfg.get('lr')}, weight decay {cfg.get('weight_decay')}, "
        f"gradient clipping {cfg.get('grad_clip') or 'none'}; "
        f"{plural(len(seeds), 'seed')} {', '.join(map(str, seeds))}",
        _runs_line(ctx, len(unique), run_time),
        _dates_line(list(unique.values())),
    ]
    lines.append(_numerics_line(ok))
    if failed:
        lines.append(
            f"- **{count(len(failed), 'run')} failed**: "
            + "; ".join(f"{o.name} (`{o.key}`): {o.error}" for o in failed[:5])
        )
    sessions = read_sessions(ctx.out)
    if sessions:
        trained = sum(int(s.get("trained", 0)) for s in sessions)
        seconds = sum(float(s.get("seconds", 0.0)) for s in sessions)
        stopped = sum(1 for s in sessions if s.get("interrupted"))
        lines.append(
            f"- sweep wall time: {seconds / 60:.1f} min in all, {count(trained, 'run')} trained "
            f"in {count(len(sessions), 'session')}"
            + (f" ({stopped} interrupted)" if stopped else "")
            + f" that wrote to this folder (`{SWEEP_LOG}`)"
        )
    if ctx.opts.suite is not None:
        lines.append(f"- suite `{ctx.opts.suite}`: {SUITES.get(ctx.opts.suite).rule}")
    if ctx.opts.quick:
        lines.append("- **--quick smoke run**: too short to mean anything; only checks the code")
    return "\n".join(lines) + "\n"


def _runs_line(ctx: Context, runs: int, run_time: float) -> str:
    """How many of the page's runs this command trained (alone or in a pool) and reused."""
    trained = ctx.executed + ctx.pooled
    line = (
        f"- runs: {runs} ({trained} trained by this command, {runs - trained} reused from "
        "earlier results)"
    )
    if ctx.pool is not None and ctx.pooled:
        pool_runs, seconds = ctx.pool
        return (
            line + f"; {ctx.pooled} of them trained together with the other experiments' runs "
            f"in one pool (`bench all`: {count(pool_runs, 'run')} trained in {seconds / 60:.1f} "
            f"min of wall time); summed run time of this page's runs {run_time / 60:.1f} min"
        )
    if ctx.pool is not None and not ctx.executed:  # bench all, and it trained none of them
        return line + f"; summed run time {run_time / 60:.1f} min"
    return (
        line + f"; summed run time {run_time / 60:.1f} min; this command's wall time "
        f"{ctx.elapsed / 60:.1f} min"
    )


#: The date at the start of a recorded time (``RunOutcome.started``, ``.finished``).
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _dates_line(outcomes: Sequence[RunOutcome]) -> str:
    """The days the page's runs were made, from what each run recorded (never today's
    date: a page made again from the same runs is the same file).

    Each run counts once; runs stored before their times were recorded are counted apart.
    """
    days = []
    unknown = 0
    for outcome in outcomes:
        ends = [_DATE.match(t) for t in (outcome.started, outcome.finished)]
        found = [m.group() for m in ends if m is not None]
        days += found
        unknown += not found
    older = (
        f"{count(unknown, 'run')} stored before feather-sparse recorded dates" if unknown else ""
    )
    if not days:
        return "- run dates: " + (f"not recorded ({older})" if older else "no runs")
    first, last = min(days), max(days)
    span = first if first == last else f"{first} to {last}"
    return f"- run dates (UTC): {span}" + (f"; {older}" if older else "")


def _numerics_line(outcomes: Sequence[RunOutcome]) -> str:
    """Which floating-point environments trained the page's runs (bold when more than one).

    A seed's run is bit-reproducible only within one environment (see
    :mod:`feather_sparse.provenance`): a page whose runs come from several,
    e.g. a runs folder reused on another machine, pairs runs that differ by
    more than the method. Each run counts once, however many cells show it;
    runs stored before the environment was recorded are counted apart.
    """
    runs = {o.key: o for o in outcomes}.values()
    if not runs:
        return "- numerics: no run finished"
    counts = Counter(o.numerics for o in runs if o.numerics)
    unknown = sum(1 for o in runs if not o.numerics)
    older = f"{count(unknown, 'run')} stored before feather-sparse recorded it" if unknown else ""
    if not counts:
        return f"- numerics: not recorded ({older})"
    if len(counts) == 1:
        (only,) = counts
        where = f"every run on {only}" if not unknown else f"{count(counts[only], 'run')} on {only}"
        return f"- numerics: {where}" + (f"; {older}" if older else "")
    parts = "; ".join(f"{n} × {name}" for name, n in counts.most_common())
    return (
        f"- **numerics: the runs come from {count(len(counts), 'floating-point environment')}** "
        f"({parts}{'; ' + older if older else ''}); a seed's runs are bit-comparable only "
        "within one, so a paired difference across them includes the machine's noise"
    )


def _set_text(value: Any) -> str:
    """A ``--set`` value as the command line reads it back to the same value.

    Overrides given from Python hold Python values, whose ``str()`` the command
    line misreads: ``True`` is fine but ``('fc', 'conv1')`` would split into
    ``"('fc'"`` and ``"'conv1')"``, and ``{'width': 2}`` is neither TOML nor JSON.
    Booleans are written ``true``/``false``, ``None`` ``none``, a mapping as JSON,
    a list or tuple as a TOML array; strings and numbers as they are.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, Mapping):
        return json.dumps(dict(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    return str(value)


def _rebuild_command(name: str, opts: BenchOptions) -> str:
    """The command line of these options: flags that differ from the defaults (or the suite's)."""
    args = ["feather-sparse", "bench", name]
    if opts.suite is not None:
        args += ["--suite", opts.suite]
        ref = BenchOptions(**SUITES.get(opts.suite).options_fields({})).for_experiment(name)
    else:
        from feather_sparse.bench.experiments import EXPERIMENTS  # they import this module

        # without --seeds the command line gives an experiment its own seeds (nm: 5)
        own = EXPERIMENTS.get(name).seeds if name in EXPERIMENTS else None
        ref = BenchOptions(
            recipe=DEFAULT_BENCH_RECIPE, seeds=own or DEFAULT_SEEDS, out=Path("results")
        )
    if opts.quick:
        args.append("--quick")
    if opts.recipe != ref.recipe:
        args += ["--recipe", opts.recipe]
    for key, value in opts.overrides.items():
        args += ["--set", f"{key}={_set_text(value)}"]
    if opts.seeds != ref.seeds:
        args += ["--seeds", ",".join(map(str, opts.seeds))]
    for flag, values, default in (
        ("--sparsities", opts.sparsities, ref.sparsities),
        ("--thetas", opts.thetas, ref.thetas),
        ("--ps", opts.ps, ref.ps),
    ):
        if values and tuple(values) != tuple(default or ()):
            args += [flag, ",".join(f"{v:g}" for v in values)]
    if opts.ablation_pattern and opts.ablation_pattern != ref.ablation_pattern:
        args += ["--ablation-pattern", opts.ablation_pattern]
    if opts.methods:
        args += ["--methods", ",".join(opts.methods)]
    if opts.out != ref.out:
        args += ["--out", str(opts.out)]
    # Every option in the runs' configs (their keys) or in where they are stored:
    # without them the printed command would plan other runs than the page's.
    if opts.threads != ref.threads:
        if opts.threads is not None:
            args += ["--threads", str(opts.threads)]
        elif "threads" not in opts.overrides:  # a suite's threads, unset: the recipe's
            threads = opts.base_config().threads
            args += ["--set", f"threads={'none' if threads is None else threads}"]
    if opts.runs_path != replace(ref, out=opts.out).runs_path:
        args += ["--runs-dir", str(opts.runs_path)]
    return shlex.join(args)


def record_session(
    out: Path,
    experiments: Sequence[str],
    trained: int,
    seconds: float,
    stopped_by: BaseException | None = None,
) -> None:
    """Append one training session (runs trained, wall time) to ``OUT/sweep.jsonl``.

    Args:
        out: the results folder.
        experiments: the experiments whose runs the session trained.
        trained: runs it finished.
        seconds: its wall time.
        stopped_by: the exception that stopped it before it finished its runs
            (Ctrl-C is ``KeyboardInterrupt``); the entry then has
            ``"interrupted": true`` and ``"error"`` (its type and first line).
    """
    out.mkdir(parents=True, exist_ok=True)
    entry: dict[str, Any] = {
        "experiments": list(experiments),
        "trained": trained,
        "seconds": round(seconds, 1),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if stopped_by is not None:
        message = str(stopped_by).strip().splitlines()
        entry["interrupted"] = True
        entry["error"] = type(stopped_by).__name__ + (f": {message[0]}" if message else "")
    with (out / SWEEP_LOG).open("a") as f:
        f.write(json.dumps(entry) + "\n")


def read_sessions(out: Path) -> list[dict[str, Any]]:
    """The sessions of ``OUT/sweep.jsonl`` (unreadable lines skipped)."""
    file = out / SWEEP_LOG
    if not file.is_file():
        return []
    sessions = []
    for line in file.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            sessions.append(entry)
    return sessions


def write_page(ctx: Context, title: str, body: str) -> Path:
    """Write ``OUT/<name>.md`` (title, body, footer) and ``OUT/<name>.json``; return the page.

    Args:
        ctx: the experiment's runs and options.
        title: the page's title.
        body: the experiment's Markdown (tables, figures) above the footer.
    """
    ctx.out.mkdir(parents=True, exist_ok=True)
    page = ctx.out / f"{ctx.name}.md"
    # Each file is whole, old or new (a sweep killed while writing leaves no half page).
    write_atomic(page, f"# {title}\n\n{body.rstrip()}\n{_footer(ctx)}".encode())
    raw = [
        {
            "group": s.group,
            "x": jsonable(s.x),
            "seed": s.seed,
            "key": o.key,
            "name": o.name,
            "ok": o.ok,
            "error": o.error,
            "test_accuracy": jsonable(o.test_accuracy),
            "sparsity": jsonable(o.sparsity),
            "dense_macs": o.dense_macs,
            "sparse_macs": o.sparse_macs,
            "wall_time": round(o.wall_time, 2),
            "epochs": o.epochs,
        }
        for s, o in ctx.pairs
    ]
    write_atomic(ctx.out / f"{ctx.name}.json", (json.dumps(raw, indent=1) + "\n").encode())
    return page
