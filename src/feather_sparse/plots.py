"""Figures of the analysis dataclasses (matplotlib, Agg, imported lazily).

Each function draws one :mod:`feather_sparse.analysis` result into a PNG (its
folder created when missing) and returns its path. Matplotlib is an optional
dependency (``feather-sparse[train]``) imported only when a figure is drawn; the
figures are built with the object-oriented API on an Agg canvas, so no global
pyplot state or GUI backend is touched and drawing works on a headless machine.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from feather_sparse.analysis import Curve, FlopsReport, MaskStability, SparsityDistribution
from feather_sparse.ops import threshold as apply_threshold

__all__ = [
    "plot_curves",
    "plot_flops",
    "plot_layer_sparsity",
    "plot_operator_family",
    "plot_panels",
    "plot_stability",
    "require_matplotlib",
]

#: Pixels per inch of the saved PNGs.
DPI = 120


def _agg() -> tuple[Any, Any]:
    """matplotlib's ``(FigureCanvasAgg, Figure)``, or an ImportError naming what to install."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(
            f"plots need matplotlib ({err}); install it with: pip install 'feather-sparse[train]'"
        ) from err
    return FigureCanvasAgg, Figure


def require_matplotlib() -> None:
    """Raise the ImportError a figure would raise, before any work that ends in one.

    ``feather-sparse bench`` calls it before training its runs, so that a
    missing matplotlib stops it at once rather than after the last run.

    Raises:
        ImportError: when matplotlib cannot be imported; the message names the install.
    """
    _agg()


def _figure(width: float = 6.4, height: float = 4.2) -> tuple[Any, Any]:
    """A new ``(figure, axes)`` on an Agg canvas, without pyplot."""
    canvas, figure = _agg()
    fig = figure(figsize=(width, height), layout="constrained")
    canvas(fig)
    return fig, fig.add_subplot()


def _legend(ax: Any) -> None:
    """A legend, when anything is labelled (an empty one only warns)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def _save(fig: Any, path: str | os.PathLike[str]) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)
    return out


def _draw_curves(
    ax: Any,
    curves: Sequence[Curve],
    *,
    baseline: tuple[str, float, float] | None,
    xscale: str | None,
    categorical_x: bool,
    xticklabels: Sequence[str] | None,
    errorbars: bool,
) -> None:
    # Categorical ticks: every x value of any curve, in order (a curve may lack some,
    # e.g. when the runs of a cell failed).
    ticks = sorted({v for curve in curves for v in curve.x}) if categorical_x else []
    for curve in curves:
        xs: list[float] = (
            [float(ticks.index(v)) for v in curve.x] if categorical_x else list(curve.x)
        )
        if errorbars:
            ax.errorbar(xs, curve.mean, yerr=curve.std, marker="o", capsize=3, label=curve.label)
        else:
            (line,) = ax.plot(xs, curve.mean, marker="o", label=curve.label)
            lo = [m - s for m, s in zip(curve.mean, curve.std)]
            hi = [m + s for m, s in zip(curve.mean, curve.std)]
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    if baseline is not None:
        label, mean, std = baseline
        ax.axhline(mean, color="black", linestyle="--", linewidth=1, label=label)
        if std > 0 and not math.isnan(std):
            ax.axhspan(mean - std, mean + std, color="black", alpha=0.08, linewidth=0)
    if categorical_x:
        if xticklabels is not None and len(xticklabels) != len(ticks):
            raise ValueError(
                f"xticklabels: {len(xticklabels)} labels for {len(ticks)} distinct x values"
            )
        ax.set_xticks(range(len(ticks)))
        ax.set_xticklabels(list(xticklabels) if xticklabels else [f"{t:g}" for t in ticks])
    elif xticklabels is not None:
        raise ValueError("xticklabels needs categorical_x=True")
    if xscale:
        ax.set_xscale(xscale)
    ax.grid(True, alpha=0.3)
    _legend(ax)


def plot_curves(
    curves: Sequence[Curve],
    path: str | os.PathLike[str],
    *,
    xlabel: str,
    ylabel: str,
    title: str | None = None,
    baseline: tuple[str, float, float] | None = None,
    xscale: str | None = None,
    categorical_x: bool = False,
    xticklabels: Sequence[str] | None = None,
    errorbars: bool = False,
) -> Path:
    """Lines of mean ± std (shaded, or error bars) against x, one per curve.

    Args:
        curves: the lines.
        path: the PNG to write.
        xlabel: x-axis label.
        ylabel: y-axis label.
        title: figure title.
        baseline: ``(label, mean, std)`` drawn as a horizontal line with a band
            (e.g. the dense model's accuracy).
        xscale: e.g. ``"log"``.
        categorical_x: place the distinct x values of all curves at equal
            spacing, in order (for sparsities 0.9/0.95/0.98/0.99, whose
            differences matter less than their order).
        xticklabels: labels of the x ticks (with ``categorical_x``), one per
            distinct x value.
        errorbars: draw error bars at the points instead of a shaded band.
    """
    fig, ax = _figure()
    _draw_curves(
        ax,
        curves,
        baseline=baseline,
        xscale=xscale,
        categorical_x=categorical_x,
        xticklabels=xticklabels,
        errorbars=errorbars,
    )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return _save(fig, path)


def plot_panels(
    panels: Sequence[tuple[str, Sequence[Curve]]],
    path: str | os.PathLike[str],
    *,
    xlabel: str,
    ylabel: str,
    title: str | None = None,
    categorical_x: bool = False,
    xticklabels: Sequence[str] | None = None,
) -> Path:
    """Side-by-side panels of :func:`plot_curves`, each with its own y range.

    Args:
        panels: ``(panel title, curves)`` pairs, drawn left to right.
        path: the PNG to write.
        xlabel: x-axis label of every panel.
        ylabel: y-axis label of the first panel.
        title: the figure's title.
        categorical_x: as in :func:`plot_curves`.
        xticklabels: as in :func:`plot_curves`.
    """
    if not panels:
        raise ValueError("nothing to plot: no panel given")
    fig, _ = _figure(width=max(6.4, 3.4 * len(panels)), height=3.8)
    fig.clear()
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (panel_title, curves) in zip(axes, panels):
        _draw_curves(
            ax,
            curves,
            baseline=None,
            xscale=None,
            categorical_x=categorical_x,
            xticklabels=xticklabels,
            errorbars=False,
        )
        ax.set_title(panel_title, fontsize="medium")
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel(ylabel)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_stability(
    runs: Sequence[MaskStability], path: str | os.PathLike[str], *, title: str | None = None
) -> Path:
    """Pearson r of each epoch's mask with the final mask, one line per run (paper appendix).

    Args:
        runs: the mask-stability curves, one per run.
        path: the PNG to write.
        title: figure title.

    Returns:
        The path written.
    """
    fig, ax = _figure()
    for run in runs:
        ax.plot(run.epochs, run.pearson, marker=".", label=run.label)
    ax.set_xlabel("epoch")
    ax.set_ylabel("Pearson r with the final mask")
    ax.set_ylim(top=1.02)
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    _legend(ax)
    return _save(fig, path)


def _same_layers(items: Sequence[tuple[str, Any]]) -> list[str]:
    """The layer names of the first labelled result; ValueError if another lists others."""
    names = [r.name for r in items[0][1].layers]
    for label, result in items[1:]:
        if [r.name for r in result.layers] != names:
            raise ValueError(f"{label!r} lists other layers than {items[0][0]!r}")
    return names


def _layer_bars(
    names: Sequence[str],
    bars: Sequence[tuple[str, Sequence[float]]],
    path: str | os.PathLike[str],
    *,
    ylabel: str,
    title: str | None,
    ylim: tuple[float, float] | None = None,
) -> Path:
    """Grouped bars, one group per layer of ``names``, one bar per ``(legend, values)``."""
    fig, ax = _figure(width=max(6.4, 0.45 * len(names) * max(1, len(bars)) / 2 + 2))
    width = 0.8 / len(bars)
    for i, (legend, values) in enumerate(bars):
        xs = [j + (i - (len(bars) - 1) / 2) * width for j in range(len(names))]
        ax.bar(xs, list(values), width=width, label=legend)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=60, ha="right", fontsize="small")
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    if title:
        ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    _legend(ax)
    return _save(fig, path)


def plot_layer_sparsity(
    distributions: Mapping[str, SparsityDistribution],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
) -> Path:
    """Grouped bars: each layer's sparsity under each labelled model (same layers).

    Args:
        distributions: the layer sparsities of each model, by label (same layers in each).
        path: the PNG to write.
        title: figure title.

    Returns:
        The path written.

    Raises:
        ValueError: for no distribution, or distributions over different layers.
    """
    items = list(distributions.items())
    if not items:
        raise ValueError("nothing to plot: no sparsity distribution given")
    names = _same_layers(items)
    bars = [(label, [100 * r.sparsity for r in d.layers]) for label, d in items]
    return _layer_bars(names, bars, path, ylabel="layer sparsity (%)", title=title, ylim=(0, 100))


def plot_flops(
    reports: Mapping[str, FlopsReport],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
) -> Path:
    """Grouped bars of each layer's sparse MFLOPs (MACs) under each labelled model (same layers).

    Args:
        reports: the FLOPs report of each model, by label (same layers in each).
        path: the PNG to write.
        title: figure title.

    Returns:
        The path written.

    Raises:
        ValueError: for no report, or reports over different layers.
    """
    items = list(reports.items())
    if not items:
        raise ValueError("nothing to plot: no FLOPs report given")
    names = _same_layers(items)
    bars = [
        (f"{label} ({r.sparse_macs / 1e6:.3g} M total)", [x.sparse_macs / 1e6 for x in r.layers])
        for label, r in items
    ]
    return _layer_bars(names, bars, path, ylabel="MFLOPs per sample (MACs)", title=title)


def plot_operator_family(
    ps: Sequence[float],
    path: str | os.PathLike[str],
    *,
    threshold: float = 1.0,
    span: float = 3.0,
    title: str | None = "P_T(w) for T = 1",
) -> Path:
    """The thresholding family ``P_T(w)`` for several ``p`` (paper Fig. 1b).

    ``p = 1`` is soft thresholding, ``p = inf`` hard; the identity is drawn
    for reference.

    Args:
        ps: the powers ``p`` to draw.
        path: the PNG to write.
        threshold: the threshold ``T``.
        span: the ``w`` axis runs over ``[-span, span]``.
        title: figure title.

    Returns:
        The path written.
    """
    import torch

    w = torch.linspace(-span, span, 1201, dtype=torch.float64)
    t = torch.tensor(threshold, dtype=torch.float64)
    fig, ax = _figure(width=5.2, height=4.2)
    ax.plot(w, w, color="grey", linewidth=0.8, linestyle=":", label="identity")
    for p in ps:
        y = apply_threshold(w, t, p=p)
        name = {1.0: " (soft)", math.inf: " (hard)"}.get(float(p), "")
        value = "∞" if math.isinf(p) else f"{p:g}"
        ax.plot(w, y, label=f"p = {value}{name}")
    ax.set_xlabel("w")
    ax.set_ylabel("P_T(w)")
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    _legend(ax)
    return _save(fig, path)
