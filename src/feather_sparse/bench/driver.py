"""Running experiments end to end: plan their runs, train the missing ones, write the pages."""

from __future__ import annotations

import time
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from feather_sparse.bench.experiments import EXPERIMENTS, Experiment
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import Context, record_session, write_page
from feather_sparse.bench.runner import ProgressFn, RunOutcome, RunSpec, StopFn, execute_runs
from feather_sparse.plots import require_matplotlib

__all__ = ["ExperimentResult", "plan_experiments", "run_experiment", "train_experiments"]


def plan_experiments(names: Sequence[str | Experiment], opts: BenchOptions) -> list[RunSpec]:
    """Every run of these experiments, each planned with its own options (``for_experiment``).

    Args:
        names: the experiments, by name or as objects.
        opts: the bench options.
    """
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

    Args:
        names: the experiments, by name or as objects.
        opts: the bench options.
        on_progress: called after each run trained (see :func:`execute_runs`).
        attempted: outcomes of runs already trained by this command (read and added to).

    Raises:
        ImportError: when matplotlib is missing (the pages' figures need it),
            before any run trains.
    """
    specs = plan_experiments(names, opts)
    experiments = [EXPERIMENTS.get(n).name for n in names]
    require_matplotlib()  # the pages' figures: fail now, not after the last run
    _, trained, elapsed = execute_runs(
        opts, specs, on_progress, attempted, _log_stopped(opts.out, experiments)
    )
    if trained:
        record_session(opts.out, experiments, trained, elapsed)
    return trained, elapsed


def _log_stopped(out: Path, experiments: Sequence[str]) -> StopFn:
    """What :func:`execute_runs` calls when its training stops on an exception:
    the session goes into ``OUT/sweep.jsonl`` marked interrupted, with the runs
    it finished, so that the folder's wall-time account keeps the time spent."""

    def log(trained: int, seconds: float, err: BaseException) -> None:
        record_session(out, experiments, trained, seconds, stopped_by=err)

    return log


@dataclass(frozen=True)
class ExperimentResult:
    """What :func:`run_experiment` produced.

    Attributes:
        name: the experiment.
        page: the Markdown results page.
        figures: the PNG plots.
        runs: distinct runs in the experiment.
        trained: runs trained by this call.
        failed: runs that raised.
        wall_time: seconds this call took, training and summary.
        failures: the outcomes of the runs that raised.
        pooled: runs trained just before by the pool of the same command
            (``bench all``); the rest (``runs - trained - pooled``) were reused.
    """

    name: str
    page: Path
    figures: tuple[Path, ...]
    runs: int
    trained: int
    failed: int
    wall_time: float
    failures: tuple[RunOutcome, ...] = ()
    pooled: int = 0


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
        pool: ``(runs trained, seconds)`` of the pool that trained the runs
            of several experiments just before (:func:`train_experiments`,
            ``bench all``), given with the same ``attempted``: the page counts
            its runs that the pool trained and names the pool.
        attempted: key -> outcome of the runs this command trained before
            (shared by its calls, and filled in by this one): they are taken
            as they are, so a run that failed earlier in the same command is
            reported, not trained again (see :func:`execute_runs`).

    Raises:
        ValueError: for an unknown experiment, method, model or data set, an
            override of a field the experiment varies, or a ``pool`` without
            ``attempted`` (the page could not tell the pool's runs from reused ones).
        ImportError: when matplotlib is missing (the page's figures need it),
            before any run trains.
    """
    experiment: Experiment = EXPERIMENTS.get(name)
    if pool is not None and attempted is None:
        raise ValueError(
            "pool: pass the `attempted` dict that train_experiments filled too, so that the "
            "page can tell the runs the pool trained from the ones reused from earlier results"
        )
    started = time.perf_counter()
    opts = opts.for_experiment(experiment.name)
    specs = plan_experiments([experiment], opts)
    require_matplotlib()  # its page's figures: fail now, not after the last run
    before = set(attempted or ())  # the runs this command trained before this call
    pairs, trained, elapsed = execute_runs(
        opts, specs, on_progress, attempted, _log_stopped(opts.out, [experiment.name])
    )
    if trained:
        record_session(opts.out, [experiment.name], trained, elapsed)
    unique = {o.key: o for _, o in pairs}
    pooled = len(before & set(unique)) if pool is not None else 0
    ctx = Context(
        name=experiment.name,
        opts=opts,
        pairs=pairs,
        executed=trained,
        elapsed=elapsed,
        workers=opts.worker_count(),
        pool=pool,
        pooled=pooled,
    )
    body, figures = experiment.summarize(ctx)
    title = f"{experiment.title} ({experiment.paper})"
    page = write_page(ctx, title, body)
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
        pooled=pooled,
    )
