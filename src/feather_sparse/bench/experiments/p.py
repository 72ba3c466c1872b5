"""``bench p`` (the paper's appendix and Fig. 1b): the power p of the thresholding family."""

from __future__ import annotations

import math
from pathlib import Path

from feather_sparse.bench.experiments.base import (
    PAPER_SPARSITIES,
    Experiment,
    accuracy,
    accuracy_tables,
    accuracy_vs_sparsity_plot,
    cells,
    p_text,
    recipe_p,
)
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import Context, Grid, img
from feather_sparse.bench.runner import RunSpec
from feather_sparse.plots import plot_operator_family

__all__ = ["EXPERIMENT", "PAPER_PS"]

#: p values of the appendix study (1 = soft, inf = hard).
PAPER_PS = (1.0, 2.0, 3.0, 4.0, math.inf)


def _ps(opts: BenchOptions) -> tuple[float, ...]:
    return tuple(opts.ps) if opts.ps else PAPER_PS


def _p_label(p: float) -> str:
    names = {1.0: " (soft)", 3.0: " (Feather)", math.inf: " (hard)"}
    return p_text(p) + names.get(float(p), "")


def plan(opts: BenchOptions) -> list[RunSpec]:
    # p = 3 is the feather operator's own power: leaving it unset makes that
    # row the very config of compare's Feather-Global, trained once for both.
    # Where the recipe or --set gives p, every row sets its own (or the p = 3
    # row would train theirs, and --set p=... is refused as what p varies).
    own = recipe_p(opts) is None
    rows = {
        _p_label(p): {
            "method": "feather",
            "operator": "feather",
            **({} if p == 3.0 and own else {"p": p}),
        }
        for p in _ps(opts)
    }
    return cells(opts, rows, opts.sparsity_grid(PAPER_SPARSITIES))


def summarize(ctx: Context) -> tuple[str, list[Path]]:
    acc = Grid(ctx.pairs, accuracy, [_p_label(p) for p in _ps(ctx.opts)])
    fig = accuracy_vs_sparsity_plot(ctx, acc, "The operator's power p")
    family = plot_operator_family(_ps(ctx.opts), ctx.figure("operators"))
    body = (
        "The power p of the thresholding family (p = 1 soft, p = ∞ hard), θ automatic "
        "(the paper's rule), global backbone. Top-1 accuracy (%), mean ± std over seeds; "
        "best per column in bold.\n\n"
        + accuracy_tables(acc, "p", _p_label(3.0), "Feather's p = 3")
        + img(fig, "accuracy vs sparsity per p")
        + "\nThe operators (paper Fig. 1b), T = 1:\n\n"
        + img(family, "the thresholding family")
    )
    return body, [fig, family]


EXPERIMENT = Experiment(
    "p",
    "The operator's power p",
    "appendix, Fig. 1b",
    plan,
    summarize,
    options=frozenset({"sparsities", "ps"}),
    why_not={"thetas": "θ is automatic (the paper's rule), as in Feather's default"},
)
