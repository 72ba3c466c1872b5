"""``bench operator`` (the paper's Fig. 2): hard, soft and Feather operators with the plain STE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from feather_sparse.bench.experiments.base import (
    PAPER_SPARSITIES,
    Experiment,
    accuracy,
    accuracy_tables,
    accuracy_vs_sparsity_plot,
    cells,
    recipe_p,
)
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import Context, Grid, img
from feather_sparse.bench.runner import RunSpec
from feather_sparse.ops import OPERATORS, ThresholdOperator

__all__ = ["EXPERIMENT", "OPERATOR_ROWS"]

#: ``operator``'s rows: thresholding operators with the plain STE (θ = 1, Fig. 2).
OPERATOR_ROWS: dict[str, dict[str, Any]] = {
    "hard": {"method": "feather", "operator": "hard", "theta": 1.0},
    "soft": {"method": "feather", "operator": "soft", "theta": 1.0},
    "Feather (p = 3)": {"method": "feather", "operator": "feather", "theta": 1.0},
}


#: The row the other operators are compared with, seed by seed: Feather's own.
REFERENCE = "Feather (p = 3)"


def _own_p(operator: str) -> float:
    """The power of a thresholding operator of the registry (∞ hard, 1 soft, 3 Feather's)."""
    op = OPERATORS.get(operator)
    if not isinstance(op, ThresholdOperator):
        raise TypeError(f"operator {operator!r} is not a thresholding operator: it has no p")
    return op.p


def plan(opts: BenchOptions) -> list[RunSpec]:
    rows = OPERATOR_ROWS
    if recipe_p(opts) is not None:  # or the Feather row trains that p under "p = 3"
        rows = {name: {**row, "p": _own_p(row["operator"])} for name, row in rows.items()}
    return cells(opts, rows, opts.sparsity_grid(PAPER_SPARSITIES))


def summarize(ctx: Context) -> tuple[str, list[Path]]:
    acc = Grid(ctx.pairs, accuracy, list(OPERATOR_ROWS))
    fig = accuracy_vs_sparsity_plot(ctx, acc, "Thresholding operator, plain STE (θ = 1)")
    body = (
        "Thresholding operator ablation, no gradient scaling (θ = 1 for all), global "
        "backbone. Top-1 accuracy (%), mean ± std over seeds; best per column in bold.\n\n"
        + accuracy_tables(acc, "operator", REFERENCE, f"the {REFERENCE} operator")
        + img(fig, "accuracy vs sparsity per operator")
    )
    return body, [fig]


EXPERIMENT = Experiment(
    "operator",
    "Thresholding operator",
    "Fig. 2",
    plan,
    summarize,
    why_not={"thetas": "every operator trains with θ = 1, the plain STE"},
)
