"""Where generated data sets are cached, and cache files written atomically and checked on read."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from feather_sparse.integrity import IntegrityError, check_zip_seal, seal_zip, write_atomic

__all__ = ["CACHE_ENV", "cache_dir", "load_npz_checked", "save_npz_atomic"]

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
    """Write ``arrays`` to ``path`` as ``.npz``, sealed, so that readers never see half a file.

    The archive carries its SHA-256 (:func:`feather_sparse.integrity.seal_zip`;
    ``numpy.load`` still reads it) and is written under a temporary name in the
    same folder, then renamed into place, so two processes that generate the
    same cache at once both leave a whole file.

    Args:
        path: the file to write.
        **arrays: the arrays, by name.
    """
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    write_atomic(path, seal_zip(buffer.getvalue()))


def load_npz_checked(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a cache file written by :func:`save_npz_atomic`, checksum verified.

    A file from before checksums (no seal) is read as it is.

    Args:
        path: the cache file.

    Raises:
        FileNotFoundError: when there is no file.
        IntegrityError: (a ``ValueError``) when the file is damaged or truncated,
            or is not a readable ``.npz``.
    """
    data = path.read_bytes()
    check_zip_seal(data, f"cache {path}")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as f:
            return {key: f[key] for key in f.files}
    except Exception as err:  # zipfile.BadZipFile, a bad CRC, a damaged .npy header, ...
        raise IntegrityError(f"cache {path} is unreadable ({type(err).__name__}: {err})") from err
