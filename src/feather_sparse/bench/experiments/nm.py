"""``bench nm``: Feather-N:M against the N:M baselines, and its θ and p ablations.

The grid (issue 14's evidence):

- methods ``feather-nm``, ``sr-ste``, ``s-ste``, ``hard-nm``, ``oneshot-nm``
  (:mod:`feather_sparse.methods`) × patterns 2:4, 4:8, 1:4 × the bundled CNN
  (``mnist1d_cnn``; its first conv, reduction 5, stays dense) and the
  Linear-heavy ``mnist1d_mlpmixer``, 5 seeds;
- at 2:4, Feather-N:M's gradient scale θ ∈ {0, 0.5, 1} and power
  p ∈ {1, 2, 3, ∞} on both models (θ = 1 and p = 3 are ``feather-nm``'s own
  settings at 2:4, so those runs are shared with the main grid). Each row
  trains its own θ and p, whatever the recipe gives or the automatic θ rule
  gives at ``--ablation-pattern`` (0.5 from 95 %, e.g. 1:32); ``--set theta=``
  and ``--set p=`` are refused as set by the experiment. The row tagged
  ``(feather-nm)``, which the ablation's paired table compares with, is
  ``feather-nm``'s own θ and p at the ablation pattern (:func:`own_settings`:
  θ = 0.5 at 1:32; a recipe's θ or p).

The page reports top-1 accuracy (mean ± std), every method's paired
difference to ``feather-nm`` with 95 % intervals, and the mask flip rate: the
fraction of the pruned layers' mask that changed from one epoch to the next
(the stability recorder's ``changed``), averaged over the second half of
training, as S-STE (Hu et al. 2024) uses it to diagnose a hard threshold.
``--set model=NAME`` (or ``--model``) runs one model instead of both;
``--methods``, ``--thetas`` and ``--ps`` narrow the grid; ``--quick`` runs
2:4 on the mixer only. It has no sparsity columns (the patterns set the
sparsity), so the command line refuses ``--sparsities`` for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from feather_sparse.analysis import Curve, mean_std
from feather_sparse.bench.experiments.base import Experiment, accuracy, p_text
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import Context, Grid, img, paired_caption
from feather_sparse.bench.runner import RunOutcome, RunSpec
from feather_sparse.nm import NMPattern
from feather_sparse.plots import plot_panels
from feather_sparse.pruner_config import auto_theta
from feather_sparse.recipes import TrainConfig

__all__ = ["EXPERIMENT", "NM_METHODS", "NM_MODELS", "NM_PATTERNS", "NM_SEEDS"]

#: The methods compared, the reference first.
NM_METHODS = ("feather-nm", "sr-ste", "s-ste", "hard-nm", "oneshot-nm")
#: The patterns (columns).
NM_PATTERNS = ("2:4", "4:8", "1:4")
#: The models: the bundled CNN and the Linear-heavy mixer.
NM_MODELS = ("mnist1d_cnn", "mnist1d_mlpmixer")
#: Seeds of a full run (the paired intervals need several).
NM_SEEDS = (0, 1, 2, 3, 4)
#: The ablations' pattern, θ values and p values.
ABLATION_PATTERN = "2:4"
NM_THETAS = (0.0, 0.5, 1.0)
NM_PS = (1.0, 2.0, 3.0, math.inf)
#: ``--quick``: one pattern, one model.
QUICK_PATTERNS = ("2:4",)
QUICK_MODELS = ("mnist1d_mlpmixer",)

REFERENCE = NM_METHODS[0]


def _models(opts: BenchOptions) -> tuple[str, ...]:
    if "model" in opts.overrides:  # one model for every run, set by the user
        return (str(opts.overrides["model"]),)
    return QUICK_MODELS if opts.quick else NM_MODELS


def _patterns(opts: BenchOptions) -> tuple[str, ...]:
    return QUICK_PATTERNS if opts.quick else NM_PATTERNS


def _methods(opts: BenchOptions) -> tuple[str, ...]:
    if not opts.methods:
        return NM_METHODS
    unknown = sorted(set(opts.methods) - set(NM_METHODS))
    if unknown:
        raise ValueError(
            f"--methods {', '.join(unknown)}: not an N:M method here; choose from "
            f"{', '.join(NM_METHODS)}"
        )
    return tuple(m for m in NM_METHODS if m in opts.methods)


def _ablation_pattern(opts: BenchOptions) -> str:
    return opts.ablation_pattern or ABLATION_PATTERN


def _thetas(opts: BenchOptions) -> tuple[float, ...]:
    return tuple(opts.thetas) if opts.thetas else NM_THETAS


def _ps(opts: BenchOptions) -> tuple[float, ...]:
    return tuple(opts.ps) if opts.ps else NM_PS


def _feather_nm_settings(config: TrainConfig) -> str:
    """How the page names the p and θ of the main grid's ``feather-nm`` runs.

    Its own (p = 3, θ automatic) unless the recipe (``config``, the options'
    base config) gives others (``--set p=`` and ``--set theta=`` are refused
    here: the ablation rows set them).
    """
    p, theta = config.p, config.theta
    auto = theta in (None, "auto")
    if p is None and auto:
        return "p = 3, θ automatic = 1 at these sparsities"
    theta_text = "θ automatic" if auto else f"θ = {theta:g}"
    return f"{p_text(3.0 if p is None else p)}, {theta_text}, as the recipe gives"


def own_settings(opts: BenchOptions, config: TrainConfig) -> tuple[float, float]:
    """``feather-nm``'s own ``(p, θ)`` at the ablation pattern: the row each ablation
    pairs with and tags ``(feather-nm)``.

    p is 3 unless the recipe (``config``, the options' base config) gives one; θ
    the recipe's, else the automatic rule's at the pattern's sparsity: 1 below
    95 %, 0.5 from it (e.g. 1:32).
    """
    theta = config.theta
    if theta in (None, "auto"):
        sparsity = NMPattern.parse(_ablation_pattern(opts)).sparsity
        theta = auto_theta(sparsity, config.theta_rule)
    return (3.0 if config.p is None else float(config.p)), float(theta)


def theta_label(t: float, own: float = 1.0) -> str:
    """The θ row's name; ``own`` is feather-nm's θ (:func:`own_settings`)."""
    return f"θ = {t:g}" + (" (feather-nm)" if t == own else "")


def p_label(p: float, own: float = 3.0) -> str:
    """The p row's name: the operator it is (soft, hard) and whether it is
    feather-nm's own p ``own`` (:func:`own_settings`)."""
    names = {1.0: "soft", math.inf: "hard"}
    tags = [t for t in (names.get(float(p)), "feather-nm" if p == own else None) if t]
    return p_text(p) + (f" ({', '.join(tags)})" if tags else "")


# ======================================================================= plan
def _model_settings(opts: BenchOptions, model: str) -> dict[str, Any]:
    return {} if "model" in opts.overrides else {"model": model}


def plan(opts: BenchOptions) -> list[RunSpec]:
    specs = []
    models, patterns = _models(opts), _patterns(opts)
    for model in models:
        for x, pattern in enumerate(patterns):
            for method in _methods(opts):
                settings = {
                    "dense": False,
                    "method": method,
                    "pattern": pattern,
                    **_model_settings(opts, model),
                }
                specs += [RunSpec(method, float(x), s, settings) for s in opts.run_seeds]
    # Ablations at 2:4: the column is the model. Every θ row sets its θ: a run's
    # key drops a θ the automatic rule gives anyway (runner._canonical), so θ = 1
    # at 2:4 is feather-nm's own run, and at 95 % or more (1:32, where the rule
    # gives 0.5) θ = 1 is still trained. p = 3 is left to feather-nm (its own
    # run) unless the recipe or --set gives p, as in bench p.
    config = opts.base_config()  # read once: the recipe's p and θ
    own_p = config.p is None  # no p from the recipe or --set (base.recipe_p)
    p_own, theta_own = own_settings(opts, config)
    for x, model in enumerate(models):
        base = {
            "dense": False,
            "method": REFERENCE,
            "pattern": _ablation_pattern(opts),
            **_model_settings(opts, model),
        }
        for t in _thetas(opts):
            settings = {**base, "theta": t}
            label = theta_label(t, theta_own)
            specs += [RunSpec(label, float(x), s, settings) for s in opts.run_seeds]
        for p in _ps(opts):
            settings = base if p == 3.0 and own_p else {**base, "p": p}
            specs += [RunSpec(p_label(p, p_own), float(x), s, settings) for s in opts.run_seeds]
    return specs


# ==================================================================== summary
def flip_rate(o: RunOutcome) -> float:
    """Mean fraction (%) of the mask flipped per epoch over the second half of training.

    The second half, as in ``bench stability``: one-shot N:M prunes at half-way,
    and a mean over all epochs would mostly count that one event. NaN if unrecorded.
    """
    changed = o.stability_changed
    flips = [v for v in changed[len(changed) // 2 :] if math.isfinite(v)]
    return 100.0 * sum(flips) / len(flips) if flips else math.nan


def _model_of(spec: RunSpec, opts: BenchOptions) -> str:
    model = spec.settings.get("model")
    return str(model) if model is not None else str(opts.overrides.get("model", ""))


def _pairs_of(ctx: Context, model: str, groups: Sequence[str]) -> list[tuple[RunSpec, RunOutcome]]:
    return [(s, o) for s, o in ctx.pairs if s.group in groups and _model_of(s, ctx.opts) == model]


def _section(ctx: Context, model: str, patterns: Sequence[str]) -> tuple[str, list[Curve]]:
    methods = list(_methods(ctx.opts))
    pairs = _pairs_of(ctx, model, methods)
    acc = Grid(pairs, accuracy, methods)
    flips = Grid(pairs, flip_rate, methods)

    def label(x: float) -> str:
        return patterns[int(x)]

    paired = (
        _paired(acc, "method", label, REFERENCE)
        if REFERENCE in methods and len(methods) > 1
        else ""
    )
    text = (
        f"### {model}\n\n"
        "Top-1 accuracy (%), mean ± std over seeds; best per pattern in bold.\n\n"
        + acc.table("method", label)
        + "\n\n"
        + paired
        + "Mask flip rate: the fraction (%) of the pruned weights' mask that changed "
        "from one epoch to the next, mean over the second half of training (mean ± std "
        "over seeds). One-shot N:M's mask is fixed there (0).\n\n"
        + flips.table("method", label, fmt="{:.3f}", best=None)
        + "\n\n"
    )
    return text, acc.curves_by_row()


def _paired(grid: Grid, title: str, label: Callable[[float], str], reference: str) -> str:
    """The paired differences to ``reference`` (same seed, same column), with the caption."""
    return paired_caption(f"`{reference}`") + grid.paired_table(title, label, reference) + "\n\n"


def _ablation(
    ctx: Context, title: str, rows: Sequence[str], reference: str, models: Sequence[str]
) -> str:
    pairs = [(s, o) for s, o in ctx.pairs if s.group in rows]
    acc = Grid(pairs, accuracy, list(rows))
    flips = Grid(pairs, flip_rate, list(rows))

    def label(x: float) -> str:
        return models[int(x)]

    paired = _paired(acc, title, label, reference) if reference in rows else ""
    return (
        f"Top-1 accuracy (%), mean ± std over seeds, {_ablation_pattern(ctx.opts)}; best per model "
        "in bold.\n\n"
        + acc.table(title, label)
        + "\n\n"
        + paired
        + "Mask flip rate (%, as above):\n\n"
        + flips.table(title, label, fmt="{:.3f}", best=None)
        + "\n\n"
    )


def summarize(ctx: Context) -> tuple[str, list[Path]]:
    models, patterns = _models(ctx.opts), _patterns(ctx.opts)
    sections, panels = [], []
    for model in models:
        text, curves = _section(ctx, model, patterns)
        sections.append(text)
        panels.append((model, curves))
    # Named ticks when every panel has the same patterns (failed cells can leave gaps).
    shown = [sorted({x for c in curves for x in c.x}) for _, curves in panels]
    same = all(xs == shown[0] for xs in shown)
    fig = plot_panels(
        panels,
        ctx.figure("accuracy"),
        xlabel="N:M pattern" if same else f"N:M pattern ({', '.join(patterns)} = 0, 1, …)",
        ylabel="top-1 accuracy (%)",
        title="N:M methods",
        categorical_x=same,
        xticklabels=[patterns[int(x)] for x in shown[0]] if same else None,
    )
    config = ctx.opts.base_config()  # read once: the recipe's p and θ
    p_own, theta_own = own_settings(ctx.opts, config)
    thetas = [theta_label(t, theta_own) for t in _thetas(ctx.opts)]
    ps = [p_label(p, p_own) for p in _ps(ctx.opts)]
    body = (
        "N:M sparse training: every method prunes each layer to the pattern "
        "(groups of M consecutive weights along the reduction dimension; layers whose "
        "reduction dimension is not a multiple of M stay dense), from the first step "
        "unless the method has its own schedule (one-shot: dense to half-way). "
        f"`feather-nm`: Feather's operator per group ({_feather_nm_settings(config)}); "
        "`sr-ste`: hard mask, STE, sparse-refined decay 2e-4; `s-ste`: soft "
        "threshold with the fixed per-tensor β; `hard-nm`: hard mask, plain STE; "
        "`oneshot-nm`: magnitude N:M at half-way, then a fixed mask.\n\n"
        "## Methods × patterns\n\n"
        + "".join(sections)
        + img(fig, "accuracy per N:M pattern")
        + "\n## θ ablation (feather-nm)\n\n"
        + _ablation(ctx, "θ", thetas, theta_label(theta_own, theta_own), models)
        + "## p ablation (feather-nm)\n\n"
        + _ablation(ctx, "p", ps, p_label(p_own, p_own), models)
        + _ranking_note(ctx, models)
    )
    return body, [fig]


def _ranking_note(ctx: Context, models: Sequence[str]) -> str:
    """One line per model: the methods ordered by mean accuracy over all cells."""
    lines = []
    for model in models:
        means: dict[str, list[float]] = {}
        for s, o in _pairs_of(ctx, model, _methods(ctx.opts)):
            if o.ok:
                means.setdefault(s.group, []).append(accuracy(o))
        order = sorted(means, key=lambda m: -mean_std(means[m])[0])
        if order:
            ranked = " > ".join(f"{m} ({mean_std(means[m])[0]:.2f})" for m in order)
            lines.append(f"- {model}: {ranked}")
    if not lines:
        return ""
    return (
        "## Ranking\n\nMethods by mean top-1 (%) over every pattern and seed run here "
        "(a summary; the paired tables above say which differences the seeds resolve):\n\n"
        + "\n".join(lines)
        + "\n"
    )


EXPERIMENT = Experiment(
    "nm",
    "N:M sparsity: Feather-N:M vs the N:M baselines",
    "issue 14",
    plan,
    summarize,
    seeds=NM_SEEDS,
    options=frozenset({"thetas", "ps", "ablation_pattern", "methods"}),
    methods=NM_METHODS,
    why_not={
        "sparsities": (
            f"its N:M patterns {', '.join(NM_PATTERNS)} set the sparsity; "
            "--methods, --thetas, --ps and --ablation-pattern narrow its grid"
        )
    },
)
