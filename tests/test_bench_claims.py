"""``feather-sparse bench claims``: each paper claim's verdict from stored results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _helpers import write_stability_runs
from feather_sparse import cli
from feather_sparse.bench.claims import assess_claims


def _page(out: Path, name: str, rows: dict[tuple[str, float], list[float]]) -> None:
    raw = [
        {"group": g, "x": x, "seed": seed, "key": f"{g}-{x}-{seed}", "ok": True, "test_accuracy": a}
        for (g, x), accs in rows.items()
        for seed, a in enumerate(accs)
    ]
    (out / f"{name}.json").write_text(json.dumps(raw))


def _verdicts(out: Path, runs: Path | None = None) -> dict[str, str]:
    return {r.claim: r.verdict for r in assess_claims(out, runs)}


def test_verdicts_follow_the_paired_intervals(tmp_path: Path) -> None:
    ref = [0.90, 0.91, 0.92]
    _page(
        tmp_path,
        "compare",
        {
            ("Feather-Global", 0.99): ref,
            ("GMP", 0.99): [0.80, 0.82, 0.81],  # clearly below: win for the claim
            ("ST-3", 0.99): [0.92, 0.89, 0.93],  # differences -2, +2, -1: n.s.
            ("Spartan", 0.99): [0.95, 0.96, 0.97],  # clearly above: loss for the claim
            ("GMP", 0.9): [0.99, 0.99, 0.99],  # below 98 %: not part of the claim
            ("Feather-Global", 0.9): [0.5, 0.5, 0.5],
        },
    )
    verdicts = _verdicts(tmp_path)
    assert verdicts["Feather-Global above GMP at high sparsity"] == "reproduced"
    assert verdicts["Feather-Global above ST-3 at high sparsity"] == "not separable"
    assert verdicts["Feather-Global above Spartan at high sparsity"] == "not reproduced"
    assert verdicts["p = 3 best: above every other p"] == "not measured"
    assert verdicts["θ < 1 helps from 95 % (θ = 0.5 above θ = 1)"] == "not measured"


def test_one_seed_is_not_measured_and_p_pairs_come_from_the_page(tmp_path: Path) -> None:
    _page(tmp_path, "p", {("p = 3 (Feather)", 0.99): [0.9], ("p = 2", 0.99): [0.8]})
    (result,) = [r for r in assess_claims(tmp_path) if r.claim.startswith("p = 3")]
    assert result.claim == "p = 3 best: above p = 2"
    assert result.verdict == "not measured" and result.comparisons[0].diff.n == 1


def test_stability_claim_reads_the_runs(tmp_path: Path) -> None:
    halves = (("θ = 0", (0.9, 0.92, 0.91)), ("θ = 1", (0.5, 0.55, 0.52)))
    runs = write_stability_runs(
        tmp_path,
        {(theta, 0.98): [(0.1, r, 0.95, 1.0) for r in r_half] for theta, r_half in halves},
        epochs=(1, 2, 3, 4),
    )
    claim = "the mask is more stable as θ falls (θ = 0 above θ = 1)"
    assert _verdicts(tmp_path, runs)[claim] == "reproduced"
    assert _verdicts(tmp_path, tmp_path / "elsewhere")[claim] == "not measured"


def test_cli_writes_the_claims_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _page(tmp_path, "theta", {("θ = 0.5", 0.99): [0.9, 0.8, 0.7], ("θ = 1", 0.99): [0.8, 0.7, 0.6]})
    assert cli.main(["bench", "claims", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "claims.md").read_text()
    assert "| θ < 1 helps from 95 % (θ = 0.5 above θ = 1) |" in text
    assert "θ = 0.5 − θ = 1 at 99 %: +10.00 points [+10.00, +10.00], n = 3: win" in text
    assert f"- command: `feather-sparse bench claims --out {tmp_path}" in text
    assert cli.main(["bench", "claims", "--out", str(tmp_path / "none")]) == 1
    assert "is not a results folder" in capsys.readouterr().err


def test_stability_claim_pairs_runs_at_the_same_sparsity(tmp_path: Path) -> None:
    # `bench stability --sparsities 0.9,0.98`: one cell per sparsity, seeds paired within it
    halves = {0.9: {"θ = 0": 0.9, "θ = 1": 0.5}, 0.98: {"θ = 0": 0.2, "θ = 1": 0.6}}
    runs = write_stability_runs(
        tmp_path,
        {
            (theta, x): [(0.1, r + 0.01 * seed, 0.95, 1.0) for seed in range(3)]
            for x, rows in halves.items()
            for theta, r in rows.items()
        },
        epochs=(1, 2, 3, 4),
    )
    (result,) = [r for r in assess_claims(tmp_path, runs) if "mask" in r.claim]
    assert [(c.x, c.diff.verdict) for c in result.comparisons] == [(0.9, "win"), (0.98, "loss")]
    assert result.verdict == "not reproduced"


def test_a_cell_without_a_common_seed_has_no_number() -> None:
    # It read "+nan points (n = 0, no interval)"; the paired tables show "—" there.
    from feather_sparse.bench.claims import Comparison, _cell_text
    from feather_sparse.bench.stats import paired_difference

    none = Comparison("feather", "gmp", 0.9, paired_difference({0: 91.0}, {1: 90.0}))
    assert _cell_text(none, " points") == "feather − gmp at 90 %: — (no seed finished in both)"
    one = Comparison("feather", "gmp", 0.9, paired_difference({0: 91.0}, {0: 90.5}))
    assert _cell_text(one, " points") == "feather − gmp at 90 %: +0.50 points (n = 1, no interval)"
