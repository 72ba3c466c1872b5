"""``bench theta-operator`` (the paper's Fig. 4): θ under each operator at high sparsity."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from feather_sparse.bench.experiments.base import (
    Experiment,
    accuracy,
    cells,
    panels_over_theta,
    theta_label,
    thetas,
)
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import Context, Grid, img, pct
from feather_sparse.bench.runner import RunSpec
from feather_sparse.plots import plot_panels

__all__ = ["EXPERIMENT", "THETA_OPERATOR_SPARSITIES", "THETA_OPERATOR_THETAS"]

#: θ values and sparsities of the θ-under-each-operator study (Fig. 4: high sparsity).
THETA_OPERATOR_THETAS = (0.0, 0.5, 1.0)
THETA_OPERATOR_SPARSITIES = (0.95, 0.99)

_OPERATORS = {"hard": "hard", "soft": "soft", "Feather": "feather"}


def plan(opts: BenchOptions) -> list[RunSpec]:
    specs = []
    for label, op in _OPERATORS.items():
        rows = {
            f"{label}, {theta_label(t)}": {"method": "feather", "operator": op, "theta": t}
            for t in thetas(opts, THETA_OPERATOR_THETAS)
        }
        specs += cells(opts, rows, opts.sparsity_grid(THETA_OPERATOR_SPARSITIES))
    return specs


def summarize(ctx: Context) -> tuple[str, list[Path]]:
    values = thetas(ctx.opts, THETA_OPERATOR_THETAS)
    grids = {}
    for label in _OPERATORS:
        relabeled = [
            (replace(s, group=s.group.split(", ", 1)[1]), o)
            for s, o in ctx.pairs
            if s.group.startswith(label + ", ")
        ]
        grids[label] = Grid(relabeled, accuracy, [theta_label(t) for t in values])
    fig = plot_panels(
        panels_over_theta(ctx, grids, values),
        ctx.figure("accuracy"),
        xlabel="θ",
        ylabel="top-1 accuracy (%)",
        title="Gradient scaling under each thresholding operator",
    )
    full = Grid(ctx.pairs, accuracy)
    body = (
        "Gradient scale θ under each thresholding operator, global backbone. Top-1 "
        "accuracy (%), mean ± std over seeds; best per column in bold.\n\n"
        + full.table("operator, θ", pct)
        + "\n\n"
        + img(fig, "accuracy vs theta per operator")
    )
    return body, [fig]


EXPERIMENT = Experiment(
    "theta-operator",
    "Gradient scaling under each operator",
    "Fig. 4",
    plan,
    summarize,
    options=frozenset({"sparsities", "thetas"}),
)
