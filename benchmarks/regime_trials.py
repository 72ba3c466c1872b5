"""Trials that choose the bundled benchmark's regime setting, and the rule applied to them.

The rule is on ``docs/results/mnist1d-regime/regime.md`` (issue 13, item 1):
for each candidate model width, train the dense model and GMP at 99 % (and at
95 %, for context) with the ``mnist1d`` recipe plus gradient clipping at 3,
three seeds each. A width qualifies when the mean dense test accuracy is at
most ``DENSE_MAX`` and GMP at 99 % loses between ``LOSS_MIN`` and ``LOSS_MAX``
points from dense; the widest qualifying width is chosen. Only dense and GMP
are run: the setting must not be tuned on how the other methods rank.

Every finished trial is appended to a JSON-lines file, so a stopped run
continues with the trials it has. The script prints one Markdown table of all
trials (setting, seed, test accuracy, wall time), one summary per width, and
the chosen width.

    OMP_NUM_THREADS=1 python benchmarks/regime_trials.py [--jobs 2] \
        [--out docs/results/mnist1d-regime/trials.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from feather_sparse.recipes import load_config
from feather_sparse.train import train

# The rule (regime.md); accuracies and losses in percentage points.
DENSE_MAX = 99.0  # dense not saturated: mean test accuracy at most this
LOSS_MIN = 8.0  # GMP at 99 % loses at least this much from dense ...
LOSS_MAX = 32.0  # ... and at most this much
RULE_SPARSITY = 0.99

# Candidates, widest (preferred) first; the settings every trial shares.
WIDTHS = (1.0, 0.75, 0.5, 0.375, 0.25)
SEEDS = (0, 1, 2)
GRAD_CLIP = 3.0
# (label, dense, sparsity): the runs of one setting and seed.
RUNS = (("dense", True, 0.0), ("GMP 95 %", False, 0.95), ("GMP 99 %", False, 0.99))


def trial_key(width: float, label: str, seed: int) -> str:
    return f"w{width:g}/{label}/s{seed}"


def run_trial(width: float, label: str, dense: bool, sparsity: float, seed: int) -> dict[str, Any]:
    """One training run; returns its record (test accuracy in %, wall time in s)."""
    overrides: dict[str, Any] = {
        "model_kwargs": {"width": width},
        "grad_clip": GRAD_CLIP,
        "seed": seed,
        "threads": 1,
        "tensorboard": False,
        "dense": dense,
    }
    if not dense:
        overrides.update(method="gmp", sparsity=sparsity)
    config = load_config("mnist1d", **overrides)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = train(config, Path(tmp) / "run", progress=False)
        wall = time.perf_counter() - start
    return {
        "key": trial_key(width, label, seed),
        "width": width,
        "run": label,
        "seed": seed,
        "test_accuracy": 100.0 * result.test_accuracy,
        "sparsity": result.sparsity,
        "wall_s": wall,
    }


def load_records(path: Path) -> dict[str, dict[str, Any]]:
    if not path.is_file():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["key"]: r for r in records}


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.2f} ± {std:.2f}"


def report(records: dict[str, dict[str, Any]]) -> None:
    """Print the trial table, the per-width summary and the rule's choice."""
    print("| width | run | seed | test acc. % | sparsity | wall s |")
    print("|---:|---|---:|---:|---:|---:|")
    for width in WIDTHS:
        for label, _, _ in RUNS:
            for seed in SEEDS:
                r = records.get(trial_key(width, label, seed))
                if r is not None:
                    print(
                        f"| {width:g} | {label} | {seed} | {r['test_accuracy']:.2f} "
                        f"| {r['sparsity']:.4f} | {r['wall_s']:.1f} |"
                    )
    print()
    print(
        "| width | dense | GMP 95 % | GMP 99 % | GMP 99 % loss | mean wall s "
        f"| dense ≤ {DENSE_MAX:g} | loss in [{LOSS_MIN:g}, {LOSS_MAX:g}] | qualifies |"
    )
    print("|---:|---:|---:|---:|---:|---:|:-:|:-:|:-:|")
    qualifying = []
    for width in WIDTHS:
        acc: dict[str, list[float]] = {}
        walls: list[float] = []
        for label, _, _ in RUNS:
            rows = [records.get(trial_key(width, label, s)) for s in SEEDS]
            acc[label] = [r["test_accuracy"] for r in rows if r is not None]
            walls += [r["wall_s"] for r in rows if r is not None]
        if any(len(v) < len(SEEDS) for v in acc.values()):
            print(f"| {width:g} | incomplete: {sum(map(len, acc.values()))} of 9 trials |")
            continue
        dense = statistics.fmean(acc["dense"])
        loss = dense - statistics.fmean(acc["GMP 99 %"])
        ok_dense = dense <= DENSE_MAX
        ok_loss = LOSS_MIN <= loss <= LOSS_MAX
        if ok_dense and ok_loss:
            qualifying.append(width)
        print(
            f"| {width:g} | {mean_std(acc['dense'])} | {mean_std(acc['GMP 95 %'])} "
            f"| {mean_std(acc['GMP 99 %'])} | {loss:.2f} | {statistics.fmean(walls):.1f} "
            f"| {'yes' if ok_dense else 'no'} | {'yes' if ok_loss else 'no'} "
            f"| {'**yes**' if ok_dense and ok_loss else 'no'} |"
        )
    print()
    if qualifying:
        print(f"chosen (widest qualifying width): width = {max(qualifying):g}")
    else:
        print("no width qualifies (or trials are missing)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time [2]")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("docs/results/mnist1d-regime/trials.jsonl"),
        help="JSON-lines record of the trials (appended; existing trials are kept)",
    )
    parser.add_argument("--report-only", action="store_true", help="print, run nothing")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if os.environ.get("OMP_NUM_THREADS") != "1":
        print("note: run with OMP_NUM_THREADS=1 (one thread per run)")

    records = load_records(args.out)
    todo = [
        (width, label, dense, sparsity, seed)
        for width in WIDTHS
        for seed in SEEDS
        for label, dense, sparsity in RUNS
        if trial_key(width, label, seed) not in records
    ]
    if todo and not args.report_only:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(run_trial, *t) for t in todo]
            for i, future in enumerate(futures, 1):
                record = future.result()
                records[record["key"]] = record
                with args.out.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                print(
                    f"[{i}/{len(todo)}] {record['key']}: {record['test_accuracy']:.2f} % "
                    f"in {record['wall_s']:.1f} s ({time.perf_counter() - started:.0f} s so far)",
                    flush=True,
                )
    report(records)


if __name__ == "__main__":
    main()
