"""Paths export writes to and files it reads: a target checked up front, kinds by first bytes.

Used by :mod:`feather_sparse.export.fsp` to check and recognize ``.fsp`` files
and by :mod:`feather_sparse.export.run` to tell a ``.fsp`` from a training
checkpoint. Errors name the path and what to do; unusable paths are
``OSError`` subclasses (``IsADirectoryError``, ``NotADirectoryError``). The
write itself is :func:`feather_sparse.integrity.write_atomic`.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

__all__ = ["check_writable", "sniff"]


def check_writable(target: Path, example: str = "model.fsp") -> None:
    """Raise a clear ``OSError`` if ``target`` cannot be a file we write.

    Args:
        target: the file to write.
        example: a file name to suggest when ``target`` is a folder.
    """
    if target.is_dir():
        raise IsADirectoryError(
            errno.EISDIR,
            f"{target} is a directory; give a file name, e.g. {target / example}",
        )
    for parent in (target.parent, *target.parent.parents):
        if parent.exists():
            if not parent.is_dir():
                raise NotADirectoryError(
                    errno.ENOTDIR, f"cannot write {target}: {parent} is a file, not a folder"
                )
            break


# The first bytes of the files feather-sparse reads: a safetensors file starts
# with its header's length (8 bytes, little-endian) and then the JSON "{"; a
# torch.save checkpoint is a zip archive.
_ZIP_MAGIC = b"PK\x03\x04"


def sniff(path: str | os.PathLike[str]) -> str | None:
    """What kind of file ``path`` is, by its first bytes.

    Returns:
        ``"safetensors"`` (a ``.fsp``), ``"zip"`` (a ``torch.save`` file) or ``None``.
    """
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) == 9 and head[8:9] == b"{":
        return "safetensors"
    if head.startswith(_ZIP_MAGIC):
        return "zip"
    return None
