"""The run folder: its name, the JSON files in it, the run log and the saved model.

The run folder::

    RUN_DIR/config.json          resolved config, model spec {"name", "kwargs"}, data facts
                                 (sealed with its SHA-256; :func:`read_run_info` checks it)
    RUN_DIR/train.log            the log of every (resumed) session
    RUN_DIR/metrics.jsonl        one JSON object per epoch (with test metrics if tested), then final
    RUN_DIR/checkpoints/last.pt  written atomically every epoch
    RUN_DIR/report.md            the final per-layer table
    RUN_DIR/model.fsp            the compressed model (``model.pt`` when export is missing)
    RUN_DIR/tensorboard/         when tensorboard is installed
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import io
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn

from feather_sparse import models
from feather_sparse.export import load_sparse, save_sparse
from feather_sparse.integrity import (
    NotWritableError,
    check_zip_seal,
    read_sealed_json,
    remove_stale_temps_in,
    seal_zip,
    write_atomic,
    write_sealed_json,
)
from feather_sparse.recipes import TrainConfig
from feather_sparse.run_files import CHECKPOINTS_DIR, MODEL_NAME, PLAIN_MODEL_NAME

logger = logging.getLogger(__name__)

RUN_FORMAT = "feather-sparse-run"

#: Where runs go when no run folder is given: ``runs/<recipe>-<method>-s<S>-<time>``.
DEFAULT_RUNS_ROOT = Path("runs")


def default_run_dir(config: TrainConfig, root: str | os.PathLike[str] = DEFAULT_RUNS_ROOT) -> Path:
    """``root/<recipe>-<method>-s<sparsity>-<YYYYmmdd-HHMMSS>`` (method ``dense`` when dense).

    A folder of that name that exists already gets a ``-2``, ``-3``, ...
    suffix; nothing is created.

    Args:
        config: the run's config (``recipe``, ``method``, ``sparsity``, ``dense``).
        root: the folder the run folders go in.
    """
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    sparsity = "0" if config.dense else f"{config.sparsity:g}"
    base = Path(root) / f"{config.recipe}-{config.run_method}-s{sparsity}-{stamp}"
    candidate, n = base, 1
    while candidate.exists():  # two runs started in the same second
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def _jsonable(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` through a JSON round trip (odd values become strings)."""
    out: dict[str, Any] = json.loads(json.dumps(payload, default=str))
    return out


def _write_text(path: Path, text: str) -> None:
    """``path`` replaced atomically by ``text`` (a kill leaves the old file or the new)."""
    write_atomic(path, text.encode("utf-8"))


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    """``path`` replaced atomically by ``payload`` as JSON, sealed with its SHA-256."""
    write_sealed_json(path, payload, indent=2)


def read_run_info(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """A run folder's ``config.json``, its checksum verified.

    Args:
        run_dir: the run folder.

    Raises:
        IntegrityError: the file was changed or damaged since the run wrote it.
        OSError: it cannot be read (missing, say).
    """
    return read_sealed_json(
        Path(run_dir) / "config.json",
        remedy="it is not what the run wrote; restore it from a copy, or train the run again",
    )


@contextlib.contextmanager
def _run_logging(run_dir: Path | None) -> Iterator[None]:
    """Send the package's log records (INFO and up) to ``RUN_DIR/train.log`` for the run."""
    pkg = logging.getLogger("feather_sparse")
    old_level = pkg.level
    if pkg.getEffectiveLevel() > logging.INFO:
        pkg.setLevel(logging.INFO)
    handler: logging.Handler | None = None
    if run_dir is not None:
        handler = logging.FileHandler(run_dir / "train.log", encoding="utf-8")
        handler.setLevel(logging.INFO)
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        )
        pkg.addHandler(handler)
    try:
        yield
    except BaseException as err:
        if handler is not None:  # the console shows the error; the file keeps it too
            handler.handle(
                logger.makeRecord(
                    logger.name, logging.ERROR, __file__, 0, "run stopped: %r", (err,), None
                )
            )
        raise
    finally:
        if handler is not None:
            pkg.removeHandler(handler)
            handler.close()
        pkg.setLevel(old_level)


def _tensorboard(run_dir: Path, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.debug("tensorboard is not installed: no TensorBoard logs")
        return None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl``; a line that does not parse is dropped with a warning.

    The file is appended to after each checkpoint, so a kill mid-append leaves
    a torn last line; the checkpoint, not this file, is the run's record.
    """
    if not path.is_file():
        return []
    rows = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            logger.warning("%s: line %d is damaged and is dropped", path, number)
            continue
        rows.append(row)
    return rows


def _trim_metrics(
    path: Path, epochs_done: int, last_row: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Keep the per-epoch lines up to the checkpoint (a crash may have left later ones).

    ``last_row``, the checkpoint's own row of epoch ``epochs_done``, is put
    back when a kill between the checkpoint and the append lost it.
    """
    if not path.is_file() and last_row is None:
        return []
    kept = [
        row
        for row in _read_metrics(path)
        if not row.get("final") and int(row.get("epoch", 0)) <= epochs_done
    ]
    lost = not kept or int(kept[-1].get("epoch", 0)) < epochs_done
    if last_row is not None and int(last_row.get("epoch", -1)) == epochs_done and lost:
        kept.append(last_row)
    _write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
    return kept


def _report_table(run_dir: Path) -> str:
    """The per-layer table of ``report.md`` (its Markdown table lines)."""
    path = run_dir / "report.md"
    if not path.is_file():
        return ""
    lines = path.read_text(errors="replace").splitlines()
    return "\n".join(line for line in lines if line.startswith("|"))


def _export_unavailable() -> str | None:
    """Why the compressed ``model.fsp`` cannot be written here, or None if it can."""
    if importlib.util.find_spec("safetensors") is None:
        return "safetensors is not installed (pip install 'feather-sparse[export]')"
    return None


def _save_model(
    model: nn.Module, spec: dict[str, Any], run_dir: Path, metadata: dict[str, Any]
) -> Path:
    """``model.fsp`` (compressed, ``feather_sparse.export``), else a plain ``model.pt``.

    A missing optional dependency at the end of a long run must not lose the
    model: it is saved uncompressed instead, with a warning.
    """
    reason = _export_unavailable()
    if reason is None:
        path = run_dir / MODEL_NAME
        try:
            save_sparse(model, path, metadata=metadata)
            return path
        except (ImportError, ValueError, RuntimeError) as err:
            reason = f"save_sparse failed ({err})"
    logger.warning(
        "%s: saving the plain state_dict as %s instead of %s", reason, PLAIN_MODEL_NAME, MODEL_NAME
    )
    path = run_dir / PLAIN_MODEL_NAME
    buffer = io.BytesIO()
    torch.save(
        {"format": "feather-sparse-model", "model": spec, "state_dict": model.state_dict()}, buffer
    )
    write_atomic(path, seal_zip(buffer.getvalue()))
    return path


def _load_saved_model(path: Path) -> nn.Module:
    """The model :func:`_save_model` wrote, verified (``.fsp`` checksums, or the seal of ``.pt``).

    Raises:
        ValueError: when the file is damaged or not a saved model.
    """
    if path.suffix == ".fsp":
        return load_sparse(path)
    data = path.read_bytes()
    check_zip_seal(data, path)
    saved = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    spec = saved["model"]
    model = models.create_model(str(spec["name"]), **dict(spec.get("kwargs") or {}))
    model.load_state_dict(saved["state_dict"])
    return model


def _finished_run(
    run_dir: Path,
) -> tuple[nn.Module, Path, dict[str, Any], list[dict[str, Any]]] | None:
    """A finished run's saved model, its path, final metrics and history; or ``None``.

    ``None`` unless ``metrics.jsonl`` holds the final row and the saved model
    reads back intact: a run that has both is done, and resuming it must not
    write anything (least of all derive its model again from a checkpoint).
    """
    rows = _read_metrics(run_dir / "metrics.jsonl")
    final = next((row for row in reversed(rows) if row.get("final")), None)
    names = (MODEL_NAME, PLAIN_MODEL_NAME)
    path = next((run_dir / n for n in names if (run_dir / n).is_file()), None)
    if final is None or path is None:
        return None
    try:
        model = _load_saved_model(path)
    except Exception as err:  # any failure to read it back means: not intact
        logger.warning("%s is damaged (%s); it is made again from the checkpoint", path, err)
        return None
    return model, path, final, [row for row in rows if not row.get("final")]


def _prepare(run_dir: Path) -> None:
    """Create the run folder, check that it can be written, remove stale temporary files.

    Raises:
        NotWritableError: when the folder cannot be created or written.
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=run_dir, prefix=".write-check.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise NotWritableError(
            f"run folder {run_dir} is not writable ({err.strerror}); "
            "choose another --run-dir, or make it writable"
        ) from err
    # Temporary files of writers killed mid-write (checkpoint, model, JSON).
    for folder in (run_dir, run_dir / CHECKPOINTS_DIR):
        remove_stale_temps_in(folder)
