"""Tests that close the gaps a mutation audit of ``feather-sparse bench nm`` found.

Each test here fails on one or more hand-made mutants of
``bench/experiments/nm.py`` that the rest of the suite let through
(``docs/mutation-audit.md``, "The N:M evidence experiment"; the mutants' ids are
in each test's docstring). The expected grid is the one the module's docstring,
``docs/results/nm/README.md`` and ``docs/guide/nm.md`` write out (five methods ×
2:4, 4:8, 1:4 × the CNN and the mixer × the seeds; θ ∈ {0, 0.5, 1} and
p ∈ {1, 2, 3, ∞} of ``feather-nm`` at the ablation pattern, per model); the
expected page numbers are worked out here from made-up outcomes (means, sample
standard deviations, paired differences with the Student-t quantile of two
degrees of freedom in closed form). Nothing trains: the plans are read, and the
summary runs on hand-made outcomes with the figure replaced by a recorder.
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
from feather_sparse.bench.experiments import EXPERIMENTS, nm
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import Context
from feather_sparse.bench.runner import RunOutcome, RunSpec, plan_runs

METHODS = ("feather-nm", "sr-ste", "s-ste", "hard-nm", "oneshot-nm")
PATTERNS = ("2:4", "4:8", "1:4")
MODELS = ("mnist1d_cnn", "mnist1d_mlpmixer")
SEEDS = (0, 1, 2)
THETA_ROWS = {"θ = 0": 0.0, "θ = 0.5": 0.5, "θ = 1 (feather-nm)": 1.0}
P_ROWS = {"p = 1 (soft)": 1.0, "p = 2": 2.0, "p = 3 (feather-nm)": 3.0, "p = ∞ (hard)": math.inf}
#: At ``--ablation-pattern 1:32`` (96.9 %), where feather-nm's automatic θ is 0.5.
AT_1_32_THETA_ROWS = {"θ = 0": 0.0, "θ = 0.5 (feather-nm)": 0.5, "θ = 1": 1.0}
INF = math.inf


def paper_theta(config: dict[str, Any]) -> float:
    """The θ a run trains with: its own, or the paper's automatic rule (0.5 at S ≥ 0.95)."""
    if config.get("theta") is not None:
        return float(config["theta"])
    return 0.5 if config["sparsity"] >= 0.95 else 1.0


def trained(opts: BenchOptions) -> dict[tuple[str, float, int], dict[str, Any]]:
    """``(row, column, seed) -> the config the run trains`` (one model)."""
    specs = plan_experiments(["nm"], opts)
    runs = plan_runs(opts, specs)
    configs = {**runs.todo}
    return {(s.group, s.x, s.seed): configs[k] for s, k in zip(specs, runs.keys)}


def recipe_with(tmp_path: Path, line: str) -> str:
    recipe = tmp_path / "recipe.toml"
    shipped = Path(__file__).resolve().parent.parent / "src/feather_sparse/recipes/mnist1d.toml"
    recipe.write_text(shipped.read_text() + f"\n{line}\n")
    return str(recipe)


# ----------------------------------------------------------------- real bugs
@guard(
    "`bench nm --ablation-pattern` at 95 % or more (1:32), where θ automatic is 0.5",
    "the row labelled θ = 1 trains θ = 1 (it trained θ = 0.5, the θ = 0.5 row's very run)",
)
def test_every_theta_row_trains_its_theta_at_any_ablation_pattern(tmp_path: Path) -> None:
    """A real bug, found by the audit (enm18): the θ = 1 row left θ to feather-nm, whose
    automatic θ is 0.5 at 1:32 (96.9 % sparse); it trained θ = 0.5 under the label
    θ = 1, the same run as the θ = 0.5 row, and θ = 1 was never trained."""
    opts = BenchOptions(
        seeds=(0,),
        overrides={"model": "mnist1d_mlpmixer"},
        methods=("feather-nm",),
        ps=(3.0,),
        ablation_pattern="1:32",
        out=tmp_path,
        runs_dir=tmp_path / "runs",
    )
    cells = trained(opts)
    rows = AT_1_32_THETA_ROWS  # feather-nm's own θ there is 0.5: that row is tagged
    thetas = {row: paper_theta(cfg) for (row, _, _), cfg in cells.items() if row in rows}
    assert thetas == rows
    assert {cells[row, 0.0, 0]["pattern"] for row in rows} == {"1:32"}
    # at 2:4 (θ automatic = 1) the θ = 1 row is still feather-nm's own 2:4 run
    plain = BenchOptions(seeds=(0,), overrides={"model": "mnist1d_mlpmixer"}, out=tmp_path)
    specs = plan_experiments(["nm"], plain)
    keys = dict(zip([(s.group, s.x) for s in specs], plan_runs(plain, specs).keys))
    assert keys["θ = 1 (feather-nm)", 0.0] == keys["feather-nm", 0.0]
    assert keys["p = 3 (feather-nm)", 0.0] == keys["feather-nm", 0.0]


@guard(
    "`bench nm` with a recipe that gives θ or p (its θ = 1 and p = 3 rows trained those)",
    "each ablation row trains its own θ and p; `--set theta=`/`p=` refused: set by the experiment",
)
def test_the_ablation_rows_train_their_own_theta_and_p_whatever_the_recipe_gives(
    tmp_path: Path,
) -> None:
    """A real bug, found by the audit (enm18, enm20): the rows labelled θ = 1 and
    p = 3 left θ and p to the config, so a recipe with ``theta = 0.5`` or ``p = 2``
    trained them at the recipe's values (two rows of p = 2, none of p = 3, and the
    paired tables against the wrong runs); ``--thetas 1 --set theta=0.5`` trained
    θ = 0.5 under the label θ = 1."""
    one: dict[str, Any] = {
        "seeds": (0,),
        "overrides": {"model": "mnist1d_mlpmixer"},
        "out": tmp_path,
    }
    # the row tagged (feather-nm) is the recipe's θ or p: feather-nm's own runs train it
    recipe_theta = {"θ = 0": 0.0, "θ = 0.5 (feather-nm)": 0.5, "θ = 1": 1.0}
    recipe_p = {"p = 1 (soft)": 1.0, "p = 2 (feather-nm)": 2.0, "p = 3": 3.0, "p = ∞ (hard)": INF}
    for line, theta_rows, p_rows in (
        ("theta = 0.5", recipe_theta, P_ROWS),
        ("p = 2.0", THETA_ROWS, recipe_p),
    ):
        opts = BenchOptions(recipe=recipe_with(tmp_path, line), methods=("feather-nm",), **one)
        cells = trained(opts)
        thetas = {r: paper_theta(c) for (r, _, _), c in cells.items() if r in theta_rows}
        ps = {r: c["p"] if c.get("p") is not None else 3.0 for (r, _, _), c in cells.items()}
        assert thetas == theta_rows, line
        assert {r: ps[r] for r in p_rows} == p_rows, line
    cases: list[tuple[dict[str, Any], float, str]] = [
        ({"thetas": (1.0,)}, 0.5, "theta"),
        ({"ps": (3.0,)}, 2.0, "p"),
    ]
    for flag, value, name in cases:
        over = BenchOptions(
            methods=("feather-nm",),
            seeds=(0,),
            overrides={name: value, "model": "mnist1d_mlpmixer"},
            out=tmp_path,
            **flag,
        )
        with pytest.raises(ValueError, match=f"{name}: set by the experiment"):
            plan_runs(over, plan_experiments(["nm"], over))


# ----------------------------------------------------------------- the grid
def grid(opts: BenchOptions) -> list[tuple[str, float, int, dict[str, Any]]]:
    return sorted(((s.group, s.x, s.seed, dict(s.settings)) for s in nm.plan(opts)), key=repr)


def expected_grid(
    models: Sequence[str],
    patterns: Sequence[str],
    methods: Sequence[str],
    seeds: Sequence[int],
    thetas: dict[str, float],
    ps: dict[str, float],
    ablation: str,
    model_set: bool = True,
) -> list[tuple[str, float, int, dict[str, Any]]]:
    def of(model: str) -> dict[str, Any]:
        return {"model": model} if model_set else {}

    cells = [
        (method, float(x), seed, {"dense": False, "method": method, "pattern": pat, **of(m)})
        for m in models
        for x, pat in enumerate(patterns)
        for method in methods
        for seed in seeds
    ]
    for x, m in enumerate(models):
        base = {"dense": False, "method": "feather-nm", "pattern": ablation, **of(m)}
        for row, t in thetas.items():
            cells += [(row, float(x), seed, {**base, "theta": t}) for seed in seeds]
        for row, p in ps.items():
            fields = base if p == 3.0 else {**base, "p": p}  # p = 3: feather-nm's own
            cells += [(row, float(x), seed, fields) for seed in seeds]
    return sorted(cells, key=repr)


def test_bench_nm_plans_its_documented_grid(tmp_path: Path) -> None:
    """enm01, enm02, enm03, enm11, enm12, enm13, enm15, enm16, enm17, enm19: five methods ×
    2:4, 4:8, 1:4 (columns 0, 1, 2) × both models × the seeds, then per model (column
    = the model) feather-nm's θ and p ablations at 2:4, each row its label's value."""
    opts = BenchOptions(seeds=SEEDS, out=tmp_path)
    assert grid(opts) == expected_grid(MODELS, PATTERNS, METHODS, SEEDS, THETA_ROWS, P_ROWS, "2:4")


def test_bench_nm_honours_every_flag_of_its_grid(tmp_path: Path) -> None:
    """enm04, enm05, enm06, enm08, enm09, enm10, enm14: ``--quick`` (2:4 on the mixer, the
    first seed), ``--set model=`` under ``--quick``, and ``--methods``, ``--thetas``,
    ``--ps``, ``--ablation-pattern`` each narrow or move the grid as given."""
    quick = BenchOptions(quick=True, seeds=(4, 5), out=tmp_path)
    mixer = ("mnist1d_mlpmixer",)
    assert grid(quick) == expected_grid(mixer, ("2:4",), METHODS, (4,), THETA_ROWS, P_ROWS, "2:4")
    cnn = BenchOptions(quick=True, seeds=(0,), overrides={"model": "mnist1d_cnn"}, out=tmp_path)
    assert nm.summarize is EXPERIMENTS.get("nm").summarize
    assert nm._models(cnn) == ("mnist1d_cnn",)
    assert grid(cnn) == expected_grid(
        ("mnist1d_cnn",), ("2:4",), METHODS, (0,), THETA_ROWS, P_ROWS, "2:4", model_set=False
    )
    narrow = BenchOptions(
        seeds=(0, 1),
        methods=("s-ste", "feather-nm"),
        thetas=(0.25, 1.0),
        ps=(1.0, 4.0),
        ablation_pattern="4:8",
        out=tmp_path,
    )
    thetas = {"θ = 0.25": 0.25, "θ = 1 (feather-nm)": 1.0}
    ps = {"p = 1 (soft)": 1.0, "p = 4": 4.0}
    assert grid(narrow) == expected_grid(
        MODELS, PATTERNS, ("feather-nm", "s-ste"), (0, 1), thetas, ps, "4:8"
    )


# ------------------------------------------------------------ the flip rate
def outcome(accuracy: float | None = 0.9, changed: Sequence[float] = ()) -> RunOutcome:
    return RunOutcome(
        key="k",
        config={},
        ok=accuracy is not None,
        test_accuracy=math.nan if accuracy is None else accuracy,
        stability_changed=tuple(changed),
    )


def test_the_flip_rate_is_the_second_halfs_mean_in_percent() -> None:
    """enm21, enm22, enm23, enm24: the mean fraction flipped per epoch over the second
    half of the records, in %, a NaN record left out of the mean, NaN (not measured)
    without records."""
    assert nm.flip_rate(outcome(changed=(0.30, 0.20, 0.02, 0.04))) == pytest.approx(3.0)
    # five records: the second half is the last three; the NaN one is not an epoch measured
    odd = (0.50, 0.40, 0.03, math.nan, 0.05)
    assert nm.flip_rate(outcome(changed=odd)) == pytest.approx(100 * (0.03 + 0.05) / 2)
    assert math.isnan(nm.flip_rate(outcome(changed=())))


# ----------------------------------------------------------------- the page
class Figure:
    """Stands in for ``nm.plot_panels``; records what it was given."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[Any, dict[str, Any]]] = []
        monkeypatch.setattr(nm, "plot_panels", self.record)

    def record(self, panels: Any, path: Path, **kwargs: Any) -> Path:
        self.calls.append((panels, kwargs))
        return Path(path)


NOISE = (0.001, -0.002, 0.004)


def acc_of(mi: int, k: int, x: int, seed: int) -> float:
    """Made-up accuracy (a fraction): model, method, column and seed all matter."""
    return 0.90 + 0.03 * mi - 0.01 * k + 0.004 * x + NOISE[seed] * (k + 1)


def flips_of(mi: int, k: int, x: int, seed: int) -> float:
    """Made-up fraction flipped per epoch over the second half."""
    return 0.001 * (1 + k + 5 * mi + 2 * x) + 0.0003 * seed


def run(
    group: str, x: float, seed: int, acc: float | None, flips: float, model: str | None
) -> tuple[RunSpec, RunOutcome]:
    settings = {} if model is None else {"model": model}
    # the first half flips a lot (the ramp); the second half is the rate the page reports
    return RunSpec(group, x, seed, settings), outcome(acc, (0.4, 0.3, flips, flips))


def main_runs(
    models: Sequence[str], methods: Sequence[str] = METHODS, model_set: bool = True
) -> list[tuple[RunSpec, RunOutcome]]:
    return [
        run(
            meth,
            float(x),
            seed,
            acc_of(mi, METHODS.index(meth), x, seed),
            flips_of(mi, METHODS.index(meth), x, seed),
            m if model_set else None,
        )
        for mi, m in enumerate(models)
        for x in range(len(PATTERNS))
        for meth in methods
        for seed in SEEDS
    ]


def ablation_runs(
    rows: Sequence[str], n_models: int, model_set: bool = True
) -> list[tuple[RunSpec, RunOutcome]]:
    return [
        run(
            row,
            float(mi),
            seed,
            0.80 + 0.02 * i + 0.05 * mi + NOISE[seed] * (i + 1),
            0.002 * (i + 1) + 0.01 * mi + 0.0001 * seed,
            (MODELS[mi] if n_models == 2 else "mnist1d_mlpmixer") if model_set else None,
        )
        for mi in range(n_models)
        for i, row in enumerate(rows)
        for seed in SEEDS
    ]


def mean_pm_std(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.fmean(values))} ± {fmt.format(statistics.stdev(values))}"


def paired_cell(row: Sequence[float], reference: Sequence[float]) -> str:
    """``row − reference`` over two or three seeds, in points: mean [95 % interval] verdict."""
    diffs = [100 * (a - b) for a, b in zip(row, reference)]
    mean = statistics.fmean(diffs)
    # the Student-t quantile q = 0.975 in closed form: one degree of freedom
    # tan(π(q − 1/2)), two (2q − 1) / √(2q(1 − q))
    q, n = 0.975, len(diffs)
    t = math.tan(math.pi * (q - 0.5)) if n == 2 else (2 * q - 1) / math.sqrt(2 * q * (1 - q))
    assert n in (2, 3)
    half = t * statistics.stdev(diffs) / math.sqrt(n)
    low, high = mean - half, mean + half
    verdict = "win" if low > 0 else "loss" if high < 0 else "n.s."  # bold dropped by tables()
    return f"{mean:+.2f} [{low:+.2f}, {high:+.2f}] {verdict}"


def tables(text: str) -> list[dict[str, list[str]]]:
    """The Markdown tables of ``text``, in order: ``{first cell: the other cells}``
    (the header row under the key ``"header"``; bold marks dropped)."""
    found: list[dict[str, list[str]]] = []
    current: dict[str, list[str]] | None = None
    for line in text.splitlines():
        if line.startswith("|---"):  # the header's rule
            continue
        if not line.startswith("| "):
            current = None
            continue
        cells = [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]
        if current is None:
            current = {"header": cells[1:]}
            found.append(current)
        else:
            current[cells[0]] = cells[1:]
    return found


def between(text: str, start: str, end: str | None) -> str:
    assert start in text, start
    rest = text.split(start, 1)[1]
    return rest.split(end, 1)[0] if end is not None else rest


def summarize(opts: BenchOptions, pairs: list[tuple[RunSpec, RunOutcome]]) -> str:
    ctx = Context("nm", opts, pairs, executed=0, elapsed=0.0, workers=1)
    body, _ = EXPERIMENTS.get("nm").summarize(ctx)
    return body


def test_each_models_section_reads_its_own_runs_and_pairs_against_feather_nm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """enm26, enm27, enm35, enm36: per model, the accuracy table (mean ± std over seeds),
    the paired table (row − feather-nm, seed by seed, with its verdict), the flip-rate
    table (%) are that model's runs of each method and pattern; the ranking orders the
    methods of that model by the mean of its finished runs, nothing else."""
    Figure(monkeypatch)
    opts = BenchOptions(seeds=SEEDS, out=tmp_path)
    # the mixer's hard-nm run at 1:4, seed 2, failed: it is left out everywhere
    failed = ("hard-nm", 2.0, 2, "mnist1d_mlpmixer")
    pairs = [
        (s, o)
        if (s.group, s.x, s.seed, s.settings["model"]) != failed
        else run(*failed[:3], None, 0.0, failed[3])
        for s, o in main_runs(MODELS)
    ]
    pairs += ablation_runs(list(THETA_ROWS), 2) + ablation_runs(list(P_ROWS), 2)
    body = summarize(opts, pairs)
    ranking = between(body, "## Ranking", None)
    for mi, model in enumerate(MODELS):
        end = f"### {MODELS[mi + 1]}" if mi + 1 < len(MODELS) else "## θ ablation"
        acc, paired, flips = tables(between(body, f"### {model}", end))
        assert acc["header"] == paired["header"] == flips["header"] == list(PATTERNS)
        means = {}
        for k, meth in enumerate(METHODS):
            ok = {x: [s for s in SEEDS if (meth, float(x), s, model) != failed] for x in range(3)}
            a = {x: [100 * acc_of(mi, k, x, s) for s in ok[x]] for x in range(3)}
            f = {x: [100 * flips_of(mi, k, x, s) for s in ok[x]] for x in range(3)}
            cells = [mean_pm_std(a[x]) for x in range(3)]
            if len(ok[2]) < 3:
                cells[2] += " (1/3 failed)"
            assert acc[meth] == cells, (model, meth)
            assert flips[meth] == [
                mean_pm_std(f[x], "{:.3f}") + (" (1/3 failed)" if len(ok[x]) < 3 else "")
                for x in range(3)
            ], (model, meth)
            if meth == "feather-nm":
                assert paired[meth] == ["reference"] * 3
            else:
                ref = {x: [acc_of(mi, 0, x, s) for s in ok[x]] for x in range(3)}
                row = {x: [acc_of(mi, k, x, s) for s in ok[x]] for x in range(3)}
                assert paired[meth] == [paired_cell(row[x], ref[x]) for x in range(3)], meth
            means[meth] = statistics.fmean([v for x in range(3) for v in a[x]])
        order = sorted(METHODS, key=lambda m: -means[m])
        expected = " > ".join(f"{m} ({means[m]:.2f})" for m in order)
        assert f"- {model}: {expected}" in ranking.splitlines()
    assert "θ = " not in ranking and "p = " not in ranking


def test_the_ablations_pair_with_feather_nms_own_theta_and_p_per_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """enm29, enm31, enm32, enm37: with ``--set model=mnist1d_mlpmixer`` (the runs carry
    no model of their own, enm25) and ``--ablation-pattern 4:8``: the ablations' column
    is that model, the tables say 4:8, the flip-rate table is in %, and the p table
    pairs every p with p = 3 (feather-nm)."""
    Figure(monkeypatch)
    opts = BenchOptions(
        seeds=SEEDS, overrides={"model": "mnist1d_mlpmixer"}, ablation_pattern="4:8", out=tmp_path
    )
    pairs = (
        main_runs(("mnist1d_mlpmixer",), model_set=False)
        + ablation_runs(list(THETA_ROWS), 1, model_set=False)
        + ablation_runs(list(P_ROWS), 1, model_set=False)
    )
    body = summarize(opts, pairs)
    section = between(body, "### mnist1d_mlpmixer", "## θ ablation")
    acc = tables(section)[0]
    assert acc["feather-nm"][0] == mean_pm_std([100 * acc_of(0, 0, 0, s) for s in SEEDS])
    for title, rows, start, end in (
        ("θ", THETA_ROWS, "## θ ablation", "## p ablation"),
        ("p", P_ROWS, "## p ablation", "## Ranking"),
    ):
        text = between(body, start, end)
        assert "mean ± std over seeds, 4:8; best per model" in text
        acc, paired, flips = tables(text)
        assert acc["header"] == paired["header"] == flips["header"] == ["mnist1d_mlpmixer"]
        reference = "θ = 1 (feather-nm)" if title == "θ" else "p = 3 (feather-nm)"
        assert f"Paired difference to `{reference}`" in text
        names = list(rows)
        ref_i = names.index(reference)
        for i, row in enumerate(names):
            a = [0.80 + 0.02 * i + NOISE[s] * (i + 1) for s in SEEDS]
            assert acc[row] == [mean_pm_std([100 * v for v in a])]
            f = [100 * (0.002 * (i + 1) + 0.0001 * s) for s in SEEDS]
            assert flips[row] == [mean_pm_std(f, "{:.3f}")]
            ref = [0.80 + 0.02 * ref_i + NOISE[s] * (ref_i + 1) for s in SEEDS]
            assert paired[row] == (["reference"] if row == reference else [paired_cell(a, ref)])


@pytest.mark.parametrize(
    ("ablation", "line", "theta_reference", "p_reference"),
    [
        ("1:32", "", "θ = 0.5 (feather-nm)", "p = 3 (feather-nm)"),
        ("2:4", "theta = 0.5", "θ = 0.5 (feather-nm)", "p = 3 (feather-nm)"),
        ("2:4", "p = 2.0", "θ = 1 (feather-nm)", "p = 2 (feather-nm)"),
    ],
)
def test_the_ablations_pair_with_the_rows_feather_nm_itself_trains(
    ablation: str,
    line: str,
    theta_reference: str,
    p_reference: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Left by the audit (not a mutant): at an ablation pattern of 95 % or more the
    θ = 1 row was tagged (feather-nm) and was the θ table's reference, though
    feather-nm's automatic θ there is 0.5; with a recipe's θ or p the same. The tag
    and the reference are feather-nm's own θ and p at the ablation pattern."""
    Figure(monkeypatch)
    recipe = {"recipe": recipe_with(tmp_path, line)} if line else {}
    opts = BenchOptions(
        seeds=SEEDS,
        overrides={"model": "mnist1d_mlpmixer"},
        ablation_pattern=ablation,
        out=tmp_path,
        **recipe,
    )
    labels = {s.group for s in nm.plan(opts)}
    tagged = sorted(r for r in labels if r.startswith(("θ", "p")) and "feather-nm)" in r)
    assert tagged == sorted([theta_reference, p_reference])
    thetas = sorted((r for r in labels if r.startswith("θ")), key=lambda r: float(r.split()[2]))
    ps = sorted(r for r in labels if r.startswith("p"))
    pairs = (
        main_runs(("mnist1d_mlpmixer",), model_set=False)
        + ablation_runs(thetas, 1, model_set=False)
        + ablation_runs(ps, 1, model_set=False)
    )
    body = summarize(opts, pairs)
    assert f"Paired difference to `{theta_reference}`" in between(
        body, "## θ ablation", "## p ablation"
    )
    assert f"Paired difference to `{p_reference}`" in between(body, "## p ablation", None)


def test_no_paired_section_without_its_reference_and_only_the_rows_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """enm28, enm30, enm33: ``--methods sr-ste,s-ste`` (feather-nm not run) has no paired
    table of the methods; ``--thetas 0,0.5`` (θ = 1 not run) none in the θ ablation,
    whose rows are the θ values given, no other."""
    Figure(monkeypatch)
    opts = BenchOptions(
        seeds=SEEDS,
        methods=("sr-ste", "s-ste"),
        thetas=(0.0, 0.5),
        overrides={"model": "mnist1d_mlpmixer"},
        out=tmp_path,
    )
    pairs = (
        main_runs(("mnist1d_mlpmixer",), ("sr-ste", "s-ste"), model_set=False)
        + ablation_runs(["θ = 0", "θ = 0.5"], 1, model_set=False)
        + ablation_runs(list(P_ROWS), 1, model_set=False)
    )
    body = summarize(opts, pairs)
    section = between(body, "### mnist1d_mlpmixer", "## θ ablation")
    assert "Paired difference" not in section
    assert [set(t) - {"header"} for t in tables(section)] == [{"sr-ste", "s-ste"}] * 2
    thetas = between(body, "## θ ablation", "## p ablation")
    assert "Paired difference" not in thetas
    assert [set(t) - {"header"} for t in tables(thetas)] == [{"θ = 0", "θ = 0.5"}] * 2
    assert "Paired difference to `p = 3 (feather-nm)`" in between(body, "## p ablation", None)


def test_the_figure_names_the_patterns_only_when_every_panel_has_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """enm34: every mixer run at 1:4 failed, the CNN's did not: the panels' patterns
    differ, so the x axis is numeric and its label says which number is which pattern;
    with every cell there the ticks are the patterns' names."""
    figure = Figure(monkeypatch)
    opts = BenchOptions(seeds=SEEDS, out=tmp_path)
    full = main_runs(MODELS)
    gap = [
        (s, o)
        if not (s.settings["model"] == "mnist1d_mlpmixer" and s.x == 2.0)
        else run(s.group, s.x, s.seed, None, 0.0, "mnist1d_mlpmixer")
        for s, o in full
    ]
    summarize(opts, full)
    summarize(opts, gap)
    (panels, same), (_, differ) = figure.calls
    assert [title for title, _ in panels] == list(MODELS)
    assert same["categorical_x"] is True and same["xticklabels"] == list(PATTERNS)
    assert same["xlabel"] == "N:M pattern"
    assert differ["categorical_x"] is False and differ["xticklabels"] is None
    assert differ["xlabel"] == "N:M pattern (2:4, 4:8, 1:4 = 0, 1, …)"
