"""``bench theta`` (the paper's Fig. 3): the gradient scale θ of the pruned weights × sparsity."""

from __future__ import annotations

from pathlib import Path

from feather_sparse.bench.experiments.base import (
    PAPER_SPARSITIES,
    PAPER_THETAS,
    Experiment,
    accuracy,
    accuracy_tables,
    cells,
    feather_p_text,
    panels_over_theta,
    theta_label,
    thetas,
)
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import Context, Grid, img
from feather_sparse.bench.runner import RunSpec
from feather_sparse.plots import plot_panels
from feather_sparse.pruner import auto_theta

__all__ = ["EXPERIMENT"]


#: What the paired table compares with: Feather's default θ, as the rows show it.
AUTO_NAME = "θ auto (the θ the paper's rule picks at each sparsity)"


def plan(opts: BenchOptions) -> list[RunSpec]:
    rows = {
        theta_label(t): {"method": "feather", "operator": "feather", "theta": t}
        for t in thetas(opts, PAPER_THETAS)
    }
    return cells(opts, rows, opts.sparsity_grid(PAPER_SPARSITIES))


def summarize(ctx: Context) -> tuple[str, list[Path]]:
    values = thetas(ctx.opts, PAPER_THETAS)
    acc = Grid(ctx.pairs, accuracy, [theta_label(t) for t in values])
    rule = ctx.opts.base_config().theta_rule

    def auto_row(sparsity: float) -> str | None:
        # Feather's default, θ "auto", trains exactly as the θ the rule picks.
        label = theta_label(auto_theta(sparsity, rule))
        return label if label in acc.rows else None

    fig = plot_panels(
        panels_over_theta(ctx, {"Feather": acc}, values),
        ctx.figure("accuracy"),
        xlabel="θ",
        ylabel="top-1 accuracy (%)",
        title="Gradient scale θ of the pruned weights",
    )
    body = (
        "Gradient scaling θ of the pruned weights (θ = 0: non-STE, θ = 1: plain STE), "
        f"Feather operator ({feather_p_text(ctx.opts)}), global backbone. Top-1 accuracy (%), "
        "mean ± std over "
        "seeds; the best θ per sparsity in bold. The paper's automatic rule picks θ = 1 "
        "below 95 % and θ = 0.5 from 95 % on.\n\n"
        + accuracy_tables(acc, "θ", auto_row, AUTO_NAME)
        + img(fig, "accuracy vs theta")
    )
    return body, [fig]


EXPERIMENT = Experiment(
    "theta",
    "Gradient scaling θ",
    "Fig. 3",
    plan,
    summarize,
    options=frozenset({"sparsities", "thetas"}),
)
