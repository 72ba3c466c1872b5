"""The ``bench`` command family of the CLI: arguments in, :mod:`feather_sparse.bench` out."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from feather_sparse.bench import (
    DEFAULT_BENCH_RECIPE,
    DEFAULT_SEEDS,
    EXPERIMENTS,
    BenchOptions,
    RunOutcome,
    RunSpec,
    execute_runs,
    run_experiment,
)
from feather_sparse.bench.experiments.compare import COMPARE_METHODS
from feather_sparse.recipes import list_recipes, parse_override

__all__ = ["add_arguments", "options_from_args", "run"]


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, got {text!r}"
        ) from None


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas, got {text!r}"
        ) from None


def add_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    """``feather-sparse bench NAME``: the experiment, the scale, where results go."""
    parser.description = (
        "Reproduce the paper's tables and figures: each experiment trains a grid of runs and "
        "writes a Markdown table (mean ± std over seeds, best per column in bold) and PNG plots. "
        "Default scale: the bundled MNIST-1D with its 1-D CNN; --recipe cifar100 --model resnet20 "
        "--data-dir DATA for the paper's."
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    names = EXPERIMENTS.names()
    parser.epilog = "experiments:\n" + "\n".join(
        f"  {e.name:<15} {e.title} ({e.paper})" for e in (EXPERIMENTS.get(n) for n in names)
    )
    parser.add_argument(
        "experiment", choices=[*names, "all"], metavar="EXPERIMENT", help="|".join(names) + "|all"
    )
    parser.add_argument("--quick", action="store_true", help="CI-sized smoke run")
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
    grid = parser.add_argument_group("grid")
    grid.add_argument("--seeds", type=_ints, default=DEFAULT_SEEDS, help="seeds [0,1,2]")
    grid.add_argument(
        "--sparsities", type=_floats, default=None, help="sparsity columns [0.9,0.95,0.98,0.99]"
    )
    grid.add_argument("--thetas", type=_floats, default=None, help="θ values (theta experiments)")
    grid.add_argument("--ps", type=_floats, default=None, help="p values (p experiment)")
    grid.add_argument(
        "--methods",
        default=None,
        help=f"compare only these (comma-separated): {','.join(COMPARE_METHODS)}",
    )
    run = parser.add_argument_group("running")
    run.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="parallel runs [usable cores // threads per run; 1 on a GPU]",
    )
    run.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads per run [the recipe's]"
    )
    run.add_argument("--out", default="results", help="folder of tables and plots [results]")
    run.add_argument("--runs-dir", default=None, help="folder of the runs [OUT/runs]")
    run.add_argument("--force", action="store_true", help="re-run runs that have results")


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """The :class:`BenchOptions` of a parsed ``bench`` command line."""
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
    methods = tuple(m.strip() for m in args.methods.split(",")) if args.methods else None
    return BenchOptions(
        recipe=recipe or DEFAULT_BENCH_RECIPE,
        overrides=overrides,
        seeds=tuple(args.seeds),
        sparsities=args.sparsities,
        thetas=args.thetas,
        ps=args.ps,
        methods=methods,
        quick=args.quick,
        jobs=args.jobs,
        threads=args.threads,
        out=Path(args.out),
        runs_dir=Path(args.runs_dir) if args.runs_dir else None,
        force=args.force,
    )


def run(command: str, args: argparse.Namespace) -> int:
    """Run ``feather-sparse bench``; prints one line per finished run and the pages written."""
    opts = options_from_args(args)
    names = EXPERIMENTS.names() if args.experiment == "all" else [args.experiment]

    def progress(done: int, total: int, spec: RunSpec, outcome: RunOutcome) -> None:
        status = (
            f"top-1 {100 * outcome.test_accuracy:.2f} %, sparsity {100 * outcome.sparsity:.2f} %"
            if outcome.ok
            else f"FAILED: {outcome.error}"
        )
        print(
            f"[{done}/{total}] {spec.group} @ {spec.x:g} seed {spec.seed}: {status} "
            f"({outcome.wall_time:.1f} s)",
            file=sys.stderr,
            flush=True,
        )

    pool: tuple[int, float] | None = None
    if len(names) > 1:
        # One pool over the union of every experiment's runs keeps all cores busy
        # to the end; the pages are then written from the stored results.
        specs = [spec for name in names for spec in EXPERIMENTS.get(name).plan(opts)]
        _, trained, elapsed = execute_runs(opts, specs, progress)
        print(f"all: {trained} runs trained in {elapsed / 60:.1f} min")
        pool = (trained, elapsed) if trained else None
    failed = 0
    for name in names:
        result = run_experiment(name, opts, progress, pool)
        failed += result.failed
        print(
            f"{name}: {result.runs} runs ({result.trained} trained, {result.failed} failed) in "
            f"{result.wall_time / 60:.1f} min -> {result.page}"
        )
    return 1 if failed else 0
