"""The model to export, from a run folder, a training checkpoint or a ``.fsp`` file.

What ``feather-sparse export`` reads, without the command line: find the file
in a run folder, tell a ``.fsp`` from a training checkpoint, and rebuild the
model with its pruning baked in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from feather_sparse.export.fsp import inspect_sparse, load_sparse

__all__ = ["load_export_source", "resolve_source"]

#: Format name of the training loop's checkpoints (``RUN_DIR/checkpoints/last.pt``).
_TRAIN_CHECKPOINT_FORMAT = "feather-sparse-checkpoint"


def resolve_source(source: Path) -> Path:
    """The file to export from a run folder or a file path."""
    if source.is_dir():
        for candidate in (source / "checkpoints" / "last.pt", source / "model.fsp"):
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(
            f"{source} is not a training run folder: "
            "neither checkpoints/last.pt nor model.fsp exists"
        )
    if not source.is_file():
        raise FileNotFoundError(f"{source} does not exist")
    return source


def _is_safetensors(path: Path) -> bool:
    with path.open("rb") as f:
        head = f.read(9)
    # 8-byte little-endian header length, then the JSON header.
    return len(head) == 9 and head[8:9] == b"{"


def _model_from_training_checkpoint(path: Path) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the model of a training checkpoint and bake its pruning in."""
    # TODO(merge): use train.checkpoint.load_checkpoint instead of reading the file here.
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(f"{path} is not a readable training checkpoint: {err}") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "config" not in ckpt:
        raise ValueError(f"{path} is not a feather-sparse training checkpoint (no model/config)")
    if ckpt.get("format", _TRAIN_CHECKPOINT_FORMAT) != _TRAIN_CHECKPOINT_FORMAT:
        raise ValueError(
            f"{path} has format {ckpt.get('format')!r}, not {_TRAIN_CHECKPOINT_FORMAT!r}"
        )
    spec = (ckpt["config"] or {}).get("model")
    if not isinstance(spec, dict) or "name" not in spec:
        raise ValueError(f"{path}: its config has no model entry {{'name', 'kwargs'}}")
    from feather_sparse.models import create_model

    model = create_model(str(spec["name"]), **dict(spec.get("kwargs") or {}))
    model.load_state_dict(ckpt["model"], strict=True)
    if ckpt.get("pruner") is not None:
        from feather_sparse.pruner import Pruner

        # The Pruner rebuilt from its saved config and state; finalize()
        # recomputes T at the target sparsity and writes P_T(w) into the weights.
        Pruner.from_state_dict(model, ckpt["pruner"]).finalize()
    metadata = {
        "source": str(path),
        "epoch": ckpt.get("epoch"),
        "step": ckpt.get("step"),
        "config": ckpt["config"],
    }
    try:
        json.dumps(metadata)
    except (TypeError, ValueError):
        metadata["config"] = None
    return model.eval(), metadata


def load_export_source(source: Path) -> tuple[nn.Module, dict[str, Any]]:
    """The model in eval mode and the metadata to store with it, from a file to export.

    Args:
        source: a ``.fsp`` file or a training checkpoint (see :func:`resolve_source`).
    """
    if _is_safetensors(source):
        model = load_sparse(source)
        metadata: dict[str, Any] = dict(inspect_sparse(source).metadata)
    else:
        model, metadata = _model_from_training_checkpoint(source)
    return model.eval(), metadata
