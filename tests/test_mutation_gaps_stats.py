"""Tests that close the gaps a mutation audit of the benchmark statistics found.

Each test here fails on one or more hand-made mutants of ``bench/stats.py``,
``bench/claims.py`` or the results pages' tables (``bench/pages.py``, the N:M
page's ranking) that the rest of the suite let through
(``docs/mutation-audit.md``, "The benchmark statistics"; the mutants' ids
are in each test's docstring). The expected numbers are worked out here from
the stated rule — ``d̄ ± t(0.975, n − 1) · s_d / √n`` over the seeds both
runs finished, a win or a loss only when the interval excludes 0, the
claims' verdict rule on the claims page — with the t quantiles of one and two
degrees of freedom in closed form, never from the code's own output.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from _helpers import write_stability_runs
from feather_sparse.bench.claims import ClaimResult, assess_claims, claims_page
from feather_sparse.bench.experiments.nm import _ranking_note
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.pages import Context, Grid
from feather_sparse.bench.runner import RunOutcome, RunSpec
from feather_sparse.bench.stats import PairedDifference, paired_difference, student_t_cdf


def t975(df: int) -> float:
    """t(0.975, df) in closed form: df = 1 is Cauchy, df = 2 has (2q − 1) / √(2q(1 − q))."""
    q = 0.975
    if df == 1:
        return math.tan(math.pi * (q - 0.5))
    assert df == 2
    return (2 * q - 1) / math.sqrt(2 * q * (1 - q))


def interval(diffs: list[float]) -> tuple[float, float, float]:
    """Mean and 95 % Student-t interval of paired differences (one or two degrees of freedom)."""
    n = len(diffs)
    mean = statistics.fmean(diffs)
    half = t975(n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    return mean, mean - half, mean + half


def outcome(acc: float, ok: bool = True) -> RunOutcome:
    return RunOutcome(key="k", config={}, ok=ok, test_accuracy=acc, error=None if ok else "E")


# ------------------------------------------------------------------- stats.py
def test_an_unfinished_run_on_either_side_is_not_a_pair() -> None:
    """st08: a NaN value (a run that did not finish) leaves its seed out, on either side."""
    mean, low, high = interval([1.0, 2.0, 3.0])
    for values, reference in (
        ({0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}, {0: 0.0, 1: 0.0, 2: 0.0, 3: math.nan}),
        ({0: 1.0, 1: 2.0, 2: 3.0, 3: math.nan}, {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}),
    ):
        d = paired_difference(values, reference)
        assert d.n == 3
        assert (d.mean, d.low, d.high) == pytest.approx((mean, low, high), rel=1e-9)
        assert d.verdict == "n.s."


def test_two_pairs_get_an_interval() -> None:
    """st09: two seeds give one degree of freedom, t(0.975, 1) = 12.706, and a verdict."""
    d = paired_difference({0: 20.0, 1: 20.5}, {0: 10.0, 1: 10.0})
    mean, low, high = interval([10.0, 10.5])
    assert d.n == 2
    assert (d.mean, d.low, d.high) == pytest.approx((mean, low, high), rel=1e-9)
    assert low > 0 and d.verdict == "win"
    wide = paired_difference({0: 1.0, 1: 3.0}, {0: 0.0, 1: 0.0})
    assert (wide.low, wide.high) == pytest.approx(interval([1.0, 3.0])[1:], rel=1e-9)
    assert wide.verdict == "n.s."


def test_an_interval_with_an_end_at_zero_contains_zero() -> None:
    """st12, st13: [0, h] and [l, 0] contain 0: neither a win nor a loss."""
    assert PairedDifference(3, 1.0, 0.0, 2.0).verdict == "n.s."
    assert PairedDifference(3, -1.0, -2.0, 0.0).verdict == "n.s."
    assert PairedDifference(3, 1.0, 1e-12, 2.0).verdict == "win"
    assert PairedDifference(3, -1.0, -2.0, -1e-12).verdict == "loss"


def test_the_verdict_is_the_intervals_not_its_rounding() -> None:
    """st15: an interval from +0.004 excludes 0 although the tables show it as +0.00."""
    assert PairedDifference(3, 1.0, 0.004, 2.0).verdict == "win"
    assert PairedDifference(3, -1.0, -2.0, -0.004).verdict == "loss"
    # the same through the data: differences 0.0039, 0.0041, 0.004 have [0.00375, 0.00425]
    d = paired_difference({0: 1.0039, 1: 1.0041, 2: 1.004}, {0: 1.0, 1: 1.0, 2: 1.0})
    _, low, _ = interval([1.0039 - 1.0, 1.0041 - 1.0, 1.004 - 1.0])
    assert 0 < low < 0.005 and d.low == pytest.approx(low, rel=1e-9)
    assert d.verdict == "win"


@pytest.mark.parametrize("t", [0.01, 0.1, 0.5, 1.0, 1.5])
def test_t_cdf_of_many_degrees_of_freedom_near_zero_is_the_normals(t: float) -> None:
    """st20: near t = 0, x = ν / (ν + t²) is close to 1, where the incomplete beta
    function needs its symmetry; at ν = 10⁶ Student's t is the normal to ~1e-7."""
    normal = 0.5 * (1.0 + math.erf(t / math.sqrt(2.0)))
    assert student_t_cdf(t, 1e6) == pytest.approx(normal, abs=1e-6)
    assert student_t_cdf(-t, 1e6) == pytest.approx(1.0 - normal, abs=1e-6)


# ------------------------------------------------------------------ claims.py
def write_page(out: Path, name: str, rows: list[tuple[str, float, int, float | None]]) -> None:
    """``OUT/<name>.json`` as ``bench`` writes it: one row per run, a None accuracy = failed."""
    raw = [
        {
            "group": g,
            "x": x,
            "seed": seed,
            "key": f"{g}-{x}-{seed}",
            "ok": acc is not None,
            "test_accuracy": acc,
        }
        for g, x, seed, acc in rows
    ]
    (out / f"{name}.json").write_text(json.dumps(raw))


def claim(out: Path, text: str, runs: Path | None = None) -> ClaimResult:
    (found,) = [r for r in assess_claims(out, runs) if r.claim == text]
    return found


GMP = "Feather-Global above GMP at high sparsity"


def cells_of(group: str, x: float, accs: list[float]) -> list[tuple[str, float, int, float | None]]:
    return [(group, x, seed, a) for seed, a in enumerate(accs)]


def test_a_claim_is_reproduced_when_exactly_half_its_cells_are_wins(tmp_path: Path) -> None:
    """st21: "at least half the cells are wins": one win of two cells is reproduced."""
    write_page(
        tmp_path,
        "compare",
        cells_of("Feather-Global", 0.98, [0.90, 0.91, 0.92])
        + cells_of("GMP", 0.98, [0.80, 0.81, 0.82])  # +10 points every seed: a win
        + cells_of("Feather-Global", 0.99, [0.90, 0.91, 0.92])
        + cells_of("GMP", 0.99, [0.92, 0.89, 0.93]),  # −2, +2, −1: n.s.
    )
    result = claim(tmp_path, GMP)
    assert [c.diff.verdict for c in result.comparisons] == ["win", "n.s."]
    assert result.verdict == "reproduced"


def test_a_claim_with_one_win_in_three_cells_is_not_separable(tmp_path: Path) -> None:
    """st22: one win and two n.s. cells is less than half: not separable."""
    rows = cells_of("Feather-Global", 0.98, [0.90, 0.91, 0.92]) + cells_of(
        "GMP", 0.98, [0.80, 0.81, 0.82]
    )
    for x in (0.99, 0.995):
        rows += cells_of("Feather-Global", x, [0.90, 0.91, 0.92])
        rows += cells_of("GMP", x, [0.92, 0.89, 0.93])
    write_page(tmp_path, "compare", rows)
    result = claim(tmp_path, GMP)
    assert [c.diff.verdict for c in result.comparisons] == ["win", "n.s.", "n.s."]
    assert result.verdict == "not separable"


def test_high_sparsity_starts_at_98_percent(tmp_path: Path) -> None:
    """st28: the claim's cells are "sparsity ≥ 98 %": the 98 % cell is one of them."""
    write_page(
        tmp_path,
        "compare",
        cells_of("Feather-Global", 0.98, [0.90, 0.91, 0.92])
        + cells_of("GMP", 0.98, [0.80, 0.81, 0.82]),
    )
    result = claim(tmp_path, GMP)
    assert [c.x for c in result.comparisons] == [0.98]
    assert result.verdict == "reproduced"


def test_claims_pair_runs_by_seed_when_one_failed(tmp_path: Path) -> None:
    """st25: Feather-Global's seed-0 run failed; seeds 1-3 pair with GMP's seeds 1-3.

    The seeds differ by far more than the methods (GMP: 50, 70, 90, 60 %), so
    pairing by position instead of by seed turns a clear win into noise.
    """
    write_page(
        tmp_path,
        "compare",
        [("Feather-Global", 0.99, 0, None)]
        + [("Feather-Global", 0.99, s, a) for s, a in ((1, 0.71), (2, 0.912), (3, 0.611))]
        + cells_of("GMP", 0.99, [0.50, 0.70, 0.90, 0.60]),
    )
    (cell,) = claim(tmp_path, GMP).comparisons
    mean, low, high = interval([71.0 - 70.0, 91.2 - 90.0, 61.1 - 60.0])
    assert cell.diff.n == 3
    assert (cell.diff.mean, cell.diff.low, cell.diff.high) == pytest.approx(
        (mean, low, high), rel=1e-6
    )
    assert cell.diff.verdict == "win"


def test_mask_stability_is_read_halfway_through_the_epochs_not_the_measurements(
    tmp_path: Path,
) -> None:
    """st29: measured at epochs 2, 4, 6, 8, "50 % of training" is epoch 4 (not the 2nd
    of four measurements' half, epoch 2)."""
    # θ = 0 is far more stable at epoch 4, far less at epoch 2
    at = {"θ = 0": {2: 0.1, 4: 0.9}, "θ = 1": {2: 0.8, 4: 0.5}}
    runs = write_stability_runs(
        tmp_path,
        {
            (theta, 0.9): [(r[2] + 0.01 * seed, r[4] + 0.02 * seed, 0.95, 1.0) for seed in range(3)]
            for theta, r in at.items()
        },
        epochs=(2, 4, 6, 8),
    )
    result = claim(tmp_path, "the mask is more stable as θ falls (θ = 0 above θ = 1)", runs)
    (cell,) = result.comparisons
    assert cell.diff.mean == pytest.approx(0.4)
    assert result.verdict == "reproduced"


def test_the_claims_table_tallies_win_ns_loss_and_shows_every_verdict_alike(
    tmp_path: Path,
) -> None:
    """st31, st32: the tally column is "win / n.s. / loss" as its header says, and a
    verdict against the paper is written as plainly (in bold) as one for it."""
    write_page(
        tmp_path,
        "compare",
        cells_of("Feather-Global", 0.99, [0.90, 0.91, 0.92])
        + cells_of("GMP", 0.99, [0.80, 0.81, 0.82])  # win
        + cells_of("Spartan", 0.99, [0.95, 0.96, 0.97])  # loss
        + cells_of("ST-3", 0.99, [0.92, 0.89, 0.93]),  # n.s.
    )
    page = claims_page(assess_claims(tmp_path), tmp_path, "cmd")
    header = next(line for line in page.splitlines() if line.startswith("| claim |"))
    assert "cells (win / n.s. / loss)" in header
    rows = {line.split(" | ")[0][2:]: line for line in page.splitlines() if "at high" in line}
    assert rows[GMP].endswith("| 1 / 0 / 0 | **reproduced** |")
    spartan = "Feather-Global above Spartan at high sparsity"
    assert rows[spartan].endswith("| 0 / 0 / 1 | **not reproduced** |")
    st3 = "Feather-Global above ST-3 at high sparsity"
    assert rows[st3].endswith("| 0 / 1 / 0 | **not separable** |")
    assert "| **not measured** |" in page


# ------------------------------------------------------------ the pages' tables
def grid(rows: dict[str, dict[int, float | None]]) -> Grid:
    """A one-column grid; a None value is a failed run."""
    pairs = [
        (RunSpec(row, 0.99, seed, {}), outcome(math.nan if v is None else v, ok=v is not None))
        for row, values in rows.items()
        for seed, v in values.items()
    ]
    return Grid(pairs, lambda o: o.test_accuracy)


def test_a_loss_is_shown_as_plainly_as_a_win() -> None:
    """st34: row below the reference on every seed: **loss**, bold like **win**."""
    table = grid(
        {
            "ref": {0: 10.0, 1: 10.0, 2: 10.0},
            "a": {0: 8.0, 1: 7.0, 2: 6.0},
            "b": {0: 12.0, 1: 13.0, 2: 14.0},
        }
    ).paired_table("m", str, "ref")
    mean, low, high = interval([-2.0, -3.0, -4.0])
    lines = table.splitlines()
    assert lines[3] == f"| a | {mean:+.2f} [{low:+.2f}, {high:+.2f}] **loss** |"
    assert lines[4] == f"| b | {-mean:+.2f} [{-high:+.2f}, {-low:+.2f}] **win** |"


def test_a_row_without_a_seed_in_common_with_the_reference_has_no_number() -> None:
    """st35: no common seed: no difference to show ("—"), not a NaN interval."""
    table = grid({"ref": {0: 10.0, 1: 11.0}, "a": {2: 12.0, 3: 13.0}}).paired_table("m", str, "ref")
    assert table.splitlines()[3] == "| a | — |"


def test_the_paired_table_pairs_by_seed_when_a_run_failed() -> None:
    """st36: the row's seed-0 run failed; seeds 1-3 pair with the reference's seeds 1-3."""
    table = grid(
        {
            "ref": {0: 50.0, 1: 70.0, 2: 90.0, 3: 60.0},
            "a": {0: None, 1: 71.0, 2: 91.2, 3: 61.1},
        }
    ).paired_table("m", str, "ref")
    mean, low, high = interval([71.0 - 70.0, 91.2 - 90.0, 61.1 - 60.0])
    assert table.splitlines()[3] == f"| a | {mean:+.2f} [{low:+.2f}, {high:+.2f}] **win** |"


def test_the_nm_ranking_lists_the_best_mean_first(tmp_path: Path) -> None:
    """st39: "the methods ordered by mean accuracy": the highest mean first."""
    accs = {"feather-nm": 80.0, "sr-ste": 70.0, "s-ste": 90.0, "hard-nm": 60.0, "oneshot-nm": 75.0}
    pairs = [
        (RunSpec(m, 0.0, seed, {"model": "mnist1d_cnn"}), outcome((a + seed) / 100))
        for m, a in accs.items()
        for seed in range(2)
    ]
    ctx = Context("nm", BenchOptions(out=tmp_path), pairs, executed=0, elapsed=0.0, workers=1)
    note = _ranking_note(ctx, ["mnist1d_cnn"])
    order = sorted(accs, key=accs.__getitem__, reverse=True)
    expected = " > ".join(f"{m} ({accs[m] + 0.5:.2f})" for m in order)
    assert f"- mnist1d_cnn: {expected}" in note
