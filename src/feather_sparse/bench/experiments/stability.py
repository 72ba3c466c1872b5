"""``bench stability`` (the paper's appendix): how early the mask settles, per θ."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from feather_sparse.analysis import Curve, mean_std
from feather_sparse.bench.experiments.base import (
    PAPER_THETAS,
    Experiment,
    accuracy,
    cells,
    theta_label,
    thetas,
)
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import Context, Grid, img, pct
from feather_sparse.bench.runner import RunOutcome, RunSpec
from feather_sparse.plots import plot_curves

__all__ = ["EXPERIMENT", "STABILITY_SPARSITY"]

#: The sparsity of the mask-stability study (where θ matters: high sparsity).
STABILITY_SPARSITY = 0.98


def plan(opts: BenchOptions) -> list[RunSpec]:
    sparsity = opts.sparsity_grid((STABILITY_SPARSITY,))[0]
    rows = {
        theta_label(t): {"method": "feather", "operator": "feather", "theta": t}
        for t in thetas(opts, PAPER_THETAS)
    }
    return cells(opts, rows, (sparsity,))


def summarize(ctx: Context) -> tuple[str, list[Path]]:
    values = thetas(ctx.opts, PAPER_THETAS)
    curves, rows = [], []
    acc = Grid(ctx.pairs, accuracy, [theta_label(t) for t in values])
    sparsity = ctx.pairs[0][0].x if ctx.pairs else math.nan
    for t in values:
        label = theta_label(t)
        runs = [o for _, o in ctx.of_group(label) if o.ok and o.stability_epochs]
        if not runs:
            continue
        epochs = runs[0].stability_epochs
        per_epoch = list(zip(*(o.stability_pearson for o in runs)))
        stats = [mean_std([v for v in vals if math.isfinite(v)]) for vals in per_epoch]
        keep = [i for i, (m, _) in enumerate(stats) if math.isfinite(m)]
        curves.append(
            Curve(
                label,
                tuple(float(epochs[i]) for i in keep),
                tuple(stats[i][0] for i in keep),
                tuple(stats[i][1] for i in keep),
            )
        )
        flips = [
            v for o in runs for v in o.stability_changed[len(o.stability_changed) // 2 :] if v == v
        ]
        first = [_first_above(o.stability_epochs, o.stability_pearson, 0.9) for o in runs]
        quarter = [_at_fraction(o, 0.25) for o in runs]
        half = [_at_fraction(o, 0.5) for o in runs]
        mean_acc, std_acc = acc.stat(label, sparsity)
        rows.append(
            f"| {label} | {_fmt_ms(mean_std(quarter), '{:.3f}')} "
            f"| {_fmt_ms(mean_std(half), '{:.3f}')} "
            f"| {_fmt_ms(mean_std([f for f in first if f is not None]), '{:.1f}')} "
            f"| {100 * mean_std(flips)[0]:.3f} | {mean_acc:.2f} ± {std_acc:.2f} |"
        )
    fig = plot_curves(
        curves,
        ctx.figure("pearson"),
        xlabel="epoch",
        ylabel="Pearson r with the final mask",
        title=f"Mask stability at sparsity {pct(sparsity)}",
    )
    body = (
        f"Pearson correlation between the mask (1 = weight kept) at the end of each epoch "
        f"and the final mask, Feather operator, global backbone, sparsity {pct(sparsity)}, "
        "mean over seeds (shaded: ± std). Before pruning starts the mask is all ones and "
        "r is undefined; those epochs are not drawn.\n\n"
        "| θ | r at 25 % of training | r at 50 % | first epoch with r ≥ 0.9 from then on "
        "| mask flips per epoch, 2nd half (%) | top-1 (%) |\n"
        "|---|---:|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n\n" + img(fig, "mask stability")
    )
    return body, [fig]


def _fmt_ms(stat: tuple[float, float], fmt: str) -> str:
    mean, std = stat
    if math.isnan(mean):
        return "—"
    return f"{fmt.format(mean)} ± {fmt.format(std)}"


def _first_above(epochs: Sequence[int], values: Sequence[float], level: float) -> float | None:
    found: float | None = None
    for e, v in zip(epochs, values):
        if not math.isfinite(v) or v < level:
            found = None
        elif found is None:
            found = float(e)
    return found


def _at_fraction(o: RunOutcome, fraction: float) -> float:
    """r at the recorded epoch closest to ``fraction`` of training."""
    if not o.stability_epochs:
        return math.nan
    target = fraction * o.stability_epochs[-1]
    i = min(range(len(o.stability_epochs)), key=lambda j: abs(o.stability_epochs[j] - target))
    return o.stability_pearson[i]


EXPERIMENT = Experiment("stability", "Mask stability vs θ", "appendix", plan, summarize)
