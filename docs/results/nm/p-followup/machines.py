"""The figures of README.md's "one configuration, two machines" and the t of its 4:8 win.

Run from the repository root:

    python docs/results/nm/p-followup/machines.py          # runs compared, and the t statistic
    python docs/results/nm/p-followup/machines.py data     # SHA-256 of the generated MNIST-1D
    NPY_DISABLE_CPU_FEATURES="X86_V3 X86_V4" python docs/results/nm/p-followup/machines.py data

The first compares the replication's stored `feather-nm` runs (another
machine) with this page's retrained ones of the same run keys; the second
prints the generated data's digests, to compare with NumPy's SIMD kernels on
and off.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from feather_sparse.bench.stats import student_t_quantile

HERE = Path(__file__).parent
PATTERNS = ("2:4", "4:8", "1:4")


def runs() -> None:
    stored = json.loads((HERE.parent / "mixer-replication" / "nm.json").read_text())
    old = {(r["x"], r["key"]): r["test_accuracy"] for r in stored if r["group"] == "feather-nm"}
    new: dict[tuple[float, str], float] = {}
    for cell in ("mixer-4x8", "mixer-1x4"):
        for r in json.loads((HERE / cell / "nm.json").read_text()):
            if r["group"] == "feather-nm":
                new[r["x"], r["key"]] = r["test_accuracy"]
    keys = sorted(k for k in old if k in new)
    differ = sum(old[k] != new[k] for k in keys)
    print(f"{len(keys)} runs with the same key on both machines, {differ} differ")
    for x, pattern in enumerate(PATTERNS):
        d = [100 * (new[k] - old[k]) for k in keys if k[0] == x]
        print(
            f"{pattern}: mean new - stored {statistics.mean(d):+.2f} points, "
            f"largest |difference| {max(map(abs, d)):.2f} ({len(d)} runs)"
        )
    # the mixer 4:8 win (p = 1 - p = 3 over the seeds): its t and the Bonferroni bound
    cell = json.loads((HERE / "mixer-4x8" / "nm.json").read_text())
    soft = {r["seed"]: 100 * r["test_accuracy"] for r in cell if r["group"] == "p = 1 (soft)"}
    ref = {r["seed"]: 100 * r["test_accuracy"] for r in cell if r["group"] == "p = 3 (feather-nm)"}
    d = [soft[s] - ref[s] for s in sorted(soft) if s in ref]
    t = statistics.mean(d) / (statistics.stdev(d) / len(d) ** 0.5)
    bound = student_t_quantile(1 - 0.025 / 5, len(d) - 1)
    print(
        f"mixer 4:8: p = 1 - p = 3 {statistics.mean(d):+.2f}, t = {t:.1f}; "
        f"Bonferroni x5: t > {bound:.2f}"
    )


def data() -> None:
    from feather_sparse.data.mnist1d import _generate

    for name, array in sorted(_generate().items()):
        digest = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
        print(f"{name} {array.dtype} {array.shape} {digest[:16]}")


if __name__ == "__main__":
    data() if sys.argv[1:] == ["data"] else runs()
