"""``bench compare`` (the paper's Table 1): Feather against the baselines × sparsity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from feather_sparse._text import plural
from feather_sparse.bench.experiments.base import (
    PAPER_SPARSITIES,
    Experiment,
    accuracy,
    accuracy_tables,
    accuracy_vs_sparsity_plot,
    cells,
    dense_line,
    dense_runs,
)
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import Context, Grid, img, pct
from feather_sparse.bench.runner import RunSpec

__all__ = ["COMPARE_METHODS", "EXPERIMENT"]

#: ``compare``'s methods: label -> config fields (Table 1 of the paper).
COMPARE_METHODS: dict[str, dict[str, Any]] = {
    "Feather-Global": {"method": "feather", "backbone": "global"},
    "Feather-ASL+": {"method": "feather", "backbone": "asl+"},
    "ST-3": {"method": "st3"},
    "Spartan": {"method": "spartan"},
    "GMP": {"method": "gmp"},
    "hard-STE": {"method": "hard"},
    "soft-STE": {"method": "soft"},
    "non-STE": {"method": "nonste"},
}


#: The row every other method is compared with, seed by seed.
REFERENCE = "Feather-Global"


def _selected_methods(opts: BenchOptions) -> dict[str, dict[str, Any]]:
    if not opts.methods:
        return COMPARE_METHODS
    unknown = [m for m in opts.methods if m not in COMPARE_METHODS]
    if unknown:
        raise ValueError(
            f"unknown compare {plural(len(unknown), 'method')} {', '.join(unknown)}; choose from: "
            f"{', '.join(COMPARE_METHODS)}"
        )
    return {m: COMPARE_METHODS[m] for m in opts.methods}


def plan(opts: BenchOptions) -> list[RunSpec]:
    sparsities = opts.sparsity_grid(PAPER_SPARSITIES)
    return cells(opts, _selected_methods(opts), sparsities) + dense_runs(opts)


def summarize(ctx: Context) -> tuple[str, list[Path]]:
    rows = list(_selected_methods(ctx.opts))
    acc = Grid(ctx.pairs, accuracy, rows)
    achieved = Grid(ctx.pairs, lambda o: 100.0 * o.sparsity, rows)
    seconds = Grid(ctx.pairs, lambda o: o.wall_time, rows)
    fig = accuracy_vs_sparsity_plot(ctx, acc, "Top-1 accuracy vs sparsity")
    body = (
        "Top-1 test accuracy (%) after training, mean ± std over seeds; the best mean "
        "per column is in bold.\n\n"
        + dense_line(ctx)
        + accuracy_tables(acc, "method", REFERENCE, REFERENCE)
        + img(fig, "accuracy vs sparsity")
        + "\nAchieved sparsity (%) of the pruned layers after `finalize()`:\n\n"
        + achieved.table("method", pct, fmt="{:.2f}", best=None)
        + "\n\nWall time per run (s; parallel runs share the cores, so these are only "
        "indicative):\n\n" + seconds.table("method", pct, fmt="{:.1f}", best=None) + "\n"
    )
    return body, [fig]


EXPERIMENT = Experiment(
    "compare",
    "Comparison with the baselines",
    "Table 1",
    plan,
    summarize,
    options=frozenset({"sparsities", "methods"}),
    methods=tuple(COMPARE_METHODS),
)
