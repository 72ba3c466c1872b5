"""The paper's experiments, one command each: ``feather-sparse bench <name>``.

Glentis Georgoulakis, Retsinas & Maragos, "Feather: An Elegant Solution to
Effective DNN Sparsification", BMVC 2023. Each experiment is a grid of
training runs of :func:`feather_sparse.train.train` (the same code path as
``feather-sparse train``), summarised as Markdown tables (mean ± std over
seeds, best per column in bold, with the command, library version and machine
underneath) and PNG plots. The experiments are listed in
:mod:`feather_sparse.bench.experiments`.

By default everything runs on the bundled data (MNIST-1D, the ``mnist1d``
recipe); ``--recipe cifar100 --model resnet20 --data-dir DATA`` (or
``--data cifar100``) runs the paper's scale. ``--quick`` is a CI-sized smoke
run.

Runs are independent processes (``--jobs``), and each run's outcome is kept
as ``RUNS_DIR/<key>/result.json``, keyed by a hash of the run's whole config:
an interrupted sweep continues where it stopped, and experiments that share a
run (``theta`` and ``stability`` at the same θ and sparsity) train it once.
The key's readable prefix names only the method, sparsity and seed
(``feather-s0.95-seed0-<hash>`` for each of ``operator``'s hard, soft and
Feather runs); people are shown the run's name, which says what it is
(``feather operator=hard theta=1 s=0.95 seed 0``, :func:`run_name`) in the
failed-run lines of the console and of the page, and beside each key in
``OUT/<experiment>.json``.
Every run also records its mask stability, per-layer sparsity and FLOPs, so
any experiment can be summarised from any run.

The flow, one module per step::

    suites (named presets) -> options (BenchOptions) -> experiments/<name>.plan
        -> runner (check the data, train, store) -> experiments/<name>.summarize
        -> pages (tables, paired differences from stats, footer, files)

``driver.run_experiment`` runs those steps for one experiment and
``driver.train_experiments`` trains several experiments' runs in one pool;
``claims`` reads a finished folder back and sets the paper's claims against it.
``feather_gmp`` is the bench's one method of its own.
"""

from __future__ import annotations

from feather_sparse.bench.driver import ExperimentResult, run_experiment
from feather_sparse.bench.experiments import EXPERIMENTS, Experiment
from feather_sparse.bench.options import DEFAULT_BENCH_RECIPE, DEFAULT_SEEDS, BenchOptions
from feather_sparse.bench.pages import Context, Grid, machine_description
from feather_sparse.bench.runner import RunOutcome, RunSpec, execute_runs, run_key, run_name

__all__ = [
    "DEFAULT_BENCH_RECIPE",
    "DEFAULT_SEEDS",
    "EXPERIMENTS",
    "BenchOptions",
    "Context",
    "Experiment",
    "ExperimentResult",
    "Grid",
    "RunOutcome",
    "RunSpec",
    "execute_runs",
    "machine_description",
    "run_experiment",
    "run_key",
    "run_name",
]
