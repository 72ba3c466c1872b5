"""The analysis this page's rule fixed: p = 1 − s-ste per cell, and p = 3 − s-ste.

Reads the ``nm.json`` of each cell's page (``<model>-<pattern>/``) and prints
the Markdown table of README.md. Run from the repository root:

    python docs/results/nm/p1-vs-sste/analysis.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from feather_sparse.bench.stats import (
    CONFIDENCE,
    PairedDifference,
    paired_difference,
    student_t_quantile,
)

HERE = Path(__file__).parent
PATTERNS = ("2:4", "4:8", "1:4")
MODELS = {"mixer": "mnist1d_mlpmixer", "cnn": "mnist1d_cnn ×0.25"}
COMPARISONS = 6  # the rule's Bonferroni factor: two models × three patterns


def accuracy(records: list[dict[str, Any]], group: str, x: float) -> dict[int, float]:
    """Seed -> top-1 (%) of the finished runs of ``group`` in column ``x``."""
    return {
        r["seed"]: 100 * r["test_accuracy"]
        for r in records
        if r["group"] == group and r["x"] == x and r["ok"]
    }


def verdict(d: PairedDifference, level: float = CONFIDENCE) -> str:
    """better / worse / n.s. at ``level`` (Student t over the paired seeds)."""
    if d.n < 2 or not math.isfinite(d.low):
        return "no data"
    # the interval's half-width at CONFIDENCE, rescaled to ``level``
    ratio = student_t_quantile(0.5 + level / 2, d.n - 1) / student_t_quantile(
        0.5 + CONFIDENCE / 2, d.n - 1
    )
    half = ratio * (d.high - d.low) / 2
    if d.mean - half > 0:
        return "better"
    if d.mean + half < 0:
        return "worse"
    return "n.s."


def cell(d: PairedDifference) -> str:
    corrected = verdict(d, 1 - 0.05 / COMPARISONS)
    return f"{d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}] {verdict(d)} (×{COMPARISONS}: {corrected})"


def main() -> None:
    print(
        "| model | pattern | seeds | p = 1 − s-ste | p = 3 − s-ste (secondary) |\n"
        "|---|---|---:|---|---|"
    )
    for short, model in MODELS.items():
        for x, pattern in enumerate(PATTERNS):
            folder = HERE / f"{short}-{pattern.replace(':', 'x')}"
            records = json.loads((folder / "nm.json").read_text())
            sste = accuracy(records, "s-ste", float(x))
            soft = accuracy(records, "p = 1 (soft)", 0.0)
            feather = accuracy(records, "feather-nm", float(x))
            primary = paired_difference(soft, sste)
            secondary = paired_difference(feather, sste)
            print(f"| {model} | {pattern} | {primary.n} | {cell(primary)} | {cell(secondary)} |")


if __name__ == "__main__":
    main()
