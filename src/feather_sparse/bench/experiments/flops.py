"""``bench flops`` (the paper's appendix): accuracy against FLOPs for each threshold backbone."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from feather_sparse.analysis import (
    Curve,
    LayerSparsity,
    SparsityDistribution,
    count_flops,
    reference_flops,
)
from feather_sparse.bench.experiments.base import (
    DENSE,
    PAPER_SPARSITIES,
    Experiment,
    accuracy,
    cells,
    dense_baseline,
    dense_runs,
    feather_p_text,
)
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import Context, Grid, img, pct
from feather_sparse.bench.runner import RunOutcome, RunSpec
from feather_sparse.models import create_model
from feather_sparse.plots import plot_curves, plot_layer_sparsity

__all__ = ["EXPERIMENT", "FLOPS_ROWS"]

#: ``flops``' rows: Feather on each threshold backbone (appendix).
FLOPS_ROWS: dict[str, dict[str, Any]] = {
    "global": {"method": "feather", "backbone": "global"},
    "global-flops": {"method": "feather", "backbone": "global-flops"},
    "uniform": {"method": "feather", "backbone": "uniform"},
}


def plan(opts: BenchOptions) -> list[RunSpec]:
    return cells(opts, FLOPS_ROWS, opts.sparsity_grid(PAPER_SPARSITIES)) + dense_runs(opts)


def summarize(ctx: Context) -> tuple[str, list[Path]]:
    rows = list(FLOPS_ROWS)
    acc = Grid(ctx.pairs, accuracy, rows)
    mflops = Grid(ctx.pairs, lambda o: o.sparse_macs / 1e6, rows)
    curves = []
    for r in rows:
        pts = [
            (mflops.stat(r, c)[0], *acc.stat(r, c))
            for c in acc.cols
            if math.isfinite(acc.stat(r, c)[0])
        ]
        if pts:
            xs, ms, ss = zip(*pts)
            curves.append(Curve(r, tuple(xs), tuple(ms), tuple(ss)))
    acc_fig = plot_curves(
        curves,
        ctx.figure("accuracy"),
        xlabel="MFLOPs per sample (multiply-accumulates)",
        ylabel="top-1 accuracy (%)",
        title="Accuracy vs FLOPs per backbone (Feather)",
        baseline=dense_baseline(ctx),
        xscale="log",
        errorbars=True,
    )
    figures = [acc_fig]
    top = max(acc.cols) if acc.cols else None
    seed = ctx.opts.run_seeds[0]  # the title's: a row whose run of it failed is left out
    dists = {}
    for r in rows:
        runs = [
            o
            for s, o in ctx.pairs
            if s.group == r and s.x == top and s.seed == seed and o.ok and o.layers
        ]
        if runs:
            dists[r] = SparsityDistribution(
                tuple(LayerSparsity(n, (p,), p, nz) for n, p, nz in runs[0].layers)
            )
    if dists:
        figures.append(
            plot_layer_sparsity(
                dists,
                ctx.figure("layers"),
                title=f"Per-layer sparsity at {pct(top or 0)} (seed {seed})",
            )
        )
    dense = [o for _, o in ctx.of_group(DENSE) if o.ok]
    validation = ""
    if dense:
        validation = _validate_flops(dense[0])
    body = (
        f"Feather ({feather_p_text(ctx.opts)}, θ automatic) on three threshold backbones. "
        "FLOPs are counted as "
        "multiply-accumulates per sample of the convolution and linear layers with zero "
        "weights skipped (the paper's convention, see `feather_sparse.analysis`).\n\n"
        + validation
        + "Top-1 accuracy (%), mean ± std over seeds; best per column in bold:\n\n"
        + acc.table("backbone", pct)
        + "\n\nSparse MFLOPs per sample, mean ± std over seeds; fewest per column in bold:\n\n"
        + mflops.table("backbone", pct, fmt="{:.4f}", best="min")
        + "\n\n"
        + img(acc_fig, "accuracy vs flops")
        + ("\n" + img(figures[1], "per-layer sparsity") if len(figures) > 1 else "")
    )
    return body, figures


def _validate_flops(dense: RunOutcome) -> str:
    """Check the dense count against ``torch.utils.flop_counter`` on the same architecture."""
    spec = dict(dense.model_spec)
    model = create_model(spec["name"], **dict(spec.get("kwargs", {})))
    ours = count_flops(model, dense.input_shape)
    theirs = reference_flops(model, dense.input_shape)
    verdict = "agree" if ours.torch_flops == theirs else "**disagree**"
    return (
        f"Dense {spec['name']}: {ours.dense_macs / 1e6:.4f} MFLOPs (MACs) per sample; "
        f"`torch.utils.flop_counter` counts {theirs:,} FLOPs = 2 × {theirs / 2:,.0f} MACs "
        f"for the same forward ({verdict} with this count).\n\n"
    )


EXPERIMENT = Experiment("flops", "Accuracy vs FLOPs", "appendix", plan, summarize)
