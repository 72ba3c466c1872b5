"""Tests that close the gaps a mutation audit of the benchmark experiments found.

Each test here fails on one or more hand-made mutants of
``bench/experiments/*.py`` (the plans and summaries of ``feather-sparse bench
compare|operator|theta|theta-operator|p|stability|backbones|flops``) that the
rest of the suite let through (``docs/mutation-audit.md``, "The benchmark
experiments"; the mutants' ids are in each test's docstring). The expected
grids are the paper's, written out here (Table 1, Figs. 2-4, the appendix, as
the registry's docstring and ``docs/results`` list them); the expected page
numbers are worked out here from made-up outcomes, with the Student-t quantile
of two degrees of freedom in closed form. Nothing trains: the plans are read,
and the summaries run on hand-made outcomes with the plotting functions
replaced by a recorder.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from _guards import guard
from feather_sparse.bench.driver import plan_experiments
from feather_sparse.bench.experiments import (
    EXPERIMENTS,
    backbones,
    base,
    flops,
    p,
    stability,
    theta,
    theta_operator,
)
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import Context
from feather_sparse.bench.runner import RunOutcome, RunSpec, plan_runs

SPARSITIES = (0.9, 0.95, 0.98, 0.99)  # Table 1 and every ablation figure
THETAS = (0.0, 0.25, 0.5, 0.75, 1.0)  # Fig. 3 and the stability study
SEEDS = (0, 1, 2)


def label(t: float) -> str:
    return f"θ = {t:g}"


def grid_of(name: str, opts: BenchOptions) -> dict[tuple[str, float, int], dict[str, Any]]:
    """``(row, sparsity, seed) -> the cell's config fields`` of one experiment's plan."""
    specs = plan_experiments([name], opts)
    cells = {(s.group, s.x, s.seed): dict(s.settings) for s in specs}
    assert len(cells) == len(specs), f"{name}: a cell planned twice"
    return cells


def expected(
    rows: dict[str, dict[str, Any]], sparsities: Sequence[float], seeds: Sequence[int] = SEEDS
) -> dict[tuple[str, float, int], dict[str, Any]]:
    return {
        (row, s, seed): {**fields, "dense": False, "sparsity": s}
        for row, fields in rows.items()
        for s in sparsities
        for seed in seeds
    }


DENSE = {("dense", 0.0, seed): {"dense": True} for seed in SEEDS}


def test_the_registry_holds_every_documented_experiment() -> None:
    """exp37: ``feather-sparse bench compare|operator|theta|theta-operator|p|stability|
    backbones|flops|nm`` (README) names the experiments there are."""
    assert set(EXPERIMENTS.names()) == {
        "compare",
        "operator",
        "theta",
        "theta-operator",
        "p",
        "stability",
        "backbones",
        "flops",
        "nm",
    }


def test_every_experiment_plans_its_documented_grid(tmp_path: Path) -> None:
    """exp02, exp03, exp05, exp14, exp15, exp19, exp22, exp23, exp25, exp27, exp33,
    exp34, exp36: each experiment runs exactly its rows (with their settings) ×
    its sparsities × the seeds, and the dense model once per seed where it has one."""
    opts = BenchOptions(seeds=SEEDS, out=tmp_path, runs_dir=tmp_path / "runs")
    table1 = {
        "Feather-Global": {"method": "feather", "backbone": "global"},
        "Feather-ASL+": {"method": "feather", "backbone": "asl+"},
        "ST-3": {"method": "st3"},
        "Spartan": {"method": "spartan"},
        "GMP": {"method": "gmp"},
        "hard-STE": {"method": "hard"},
        "soft-STE": {"method": "soft"},
        "non-STE": {"method": "nonste"},
    }
    assert grid_of("compare", opts) == expected(table1, SPARSITIES) | DENSE
    fig2 = {  # θ = 1 for every operator: the plain STE
        "hard": {"method": "feather", "operator": "hard", "theta": 1.0},
        "soft": {"method": "feather", "operator": "soft", "theta": 1.0},
        "Feather (p = 3)": {"method": "feather", "operator": "feather", "theta": 1.0},
    }
    assert grid_of("operator", opts) == expected(fig2, SPARSITIES)
    fig3 = {label(t): {"method": "feather", "operator": "feather", "theta": t} for t in THETAS}
    assert grid_of("theta", opts) == expected(fig3, SPARSITIES)
    fig4 = {
        f"{name}, {label(t)}": {"method": "feather", "operator": op, "theta": t}
        for name, op in (("hard", "hard"), ("soft", "soft"), ("Feather", "feather"))
        for t in (0.0, 0.5, 1.0)
    }
    assert grid_of("theta-operator", opts) == expected(fig4, (0.95, 0.99))
    ps = {  # p = 3 left to the operator (Feather's own), the others set
        "p = 1 (soft)": {"method": "feather", "operator": "feather", "p": 1.0},
        "p = 2": {"method": "feather", "operator": "feather", "p": 2.0},
        "p = 3 (Feather)": {"method": "feather", "operator": "feather"},
        "p = 4": {"method": "feather", "operator": "feather", "p": 4.0},
        "p = ∞ (hard)": {"method": "feather", "operator": "feather", "p": math.inf},
    }
    assert grid_of("p", opts) == expected(ps, SPARSITIES)
    assert grid_of("stability", opts) == expected(fig3, (0.98,))
    appendix = {
        "GMP": {"method": "gmp"},
        "Feather-GMP": {"method": "feather-gmp"},
        "ASL+": {"method": "hard", "backbone": "asl+"},
        "Feather-ASL+": {"method": "feather", "backbone": "asl+"},
    }
    assert grid_of("backbones", opts) == expected(appendix, SPARSITIES)
    flops = {b: {"method": "feather", "backbone": b} for b in ("global", "global-flops", "uniform")}
    assert grid_of("flops", opts) == expected(flops, SPARSITIES) | DENSE


@pytest.mark.parametrize("name", ["theta", "theta-operator", "stability"])
def test_every_theta_given_is_run(name: str, tmp_path: Path) -> None:
    """exp04: ``--thetas 0.1 0.2 0.3`` runs all three, in every experiment that takes it."""
    opts = BenchOptions(seeds=(0,), thetas=(0.1, 0.2, 0.3), out=tmp_path)
    thetas = {cfg["theta"] for cfg in grid_of(name, opts).values()}
    assert thetas == {0.1, 0.2, 0.3}


@guard(
    "`bench p` with a recipe or `--set` that gives p (its p = 3 row would train that p)",
    "every row trains its own p; `--set p=...` refused as set by the experiment, before any run",
)
def test_the_p_rows_train_their_own_p_whatever_the_recipe_gives(tmp_path: Path) -> None:
    """A real bug, found by the audit: the row labelled "p = 3 (Feather)" left p to the
    config, so a recipe with ``p = 2`` trained it at p = 2 (two rows of p = 2, none of
    p = 3, and the paired table against the wrong run), and ``--ps 3 --set p=2``
    trained p = 2 under the label p = 3."""
    recipe = tmp_path / "recipe.toml"
    shipped = Path(__file__).resolve().parent.parent / "src/feather_sparse/recipes/mnist1d.toml"
    recipe.write_text(shipped.read_text() + "\np = 2.0\n")
    opts = BenchOptions(recipe=str(recipe), seeds=(0,), sparsities=(0.9,), out=tmp_path)
    specs = plan_experiments(["p"], opts)
    plan = plan_runs(opts, specs)
    trained = {s.group: plan.todo[k]["p"] for s, k in zip(specs, plan.keys)}
    assert trained == {
        "p = 1 (soft)": 1.0,
        "p = 2": 2.0,
        "p = 3 (Feather)": 3.0,
        "p = 4": 4.0,
        "p = ∞ (hard)": math.inf,
    }
    over = BenchOptions(ps=(3.0,), overrides={"p": 2.0}, seeds=(0,), out=tmp_path)
    with pytest.raises(ValueError, match="p: set by the experiment"):
        plan_runs(over, plan_experiments(["p"], over))
    # without a p of the recipe's or the user's, the p = 3 row is compare's Feather-Global
    plain = BenchOptions(seeds=(0,), sparsities=(0.9,), out=tmp_path)
    keys = set(plan_runs(plain, plan_experiments(["p"], plain)).keys)
    assert set(plan_runs(plain, plan_experiments(["compare"], plain)).keys) & keys


# ----------------------------------------------------------------- the pages
def t975(df: int) -> float:
    assert df == 2  # (2q − 1) / √(2q(1 − q)), q = 0.975
    q = 0.975
    return (2 * q - 1) / math.sqrt(2 * q * (1 - q))


def paired_cell(row: Sequence[float], reference: Sequence[float]) -> str:
    """``row − reference`` over three seeds, in points: mean [95 % interval] verdict."""
    diffs = [100 * (a - b) for a, b in zip(row, reference)]
    mean = statistics.fmean(diffs)
    half = t975(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    low, high = mean - half, mean + half
    verdict = "**win**" if low > 0 else "**loss**" if high < 0 else "n.s."
    return f"{mean:+.2f} [{low:+.2f}, {high:+.2f}] {verdict}"


class Plots:
    """Stands in for the plotting functions of ``modules``; records what each was given."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *targets: tuple[Any, str]) -> None:
        self.calls: dict[str, list[tuple[Any, dict[str, Any]]]] = {}
        for module, name in targets:
            monkeypatch.setattr(module, name, self._recorder(name))

    def _recorder(self, name: str) -> Any:
        def record(first: Any, path: Path, **kwargs: Any) -> Path:
            self.calls.setdefault(name, []).append((first, kwargs))
            return Path(path)

        return record


def runs(
    row: str, x: float, accuracies: Sequence[float | None], **fields: Any
) -> list[tuple[RunSpec, RunOutcome]]:
    """One run per seed (0, 1, ...); ``None`` is a failed run."""
    return [
        (
            RunSpec(row, x, seed, {}),
            RunOutcome(
                key=f"{row}-{x}-{seed}",
                config={},
                ok=a is not None,
                error=None if a is not None else "E",
                test_accuracy=math.nan if a is None else a,
                **fields,
            ),
        )
        for seed, a in enumerate(accuracies)
    ]


def context(name: str, opts: BenchOptions, pairs: list[tuple[RunSpec, RunOutcome]]) -> Context:
    return Context(name, opts, pairs, executed=0, elapsed=0.0, workers=1)


def after(text: str, marker: str) -> str:
    assert marker in text, marker
    return text.split(marker, 1)[1]


FG = [0.90, 0.92, 0.91]
GMP = [0.85, 0.88, 0.86]


def test_compare_page_pairs_each_method_against_feather_global_with_the_dense_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exp06, exp09, exp10, exp11, exp16, exp18: the paired table is row − Feather-Global
    under a caption naming Feather-Global; the dense line and the plot's baseline are
    the finished dense runs' mean ± std (a failed one left out); the achieved sparsity
    is in %."""
    plots = Plots(monkeypatch, (base, "plot_curves"))
    opts = BenchOptions(seeds=SEEDS, methods=("Feather-Global", "GMP"), out=tmp_path)
    pairs = (
        runs("Feather-Global", 0.99, FG, sparsity=0.99)
        + runs("GMP", 0.99, GMP, sparsity=0.99)
        + runs("dense", 0.0, [0.97, 0.99, None], params=1234)
    )
    body, _ = EXPERIMENTS.get("compare").summarize(context("compare", opts, pairs))
    assert "Dense model (1,234 parameters): **98.00 ± 1.41** % top-1." in body
    paired = after(body, "Paired difference to Feather-Global, in points")
    lines = paired.splitlines()
    assert "| method | 99 % |" in lines
    assert "| Feather-Global | reference |" in lines
    assert f"| GMP | {paired_cell(GMP, FG)} |" in lines  # GMP − Feather-Global: a loss
    achieved = after(body, "Achieved sparsity (%)")
    assert "| Feather-Global | 99.00 ± 0.00 |" in achieved.splitlines()
    ((curves, kwargs),) = plots.calls["plot_curves"]
    assert kwargs["baseline"] == ("dense", 98.0, pytest.approx(statistics.stdev([97.0, 99.0])))
    assert [c.label for c in curves] == ["Feather-Global", "GMP"]


def test_compare_page_of_selected_methods_shows_only_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exp07, exp17: ``--methods GMP`` (Feather-Global not run): the tables have the GMP
    row alone, and there is no paired section (no reference to pair with)."""
    Plots(monkeypatch, (base, "plot_curves"))
    opts = BenchOptions(seeds=SEEDS, methods=("GMP",), out=tmp_path)
    body, _ = EXPERIMENTS.get("compare").summarize(
        context("compare", opts, runs("GMP", 0.99, GMP, sparsity=0.99))
    )
    rows = [line.split(" | ")[0] for line in body.splitlines() if line.startswith("| ")]
    assert set(rows) == {"| method", "| GMP"}
    assert "Paired difference" not in body


def test_a_named_reference_that_was_run_gets_its_paired_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exp08, exp20: the operator page pairs each operator with Feather's (p = 3):
    hard − Feather, seed by seed."""
    Plots(monkeypatch, (base, "plot_curves"))
    opts = BenchOptions(seeds=SEEDS, out=tmp_path)
    hard, soft = [0.80, 0.84, 0.83], [0.93, 0.95, 0.92]
    pairs = runs("hard", 0.99, hard) + runs("soft", 0.99, soft) + runs("Feather (p = 3)", 0.99, FG)
    body, _ = EXPERIMENTS.get("operator").summarize(context("operator", opts, pairs))
    lines = after(body, "Paired difference to the Feather (p = 3) operator").splitlines()
    assert f"| hard | {paired_cell(hard, FG)} |" in lines
    assert f"| soft | {paired_cell(soft, FG)} |" in lines
    assert "| Feather (p = 3) | reference |" in lines


def test_the_plots_sparsity_labels_are_every_column_a_curve_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exp12: Feather-Global's runs at 95 % all failed; GMP's did not: the categorical
    axis still labels 90 % and 95 %."""
    plots = Plots(monkeypatch, (base, "plot_curves"))
    opts = BenchOptions(seeds=SEEDS, methods=("Feather-Global", "GMP"), out=tmp_path)
    pairs = (
        runs("Feather-Global", 0.9, FG)
        + runs("Feather-Global", 0.95, [None, None, None])
        + runs("GMP", 0.9, GMP)
        + runs("GMP", 0.95, GMP)
    )
    EXPERIMENTS.get("compare").summarize(context("compare", opts, pairs))
    ((curves, kwargs),) = plots.calls["plot_curves"]
    assert [c.x for c in curves] == [(0.9,), (0.9, 0.95)]
    assert kwargs["xticklabels"] == ["90 %", "95 %"]


def test_theta_page_pairs_with_the_theta_of_the_recipes_rule_and_panels_per_sparsity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exp13, exp21: with ``theta_rule = "released"`` (θ = 0.5 only above 95 %) the
    reference at 95 % is θ = 1 and at 99 % θ = 0.5; each panel shows its own sparsity."""
    plots = Plots(monkeypatch, (theta, "plot_panels"))
    opts = BenchOptions(
        seeds=SEEDS, thetas=(0.5, 1.0), overrides={"theta_rule": "released"}, out=tmp_path
    )
    acc = {
        (0.5, 0.95): [0.91, 0.92, 0.93],
        (1.0, 0.95): [0.95, 0.96, 0.94],
        (0.5, 0.99): [0.81, 0.85, 0.82],
        (1.0, 0.99): [0.71, 0.70, 0.74],
    }
    pairs = [pair for (t, s), a in acc.items() for pair in runs(label(t), s, a)]
    body, _ = theta.summarize(context("theta", opts, pairs))
    lines = after(body, "Paired difference to").splitlines()
    half = paired_cell(acc[(0.5, 0.95)], acc[(1.0, 0.95)])
    one = paired_cell(acc[(1.0, 0.99)], acc[(0.5, 0.99)])
    assert f"| θ = 0.5 | {half} | reference |" in lines
    assert f"| θ = 1 | reference | {one} |" in lines
    ((panels, _),) = plots.calls["plot_panels"]
    assert [title for title, _ in panels] == ["sparsity 95 %", "sparsity 99 %"]
    for (title, (curve,)), s in zip(panels, (0.95, 0.99)):
        assert curve.x == (0.5, 1.0), title
        means = [100 * statistics.fmean(acc[(t, s)]) for t in (0.5, 1.0)]
        assert curve.mean == pytest.approx(means), title


def test_theta_operator_panels_show_the_thetas_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exp24: ``--thetas 0.25``: each operator's curve has its θ = 0.25 point."""
    plots = Plots(monkeypatch, (theta_operator, "plot_panels"))
    opts = BenchOptions(seeds=SEEDS, thetas=(0.25,), out=tmp_path)
    pairs = [
        pair
        for i, op in enumerate(("hard", "soft", "Feather"))
        for pair in runs(f"{op}, θ = 0.25", 0.95, [0.9 + 0.01 * i] * 3)
    ]
    theta_operator.summarize(context("theta-operator", opts, pairs))
    ((panels, _),) = plots.calls["plot_panels"]
    ((title, curves),) = panels
    assert title == "sparsity 95 %"
    assert [(c.label, c.x) for c in curves] == [
        ("hard", (0.25,)),
        ("soft", (0.25,)),
        ("Feather", (0.25,)),
    ]
    assert [c.mean[0] for c in curves] == pytest.approx([90.0, 91.0, 92.0])


def test_p_page_pairs_with_feathers_p_3_and_draws_the_ps_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exp26, exp28: ``--ps 1 3``: the paired table is p = 1 − p = 3, and the operator
    family drawn is p ∈ {1, 3}."""
    plots = Plots(monkeypatch, (base, "plot_curves"), (p, "plot_operator_family"))
    opts = BenchOptions(seeds=SEEDS, ps=(1.0, 3.0), out=tmp_path)
    pairs = runs("p = 1 (soft)", 0.99, GMP) + runs("p = 3 (Feather)", 0.99, FG)
    body, _ = p.summarize(context("p", opts, pairs))
    lines = after(body, "Paired difference to Feather's p = 3").splitlines()
    assert f"| p = 1 (soft) | {paired_cell(GMP, FG)} |" in lines
    assert "| p = 3 (Feather) | reference |" in lines
    ((ps, _),) = plots.calls["plot_operator_family"]
    assert tuple(ps) == (1.0, 3.0)


def stable(
    row: str, x: float, pearson: tuple[float, ...], changed: tuple[float, ...]
) -> list[tuple[RunSpec, RunOutcome]]:
    """Two seeds of one stability run, recorded at epochs 2, 4, 6, 8."""
    return runs(
        row,
        x,
        [0.9, 0.9],
        stability_epochs=(2, 4, 6, 8),
        stability_pearson=pearson,
        stability_changed=changed,
    )


def test_stability_table_reads_each_column_as_its_header_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exp29, exp30, exp31: recorded at epochs 2, 4, 6, 8 of 8: r at 25 % is epoch 2's,
    at 50 % epoch 4's; r first reaches 0.9 at epoch 4 but dips at 6, so "from then on"
    is epoch 8; the flips of the 2nd half are those of epochs 6 and 8, in %."""
    Plots(monkeypatch, (stability, "plot_curves"), (stability, "plot_panels"))
    opts = BenchOptions(seeds=(0, 1), thetas=(0.5,), out=tmp_path)
    pairs = stable(label(0.5), 0.98, (0.5, 0.95, 0.85, 1.0), (0.4, 0.3, 0.02, 0.01))
    body, _ = stability.summarize(context("stability", opts, pairs))
    flips = 100 * statistics.fmean([0.02, 0.01])
    row = f"| θ = 0.5 | 0.500 ± 0.000 | 0.950 ± 0.000 | 8.0 ± 0.0 | {flips:.3f} | 90.00 ± 0.00 |"
    assert row in body.splitlines()


def test_stability_at_several_sparsities_reads_each_sparsitys_own_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exp32: ``--sparsities 0.95 0.99``: the table and curve of 95 % are the 95 % runs'."""
    plots = Plots(monkeypatch, (stability, "plot_curves"), (stability, "plot_panels"))
    opts = BenchOptions(seeds=(0, 1), thetas=(0.5,), sparsities=(0.95, 0.99), out=tmp_path)
    pairs = stable(label(0.5), 0.95, (0.2, 0.4, 0.6, 1.0), (0.1, 0.1, 0.1, 0.1)) + stable(
        label(0.5), 0.99, (0.8, 0.9, 0.95, 1.0), (0.3, 0.3, 0.3, 0.3)
    )
    body, _ = stability.summarize(context("stability", opts, pairs))
    at95 = after(body, "### Sparsity 95 %").split("### Sparsity 99 %")[0]
    assert "| θ = 0.5 | 0.200 ± 0.000 | 0.400 ± 0.000 | 8.0 ± 0.0 | 10.000 |" in at95
    at99 = after(body, "### Sparsity 99 %")
    assert "| θ = 0.5 | 0.800 ± 0.000 | 0.900 ± 0.000 | 4.0 ± 0.0 | 30.000 |" in at99
    ((panels, _),) = plots.calls["plot_panels"]
    assert [(title, [c.mean for c in curves]) for title, curves in panels] == [
        ("sparsity 95 %", [(0.2, 0.4, 0.6, 1.0)]),
        ("sparsity 99 %", [(0.8, 0.9, 0.95, 1.0)]),
    ]


def test_backbones_panels_pair_each_backbone_with_its_feather(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exp35: the GMP panel draws GMP and Feather-GMP, the ASL+ panel ASL+ and Feather-ASL+."""
    plots = Plots(monkeypatch, (backbones, "plot_panels"))
    opts = BenchOptions(seeds=SEEDS, out=tmp_path)
    pairs = [
        pair
        for row in ("GMP", "Feather-GMP", "ASL+", "Feather-ASL+")
        for pair in runs(row, 0.99, FG)
    ]
    backbones.summarize(context("backbones", opts, pairs))
    ((panels, _),) = plots.calls["plot_panels"]
    assert [(title, [c.label for c in curves]) for title, curves in panels] == [
        ("GMP backbone (uniform)", ["GMP", "Feather-GMP"]),
        ("ASL+ backbone", ["ASL+", "Feather-ASL+"]),
    ]


@guard(
    "a `bench flops` page whose first seed's run of a row failed at the top sparsity",
    "the per-layer figure draws only runs of the seed its title names; that row is left out",
)
def test_the_per_layer_figure_draws_the_seed_its_title_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real bug, found by the audit: the figure titled "(seed 0)" drew each row's
    first finished run, seed 1's where seed 0's had failed."""
    plots = Plots(monkeypatch, (flops, "plot_curves"), (flops, "plot_layer_sparsity"))
    opts = BenchOptions(seeds=(0, 1), out=tmp_path)
    pairs = []
    for row in ("global", "uniform"):
        for seed in (0, 1):
            ok = not (row == "global" and seed == 0)
            layers = (("fc", 100, 10 * (seed + 1)),)  # seed 0 keeps 10 weights, seed 1 keeps 20
            outcome = RunOutcome(
                key=f"{row}-{seed}",
                config={},
                ok=ok,
                error=None if ok else "E",
                test_accuracy=0.9 if ok else math.nan,
                sparse_macs=1000,
                layers=layers if ok else (),
            )
            pairs.append((RunSpec(row, 0.99, seed, {}), outcome))
    flops.summarize(context("flops", opts, pairs))
    ((dists, kwargs),) = plots.calls["plot_layer_sparsity"]
    assert kwargs["title"] == "Per-layer sparsity at 99 % (seed 0)"
    assert list(dists) == ["uniform"]
    (layer,) = dists["uniform"].layers
    assert layer.nonzeros == 10
