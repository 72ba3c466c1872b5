"""The former home of ``feather-sparse bench``, kept as an import path; see :mod:`.bench`.

Every name this module used to define is re-exported from where it lives
now: the sweep in :mod:`feather_sparse.bench`, the argument parsing in
:mod:`feather_sparse.cli.bench`.
"""

from __future__ import annotations

from feather_sparse.bench import (
    DEFAULT_BENCH_RECIPE,
    DEFAULT_SEEDS,
    EXPERIMENTS,
    BenchOptions,
    Context,
    Experiment,
    ExperimentResult,
    Grid,
    RunOutcome,
    RunSpec,
    execute_runs,
    machine_description,
    run_experiment,
    run_key,
)
from feather_sparse.bench.experiments.backbones import BACKBONE_ROWS
from feather_sparse.bench.experiments.base import DENSE, PAPER_SPARSITIES, PAPER_THETAS
from feather_sparse.bench.experiments.compare import COMPARE_METHODS
from feather_sparse.bench.experiments.flops import FLOPS_ROWS
from feather_sparse.bench.experiments.operator import OPERATOR_ROWS
from feather_sparse.bench.experiments.p import PAPER_PS
from feather_sparse.bench.experiments.stability import STABILITY_SPARSITY
from feather_sparse.bench.experiments.theta_operator import (
    THETA_OPERATOR_SPARSITIES,
    THETA_OPERATOR_THETAS,
)
from feather_sparse.bench.options import (
    BENCH_OVERRIDES,
    QUICK_OVERRIDES,
    QUICK_SPARSITIES,
)
from feather_sparse.bench.runner import OUTCOME_FORMAT, ProgressFn
from feather_sparse.cli.bench import add_arguments as add_cli_arguments
from feather_sparse.cli.bench import options_from_args
from feather_sparse.cli.bench import run as run_cli

__all__ = [
    "BACKBONE_ROWS",
    "BENCH_OVERRIDES",
    "COMPARE_METHODS",
    "DEFAULT_BENCH_RECIPE",
    "DEFAULT_SEEDS",
    "DENSE",
    "EXPERIMENTS",
    "FLOPS_ROWS",
    "OPERATOR_ROWS",
    "OUTCOME_FORMAT",
    "PAPER_PS",
    "PAPER_SPARSITIES",
    "PAPER_THETAS",
    "QUICK_OVERRIDES",
    "QUICK_SPARSITIES",
    "STABILITY_SPARSITY",
    "THETA_OPERATOR_SPARSITIES",
    "THETA_OPERATOR_THETAS",
    "BenchOptions",
    "Context",
    "Experiment",
    "ExperimentResult",
    "Grid",
    "ProgressFn",
    "RunOutcome",
    "RunSpec",
    "add_cli_arguments",
    "execute_runs",
    "machine_description",
    "options_from_args",
    "run_cli",
    "run_experiment",
    "run_key",
]
