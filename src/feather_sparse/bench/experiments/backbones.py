"""``bench backbones`` (the paper's appendix): each pruning backbone with and without Feather."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from feather_sparse.bench.experiments.base import (
    PAPER_SPARSITIES,
    Experiment,
    accuracy,
    cells,
    feather_p_text,
    sparsity_ticks,
)
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import Context, Grid, img, pct
from feather_sparse.bench.runner import RunSpec
from feather_sparse.plots import plot_panels

__all__ = ["BACKBONE_ROWS", "EXPERIMENT"]

#: ``backbones``' rows: each backbone with and without Feather (appendix).
BACKBONE_ROWS: dict[str, dict[str, Any]] = {
    "GMP": {"method": "gmp"},
    "Feather-GMP": {"method": "feather-gmp"},
    "ASL+": {"method": "hard", "backbone": "asl+"},
    "Feather-ASL+": {"method": "feather", "backbone": "asl+"},
}


def plan(opts: BenchOptions) -> list[RunSpec]:
    return cells(opts, BACKBONE_ROWS, opts.sparsity_grid(PAPER_SPARSITIES))


def summarize(ctx: Context) -> tuple[str, list[Path]]:
    acc = Grid(ctx.pairs, accuracy, list(BACKBONE_ROWS))
    curves = {c.label: c for c in acc.curves_by_row()}
    panels = [
        ("GMP backbone (uniform)", [curves[k] for k in ("GMP", "Feather-GMP") if k in curves]),
        ("ASL+ backbone", [curves[k] for k in ("ASL+", "Feather-ASL+") if k in curves]),
    ]
    ticks = {tuple(sparsity_ticks(group)) for _, group in panels}
    fig = plot_panels(
        panels,
        ctx.figure("accuracy"),
        xlabel="sparsity",
        ylabel="top-1 accuracy (%)",
        title="Feather on other pruning backbones",
        categorical_x=True,
        # one set of labels for both panels; when failed runs leave them different
        # x values, each panel falls back to the plain numbers
        xticklabels=list(next(iter(ticks))) if len(ticks) == 1 else None,
    )
    body = (
        "Each backbone with its own thresholding (GMP: hard mask, no gradient to pruned "
        "weights; ASL+: hard thresholding, plain STE) and with Feather "
        f"({feather_p_text(ctx.opts)}, θ automatic). Top-1 accuracy (%), mean ± std over "
        "seeds; best per column in bold.\n\n"
        + acc.table("backbone", pct)
        + "\n\n"
        + img(fig, "feather on other backbones")
    )
    return body, [fig]


EXPERIMENT = Experiment("backbones", "Feather on other backbones", "appendix", plan, summarize)
