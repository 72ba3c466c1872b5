"""Files on disk, safely: atomic writes, leftovers of killed writers, kinds by first bytes.

Used by :mod:`feather_sparse.export.fsp` to write and recognize ``.fsp`` files
and by :mod:`feather_sparse.export.run` to tell a ``.fsp`` from a training
checkpoint. Errors name the path and what to do; unusable paths are
``OSError`` subclasses (``IsADirectoryError``, ``NotADirectoryError``, and
``errno.ENOSPC`` for a full disk).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import logging
import os
import secrets
from pathlib import Path

__all__ = ["check_writable", "sniff", "write_atomically"]

logger = logging.getLogger(__name__)


# Temporary files are named ".<target>.<pid>.<random>.tmp" beside the target, so
# that the rename is atomic and a later write can tell the leftovers of a
# killed writer (its pid is gone) from a concurrent writer's file.
_TMP_SUFFIX = ".tmp"


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _remove_stale_temporaries(target: Path) -> None:
    """Delete the temporary files of writers to ``target`` that were killed."""
    if os.name != "posix":  # os.kill(pid, 0) would terminate the process on Windows
        return
    prefix = f".{target.name}."
    for leftover in target.parent.glob(f"{glob.escape(prefix)}*{_TMP_SUFFIX}"):
        pid = leftover.name[len(prefix) :].split(".")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            with contextlib.suppress(OSError):
                leftover.unlink()
                logger.info("removed %s, left by a writer that was killed", leftover)


def write_atomically(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` so that readers see the old file or the new one.

    The bytes go to a temporary file in the same folder, are flushed to disk,
    and replace ``target`` in one rename. If the writer dies, ``target`` is
    untouched; the next write removes the temporary file it left.
    """
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise type(err)(
            err.errno, f"cannot create the folder for {target}: {err.strerror}"
        ) from None
    _remove_stale_temporaries(target)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}{_TMP_SUFFIX}")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise OSError(
                errno.ENOSPC,
                f"the disk is full: could not write {target} "
                f"({len(data)} bytes); the existing file, if any, is unchanged",
            ) from None
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    if os.name == "posix":  # make the rename itself durable
        fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
