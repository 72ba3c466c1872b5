"""The run folder: its name, the JSON files in it, the run log and the saved model.

The run folder::

    RUN_DIR/config.json          resolved config, model spec {"name", "kwargs"}, data facts
    RUN_DIR/train.log            the log of every (resumed) session
    RUN_DIR/metrics.jsonl        one JSON object per epoch (with test metrics if tested), then final
    RUN_DIR/checkpoints/last.pt  written atomically every epoch
    RUN_DIR/report.md            the final per-layer table
    RUN_DIR/model.fsp            the compressed model (``model.pt`` when export is missing)
    RUN_DIR/tensorboard/         when tensorboard is installed
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn

from feather_sparse.recipes import TrainConfig

logger = logging.getLogger(__name__)

RUN_FORMAT = "feather-sparse-run"

#: Where runs go when no run folder is given: ``runs/<recipe>-<method>-s<S>-<time>``.
DEFAULT_RUNS_ROOT = Path("runs")


def default_run_dir(config: TrainConfig, root: str | os.PathLike[str] = DEFAULT_RUNS_ROOT) -> Path:
    """``root/<recipe>-<method>-s<sparsity>-<YYYYmmdd-HHMMSS>`` (method ``dense`` when dense)."""
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


def _write_json(path: Path, payload: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    os.replace(tmp, path)


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
                    logger.name, logging.ERROR, __file__, 0, "run failed: %r", (err,), None
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


def _trim_metrics(path: Path, epochs_done: int) -> list[dict[str, Any]]:
    """Keep the per-epoch lines up to the checkpoint (a crash may have left later ones)."""
    if not path.is_file():
        return []
    kept = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if not row.get("final") and int(row.get("epoch", 0)) <= epochs_done:
            kept.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return kept


def _export_unavailable() -> str | None:
    """Why the compressed ``model.fsp`` cannot be written here, or None if it can."""
    try:
        import feather_sparse.export  # noqa: F401
    except ImportError as err:
        return f"feather_sparse.export does not import ({err})"
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
        from feather_sparse.export import save_sparse

        path = run_dir / "model.fsp"
        try:
            save_sparse(model, path, metadata=metadata)
            return path
        except (ImportError, ValueError, RuntimeError) as err:
            reason = f"save_sparse failed ({err})"
    logger.warning("%s: saving the plain state_dict as model.pt instead of model.fsp", reason)
    path = run_dir / "model.pt"
    torch.save(
        {"format": "feather-sparse-model", "model": spec, "state_dict": model.state_dict()}, path
    )
    return path
