"""Fault injection on the training side: damaged files, kills, Ctrl-C, a full disk, no permission.

What must hold (docs/reliability.md): every flipped bit and every truncation of
a training checkpoint or of the data cache is detected; no good artefact is
overwritten by a result derived from a damaged or older state; a run killed at
any point resumes to weights bit-identical to an uninterrupted run and leaves
no temporary file; each fault gives one line that names the problem and the
fix. The ``slow`` variants repeat the random cases many times.
"""

from __future__ import annotations

import copy
import errno
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from _guards import BEGIN, END, ROOT, guard
from _helpers import checkpoint_state, needs_safetensors, tiny_config, tiny_run, tiny_run_args
from feather_sparse import cli, integrity, run_lock
from feather_sparse.data import cache, mnist1d
from feather_sparse.export import load_sparse
from feather_sparse.integrity import DiskFullError, IntegrityError, NotWritableError
from feather_sparse.recipes import TrainConfig
from feather_sparse.train import (
    CHECKPOINT_FORMAT,
    TrainResult,
    checkpoint_path,
    load_checkpoint,
    load_latest_checkpoint,
    resume_config,
    train,
)

# The default model at a quarter of its width on 256 synthetic samples: 4 steps
# an epoch, 3 epochs, about a second a run.
SMALL = tiny_run(train_size=256, test_size=64, eval_batch_size=64)
SMALL_ARGS = tiny_run_args(train_size=256, test_size=64, eval_batch_size=64)

# A child process running the CLI: SIGKILL after a delay (seconds, from the
# start of training), or during the N-th atomic file write ("write:N", half of
# the file written), or never ("none").
CHILD = """
import os, signal, sys, threading
from feather_sparse import cli, integrity, run_lock
fault, args = sys.argv[1], sys.argv[2:]
if fault.startswith("write:"):
    target, calls, real = int(fault[6:]), [0], integrity._write_file
    def write(fd, data):
        calls[0] += 1
        if calls[0] == target:
            os.write(fd, data[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        real(fd, data)
    integrity._write_file = write
elif fault != "none":
    threading.Timer(float(fault), os.kill, (os.getpid(), signal.SIGKILL)).start()
sys.exit(cli.main(args))
"""


def small_config(**overrides: Any) -> TrainConfig:
    return tiny_config(SMALL, **overrides)


def run_child(
    fault: str, args: list[str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", CHILD, fault, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def temp_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


def flip_bit(path: Path, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    bit = rng.randrange(8 * len(data))
    data[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))


def truncate(path: Path, rng: random.Random) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: rng.randrange(len(data))])


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    """The uninterrupted run every recovered run must equal bit for bit."""
    return train(small_config(), tmp_path_factory.mktemp("straight") / "run", progress=False)


@pytest.fixture(scope="module")
def finished_run(straight: TrainResult) -> Path:
    return straight.run_dir


@pytest.fixture(scope="module")
def half_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run stopped after 2 of 3 epochs: last.pt (epoch 2) and prev.pt (epoch 1)."""
    run = tmp_path_factory.mktemp("half") / "run"
    train(small_config(), run, stop_after_epoch=2, progress=False)
    return run


def copy_run(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / run.name))


# ---------------------------------------------------------------- checkpoints
def check_checkpoint_damage(half_run: Path, tmp_path: Path, cases: int, seed: int) -> None:
    rng = random.Random(seed)
    original = checkpoint_path(half_run)
    for case in range(cases):
        damaged = tmp_path / f"{case}.pt"
        shutil.copyfile(original, damaged)
        (flip_bit if case % 2 == 0 else truncate)(damaged, rng)
        with pytest.raises(ValueError):  # IntegrityError, or unreadable
            load_checkpoint(damaged)
        damaged.unlink()


@guard("a training checkpoint with a flipped bit or truncated", "`IntegrityError` naming the file")
def test_every_flipped_bit_and_truncation_of_a_checkpoint_is_detected(
    half_run: Path, tmp_path: Path
) -> None:
    check_checkpoint_damage(half_run, tmp_path, cases=24, seed=0)


@pytest.mark.slow
def test_every_flipped_bit_and_truncation_of_a_checkpoint_is_detected_many(
    half_run: Path, tmp_path: Path
) -> None:
    check_checkpoint_damage(half_run, tmp_path, cases=1000, seed=1)


def test_a_sealed_checkpoint_is_still_a_plain_torch_archive(half_run: Path) -> None:
    """``torch.load`` (export's reader) reads it as it is; the seal is the zip comment."""
    data = checkpoint_path(half_run).read_bytes()
    assert integrity.check_zip_seal(data, "last.pt") is True
    plain = torch.load(checkpoint_path(half_run), map_location="cpu", weights_only=True)
    assert plain["format"] == CHECKPOINT_FORMAT and plain["checkpoint_version"] == 2


@guard(
    "a checkpoint from before checksums (format 1)", "loads, with a warning that it is unverified"
)
def test_a_legacy_checkpoint_without_a_checksum_loads_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    legacy = tmp_path / "legacy.pt"
    torch.save(checkpoint_state(checkpoint_version=1, epoch=4), legacy)
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        assert load_checkpoint(legacy)["epoch"] == 4
    assert "no checksum" in caplog.text
    # The same without its seal but claiming the sealed format: the seal was cut off.
    torch.save(checkpoint_state(checkpoint_version=2, epoch=4), legacy)
    with pytest.raises(IntegrityError, match="checksum is missing"):
        load_checkpoint(legacy)


@guard(
    "`--resume` from a checkpoint without a checksum (format 1) with an entry missing or retyped",
    "`IntegrityError` naming the file and the entry; resumes from `prev.pt`, bit-exact; "
    "CLI exit 1, one line, when there is none",
)
def test_a_damaged_unverified_checkpoint_falls_back_to_the_previous_one(
    half_run: Path,
    straight: TrainResult,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = copy_run(half_run, tmp_path)
    last = checkpoint_path(run)
    good = load_checkpoint(last)
    damages = {  # what the message names: each read raw (KeyError, TypeError) by a resume
        "no 'optimizer' entry": lambda state: state.pop("optimizer"),
        "no 'rng' entry": lambda state: state.pop("rng"),
        "'config' of type NoneType": lambda state: state.update(config=None),
        "'pruner' entry has no 'step'": lambda state: state["pruner"].pop("step"),
    }
    for named, damage in damages.items():
        state = copy.deepcopy(good)
        state["checkpoint_version"] = 1  # written before checksums: nothing verifies it
        damage(state)
        torch.save(state, last)
        with pytest.raises(IntegrityError, match="is damaged") as info:
            load_checkpoint(last)
        assert str(last) in str(info.value) and named in str(info.value)

    # The command line, with no prev.pt to fall back to: one line naming file and entry.
    alone = copy_run(run, tmp_path / "alone")
    (alone / "checkpoints" / "prev.pt").unlink()
    assert cli.main(["train", "--resume", str(alone), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert str(checkpoint_path(alone)) in err[0] and "'pruner' entry has no 'step'" in err[0]

    # With prev.pt (epoch 1) beside it, the resume uses it and ends as an uninterrupted run.
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        result = train(small_config(), run, resume=True, progress=False)
    assert "resuming from the previous checkpoint" in caplog.text
    assert result.completed and same_weights(result.model, straight.model)


@guard("`--resume` with a damaged `last.pt`", "warns, resumes from `prev.pt`, bit-exact result")
def test_a_damaged_last_checkpoint_resumes_from_the_previous_one_bit_exactly(
    half_run: Path, straight: TrainResult, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = copy_run(half_run, tmp_path)
    flip_bit(checkpoint_path(run), random.Random(3))
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        result = train(small_config(), run, resume=True, progress=False)
    assert "resuming from the previous checkpoint" in caplog.text and "prev.pt" in caplog.text
    assert result.completed and same_weights(result.model, straight.model)
    assert (run / "checkpoints" / "last.pt.damaged").is_file()  # kept for inspection
    assert load_checkpoint(run)["epoch"] == 3 and load_checkpoint(run / "checkpoints/prev.pt")
    assert temp_files(run) == []


@guard("`--resume` when `last.pt` and `prev.pt` are both damaged", "`IntegrityError` naming both")
def test_no_intact_checkpoint_left_is_a_clear_error(half_run: Path, tmp_path: Path) -> None:
    run = copy_run(half_run, tmp_path)
    rng = random.Random(4)
    flip_bit(checkpoint_path(run), rng)
    truncate(run / "checkpoints" / "prev.pt", rng)
    with pytest.raises(IntegrityError, match="no intact checkpoint") as info:
        load_latest_checkpoint(run)
    assert "last.pt" in str(info.value) and "prev.pt" in str(info.value)


@guard(
    "`--resume` of a finished run with damaged checkpoints",
    "writes nothing (but the run lock's record of who read it); model kept",
)
def test_resuming_a_finished_run_never_overwrites_its_model(
    finished_run: Path, straight: TrainResult, tmp_path: Path
) -> None:
    run = copy_run(finished_run, tmp_path)
    model = next(p for p in (run / "model.fsp", run / "model.pt") if p.is_file())
    before = {
        p: p.read_bytes()
        for p in run.rglob("*")
        if p.is_file() and p.suffix != ".log" and p.name != run_lock.LOCK_NAME
    }
    flip_bit(checkpoint_path(run), random.Random(5))
    flip_bit(run / "checkpoints" / "prev.pt", random.Random(6))
    result = train(small_config(), run, resume=True, progress=False)
    assert result.completed and result.model_path == model
    assert result.test_accuracy == straight.test_accuracy
    assert same_weights(result.model, straight.model)
    changed = {p for p, data in before.items() if p.read_bytes() != data}
    assert changed == {checkpoint_path(run), run / "checkpoints" / "prev.pt"}  # our flips only


@guard(
    "a new run into a folder holding a finished run whose checkpoints were deleted",
    "`ValueError` naming what the folder holds; its model and metrics untouched",
)
def test_a_new_run_never_writes_over_a_finished_run(finished_run: Path, tmp_path: Path) -> None:
    run = copy_run(finished_run, tmp_path)
    shutil.rmtree(run / "checkpoints")  # kept the model only, to save space
    before = {p: p.read_bytes() for p in (run / "metrics.jsonl", run / "config.json")}
    model = next(p for p in (run / "model.fsp", run / "model.pt") if p.is_file())
    before[model] = model.read_bytes()
    with pytest.raises(ValueError, match=rf"already holds a run \(metrics.jsonl, {model.name}\)"):
        train(small_config(sparsity=0.5), run, progress=False)
    assert all(p.read_bytes() == data for p, data in before.items())
    assert not (run / "checkpoints").exists()


@guard(
    "`--resume` of a finished run with settings that differ from its own (more epochs)",
    "`ValueError` naming the fields (as for an unfinished run) and how to train the model "
    "further: a new run from its weights (`--init-from RUN`); nothing written",
)
def test_resuming_a_finished_run_with_other_settings_is_refused(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_run(finished_run, tmp_path)
    with pytest.raises(ValueError, match=r"contradicts.*sparsity=0.9 in the checkpoint but 0.5"):
        train(small_config(sparsity=0.5), run, resume=True, progress=False)
    assert cli.main(["train", "--resume", str(run), "--epochs", "5"]) == 1
    err = capsys.readouterr().err
    assert f"{run} has finished: to train its model further" in err
    assert f"feather-sparse train --init-from {run} --run-dir NEW_FOLDER" in err


@guard(
    "CLI `--resume` of a finished run whose checkpoints are gone or damaged",
    "hands back its model (the config comes from its `config.json`), exit 0",
)
def test_cli_resume_of_a_finished_run_without_checkpoints_hands_back_its_model(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_run(finished_run, tmp_path)
    flip_bit(checkpoint_path(run), random.Random(9))
    flip_bit(run / "checkpoints" / "prev.pt", random.Random(10))
    assert cli.main(["train", "--resume", str(run)]) == 0
    shutil.rmtree(run / "checkpoints")
    assert cli.main(["train", "--resume", str(run)]) == 0
    assert "achieved sparsity:   90.00%" in capsys.readouterr().out
    half = copy_run(finished_run, tmp_path / "unfinished")
    (half / "metrics.jsonl").write_text("")  # not finished: no checkpoint, nothing to resume
    shutil.rmtree(half / "checkpoints")
    assert cli.main(["train", "--resume", str(half)]) == 1


def test_a_damaged_saved_model_is_made_again_from_the_verified_checkpoint(
    finished_run: Path, straight: TrainResult, tmp_path: Path
) -> None:
    run = copy_run(finished_run, tmp_path)
    model = next(p for p in (run / "model.fsp", run / "model.pt") if p.is_file())
    truncate(model, random.Random(7))
    result = train(small_config(), run, resume=True, progress=False)
    assert result.completed and same_weights(result.model, straight.model)
    assert result.test_accuracy == straight.test_accuracy


def flip_readable_bit(path: Path, rng: random.Random) -> None:
    """Flip one bit of ``path`` where ``torch.load`` still reads the file (a tensor's bytes)."""
    good = path.read_bytes()
    for _ in range(200):
        flip_bit(path, rng)
        try:
            torch.load(path, map_location="cpu", weights_only=True)
            return
        except Exception:
            path.write_bytes(good)
    raise AssertionError(f"no readable single-bit flip of {path} found")


@pytest.fixture
def damaged_run(finished_run: Path, tmp_path: Path) -> Path:
    """A copy of the finished run whose ``last.pt`` has a flipped bit torch still reads."""
    run = copy_run(finished_run, tmp_path)
    flip_readable_bit(checkpoint_path(run), random.Random(8))
    return run


@guard(
    "`export RUN_DIR` whose `last.pt` has a flipped bit (torch still reads it)",
    "warns, exports `prev.pt`; the damaged file is never exported",
)
@needs_safetensors
def test_export_of_a_damaged_run_falls_back_to_the_previous_checkpoint(
    damaged_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = damaged_run
    (run / "model.fsp").unlink()  # a run that has not finished: no final model to prefer
    out, expected = tmp_path / "out.fsp", tmp_path / "prev.fsp"
    assert cli.main(["export", str(run / "checkpoints" / "prev.pt"), "-o", str(expected)]) == 0
    capsys.readouterr()
    assert cli.main(["export", str(run), "-o", str(out)]) == 0
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and "SHA-256" in warning[0] and "prev.pt" in warning[0]
    assert same_weights(load_sparse(out), load_sparse(expected))  # prev.pt's model, not last.pt's


@needs_safetensors
def test_export_of_a_run_whose_last_checkpoint_is_no_zip_falls_back(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_run(finished_run, tmp_path)
    (run / "model.fsp").unlink()  # a run that has not finished: no final model to prefer
    last = checkpoint_path(run)
    last.write_bytes(b"\0" * 8 + last.read_bytes()[8:])  # its zip signature gone
    assert cli.main(["export", str(run), "-o", str(tmp_path / "out.fsp")]) == 0
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and "prev.pt" in warning[0]


@guard(
    "`export last.pt` with a flipped bit (torch still reads it)",
    "CLI exit 1, one line naming the file; nothing written",
)
def test_export_of_a_damaged_checkpoint_file_is_refused(
    damaged_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.fsp"
    assert cli.main(["export", str(checkpoint_path(damaged_run)), "-o", str(out)]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "last.pt" in error[0] and "SHA-256" in error[0]
    assert not out.exists() and temp_files(tmp_path) == []


# ---------------------------------------------------------------- data cache
def check_cache_damage(tmp_path: Path, cases: int, seed: int) -> None:
    rng = random.Random(seed)
    good = tmp_path / "good.npz"
    cache.save_npz_atomic(good, x=np.arange(400, dtype=np.float32).reshape(10, 40), y=np.arange(10))
    assert cache.load_npz_checked(good)["y"].tolist() == list(range(10))
    for case in range(cases):
        damaged = tmp_path / "damaged.npz"
        shutil.copyfile(good, damaged)
        (flip_bit if case % 2 == 0 else truncate)(damaged, rng)
        with pytest.raises(IntegrityError):
            cache.load_npz_checked(damaged)


@guard("a data cache with a flipped bit or truncated", "`IntegrityError`; the cache is regenerated")
def test_every_flipped_bit_and_truncation_of_the_cache_is_detected(tmp_path: Path) -> None:
    check_cache_damage(tmp_path, cases=40, seed=0)


@pytest.mark.slow
def test_every_flipped_bit_and_truncation_of_the_cache_is_detected_many(tmp_path: Path) -> None:
    check_cache_damage(tmp_path, cases=2000, seed=1)


@pytest.fixture
def fake_generator(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """MNIST-1D generation replaced by zeros of the right shapes; counts the calls."""
    calls: list[int] = []

    def generate() -> dict[str, np.ndarray]:
        calls.append(1)
        return {
            "x": np.zeros((4000, 40), np.float32),
            "y": np.zeros(4000, np.int64),
            "x_test": np.zeros((1000, 40), np.float32),
            "y_test": np.zeros(1000, np.int64),
        }

    monkeypatch.setattr(mnist1d, "_generate", generate)
    return calls


def _bad_crc_zip(path: Path) -> None:
    """An unsealed (old) .npz whose array bytes changed: only the zip CRC can tell."""
    np.savez(path, x=np.ones(1000, np.float32))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@guard("a damaged MNIST-1D cache (truncated, bad CRC, wrong arrays)", "warning, then regenerated")
@pytest.mark.parametrize("damage", ["truncated", "bad-crc", "wrong-arrays", "garbage"])
def test_a_damaged_mnist1d_cache_is_regenerated_with_a_warning(
    damage: str, tmp_path: Path, fake_generator: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / mnist1d.MNIST1D_FILE
    if damage == "truncated":
        mnist1d.load_mnist1d_arrays(tmp_path)  # a good cache first
        path.write_bytes(path.read_bytes()[:1000])
    elif damage == "bad-crc":
        _bad_crc_zip(path)
    elif damage == "wrong-arrays":
        cache.save_npz_atomic(path, x=np.zeros((3, 40)), y=np.zeros(3), x_test=[], y_test=[])
    else:
        path.write_bytes(b"PK\x03\x04 not really a zip")
    fake_generator.clear()
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        arrays = mnist1d.load_mnist1d_arrays(tmp_path)
    assert fake_generator == [1] and arrays["x"].shape == (4000, 40)
    assert "regenerating" in caplog.text and str(path) in caplog.text
    assert integrity.check_zip_seal(path.read_bytes(), path)  # rewritten, sealed
    fake_generator.clear()
    mnist1d.load_mnist1d_arrays(tmp_path)
    assert fake_generator == []  # and read from then on


# ------------------------------------------------------------- kills, Ctrl-C
def recover(run: Path) -> TrainResult:
    """What a user does after a kill: resume if a checkpoint exists, else start again."""
    if checkpoint_path(run).is_file() or (run / "checkpoints" / "prev.pt").is_file():
        return train(resume_config(run), run, resume=True, progress=False)
    return train(small_config(), run, progress=False)


def check_kill_and_resume(fault: str, run: Path, straight: TrainResult) -> None:
    child = run_child(fault, ["train", *SMALL_ARGS, "--epochs", "3", "--run-dir", str(run)])
    assert child.returncode in (-signal.SIGKILL, 0), child.stderr
    result = recover(run)
    assert result.completed and same_weights(result.model, straight.model), fault
    assert result.test_accuracy == straight.test_accuracy
    assert temp_files(run) == []


@guard("SIGKILL during a checkpoint write, then `--resume`", "bit-exact result, no temporary file")
def test_a_kill_during_a_checkpoint_write_resumes_bit_exactly(
    tmp_path: Path, straight: TrainResult
) -> None:
    # Writes: 1 config.json, 2 epoch 1's checkpoint, 3 epoch 2's: killed half-way.
    check_kill_and_resume("write:3", tmp_path / "run", straight)
    assert load_checkpoint(tmp_path / "run")["epoch"] == 3


@pytest.mark.slow
def test_kills_at_random_points_resume_bit_exactly(tmp_path: Path, straight: TrainResult) -> None:
    rng = random.Random(0)
    for case in range(20):
        fault = f"write:{rng.randrange(1, 6)}" if case % 4 == 0 else f"{rng.uniform(0, 3):.2f}"
        check_kill_and_resume(fault, tmp_path / f"run{case}", straight)


@guard("Ctrl-C during training", "exit 130; says the epoch, step and the `--resume` command")
def test_ctrl_c_says_where_the_run_stopped_and_how_to_resume(tmp_path: Path) -> None:
    check_stop_and_hint(tmp_path / "run", signal.SIGINT, 130)


@guard(
    "SIGTERM during training (a scheduler's stop, `docker stop`, `timeout`)",
    "ends as Ctrl-C does: exit 143, says `SIGTERM:`, the epoch, step and the `--resume` "
    "command (it died without a word)",
)
def test_sigterm_stops_training_as_ctrl_c_does(tmp_path: Path) -> None:
    check_stop_and_hint(tmp_path / "run", signal.SIGTERM, 143)


def check_stop_and_hint(run: Path, sig: int, code: int) -> None:
    """Send ``sig`` to a training run once it wrote a checkpoint: it ends with ``code``
    and one last line naming where it stopped and the command that continues it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    args = ["train", *SMALL_ARGS, "--epochs", "1000", "--run-dir", str(run)]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, "none", *args],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.monotonic() + 300  # the machine may be slow: wait for a checkpoint
    while not checkpoint_path(run).is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert checkpoint_path(run).is_file(), "no checkpoint written in 300 s"
    child.send_signal(sig)
    _, err = child.communicate(timeout=60)
    assert child.returncode == code, err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err
    assert "interrupted in epoch" in last and "step" in last
    assert last.startswith("feather-sparse train: SIGTERM: ") == (sig == signal.SIGTERM)
    assert last.endswith(f"continue with: feather-sparse train --resume {run}")
    assert load_checkpoint(run)["epoch"] >= 1 and temp_files(run) == []


# --------------------------------------------------------- disk and folders
def fail_writes(monkeypatch: pytest.MonkeyPatch, code: int, name: str = "last.pt") -> None:
    """Writes of ``name`` fail with ``code`` after half the bytes, as a full disk does."""
    real_temp, real_write = integrity._temp_in, integrity._write_file
    target: set[int] = set()

    def temp_in(folder: Path, file_name: str) -> tuple[int, str]:
        fd, tmp = real_temp(folder, file_name)
        if file_name == name:
            target.add(fd)
        return fd, tmp

    def write(fd: int, data: bytes) -> None:
        if fd in target:
            target.discard(fd)
            os.write(fd, data[: len(data) // 2])
            os.close(fd)
            raise OSError(code, os.strerror(code))
        real_write(fd, data)

    monkeypatch.setattr(integrity, "_temp_in", temp_in)
    monkeypatch.setattr(integrity, "_write_file", write)


@guard("the disk fills up while a checkpoint is written", "exit 1: disk full, previous one intact")
def test_a_full_disk_keeps_the_previous_checkpoint_and_says_so(
    half_run: Path,
    straight: TrainResult,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = copy_run(half_run, tmp_path)
    before = checkpoint_path(run).read_bytes()
    fail_writes(monkeypatch, errno.ENOSPC)
    with pytest.raises(DiskFullError, match="disk is full") as info:
        train(small_config(), run, resume=True, progress=False)
    assert "previous checkpoint (epoch 2) is intact" in str(info.value)
    assert f"feather-sparse train --resume {run}" in str(info.value)
    assert checkpoint_path(run).read_bytes() == before and temp_files(run) == []
    # The command line: one line, exit code 1.
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("feather-sparse train: error: the disk is full")
    monkeypatch.undo()
    result = train(small_config(), run, resume=True, progress=False)  # space again: on it goes
    assert same_weights(result.model, straight.model)


@guard("the run folder becomes read-only during training", "exit 1: cannot write in the folder")
def test_a_read_only_checkpoint_folder_is_a_clear_error(
    half_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = copy_run(half_run, tmp_path)
    fail_writes(monkeypatch, errno.EROFS)
    with pytest.raises(NotWritableError, match=r"cannot write in .*checkpoints.*Read-only"):
        train(small_config(), run, resume=True, progress=False)
    assert load_checkpoint(run)["epoch"] == 2 and temp_files(run) == []


@guard("`--run-dir` a folder that cannot be written", "exit 1: `NotWritableError`, before any work")
def test_a_read_only_run_folder_is_refused_up_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "locked"
    run.mkdir()
    if os.geteuid() == 0:  # root writes anywhere: refuse the folder's writes by hand
        real = integrity.tempfile.mkstemp

        def mkstemp(*args: Any, dir: Any = None, **kwargs: Any) -> tuple[int, str]:
            if dir is not None and Path(dir) == run:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            return real(*args, dir=dir, **kwargs)

        monkeypatch.setattr(integrity.tempfile, "mkstemp", mkstemp)
    else:
        run.chmod(0o555)
    try:
        with pytest.raises(NotWritableError, match="not writable"):
            train(small_config(), run, progress=False)
        assert cli.main(["train", *SMALL_ARGS, "--run-dir", str(run)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == (
            f"feather-sparse train: error: run folder {run} is not writable (Permission denied); "
            "choose another --run-dir, or make it writable"
        )
    finally:
        run.chmod(0o755)


@guard("`--run-dir` names an existing file", "exit 1: 'is an existing file, not a folder'")
def test_a_run_dir_that_is_a_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    with pytest.raises(ValueError, match="is an existing file, not a folder"):
        train(small_config(), path, progress=False)
    assert cli.main(["train", *SMALL_ARGS, "--run-dir", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is an existing file, not a folder" in err[0]
    assert path.read_text() == "mine"


@guard("a torn last line in `metrics.jsonl`", "warning; the line is dropped and rebuilt")
def test_a_torn_metrics_line_is_repaired_from_the_checkpoint(
    half_run: Path, straight: TrainResult, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = copy_run(half_run, tmp_path)
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text(lines[0] + "\n" + lines[1][:20])  # killed while appending epoch 2
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        train(small_config(), run, resume=True, progress=False)
    assert "line 2 is damaged" in caplog.text

    def rows(path: Path) -> list[dict[str, Any]]:
        out = [json.loads(line) for line in path.read_text().splitlines()]
        return [{k: v for k, v in row.items() if k != "epoch_time"} for row in out]

    assert rows(metrics) == rows(straight.run_dir / "metrics.jsonl")  # 3 epochs, final


# --------------------------------------------------------------- the docs
def test_the_guard_table_in_the_docs_is_current() -> None:
    """docs/reliability.md's table is what ``python tests/_guards.py`` makes of the tests."""
    made = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "_guards.py")],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=ROOT,
    ).stdout.strip()
    page = (ROOT / "docs" / "reliability.md").read_text()
    shown = page.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert shown == made, "run: python tests/_guards.py --write docs/reliability.md"


# ------------------------------------------------ a checkpoint of another run
@guard(
    "`--resume RUN` whose checkpoints were copied in from another run",
    "`ValueError` naming the checkpoint, `config.json` and the fields that differ; "
    "nothing in the folder changes",
)
def test_a_checkpoint_of_another_run_is_refused_and_the_folder_kept(
    half_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "other"
    train(small_config(method="gmp", sparsity=0.8), run, stop_after_epoch=1, progress=False)
    for ckpt in (half_run / "checkpoints").glob("*.pt"):  # the Feather run's, into the GMP run's
        shutil.copyfile(ckpt, run / "checkpoints" / ckpt.name)

    def files() -> dict[Path, bytes]:
        return {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}

    before = files()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "belongs to another run" in err[0]
    assert str(checkpoint_path(run)) in err[0] and str(run / "config.json") in err[0]
    assert "method='feather' in the checkpoint but 'gmp' in config.json" in err[0]
    assert "sparsity=0.9 in the checkpoint but 0.8 in config.json" in err[0]
    with pytest.raises(ValueError, match="belongs to another run"):
        train(resume_config(run), run, resume=True, progress=False)
    assert files() == before  # config.json, metrics.jsonl, train.log, checkpoints: as they were


def test_a_config_json_that_differs_only_where_a_resume_may_resumes(
    half_run: Path, straight: TrainResult, tmp_path: Path
) -> None:
    """A session resumed with ``--device`` or ``--eval-every`` rewrites ``config.json``
    before its first checkpoint: those fields may differ from the checkpoint's."""
    run = copy_run(half_run, tmp_path)
    info = json.loads((run / "config.json").read_text())
    info.pop("sha256")
    info["config"].update(device="cpu", eval_every=2, threads=None)
    integrity.write_sealed_json(run / "config.json", info, indent=2)
    result = train(small_config(), run, resume=True, progress=False)
    assert result.completed and same_weights(result.model, straight.model)


@guard(
    "`feather-sparse train --resume` with a damaged `last.pt`",
    "one warning, on the console and in `train.log`: the reason, the `prev.pt` epoch it "
    "resumes from, and that the training after it is done again",
)
def test_a_damaged_last_checkpoint_is_reported_once_and_logged_to_train_log(
    half_run: Path, tmp_path: Path
) -> None:
    run = copy_run(half_run, tmp_path)
    flip_bit(checkpoint_path(run), random.Random(11))
    child = run_child("none", ["train", "--resume", str(run), "--no-progress"])
    assert child.returncode == 0, child.stderr
    warnings = [line for line in child.stderr.splitlines() if str(checkpoint_path(run)) in line]
    assert len(warnings) == 1, child.stderr  # once: not also by the root logger
    (warning,) = warnings
    assert "resuming from the previous checkpoint" in warning and "(epoch 1)" in warning
    assert "the training after epoch 1 is lost and is done again" in warning
    assert "resume from an intact copy" not in warning  # it does not need one: prev.pt is used
    assert f"kept as {checkpoint_path(run)}.damaged" in warning
    log = (run / "train.log").read_text()
    assert log.count("falling back to prev.pt") == 1 and "WARNING" in log
