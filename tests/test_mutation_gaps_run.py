"""Tests that close the gaps a mutation audit of the run folder and its lock found.

Each test here fails on one or more hand-made mutants of ``train/run_dir.py``,
``run_lock.py``, ``provenance.py``, ``train/init_from.py`` or
``train/result.py`` that the rest of the suite let through
(``docs/mutation-audit.md``, "The run folder, its lock and what a resume
reads"; the mutants' ids are in each test's docstring) and checks the code
against its docstrings and the documented contract — not against the code's
own output.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import os
import types
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import torch

from _guards import guard
from _helpers import needs_safetensors
from feather_sparse import models, provenance, run_lock
from feather_sparse.export import save_sparse
from feather_sparse.integrity import (
    JSON_SEAL_KEY,
    IntegrityError,
    NotWritableError,
    check_zip_seal,
    seal_zip,
)
from feather_sparse.recipes import load_config
from feather_sparse.train import run_dir
from feather_sparse.train.init_from import load_init, resolve_init
from feather_sparse.train.result import TrainingInterrupted

SPEC: dict[str, Any] = {"name": "mnist1d_cnn", "kwargs": {"width": 0.25}}


def small_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return models.create_model(SPEC["name"], **SPEC["kwargs"])


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ------------------------------------------------------------------ the folder's name
class _FixedNow(datetime):
    @classmethod
    def now(cls, tz: Any = None) -> _FixedNow:
        return cls(2026, 11, 26, 12, 0, 0)


def test_a_default_run_folder_is_named_as_documented_and_never_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rn01, rn02: ``<recipe>-<method>-s<sparsity>-<time>``, method ``dense`` and ``s0`` for a
    dense run; a name that exists gets ``-2``, ``-3``, ... until one is free."""
    monkeypatch.setattr(run_dir, "datetime", _FixedNow)
    dense = load_config("mnist1d", {"dense": True, "sparsity": 0.9})
    assert run_dir.default_run_dir(dense, tmp_path) == tmp_path / "mnist1d-dense-s0-20261126-120000"
    sparse = load_config("mnist1d", {"sparsity": 0.95})
    base = tmp_path / f"mnist1d-{sparse.run_method}-s0.95-20261126-120000"
    assert run_dir.default_run_dir(sparse, tmp_path) == base
    base.mkdir()
    assert run_dir.default_run_dir(sparse, tmp_path) == base.with_name(base.name + "-2")
    base.with_name(base.name + "-2").mkdir()
    third = run_dir.default_run_dir(sparse, tmp_path)
    assert third == base.with_name(base.name + "-3") and not third.exists()


# ------------------------------------------------------------------ config.json
def _config_json(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    run_dir._write_json(folder / "config.json", {"config": {"epochs": 2}, "world_size": 1})
    return folder / "config.json"


@guard(
    "a run's `config.json` truncated, or a value changed with the JSON still valid",
    "`IntegrityError` naming the file and the fix (restore it from a copy, or train the run again)",
)
@pytest.mark.parametrize("damage", ["truncated", "value changed"])
def test_a_damaged_config_json_is_refused_naming_the_file_and_the_fix(
    tmp_path: Path, damage: str
) -> None:
    """rn03, rn05: ``config.json`` is sealed with its SHA-256 when written and checked
    when read; the error names the file and what to do."""
    path = _config_json(tmp_path / "run")
    text = path.read_text()
    stored = json.loads(text)
    payload = {k: v for k, v in stored.items() if k != JSON_SEAL_KEY}
    digest = hashlib.sha256(
        json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    assert stored[JSON_SEAL_KEY] == digest  # sealed, over the payload's canonical JSON
    if damage == "truncated":
        path.write_text(text[: len(text) // 2])
    else:
        path.write_text(text.replace('"epochs": 2', '"epochs": 3'))
    with pytest.raises(IntegrityError) as err:
        run_dir.read_run_info(tmp_path / "run")
    message = str(err.value)
    assert str(path) in message
    assert "restore it from a copy, or train the run again" in message


def test_run_files_are_replaced_never_written_into(tmp_path: Path) -> None:
    """rn04, rn05: ``metrics.jsonl`` and ``config.json`` are replaced atomically: the file
    that was there is never written into (a kill mid-write would leave it torn), a new
    one takes its place. A hard link to the old file shows which happened."""
    run = tmp_path / "run"
    config = _config_json(run)
    metrics = run / "metrics.jsonl"
    rows = [{"epoch": 1, "loss": 1.0}, {"epoch": 2, "loss": 0.5}]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for path, rewrite in (
        (metrics, lambda: run_dir._trim_metrics(metrics, 1)),
        (config, lambda: run_dir._write_json(config, {"config": {"epochs": 5}})),
    ):
        old = path.read_bytes()
        link = tmp_path / f"{path.name}.link"
        os.link(path, link)
        rewrite()
        assert link.read_bytes() == old, f"{path.name} was written into"
        assert path.read_bytes() != old
    assert run_dir.read_run_info(run) == {"config": {"epochs": 5}}


# ------------------------------------------------------------------ metrics.jsonl
def _metrics(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_resume_keeps_the_rows_up_to_its_checkpoint_and_puts_back_a_lost_one(
    tmp_path: Path,
) -> None:
    """rn06, rn07, rn08, rn09: resuming after epoch ``e`` keeps the per-epoch rows 1..e
    (never a final row, never a later epoch) and puts back the checkpoint's own row of
    epoch ``e`` when a kill lost it, also when the whole file is gone."""
    path = tmp_path / "metrics.jsonl"
    one, two, three = ({"epoch": e, "loss": 1.0 / e} for e in (1, 2, 3))
    final = {"final": True, "epoch": 3, "test_acc": 0.5}
    _metrics(path, [one, two, three, final])
    assert run_dir._trim_metrics(path, 2) == [one, two]  # rn06: epoch 2's own row kept
    assert _rows(path) == [one, two]
    finished = {"final": True, "epoch": 2, "test_acc": 0.5}  # the final row of a 2-epoch run
    _metrics(path, [one, two, finished])  # whose saved model was damaged: made again
    assert run_dir._trim_metrics(path, 2) == [one, two]  # rn07: no final row kept
    assert _rows(path) == [one, two]
    _metrics(path, [one])  # killed between the checkpoint of epoch 2 and the append
    assert run_dir._trim_metrics(path, 2, two) == [one, two]  # rn08
    assert _rows(path) == [one, two]
    path.unlink()  # the file is gone: the checkpoint's row starts it again
    assert run_dir._trim_metrics(path, 1, one) == [one]  # rn09
    assert _rows(path) == [one]


# ------------------------------------------------------------------ the saved model
@guard(
    "writing `model.fsp` at the end of a run fails (`save_sparse` raises a `ValueError`)",
    "the model is saved as a sealed `model.pt` instead, with a warning; it reads back intact",
)
@needs_safetensors
def test_a_failed_export_still_saves_the_model_sealed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """rn10, rn11: ``_save_model`` falls back to a plain ``model.pt`` when ``save_sparse``
    fails ("a missing optional dependency at the end of a long run must not lose the
    model"), and ``model.pt`` carries the seal ``_load_saved_model`` verifies."""

    def failing(*args: Any, **kwargs: Any) -> None:
        raise ValueError("cannot encode this tensor")

    monkeypatch.setattr(run_dir, "save_sparse", failing)
    model = small_model()
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        path = run_dir._save_model(model, SPEC, tmp_path, {})
    assert path == tmp_path / "model.pt"
    assert "save_sparse failed (cannot encode this tensor)" in caplog.text
    assert check_zip_seal(path.read_bytes(), path) is True  # sealed, not a legacy archive
    assert same_weights(run_dir._load_saved_model(path), model)


def _sealed_model_pt(path: Path, model: torch.nn.Module, state: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save({"format": "feather-sparse-model", "model": SPEC, "state_dict": state}, buffer)
    path.write_bytes(seal_zip(buffer.getvalue()))


@guard(
    "a saved `model.pt` with a changed byte in a tensor (the archive still loads)",
    "`IntegrityError` on reading it back; a resume of the run makes it again from the checkpoint",
)
def test_a_changed_byte_of_a_saved_model_pt_is_detected(tmp_path: Path) -> None:
    """rn12: ``_load_saved_model`` checks the seal of ``model.pt`` before loading it."""
    model = small_model()
    path = tmp_path / "model.pt"
    _sealed_model_pt(path, model, model.state_dict())
    data = bytearray(path.read_bytes())
    weight = next(v for v in model.state_dict().values() if v.numel() >= 64)
    where = bytes(data).index(weight.numpy().tobytes()) + 4 * (weight.numel() // 2)
    data[where] ^= 0x40  # one bit of one float: torch.load alone would not notice
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model\.pt: its SHA-256 does not match"):
        run_dir._load_saved_model(path)


@needs_safetensors
def test_only_a_run_with_its_final_row_and_an_intact_model_is_finished(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """rn13, rn14: ``_finished_run`` is None unless ``metrics.jsonl`` holds the final row
    *and* the saved model reads back; any failure to read it back (here a
    ``RuntimeError`` of ``load_state_dict``) means: not intact, made again."""
    model = small_model()
    run = tmp_path / "run"
    run.mkdir()
    one = {"epoch": 1, "loss": 1.0}
    final = {"final": True, "epoch": 1, "test_acc": 0.5}
    save_sparse(model, run / "model.fsp")
    _metrics(run / "metrics.jsonl", [one])  # killed after the model, before the final row
    assert run_dir._finished_run(run) is None
    _metrics(run / "metrics.jsonl", [one, final])
    finished = run_dir._finished_run(run)
    assert finished is not None and finished[1:] == (run / "model.fsp", final, [one])
    other = tmp_path / "other"
    other.mkdir()
    _metrics(other / "metrics.jsonl", [one, final])
    _sealed_model_pt(other / "model.pt", model, {"not.a.weight": torch.zeros(3)})
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        assert run_dir._finished_run(other) is None
    assert f"{other / 'model.pt'} is damaged" in caplog.text


# ------------------------------------------------------------------ the folder itself
@guard(
    "`--run-dir` on a read-only file system (`EROFS`)",
    "`NotWritableError` naming the folder and saying to choose another `--run-dir`",
)
def test_a_run_folder_on_a_read_only_file_system_is_not_writable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rn15: ``_prepare`` reports EACCES, EPERM and EROFS alike as ``NotWritableError``."""
    for code in (errno.EROFS, errno.EACCES, errno.EPERM):

        def refused(*args: Any, code: int = code, **kwargs: Any) -> None:
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(run_dir.tempfile, "mkstemp", refused)
        with pytest.raises(NotWritableError, match="choose another --run-dir") as err:
            run_dir._prepare(tmp_path / "run")
        assert f"run folder {tmp_path / 'run'} is not writable" in str(err.value)


def test_the_run_log_is_detached_and_the_log_level_given_back(tmp_path: Path) -> None:
    """rn16, rn17: ``_run_logging`` sends the package's records to ``train.log`` for the run
    only: afterwards the package logger has its handlers and its level as before, and a
    later record does not reach the run's log."""
    pkg = logging.getLogger("feather_sparse")
    level, handlers = pkg.level, list(pkg.handlers)
    pkg.setLevel(logging.WARNING)
    try:
        with run_dir._run_logging(tmp_path):
            logging.getLogger("feather_sparse.test").info("during the run")
        assert pkg.level == logging.WARNING
        assert pkg.handlers == handlers
        logging.getLogger("feather_sparse.test").warning("after the run")
    finally:
        pkg.setLevel(level)
    log = (tmp_path / "train.log").read_text()
    assert "during the run" in log and "after the run" not in log


# ------------------------------------------------------------------ the lock
needs_flock = pytest.mark.skipif(run_lock.fcntl is None, reason="no flock on this platform")


@needs_flock
def test_a_shorter_record_replaces_a_longer_one_whole(tmp_path: Path) -> None:
    """rn20: the holder's record (pid, host, start, command) is the whole lock file, also
    when the previous holder's record was longer: the refused process can name it."""
    lock = tmp_path / ".lock"
    lock.write_text(json.dumps({"pid": 1, "host": "h", "started": 0, "command": "x" * 500}))
    with run_lock.hold(lock, what="run folder r"):
        record = json.loads(lock.read_text())
        assert record["pid"] == os.getpid() and record["command"] != "x" * 500
        with (
            pytest.raises(run_lock.RunInUseError, match=f"by process {os.getpid()} on "),
            run_lock.hold(lock, what="run folder r"),
        ):
            pass


@needs_flock
def test_the_holder_is_named_with_the_host_its_record_gives(tmp_path: Path) -> None:
    """rn21: a run folder on a shared file system, held by a process of another host: the
    message names that host (and its pid), as the lock file records them."""
    lock = tmp_path / ".lock"
    with run_lock.hold(lock, what="run folder r"):
        record = {"pid": 4242, "host": "node-7", "started": 0.0, "command": "train"}
        lock.write_text(json.dumps(record))  # what the holder on node-7 wrote
        with (
            pytest.raises(run_lock.RunInUseError) as err,
            run_lock.hold(lock, what="run folder r"),
        ):
            pass
    assert "run folder r is in use by process 4242 on node-7, since " in str(err.value)
    assert ": train; wait for it to finish" in str(err.value)


@guard(
    "a run folder on a file system without file locks (`flock` fails with `ENOLCK`, "
    "`EOPNOTSUPP`, `ENOSYS` or `EINVAL`)",
    "the work goes ahead unlocked, with a warning that a second process is not detected",
)
@pytest.mark.parametrize(
    "code",
    [errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL],
    ids=["ENOLCK", "EOPNOTSUPP", "ENOSYS", "EINVAL"],
)
def test_a_file_system_without_locks_runs_unlocked_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    """rn23: ``flock`` failing with an errno of "no locks here" is a warning, not an error."""

    def flock(fd: int, op: int) -> None:
        raise OSError(code, os.strerror(code))

    fake = types.SimpleNamespace(LOCK_EX=2, LOCK_NB=4, LOCK_SH=1, flock=flock)
    monkeypatch.setattr(run_lock, "fcntl", fake)
    ran = False
    with (
        caplog.at_level(logging.WARNING, logger="feather_sparse"),
        run_lock.hold(tmp_path / ".lock", what="run folder r"),
    ):
        ran = True
    assert ran
    assert "the file system of run folder r cannot lock files" in caplog.text


@needs_flock
def test_a_lock_file_that_cannot_be_created_leaves_the_folder_unlocked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rn24: "A folder where the lock file cannot be written is not locked" (EACCES, EPERM,
    EROFS); any other error of opening it is raised."""
    real_open = os.open
    target = tmp_path / "ro" / ".lock"

    def refusing_open(path: Any, *args: Any, **kwargs: Any) -> int:
        if Path(path) == target:
            raise OSError(refusing_open.code, os.strerror(refusing_open.code))  # type: ignore[attr-defined]
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(run_lock.os, "open", refusing_open)
    for code in (errno.EACCES, errno.EPERM, errno.EROFS):
        refusing_open.code = code  # type: ignore[attr-defined]
        with run_lock.hold(target, what="run folder ro"):
            pass
    refusing_open.code = errno.EIO  # type: ignore[attr-defined]
    with (
        pytest.raises(OSError, match=os.strerror(errno.EIO)),
        run_lock.hold(target, what="run folder ro"),
    ):
        pass


# ------------------------------------------------------------------ the numerics line
def test_numerics_names_the_torch_build_the_processor_and_its_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """rn25, rn26, rn27, rn28: ``torch <version>, CPU <model name>, <capability> kernels``
    on CPU (the processor as ``/proc/cpuinfo``'s "model name" says), ``torch <version>,
    CUDA <GPU name>`` on CUDA."""
    try:
        names = [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.split(":")[0].strip() == "model name"
        ]
    except OSError:
        names = []
    if names:
        assert provenance.cpu_model() == names[0]
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100")
    version = torch.__version__
    cpu = provenance.cpu_model()
    assert provenance.numerics("cpu") == f"torch {version}, CPU {cpu}, AVX2 kernels"
    assert provenance.numerics(torch.device("cuda", 0)) == f"torch {version}, CUDA NVIDIA H100"


# ------------------------------------------------------------------ init_from
@needs_safetensors
def test_init_from_expands_the_home_folder_and_records_an_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rn29, rn31: ``~`` is the user's home folder; ``config.json`` records the file's
    resolved path, so that it still names the file when read from elsewhere."""
    model = small_model()
    save_sparse(model, tmp_path / "start.fsp")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_init("~/start.fsp") == tmp_path / "start.fsp"
    monkeypatch.chdir(tmp_path)
    record = load_init(small_model(seed=1), Path("start.fsp"))
    assert record["path"] == str((tmp_path / "start.fsp").resolve())
    assert Path(record["path"]).is_absolute()


@pytest.mark.parametrize("kind", ["missing", "text"])
@needs_safetensors
def test_resolve_init_checks_the_file_itself(tmp_path: Path, kind: str) -> None:
    """rn30: ``resolve_init`` finds a missing file or one of another kind itself (before
    any data is loaded), with ``init_from:`` first."""
    source = tmp_path / "start.fsp"
    if kind == "text":
        source.write_text("hello")
    error = FileNotFoundError if kind == "missing" else ValueError
    with pytest.raises(error, match=r"^init_from: "):
        resolve_init(str(source))


# ------------------------------------------------------------------ result.py
def test_an_interrupt_after_the_last_epoch_says_it_was_finishing() -> None:
    """rn35: Ctrl-C after the last epoch (while finishing: finalizing, exporting) names
    that, not an epoch past the run's end."""
    err = TrainingInterrupted(Path("runs/r"), 3, 24, 3, 3)
    assert str(err).startswith("interrupted while finishing, after epoch 3/3; ")
    assert str(err).endswith("continue with: feather-sparse train --resume runs/r")
    assert str(TrainingInterrupted(Path("runs/r"), 2, 17, 3, 2)).startswith(
        "interrupted in epoch 3/3 at step 17; "
    )
