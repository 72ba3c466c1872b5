"""Running an experiment end to end: plan its runs, train the missing ones, write its page."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from feather_sparse.bench.experiments import EXPERIMENTS, Experiment
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import Context, write_page
from feather_sparse.bench.runner import ProgressFn, execute_runs

__all__ = ["ExperimentResult", "run_experiment"]


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
    """

    name: str
    page: Path
    figures: tuple[Path, ...]
    runs: int
    trained: int
    failed: int
    wall_time: float


def run_experiment(
    name: str | Experiment,
    opts: BenchOptions,
    on_progress: ProgressFn | None = None,
    pool: tuple[int, float] | None = None,
) -> ExperimentResult:
    """Run (or continue) an experiment and write its page, plots and raw results.

    Args:
        name: a registered experiment name (``EXPERIMENTS.names()``) or an Experiment.
        opts: how to run it.
        on_progress: called after every finished run with ``(done, total, spec, outcome)``.
        pool: ``(runs trained, seconds)`` of a pool that trained this
            experiment's runs just before, with other experiments' (``bench
            all``); the page then names that pool instead of "0 trained".

    Raises:
        ValueError: for an unknown experiment, method, model or data set, or an
            override of a field the experiment varies.
    """
    experiment: Experiment = EXPERIMENTS.get(name)
    started = time.perf_counter()
    specs = experiment.plan(opts)
    pairs, trained, elapsed = execute_runs(opts, specs, on_progress)
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
    return ExperimentResult(
        name=experiment.name,
        page=page,
        figures=tuple(figures),
        runs=len(unique),
        trained=trained,
        failed=sum(not o.ok for o in unique.values()),
        wall_time=time.perf_counter() - started,
    )
