"""Start a run from saved weights (``init_from``): prune a dense run, say.

A run begins from the model's random initialisation unless its config names
weights to start from: a ``.fsp`` file, or a finished run folder (whose
``model.fsp`` is used), of the same architecture. :func:`resolve_init`
finds the file before any data is loaded, so a wrong path fails at once;
:func:`load_init` copies its tensors into the freshly built model before the
Pruner is attached, checking the architecture first (every differing tensor
is named). A resumed run takes its weights from its checkpoint and reads
``init_from`` no more; ``config.json`` keeps the file's path and SHA-256.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from torch import nn

from feather_sparse.export.fsp import _load_sparse, inspect_sparse
from feather_sparse.run_files import MODEL_NAME, PLAIN_MODEL_NAME

__all__ = ["load_init", "resolve_init"]


def resolve_init(source: str) -> Path:
    """The ``.fsp`` file ``init_from`` names: the file itself, or a run folder's ``model.fsp``.

    Args:
        source: the config's ``init_from``.

    Raises:
        FileNotFoundError: if nothing is there, or a folder has no ``model.fsp``
            (a run that did not finish: the message gives the export command).
        ValueError: for a training checkpoint (the message gives the export
            command), a file of another kind, or a damaged ``.fsp`` header.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        model = path / MODEL_NAME
        if not model.is_file() and (path / PLAIN_MODEL_NAME).is_file():
            raise FileNotFoundError(
                f"init_from: {path} holds a {PLAIN_MODEL_NAME}, not a {MODEL_NAME} (its run "
                f"finished where the safetensors package was not installed); install it "
                f"(pip install 'feather-sparse[export]'), export the run (feather-sparse "
                f"export {path} -o {path / 'start.fsp'}) and give that file"
            )
        if not model.is_file():
            raise FileNotFoundError(
                f"init_from: {path} is a folder without a {MODEL_NAME} (a run that has not "
                f"finished, or not a run folder); export the model of its last checkpoint "
                f"first (feather-sparse export {path} -o {path / 'start.fsp'}) and give that file"
            )
        path = model
    try:
        inspect_sparse(path)  # the header alone: the kind of file, its format and version
    except FileNotFoundError as err:
        raise FileNotFoundError(f"init_from: {err}") from None
    except ValueError as err:
        raise ValueError(f"init_from: {err}") from None
    return path


def load_init(model: nn.Module, path: Path) -> dict[str, Any]:
    """Copy the weights of the ``.fsp`` at ``path`` into ``model``; what was loaded.

    The file is read once: the weights are loaded from the very bytes whose
    SHA-256 is recorded (a file replaced meanwhile cannot be recorded with
    another file's hash), without reading it a second time.

    Args:
        model: the freshly built model, before a Pruner is attached.
        path: the file :func:`resolve_init` gave.

    Returns:
        ``{"path", "sha256"}`` of the file, for the run's records.

    Raises:
        ValueError: for a file of another architecture (naming every tensor
            that differs) or a damaged file; the model is then left as built.
    """
    content = path.read_bytes()
    digest = hashlib.sha256(content).hexdigest()
    try:
        _load_sparse(path, model, content)
    except ValueError as err:
        raise ValueError(f"init_from: {err}") from None
    return {"path": str(path.resolve()), "sha256": digest}
