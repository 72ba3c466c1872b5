"""Running experiments end to end: plan their runs, train the missing ones, write the pages."""

from __future__ import annotations

import time
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from feather_sparse.bench.experiments import EXPERIMENTS, Experiment
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import Context, record_session, write_page
from feather_sparse.bench.runner import ProgressFn, RunOutcome, RunSpec, execute_runs

__all__ = ["ExperimentResult", "plan_experiments", "run_experiment", "train_experiments"]


def plan_experiments(names: Sequence[str | Experiment], opts: BenchOptions) -> list[RunSpec]:
    """Every run of these experiments, each planned with its own options (``for_experiment``)."""
    specs = []
    for name in names:
        experiment: Experiment = EXPERIMENTS.get(name)
        planned = experiment.plan(opts.for_experiment(experiment.name))
        specs += [replace(s, experiment=experiment.name) for s in planned]
    return specs


def train_experiments(
    names: Sequence[str | Experiment],
    opts: BenchOptions,
    on_progress: ProgressFn | None = None,
    attempted: MutableMapping[str, RunOutcome] | None = None,
) -> tuple[int, float]:
    """Train the missing runs of several experiments in one pool; ``(runs trained, seconds)``.

    One pool over the union of their runs keeps every worker busy to the end
    (per experiment, the last runs of each would leave workers idle); the
    pages are then written from the stored results by :func:`run_experiment`.
    Pass the same ``attempted`` dict to those calls: a run that failed in the
    pool is then reported by them, not trained again (see :func:`execute_runs`).
    """
    specs = plan_experiments(names, opts)
    _, trained, elapsed = execute_runs(opts, specs, on_progress, attempted)
    if trained:
        record_session(opts.out, [EXPERIMENTS.get(n).name for n in names], trained, elapsed)
    return trained, elapsed


@dataclass(frozen=True)
class ExperimentResult:
    """What :func:`run_experiment` produced.

    Attributes:
        name: the experiment.
        page: the Markdown results page.
        figures: the PNG plots.
        runs: distinct runs in the experiment.
        trained: runs trained by this call (the rest were reused).
        failed: runs that raised.
        wall_time: seconds this call took, training and summary.
        failures: the outcomes of the runs that raised.
    """

    name: str
    page: Path
    figures: tuple[Path, ...]
    runs: int
    trained: int
    failed: int
    wall_time: float
    failures: tuple[RunOutcome, ...] = ()


def run_experiment(
    name: str | Experiment,
    opts: BenchOptions,
    on_progress: ProgressFn | None = None,
    pool: tuple[int, float] | None = None,
    attempted: MutableMapping[str, RunOutcome] | None = None,
) -> ExperimentResult:
    """Run (or continue) an experiment and write its page, plots and raw results.

    Args:
        name: a registered experiment name (``EXPERIMENTS.names()``) or an Experiment.
        opts: how to run it.
        on_progress: called after every finished run with ``(done, total, spec, outcome)``.
        pool: ``(runs trained, seconds)`` of a pool that trained this
            experiment's runs just before, with other experiments' (``bench
            all``); the page then names that pool instead of "0 trained".
        attempted: key -> outcome of the runs this command trained before
            (shared by its calls, and filled in by this one): they are taken
            as they are, so a run that failed earlier in the same command is
            reported, not trained again (see :func:`execute_runs`).

    Raises:
        ValueError: for an unknown experiment, method, model or data set, or an
            override of a field the experiment varies.
    """
    experiment: Experiment = EXPERIMENTS.get(name)
    started = time.perf_counter()
    opts = opts.for_experiment(experiment.name)
    specs = plan_experiments([experiment], opts)
    pairs, trained, elapsed = execute_runs(opts, specs, on_progress, attempted)
    if trained:
        record_session(opts.out, [experiment.name], trained, elapsed)
    ctx = Context(
        name=experiment.name,
        opts=opts,
        pairs=pairs,
        executed=trained,
        elapsed=elapsed,
        workers=opts.worker_count(),
        pool=pool if pool is not None and trained == 0 else None,
    )
    body, figures = experiment.summarize(ctx)
    title = f"{experiment.title} ({experiment.paper})"
    page = write_page(ctx, title, body)
    unique = {o.key: o for _, o in pairs}
    failures = tuple(o for o in unique.values() if not o.ok)
    return ExperimentResult(
        name=experiment.name,
        page=page,
        figures=tuple(figures),
        runs=len(unique),
        trained=trained,
        failed=len(failures),
        wall_time=time.perf_counter() - started,
        failures=failures,
    )
