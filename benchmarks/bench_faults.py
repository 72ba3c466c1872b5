"""Fault injection on the training side, as figures: damaged files and killed runs.

For each fault kind, N random cases, and a Markdown table of what happened:

- *checkpoint, bit flip / truncation*: one random bit of a run's ``last.pt``
  flipped, or the file cut at a random length. *Detected*: ``load_checkpoint``
  refuses it. *Recovered*: the run (stopped after 2 of 3 epochs) resumes from
  ``prev.pt`` to weights bit-identical to an uninterrupted run. *Overwritten*:
  the same damage in a finished run, then ``--resume``: any file of the run
  other than the damaged one that changed (``model.fsp`` above all).
- *cache, bit flip / truncation*: the same for the MNIST-1D cache. *Detected*:
  ``load_npz_checked`` refuses it. *Recovered*: ``load_mnist1d_arrays``
  regenerates it, equal to the original.
- *SIGKILL, then resume*: a training process (the CLI) killed after a random
  delay, or half-way through a random atomic write (checkpoint, config.json);
  then ``--resume`` (or a fresh start when no checkpoint was written yet).
  *Recovered*: final weights bit-identical to an uninterrupted run, with no
  temporary file left. *Overwritten*: a saved model that changed.

The helpers (the small run, the child process, the damage) are those of
``tests/test_faults.py``, so the figures and the tests exercise the same code.

Usage::

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_faults.py [--cases 100] [--kills 20]
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from _timing import machine

# The tests' helpers (run, child process, damage): one source of truth.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import test_faults as tf
from feather_sparse import run_lock
from feather_sparse.data import cache, mnist1d
from feather_sparse.train import TrainResult, checkpoint_path, load_checkpoint, train

Damage = Callable[[Path, random.Random], None]
DAMAGES: dict[str, Damage] = {"bit flip": tf.flip_bit, "truncation": tf.truncate}


class Row:
    def __init__(self, kind: str) -> None:
        self.kind, self.cases, self.detected, self.recovered, self.overwritten = kind, 0, 0, 0, 0

    def markdown(self, overwritten: bool = True) -> str:
        share = f"{self.detected}/{self.cases} ({self.detected / self.cases:.0%})"
        rec = f"{self.recovered}/{self.cases} ({self.recovered / self.cases:.0%})"
        over = str(self.overwritten) if overwritten else "n/a"
        return f"| {self.kind} | {self.cases} | {share} | {rec} | {over} |"


def snapshot(run: Path, skip: Path) -> dict[Path, bytes]:
    """The run's files but ``skip``, the logs and the lock's record of who last held it."""
    return {
        p: p.read_bytes()
        for p in run.rglob("*")
        if p.is_file() and p != skip and p.suffix != ".log" and p.name != run_lock.LOCK_NAME
    }


def checkpoint_rows(work: Path, cases: int, seed: int, straight: TrainResult) -> list[Row]:
    half = work / "half"
    train(tf.small_config(), half, stop_after_epoch=2, progress=False)
    rows = []
    for name, damage in DAMAGES.items():
        rng, row = random.Random(seed), Row(f"checkpoint `last.pt`: {name}")
        for case in range(cases):
            row.cases += 1
            # Detection, and resuming the unfinished run from prev.pt.
            run = Path(shutil.copytree(half, work / f"h{case}"))
            damage(checkpoint_path(run), rng)
            try:
                load_checkpoint(run)
            except ValueError:
                row.detected += 1
            result = train(tf.resume_config(run), run, resume=True, progress=False)
            row.recovered += tf.same_weights(result.model, straight.model)
            shutil.rmtree(run)
            # The finished run: resuming must change nothing but the damaged file.
            run = Path(shutil.copytree(straight.run_dir, work / f"f{case}"))
            damage(checkpoint_path(run), rng)
            before = snapshot(run, checkpoint_path(run))
            train(tf.resume_config(run), run, resume=True, progress=False)
            after = snapshot(run, checkpoint_path(run))
            row.overwritten += sum(after.get(p) != data for p, data in before.items())
            shutil.rmtree(run)
        rows.append(row)
    return rows


def cache_rows(work: Path, cases: int, seed: int) -> list[Row]:
    folder = work / "cache"
    original = mnist1d.load_mnist1d_arrays(folder)  # generated once (seed 42)
    good = (folder / mnist1d.MNIST1D_FILE).read_bytes()
    rows = []
    for name, damage in DAMAGES.items():
        rng, row = random.Random(seed), Row(f"MNIST-1D cache: {name}")
        for _ in range(cases):
            row.cases += 1
            path = folder / mnist1d.MNIST1D_FILE
            path.write_bytes(good)
            damage(path, rng)
            try:
                cache.load_npz_checked(path)
            except ValueError:
                row.detected += 1
            arrays = mnist1d.load_mnist1d_arrays(folder)
            row.recovered += all(np.array_equal(arrays[k], original[k]) for k in original)
        rows.append(row)
    return rows


def kill_row(work: Path, kills: int, seed: int, straight: TrainResult) -> Row:
    started = time.perf_counter()
    train(tf.small_config(), work / "timing", progress=False)
    duration = time.perf_counter() - started  # the child's training takes about as long
    rng, row = random.Random(seed), Row("SIGKILL, then `--resume`")
    for case in range(kills):
        run = work / f"k{case}"
        # One case in four: half-way through the 1st to 5th atomic write.
        fault = (
            f"write:{rng.randrange(1, 6)}" if case % 4 == 0 else f"{rng.uniform(0, duration):.3f}"
        )
        child = tf.run_child(
            fault, ["train", *tf.SMALL_ARGS, "--epochs", "3", "--run-dir", str(run)]
        )
        row.cases += 1
        row.detected += child.returncode == -signal.SIGKILL
        saved = next((p for p in (run / "model.fsp", run / "model.pt") if p.is_file()), None)
        before = saved.read_bytes() if saved is not None else None
        result = tf.recover(run)
        same = tf.same_weights(result.model, straight.model)
        row.recovered += same and not tf.temp_files(run)
        row.overwritten += saved is not None and saved.read_bytes() != before
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100, help="cases per file fault kind")
    parser.add_argument("--cache-cases", type=int, default=20, help="cases per cache fault kind")
    parser.add_argument("--kills", type=int, default=20, help="SIGKILL cases")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the expected warnings of every case
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        straight = train(tf.small_config(), work / "straight", progress=False)
        rows = checkpoint_rows(work, args.cases, args.seed, straight)
        cache_results = cache_rows(work, args.cache_cases, args.seed)
        kill = kill_row(work, args.kills, args.seed, straight)
    print(f"fault injection, training side; {machine()}; {time.perf_counter() - started:.0f} s.")
    print()
    print("| fault | cases | detected | recovered | good artefacts overwritten |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        print(row.markdown())
    for row in cache_results:
        print(row.markdown(overwritten=False))
    print(kill.markdown())


if __name__ == "__main__":
    main()
