"""What an experiment is (:class:`Experiment`), and the pieces its plan and summary share."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feather_sparse._text import plural
from feather_sparse.analysis import Curve, mean_std
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import Context, Grid, finite_curve, paired_caption, pct
from feather_sparse.bench.runner import RunOutcome, RunSpec
from feather_sparse.plots import plot_curves

__all__ = [
    "DENSE",
    "GRID_OPTIONS",
    "PAPER_SPARSITIES",
    "PAPER_THETAS",
    "Experiment",
]

#: The paper's sparsity grid (Table 1 and every ablation figure).
PAPER_SPARSITIES = (0.9, 0.95, 0.98, 0.99)
#: θ values of Fig. 3 and of the stability study.
PAPER_THETAS = (0.0, 0.25, 0.5, 0.75, 1.0)
#: The group of the dense model's runs.
DENSE = "dense"
#: The grid fields of :class:`BenchOptions` -> their command-line flags. Each
#: experiment reads only some of them (:attr:`Experiment.options`); the command
#: line refuses a flag that the experiment would ignore.
GRID_OPTIONS = {
    "sparsities": "--sparsities",
    "thetas": "--thetas",
    "ps": "--ps",
    "ablation_pattern": "--ablation-pattern",
    "methods": "--methods",
}


@dataclass(frozen=True)
class Experiment:
    """A named grid of runs and how to summarise it.

    Attributes:
        name: the ``feather-sparse bench`` name.
        title: the results page's title.
        paper: what it reproduces (table / figure of the paper).
        plan: ``opts -> runs``.
        summarize: ``context -> (Markdown body, figures written)``.
        seeds: the seeds it runs unless the command names others (``None``:
            the bench default); the command line passes them on.
        options: the grid fields of :class:`BenchOptions` its plan reads (keys
            of :data:`GRID_OPTIONS`); it ignores the others.
        methods: the labels ``--methods`` may name (with ``"methods"`` in ``options``).
        why_not: why it has none of the other grid options, per field, for the
            command line's error (e.g. ``nm``: no sparsity columns).
    """

    name: str
    title: str
    paper: str
    plan: Callable[[BenchOptions], list[RunSpec]]
    summarize: Callable[[Context], tuple[str, list[Path]]]
    seeds: tuple[int, ...] | None = None
    options: frozenset[str] = frozenset({"sparsities"})
    methods: tuple[str, ...] = ()
    why_not: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(self.options - set(GRID_OPTIONS))
        if unknown:
            raise ValueError(
                f"experiment {self.name}: options {', '.join(unknown)} are not grid options; "
                f"choose from: {', '.join(GRID_OPTIONS)}"
            )


# ====================================================================== plans
def recipe_p(opts: BenchOptions) -> float | None:
    """The operator power ``p`` the recipe or ``--set`` gives every run, if any.

    ``None`` (the usual case) leaves each operator its own: 3 for Feather's, 1
    soft, ∞ hard. An experiment whose rows stand for an operator's own power
    (``operator``, ``p``) then sets ``p`` in each row, so that the recipe's
    cannot train under their labels, and ``--set p=...`` is refused as set by
    the experiment.
    """
    return opts.base_config().p


def p_text(p: float) -> str:
    """``p = 3``, ``p = 1.5``, ``p = ∞``: an operator power as the pages write it."""
    return f"p = {'∞' if math.isinf(p) else f'{p:g}'}"


def feather_p_text(opts: BenchOptions) -> str:
    """How a page names the power of the Feather operator its runs train with."""
    p = recipe_p(opts)
    return "p = 3" if p is None else f"{p_text(p)}, set by the recipe or --set"


def cells(
    opts: BenchOptions, rows: Mapping[str, Mapping[str, Any]], sparsities: Sequence[float]
) -> list[RunSpec]:
    """One run per row, sparsity and seed; ``rows`` maps a label to its config fields."""
    return [
        RunSpec(label, s, seed, {**settings, "dense": False, "sparsity": s})
        for label, settings in rows.items()
        for s in sparsities
        for seed in opts.run_seeds
    ]


def dense_runs(opts: BenchOptions) -> list[RunSpec]:
    """The dense model, once per seed."""
    return [RunSpec(DENSE, 0.0, seed, {"dense": True}) for seed in opts.run_seeds]


def thetas(opts: BenchOptions, default: Sequence[float]) -> tuple[float, ...]:
    """The θ values: the given ones, else ``default``."""
    return tuple(opts.thetas) if opts.thetas else tuple(default)


def theta_label(t: float) -> str:
    return f"θ = {t:g}"


# ================================================================== summaries
def accuracy(o: RunOutcome) -> float:
    """Top-1 test accuracy in %."""
    return 100.0 * o.test_accuracy


def paired_section(
    grid: Grid,
    row_title: str,
    reference: str | Callable[[float], str | None],
    reference_name: str,
) -> str:
    """The paired-difference table of ``grid`` against ``reference``, with its caption."""
    return paired_caption(reference_name) + grid.paired_table(row_title, pct, reference) + "\n\n"


def accuracy_tables(
    grid: Grid,
    row_title: str,
    reference: str | Callable[[float], str | None],
    reference_name: str,
) -> str:
    """``grid``'s table, then its :func:`paired_section` against ``reference``.

    The paired section is left out when ``reference`` names a row that
    ``grid`` does not have (the reference run was not selected).
    """
    paired = callable(reference) or reference in grid.rows
    return (
        grid.table(row_title, pct)
        + "\n\n"
        + (paired_section(grid, row_title, reference, reference_name) if paired else "")
    )


def dense_line(ctx: Context) -> str:
    """The dense model's accuracy as a sentence above a table ("" without dense runs)."""
    dense = [o for _, o in ctx.of_group(DENSE) if o.ok]
    if not dense:
        return ""
    mean, std = mean_std([accuracy(o) for o in dense])
    value = f"{mean:.2f}" if len(dense) == 1 else f"{mean:.2f} ± {std:.2f}"
    params = dense[0].params
    return f"Dense model ({params:,} {plural(params, 'parameter')}): **{value}** % top-1.\n\n"


def dense_baseline(ctx: Context) -> tuple[str, float, float] | None:
    """The dense model's accuracy as a plot's horizontal line, or None."""
    dense = [accuracy(o) for _, o in ctx.of_group(DENSE) if o.ok]
    if not dense:
        return None
    mean, std = mean_std(dense)
    return ("dense", mean, std)


def accuracy_vs_sparsity_plot(
    ctx: Context, grid: Grid, title: str, suffix: str = "accuracy"
) -> Path:
    """One line per row of ``grid`` over the sparsity columns, the dense model as a baseline."""
    curves = grid.curves_by_row()
    return plot_curves(
        curves,
        ctx.figure(suffix),
        xlabel="sparsity",
        ylabel="top-1 accuracy (%)",
        title=title,
        baseline=dense_baseline(ctx),
        categorical_x=True,
        xticklabels=sparsity_ticks(curves),
    )


def sparsity_ticks(curves: Sequence[Curve]) -> list[str]:
    """Labels of the categorical sparsity axis: every x of any curve, in order."""
    return [pct(x) for x in sorted({x for curve in curves for x in curve.x})]


def panels_over_theta(
    ctx: Context, grids: Mapping[str, Grid], thetas: Sequence[float]
) -> list[tuple[str, list[Curve]]]:
    """Per sparsity (one panel), accuracy against θ, one curve per grid."""
    cols = sorted({c for g in grids.values() for c in g.cols})
    panels = []
    for c in cols:
        found = (
            finite_curve(label, [(t, grid.stat(theta_label(t), c)) for t in thetas])
            for label, grid in grids.items()
        )
        panels.append((f"sparsity {pct(c)}", [curve for curve in found if curve is not None]))
    return panels
