"""One process per run folder: the lock of `train` and of the bench's runs."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from _dist import launch
from _guards import guard
from _helpers import tiny_config, tiny_run, tiny_run_args
from feather_sparse import cli, run_lock
from feather_sparse.bench.runner import REUSED, RunOutcome, _execute, load_outcome
from feather_sparse.integrity import write_sealed_json
from feather_sparse.train import train
from feather_sparse.train.run_dir import _prepare

pytestmark = pytest.mark.skipif(run_lock.fcntl is None, reason="no flock on this platform")

SMALL = tiny_run(train_size=256, test_size=64, eval_batch_size=64)

HOLD = """
import sys, time
from pathlib import Path
from feather_sparse import run_lock
with run_lock.hold(Path(sys.argv[1]), what="test"):
    print("held", flush=True)
    time.sleep(600)
"""


def held_elsewhere(lock_file: Path) -> subprocess.Popen[str]:
    """Another process holding ``lock_file`` (until killed)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock_file)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_held_lock_names_its_holder_and_is_free_once_released(tmp_path: Path) -> None:
    lock = tmp_path / "sub" / ".lock"
    with run_lock.hold(lock, what="run folder x"):
        with pytest.raises(run_lock.RunInUseError) as err, run_lock.hold(lock, what="run folder x"):
            pass
        message = str(err.value)
        assert message.startswith("run folder x is in use by process ")
        assert f"process {os.getpid()} on " in message and "wait for it to finish" in message
    with run_lock.hold(lock, what="run folder x"):  # released: free again
        pass


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    lock = tmp_path / ".lock"
    proc = held_elsewhere(lock)
    try:
        with (
            pytest.raises(run_lock.RunInUseError, match=f"process {proc.pid} on"),
            run_lock.hold(lock, what="x"),
        ):
            pass
    finally:
        proc.kill()  # SIGKILL: no clean-up code runs
        proc.wait()
    with run_lock.hold(lock, what="x"):  # the system released it with the process
        pass


@guard(
    "a second `feather-sparse train` into a run folder another process is training "
    "(started twice, a requeued job), fresh or `--resume`",
    "exit 1 naming the folder and the process that holds it (pid, host, start, command); "
    "the running training's files untouched",
)
def test_a_second_training_into_a_busy_run_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    train(tiny_config(SMALL, epochs=2), run, stop_after_epoch=1, progress=False)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    proc = held_elsewhere(run / run_lock.LOCK_NAME)  # the other training, holding the folder
    try:
        args = tiny_run_args(train_size=256, test_size=64, epochs=2)
        assert cli.main(["train", *args, "--resume", str(run)]) == 1
        err = capsys.readouterr().err
        assert f"run folder {run} is in use by process {proc.pid}" in err
        with pytest.raises(run_lock.RunInUseError):
            train(tiny_config(SMALL, epochs=2), tmp_path / "run", progress=False)
    finally:
        proc.kill()
        proc.wait()
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    after.pop(run / run_lock.LOCK_NAME)  # the holder's record
    before.pop(run / run_lock.LOCK_NAME)
    assert after == before
    # once the other process is gone, the resume goes ahead
    assert train(tiny_config(SMALL, epochs=2), run, resume=True, progress=False).completed


@guard(
    "two sweeps sharing a `--runs-dir` reach the same run while one is training it",
    "the second waits for it and reuses its result; the run's folder is never cleared "
    "under the training",
)
def test_a_sweep_waits_for_a_run_another_sweep_is_training(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "r-abc"
    path.mkdir(parents=True)
    (path / "train.log").write_text("another sweep is training this run\n")
    config = tiny_config(SMALL, epochs=1).to_dict()
    result: dict[str, object] = {}
    with run_lock.hold(path.parent / ".r-abc.lock", what="the other sweep"):
        worker = threading.Thread(target=lambda: result.update(_execute(config, str(path))))
        worker.start()
        time.sleep(0.5)
        assert worker.is_alive()  # waiting, and the folder is untouched
        assert (path / "train.log").read_text() == "another sweep is training this run\n"
        done = RunOutcome(key="r-abc", config=config, ok=True, test_accuracy=0.5, sparsity=0.9)
        write_sealed_json(path / "result.json", done.to_json())
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert result["test_accuracy"] == 0.5 and result["key"] == "r-abc"  # reused, not retrained
    assert result[REUSED] is True  # counted as reused on the page, not as trained here
    assert (path / "train.log").read_text() == "another sweep is training this run\n"
    stored = load_outcome(path)
    assert stored is not None and stored.test_accuracy == 0.5


def test_preparing_a_run_folder_keeps_the_files_of_live_writers(tmp_path: Path) -> None:
    """Leftovers of killed writers go; an export writing into the folder keeps its file."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    dead = run / ".model.fsp.999999999.0a1b2c3d.tmp"
    alive = run / f".model.fsp.{os.getppid()}.0a1b2c3d.tmp"
    killed = run / "checkpoints" / ".last.pt.999999999.0a1b2c3d.tmp"  # a killed writer
    users = run / "checkpoints" / ".last.pt.killed.tmp"  # no pid: not a temporary file of ours
    for f in (dead, alive, killed, users):
        f.write_bytes(b"x")
    _prepare(run)
    assert alive.exists() and not dead.exists() and not killed.exists()
    assert users.exists()


@guard(
    "a sweep reaches a run whose folder a `train --resume` (by hand) is training",
    "that run fails with the holder named; its folder is neither cleared nor written to",
)
def test_a_sweep_leaves_alone_a_run_folder_that_train_holds(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "r-abc"
    path.mkdir(parents=True)
    (path / "train.log").write_text("resumed by hand\n")
    proc = held_elsewhere(path / run_lock.LOCK_NAME)
    try:
        result = _execute(tiny_config(SMALL, epochs=1).to_dict(), str(path))
    finally:
        proc.kill()
        proc.wait()
    assert result["ok"] is False and f"is in use by process {proc.pid}" in str(result["error"])
    assert sorted(p.name for p in path.iterdir()) == [run_lock.LOCK_NAME, "train.log"]
    assert (path / "train.log").read_text() == "resumed by hand\n"
    # free again: the unfinished attempt is cleared (the lock file kept) and trained
    result = _execute(tiny_config(SMALL, epochs=1).to_dict(), str(path))
    assert result["ok"] is True and REUSED not in result
    assert "resumed by hand" not in (path / "train.log").read_text()


def test_a_refused_resume_leaves_nothing_behind(tmp_path: Path) -> None:
    """No folder is made for a resume of nothing, and no lock is left in a folder with no run."""
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(tiny_config(SMALL), tmp_path / "a" / "b" / "gone", resume=True, progress=False)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("mine")
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(tiny_config(SMALL), plain, resume=True, progress=False)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "plain",
        "plain/notes.txt",
    ]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_does_not_keep_the_lock(tmp_path: Path) -> None:
    """A DataLoader worker forked during training must not hold the run after the trainer."""
    lock = tmp_path / ".lock"
    started, ready = os.pipe()
    with run_lock.hold(lock, what="x"):
        child = os.fork()
        if child == 0:  # the worker: outlives the lock's holder for a while
            os.write(ready, b"1")  # its fork handlers have run
            time.sleep(5)
            os._exit(0)
        assert os.read(started, 1) == b"1"
    try:
        with run_lock.hold(lock, what="x"):  # free at once, the child still alive
            assert os.waitpid(child, os.WNOHANG) == (0, 0)
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)


def _train_busy_folder(rank: int, world: int, run: str) -> str:
    try:
        train(tiny_config(SMALL, epochs=1), Path(run), progress=False)
    except run_lock.RunInUseError as err:
        return f"refused: {err}"
    return "trained"


def test_every_rank_of_a_distributed_run_is_told_the_folder_is_busy(tmp_path: Path) -> None:
    """Rank 0 takes the lock; a refusal reaches every rank at once, none waits in a collective."""
    run = tmp_path / "run"
    with run_lock.hold(run / run_lock.LOCK_NAME, what="the other training"):
        results = launch(functools.partial(_train_busy_folder, run=str(run)), 2)
    assert all(r.startswith(f"refused: run folder {run} is in use by process ") for r in results)
    assert sorted(p.name for p in run.iterdir()) == [run_lock.LOCK_NAME]
