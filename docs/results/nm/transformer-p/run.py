"""The check this page's rule fixed: p = 1 against p = 3 on the examples' toy transformer.

Trains ``examples/prune_transformer.py``'s model as it ships at 2:4, 4:8 and
1:4 with p = 1 and p = 3 on the seeds 0-14 and prints the Markdown table of
README.md (held-out loss after ``finalize()``; paired p = 1 − p = 3). Run
from the repository root:

    OMP_NUM_THREADS=1 python docs/results/nm/transformer-p/run.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from feather_sparse.bench.stats import paired_difference
from feather_sparse.provenance import numerics

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "examples"))
import prune_transformer as example  # noqa: E402

PATTERNS = ("2:4", "4:8", "1:4")
SEEDS = range(15)


def main() -> None:
    torch.set_num_threads(1)
    started = time.perf_counter()
    print("| pattern | seeds | p = 3 loss | p = 1 loss | p = 1 − p = 3 | verdict |")
    print("|---|---:|---:|---:|---:|---|")
    for pattern in PATTERNS:
        loss = {
            p: {s: example.run(pattern=pattern, seed=s, p=p).loss_end for s in SEEDS}
            for p in (3.0, 1.0)
        }
        d = paired_difference(loss[1.0], loss[3.0])
        verdict = "p = 1 lower" if d.high < 0 else "p = 3 lower" if d.low > 0 else "n.s."
        means = {p: statistics.mean(v.values()) for p, v in loss.items()}
        print(
            f"| {pattern} | {d.n} | {means[3.0]:.4f} | {means[1.0]:.4f} "
            f"| {d.mean:+.4f} [{d.low:+.4f}, {d.high:+.4f}] | {verdict} |"
        )
    print()
    print(f"- numerics: {numerics('cpu')}")
    print(f"- wall time: {(time.perf_counter() - started) / 60:.1f} min")


if __name__ == "__main__":
    main()
