"""The ``bench`` command family of the CLI: arguments in, :mod:`feather_sparse.bench` out."""

from __future__ import annotations

import argparse
import shlex
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

from feather_sparse._text import count
from feather_sparse.bench import (
    DEFAULT_BENCH_RECIPE,
    DEFAULT_SEEDS,
    EXPERIMENTS,
    BenchOptions,
    RunOutcome,
    RunSpec,
    run_experiment,
)
from feather_sparse.bench.claims import write_claims
from feather_sparse.bench.driver import plan_experiments, train_experiments
from feather_sparse.bench.experiments.base import GRID_OPTIONS
from feather_sparse.bench.experiments.compare import COMPARE_METHODS
from feather_sparse.bench.experiments.nm import NM_METHODS
from feather_sparse.bench.runner import TRACEBACK_FILE, check_data, plan_runs
from feather_sparse.bench.suites import SUITES
from feather_sparse.plots import require_matplotlib
from feather_sparse.recipes import list_recipes, parse_override

__all__ = ["add_arguments", "options_from_args", "run"]


_T = TypeVar("_T")


def _comma_list(text: str, convert: Callable[[str], _T], noun: str) -> tuple[_T, ...]:
    """``text``'s comma-separated values, each through ``convert``; ``noun`` names one in errors.

    Raises:
        argparse.ArgumentTypeError: for a value ``convert`` refuses, or no value at all.
    """
    try:
        values = tuple(convert(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {noun}s separated by commas, got {text!r}"
        ) from None
    if not values:  # an empty list would mean the default grid: say so instead
        raise argparse.ArgumentTypeError(
            f"expected at least one {noun}; leave the flag out for the default"
        )
    return values


def _floats(text: str) -> tuple[float, ...]:
    return _comma_list(text, float, "number")


def _ints(text: str) -> tuple[int, ...]:
    return _comma_list(text, int, "integer")


def _takers(field: str) -> str:
    """The experiments that take grid option ``field``, for ``--help``."""
    names = EXPERIMENTS.names()
    takers = [n for n in names if field in EXPERIMENTS.get(n).options]
    others = [n for n in names if n not in takers]
    return ", ".join(takers) if len(takers) <= len(others) else f"all but {', '.join(others)}"


def add_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    """``feather-sparse bench NAME``: the experiment, the scale, where results go.

    Args:
        command: the command's name, as :data:`feather_sparse.cli.COMMANDS` registers it.
        parser: the command's subparser, to add the arguments to.
    """
    parser.description = (
        "Reproduce the paper's tables and figures: each experiment trains a grid of runs and "
        "writes a Markdown table (mean ± std over seeds, best per column in bold) and PNG plots. "
        "Default scale: the bundled MNIST-1D with its 1-D CNN; --recipe cifar100 --model resnet20 "
        "--data-dir DATA for the paper's."
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    names = EXPERIMENTS.names()
    parser.epilog = (
        "experiments:\n"
        + "\n".join(
            f"  {e.name:<15} {e.title} ({e.paper})" for e in (EXPERIMENTS.get(n) for n in names)
        )
        + "\n\nsuites (--suite NAME; flags given explicitly override the suite's values):\n"
        + "\n".join(
            textwrap.fill(
                s.summary, width=79, initial_indent=f"  {s.name:<15} ", subsequent_indent=" " * 18
            )
            for s in map(SUITES.get, SUITES.names())
        )
    )
    parser.add_argument(
        "experiment",
        choices=[*names, "all", "claims"],
        metavar="EXPERIMENT",
        help="|".join(names) + "|all, or claims: where the paper's claims stand on the "
        "stored results in --out (trains nothing)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="CI-sized smoke run: 2 epochs, one seed, one sparsity (not with --suite)",
    )
    parser.add_argument(
        "--suite",
        choices=SUITES.names(),
        default=None,
        help="a named sweep: recipe, seeds, sparsities, output folder and jobs (see below); "
        "with 'all', the suite's experiments",
    )
    scale = parser.add_argument_group("scale (every run)")
    scale.add_argument(
        "--recipe", default=None, help=f"training recipe (name or .toml) [{DEFAULT_BENCH_RECIPE}]"
    )
    scale.add_argument(
        "--data", default=None, help="data set (a recipe of that name is used if there is one)"
    )
    scale.add_argument("--model", default=None, help="registered model name")
    scale.add_argument("--data-dir", default=None, help="where the data set lives")
    scale.add_argument("--epochs", type=int, default=None, help="training epochs")
    scale.add_argument("--batch-size", type=int, default=None, help="training batch size")
    scale.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:N")
    scale.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="any other recipe field for every run (repeatable)",
    )
    grid = parser.add_argument_group(
        "grid (an experiment refuses a grid flag it has no use for; 'all' gives each its own)"
    )
    grid.add_argument("--seeds", type=_ints, default=None, help="seeds [0,1,2]")
    grid.add_argument(
        "--sparsities",
        type=_floats,
        default=None,
        help=f"sparsity columns [0.9,0.95,0.98,0.99] ({_takers('sparsities')})",
    )
    grid.add_argument(
        "--thetas",
        type=_floats,
        default=None,
        help=f"θ values ({_takers('thetas')})",
    )
    grid.add_argument("--ps", type=_floats, default=None, help=f"p values ({_takers('ps')})")
    grid.add_argument(
        "--ablation-pattern",
        default=None,
        help="N:M pattern of the nm experiment's θ and p ablations [2:4]",
    )
    grid.add_argument(
        "--methods",
        default=None,
        help=f"run only these (comma-separated): compare's {','.join(COMPARE_METHODS)}; "
        f"nm's {','.join(NM_METHODS)}",
    )
    run = parser.add_argument_group("running")
    run.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="parallel runs [usable cores // threads per run; 1 on a GPU]",
    )
    run.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads per run [the recipe's]"
    )
    run.add_argument("--out", default=None, help="folder of tables and plots [results]")
    run.add_argument("--runs-dir", default=None, help="folder of the runs [OUT/runs]")
    run.add_argument("--force", action="store_true", help="re-run runs that have results")
    run.add_argument(
        "--plan",
        action="store_true",
        help="check the data and print how many runs the command would train, how many "
        "are stored and about how long the rest takes; train nothing",
    )


#: The flags ``bench claims`` reads (it trains nothing: it would ignore every other one).
_CLAIMS_FLAGS = ("suite", "out", "runs_dir")
#: Parsed arguments that are not ``bench`` flags (the command, the log level).
_NOT_FLAGS = ("experiment", "command", "verbose", "command_verbose")
#: What each grid option sets, for the messages.
_GRID_NOUNS = {
    "sparsities": "sparsity columns",
    "thetas": "θ values to set",
    "ps": "p values to set",
    "ablation_pattern": "N:M ablations",
    "methods": "methods to choose from",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _given(args: argparse.Namespace, names: Sequence[str]) -> list[str]:
    """The flags of ``names`` that the command line gives (not left at their defaults)."""
    return [n for n in names if getattr(args, n, None) not in (None, False, [])]


def _grid_given(args: argparse.Namespace) -> dict[str, Any]:
    """The grid options the command line gives, as :class:`BenchOptions` values."""
    given: dict[str, Any] = {n: getattr(args, n) for n in _given(args, list(GRID_OPTIONS))}
    if "methods" in given:
        given["methods"] = tuple(m.strip() for m in given["methods"].split(",") if m.strip())
        if not given["methods"]:  # an empty list would mean every method
            raise ValueError("--methods: give at least one method; leave it out for all")
    return given


def _refuse_ignored(args: argparse.Namespace) -> None:
    """Refuse the flags that the command would accept and then ignore (grid flags aside)."""
    if args.experiment == "claims":
        flags = [n for n in vars(args) if n not in _CLAIMS_FLAGS + _NOT_FLAGS]
        ignored = _given(args, flags)
        if ignored:
            raise ValueError(
                f"{', '.join(map(_flag, ignored))}: `bench claims` reads the stored results "
                "and trains nothing, so it would ignore "
                + ("them" if len(ignored) > 1 else "it")
                + "; give only --suite, --out and --runs-dir (the folders to read)"
            )
        return
    if args.quick and args.suite is not None:
        suite = SUITES.get(args.suite)
        raise ValueError(
            f"--quick with --suite {suite.name}: a suite is a fixed sweep (its recipe, seeds, "
            f"sparsities and folder {suite.fields.get('out', 'results')}) that --quick would "
            "cut to a smoke run whose pages replace the suite's; drop --quick, or drop "
            "--suite for a smoke run"
            + (
                f" (of the suite's recipe: --quick --recipe {suite.fields['recipe']})"
                if "recipe" in suite.fields
                else ""
            )
        )
    if args.quick and args.seeds is not None and len(args.seeds) > 1:
        raise ValueError(
            f"--quick runs one seed, and --seeds gives {len(args.seeds)} "
            f"({','.join(map(str, args.seeds))}): give one seed, or drop --quick for a full run"
        )


def _grid_fit(
    names: Sequence[str], given: Mapping[str, Any], command: str
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Which grid options each experiment of the command takes: ``(changes, notes)``.

    A given grid option that none of ``names`` takes is refused. With several
    experiments (``bench all``), an option that only some take is cleared for
    the others (``changes``: per-experiment fields, so that each page's command
    is the one that made it) and named in a note; ``--methods`` goes to each
    experiment as the methods of its own that it names.

    Raises:
        ValueError: for a grid option that no experiment of the command takes,
            or ``--methods`` naming an unknown method or none of an experiment's.
    """
    experiments = [EXPERIMENTS.get(n) for n in names]
    changes: dict[str, dict[str, Any]] = {}
    notes = []
    for field in given:
        flag, noun = GRID_OPTIONS[field], _GRID_NOUNS[field]
        takers = [e.name for e in experiments if field in e.options]
        others = [e for e in experiments if field not in e.options]
        if not takers:
            elsewhere = [e for e in EXPERIMENTS.names() if field in EXPERIMENTS.get(e).options]
            if len(experiments) == 1:
                (only,) = experiments
                why = only.why_not.get(field)
                what = f"experiment {only.name} has no {noun}" + (f" ({why})" if why else "")
            else:
                what = f"none of the experiments of `{command}` ({', '.join(names)}) has {noun}"
            raise ValueError(
                f"{flag}: {what}, so it would ignore {flag}; drop it, or run an experiment "
                f"that takes it: {', '.join(elsewhere)}"
            )
        if not others:
            continue
        notes.append(
            f"note: {flag} applies to {', '.join(takers)} only "
            f"({', '.join(e.name for e in others)}: no {noun})"
        )
        for e in others:
            changes.setdefault(e.name, {})[field] = None
    if "methods" in given and len(experiments) > 1:
        takers_of = [e for e in experiments if "methods" in e.options]
        named = given["methods"]
        unknown = [m for m in named if not any(m in e.methods for e in takers_of)]
        if unknown:
            raise ValueError(
                f"--methods {', '.join(unknown)}: not a method of "
                + " or ".join(f"{e.name} ({', '.join(e.methods)})" for e in takers_of)
            )
        for e in takers_of:
            mine = tuple(m for m in named if m in e.methods)
            if not mine:
                raise ValueError(
                    f"--methods {','.join(named)} names none of {e.name}'s methods "
                    f"({', '.join(e.methods)}), and `{command}` runs {e.name} too: add some "
                    "of them, or run the experiments one at a time "
                    "(`bench EXPERIMENT --methods ...`)"
                )
            changes.setdefault(e.name, {})["methods"] = mine
    return changes, notes


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """The :class:`BenchOptions` of a parsed ``bench`` command line.

    Args:
        args: the parsed command line.

    Raises:
        ValueError: for a flag that the command would accept and then ignore
            (see :func:`_refuse_ignored` and :func:`_grid_fit`), or a bad value.
    """
    _refuse_ignored(args)
    overrides: dict[str, Any] = {}
    for text in args.set:
        key, value = parse_override(text)
        overrides[key] = value
    recipe = args.recipe
    if args.data is not None:
        overrides["dataset"] = args.data
        if recipe is None and args.data in list_recipes():
            recipe = args.data
    for key in ("model", "data_dir", "epochs", "batch_size", "device"):
        value = getattr(args, key)
        if value is not None:
            overrides[key] = value
    grid = _grid_given(args)
    # The flags given: they override a suite's values, and the defaults apply to the rest.
    given: dict[str, Any] = {
        "recipe": recipe,
        "seeds": tuple(args.seeds) if args.seeds is not None else None,
        "sparsities": args.sparsities,
        "jobs": args.jobs,
        "threads": args.threads,
        "out": Path(args.out) if args.out is not None else None,
        "runs_dir": Path(args.runs_dir) if args.runs_dir else None,
    }
    explicit = {k: v for k, v in given.items() if v is not None}
    fields: dict[str, Any] = {"recipe": DEFAULT_BENCH_RECIPE, "seeds": DEFAULT_SEEDS}
    if args.suite is not None:
        fields.update(SUITES.get(args.suite).options_fields(explicit))
    else:
        fields.update(explicit)
        if "seeds" not in explicit:  # experiments with seeds of their own (nm: 5)
            fields["per_experiment"] = {
                e.name: {"seeds": e.seeds}
                for e in map(EXPERIMENTS.get, EXPERIMENTS.names())
                if e.seeds is not None
            }
    if args.experiment != "claims":
        changes, _ = _grid_fit(_experiment_names(args), grid, _command_name(args))
        per_experiment = {k: dict(v) for k, v in fields.get("per_experiment", {}).items()}
        for name, values in changes.items():
            per_experiment.setdefault(name, {}).update(values)
        fields["per_experiment"] = per_experiment
    return BenchOptions(
        overrides=overrides,
        thetas=args.thetas,
        ps=args.ps,
        ablation_pattern=args.ablation_pattern,
        methods=grid.get("methods"),
        quick=args.quick,
        force=args.force,
        **fields,
    )


def _command_name(args: argparse.Namespace) -> str:
    return f"bench {args.experiment}" + (f" --suite {args.suite}" if args.suite else "")


def _experiment_names(args: argparse.Namespace) -> list[str]:
    if args.experiment != "all":
        return [args.experiment]
    if args.suite is not None:
        return list(SUITES.get(args.suite).experiments)
    return EXPERIMENTS.names()


def _progress(done: int, total: int, spec: RunSpec, outcome: RunOutcome) -> None:
    """One line per finished run, e.g. ``[17/240] compare GMP s=0.99 seed 3: top-1 ...``."""
    status = (
        f"top-1 {100 * outcome.test_accuracy:.2f} %, sparsity {100 * outcome.sparsity:.2f} %"
        if outcome.ok
        else f"FAILED: {outcome.error}"
    )
    if spec.group == "dense":
        cell = f"{spec.group} seed {spec.seed}"
    elif "pattern" in spec.settings:  # N:M runs: the pattern (and model) name the cell
        where = " ".join(str(spec.settings[k]) for k in ("pattern", "model") if k in spec.settings)
        cell = f"{spec.group} {where} seed {spec.seed}"
    else:
        cell = f"{spec.group} s={spec.x:g} seed {spec.seed}"
    print(
        f"[{done}/{total}] {spec.experiment} {cell}: {status} ({outcome.wall_time:.1f} s)",
        file=sys.stderr,
        flush=True,
    )


def _announce(names: list[str], opts: BenchOptions, file: TextIO | None = None) -> None:
    """Check the data, then print how many runs there are to train (and a time estimate),
    to ``file`` (standard error by default: the line that starts a sweep)."""
    plan = plan_runs(opts, plan_experiments(names, opts))
    check_data(list(plan.todo.values()))
    todo = len(plan.todo)
    workers = min(opts.worker_count(), max(1, todo))
    threads = opts.base_config().threads or "default"
    what = f"suite {opts.suite}: " if opts.suite else ""
    line = (
        f"{what}{', '.join(names)}: {count(plan.distinct, 'distinct run')}, "
        f"{len(plan.stored)} stored, {todo} to train in {count(workers, 'process')} × "
        f"{count(threads, 'thread')}"
    )
    times = [o.wall_time for o in plan.stored.values() if o.ok]
    if todo and times:
        mean = sum(times) / len(times)
        minutes = mean * todo / workers / 60
        line += f"; about {minutes:.0f} min at the stored runs' {mean:.1f} s a run"
    print(line, file=sys.stderr if file is None else file, flush=True)


def run(command: str, args: argparse.Namespace) -> int:
    """Run ``feather-sparse bench``; prints one line per finished run and the pages written.

    Args:
        command: ``"bench"``.
        args: the parsed command line.

    With ``--plan``, only checks the data and prints the plan (runs to train,
    stored, a time estimate from the stored runs' times).

    Returns:
        The process exit code (130 when Ctrl-C stopped it).
    """
    opts = options_from_args(args)
    if args.experiment == "claims":
        argv = ["feather-sparse", "bench", "claims"]
        argv += ["--suite", opts.suite] if opts.suite else []
        argv += ["--out", str(opts.out), "--runs-dir", str(opts.runs_path)]
        page = write_claims(opts.out, opts.runs_path, shlex.join(argv))
        print(f"claims -> {page}")
        return 0
    names = _experiment_names(args)
    for note in _grid_fit(names, _grid_given(args), _command_name(args))[1]:
        print(note, file=sys.stderr)
    if args.plan:  # the sweep's first line, and nothing trained
        _announce(names, opts, sys.stdout)
        return 0
    try:
        return _run(names, opts)
    except KeyboardInterrupt:
        print(
            f"\nstopped; the finished runs are stored in {opts.runs_path}: "
            "run the same command again to continue",
            file=sys.stderr,
        )
        return 130


def _run(names: list[str], opts: BenchOptions) -> int:
    require_matplotlib()  # the pages' figures need it: say so before the plan line
    _announce(names, opts)
    pool: tuple[int, float] | None = None
    # Every run this command trains, failed or not: a later experiment of the
    # same command that shares a run takes it as it is (a failed run is
    # reported, not trained again; the next command retries it).
    attempted: dict[str, RunOutcome] = {}
    if len(names) > 1:
        pool = train_experiments(names, opts, _progress, attempted)
        trained, elapsed = pool
        print(
            f"all: {count(trained, 'run')} trained in one pool in {elapsed / 60:.1f} min"
            if trained
            else "all: nothing to train, every run was stored already"
        )
    failures: dict[str, RunOutcome] = {}
    for name in names:
        result = run_experiment(name, opts, _progress, pool, attempted)
        failures.update((o.key, o) for o in result.failures)
        print(
            f"{name}: {count(result.runs, 'run')} ({result.trained + result.pooled} trained, "
            f"{result.failed} failed) in {result.wall_time / 60:.1f} min -> {result.page}"
        )
    for key, outcome in failures.items():  # the run's folder is the one of its traceback
        print(
            f"failed run {outcome.name}: {outcome.error} "
            f"(traceback: {opts.runs_path / key / TRACEBACK_FILE})",
            file=sys.stderr,
        )
    return 1 if failures else 0
