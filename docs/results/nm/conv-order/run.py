"""The check this page's rule fixed: the CNN's N:M groups flat against by channels.

Trains the bundled ``mnist1d`` recipe at 2:4 with ``feather-nm`` once with
``--conv-order flat`` and once with ``--conv-order channels`` on the seeds
40-54 through the CLI, and prints the Markdown table of README.md (final test
accuracy; paired channels − flat). A run folder that already holds a final
metrics row is reused, not retrained. Run from the repository root:

    OMP_NUM_THREADS=1 python docs/results/nm/conv-order/run.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

from feather_sparse.bench.stats import paired_difference
from feather_sparse.cli import main as cli
from feather_sparse.provenance import numerics

ORDERS = ("flat", "channels")
SEEDS = range(40, 55)
MARGIN = -0.5  # points: the rule's bound on the interval's lower end
COMMAND = "OMP_NUM_THREADS=1 python docs/results/nm/conv-order/run.py"


def final_acc(run_dir: Path) -> float | None:
    """The final row's test accuracy of ``run_dir`` in percent, or None if unfinished."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return None
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if row.get("final"):
            return 100.0 * float(row["test_acc"])
    return None


def train(order: str, seed: int, run_dir: Path) -> float:
    """Train (or reuse) one run and return its final test accuracy in percent."""
    if final_acc(run_dir) is not None:  # finished: --resume hands it back untrained
        argv = ["train", "--resume", str(run_dir), "--no-progress"]
    else:
        argv = ["train", "--pattern", "2:4", "--method", "feather-nm", "--conv-order", order]
        argv += ["--seed", str(seed), "--no-progress", "--no-tensorboard"]
        argv += ["--run-dir", str(run_dir)]
    with contextlib.redirect_stdout(sys.stderr):  # stdout: only the table
        code = cli(argv)
    acc = final_acc(run_dir)
    if code != 0 or acc is None:
        raise RuntimeError(f"{run_dir}: train exited {code} without a final metrics row")
    return acc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("runs/conv-order"))
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="first K seeds")
    args = parser.parse_args()
    seeds = list(SEEDS)[: args.seeds]
    started = time.perf_counter()
    acc: dict[str, dict[int, float]] = {order: {} for order in ORDERS}
    for seed in seeds:
        for order in ORDERS:
            acc[order][seed] = train(order, seed, args.runs / f"{order}-s{seed}")
    d = paired_difference(acc["channels"], acc["flat"])
    verdict = "no measurable cost" if d.low > MARGIN else "cost not excluded"
    print()
    print("| seeds | flat acc (%) | channels acc (%) | channels − flat [95 %] (points) | verdict |")
    print("|---:|---:|---:|---:|---|")
    print(
        f"| {d.n} ({seeds[0]}–{seeds[-1]}) | {statistics.mean(acc['flat'].values()):.2f} "
        f"| {statistics.mean(acc['channels'].values()):.2f} "
        f"| {d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}] | {verdict} |"
    )
    print()
    print("| seed | flat | channels | channels − flat |")
    print("|---:|---:|---:|---:|")
    for seed in seeds:
        f, c = acc["flat"][seed], acc["channels"][seed]
        print(f"| {seed} | {f:.2f} | {c:.2f} | {c - f:+.2f} |")
    print()
    print(f"- numerics: {numerics('cpu')}")
    print(f"- wall time: {(time.perf_counter() - started) / 60:.1f} min")
    print(f"- command: `{COMMAND}`")


if __name__ == "__main__":
    main()
