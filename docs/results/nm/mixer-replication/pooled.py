"""Secondary analysis of the mixer replication: paired differences over all 20 seeds.

Pools the sweep's seeds 0-4 (``docs/results/nm/nm.json``) with the
replication's seeds 5-19 (``nm.json`` beside this file) and prints the table
of README.md's secondary analysis. Run from the repository root:

    python docs/results/nm/mixer-replication/pooled.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from feather_sparse.bench.stats import PairedDifference, paired_difference

HERE = Path(__file__).parent
PATTERNS = ("2:4", "4:8", "1:4")
REFERENCE = "feather-nm"


def load(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        records: list[dict[str, Any]] = json.load(f)
    return records


def accuracy(records: list[dict[str, Any]], group: str, x: float) -> dict[int, float]:
    """Seed -> top-1 (%) of the finished runs of ``group`` in column ``x``."""
    return {
        r["seed"]: 100 * r["test_accuracy"]
        for r in records
        if r["group"] == group and r["x"] == x and r["ok"]
    }


def row(name: str, pattern: str, d: PairedDifference) -> str:
    return f"| {name} | {pattern} | {d.n} | {d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}] |"


def main() -> None:
    sweep = load(HERE.parent / "nm.json")
    fresh = load(HERE / "nm.json")
    # The sweep's records come in its plan order: the CNN's 75 method runs, then
    # the mixer's 75, then the ablations, whose column x is the model (1: the mixer).
    mixer = sweep[75:150] + [r for r in sweep[150:] if r["x"] == 1.0]
    print("| comparison | pattern | seeds | mean [95 % CI] |\n|---|---|---:|---|")
    for method in ("sr-ste", "s-ste", "hard-nm", "oneshot-nm"):
        for x, pattern in enumerate(PATTERNS):
            ours = {**accuracy(mixer, method, x), **accuracy(fresh, method, x)}
            ref = {**accuracy(mixer, REFERENCE, x), **accuracy(fresh, REFERENCE, x)}
            print(row(f"{method} − {REFERENCE}", pattern, paired_difference(ours, ref)))
    # The p ablation: column 1 in the sweep (two models), 0 here (the mixer alone).
    soft = {**accuracy(mixer, "p = 1 (soft)", 1.0), **accuracy(fresh, "p = 1 (soft)", 0.0)}
    ref = {**accuracy(mixer, "p = 3 (feather-nm)", 1.0), **accuracy(fresh, REFERENCE, 0.0)}
    print(row("p = 1 − p = 3", "2:4", paired_difference(soft, ref)))
    # Not in the rule (exploratory): the soft threshold without S-STE's fixed β.
    soft, ref = accuracy(fresh, "p = 1 (soft)", 0.0), accuracy(fresh, "s-ste", 0.0)
    print(row("p = 1 − s-ste (seeds 5–19; exploratory)", "2:4", paired_difference(soft, ref)))


if __name__ == "__main__":
    main()
