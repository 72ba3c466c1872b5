"""Where generated data sets are cached, and writing cache files atomically."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["CACHE_ENV", "cache_dir", "save_npz_atomic"]

CACHE_ENV = "FEATHER_SPARSE_CACHE"


def cache_dir() -> Path:
    """The user's cache folder for feather-sparse (not created here).

    ``$FEATHER_SPARSE_CACHE`` if set, else ``$XDG_CACHE_HOME/feather-sparse``,
    else ``~/.cache/feather-sparse``.
    """
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "feather-sparse"


def save_npz_atomic(path: Path, **arrays: np.ndarray) -> None:
    """Write ``arrays`` to ``path`` as ``.npz`` so that readers never see half a file.

    The file is written under a temporary name in the same folder and renamed
    into place (``os.replace`` is atomic on one file system), so two processes
    that generate the same cache at once both leave a whole file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
