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
from feather_sparse.plots import plot_curves, plot_panels

__all__ = ["EXPERIMENT", "STABILITY_SPARSITY"]

#: The sparsity of the mask-stability study (where θ matters: high sparsity);
#: ``--sparsities`` runs it at each sparsity given instead.
STABILITY_SPARSITY = 0.98


def plan(opts: BenchOptions) -> list[RunSpec]:
    rows = {
        theta_label(t): {"method": "feather", "operator": "feather", "theta": t}
        for t in thetas(opts, PAPER_THETAS)
    }
    return cells(opts, rows, opts.sparsity_grid((STABILITY_SPARSITY,)))


def _at_sparsity(
    ctx: Context, values: Sequence[float], acc: Grid, sparsity: float
) -> tuple[list[Curve], list[str]]:
    """The Pearson curve and the table row of each θ at one sparsity."""
    curves, rows = [], []
    for t in values:
        label = theta_label(t)
        runs = [
            o for s, o in ctx.of_group(label) if s.x == sparsity and o.ok and o.stability_epochs
        ]
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
    return curves, rows


_HEADER = (
    "| θ | r at 25 % of training | r at 50 % | first epoch with r ≥ 0.9 from then on "
    "| mask flips per epoch, 2nd half (%) | top-1 (%) |\n"
    "|---|---:|---:|---:|---:|---:|\n"
)


def summarize(ctx: Context) -> tuple[str, list[Path]]:
    values = thetas(ctx.opts, PAPER_THETAS)
    acc = Grid(ctx.pairs, accuracy, [theta_label(t) for t in values])
    # every sparsity planned, failed runs included (a page of failed runs still has its columns)
    sparsities = sorted({s.x for s, _ in ctx.pairs}) or [math.nan]
    found = [_at_sparsity(ctx, values, acc, s) for s in sparsities]
    if len(sparsities) == 1:
        sparsity = sparsities[0]
        fig = plot_curves(
            found[0][0],
            ctx.figure("pearson"),
            xlabel="epoch",
            ylabel="Pearson r with the final mask",
            title=f"Mask stability at sparsity {pct(sparsity)}",
        )
        where = f"sparsity {pct(sparsity)}"
        tables = _HEADER + "\n".join(found[0][1]) + "\n\n"
    else:  # one table and one panel per sparsity
        fig = plot_panels(
            [(f"sparsity {pct(s)}", curves) for s, (curves, _) in zip(sparsities, found)],
            ctx.figure("pearson"),
            xlabel="epoch",
            ylabel="Pearson r with the final mask",
            title="Mask stability per sparsity",
        )
        where = "at each sparsity below"
        tables = "".join(
            f"### Sparsity {pct(s)}\n\n" + _HEADER + "\n".join(rows) + "\n\n"
            for s, (_, rows) in zip(sparsities, found)
        )
    body = (
        f"Pearson correlation between the mask (1 = weight kept) at the end of each epoch "
        f"and the final mask, Feather operator, global backbone, {where}, "
        "mean over seeds (shaded: ± std). Before pruning starts the mask is all ones and "
        "r is undefined; those epochs are not drawn.\n\n" + tables + img(fig, "mask stability")
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


EXPERIMENT = Experiment(
    "stability",
    "Mask stability vs θ",
    "appendix",
    plan,
    summarize,
    options=frozenset({"sparsities", "thetas"}),
)
