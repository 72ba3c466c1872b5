"""Files the library writes and later reads back: atomic writes and a SHA-256 seal.

**Atomic writes.** :func:`write_atomic` puts the bytes in a temporary file in
the target's folder, flushes them to disk and renames the file over the target
(``os.replace`` is atomic on one file system): a reader sees the old file or
the new one, never half of one, and a crash, a kill or a full disk leaves the
old file untouched; the next write of the same file removes a temporary file
its killed writer left. With ``keep_previous`` the old file is first linked
(or copied) to a second name, so that one damaged file never loses the run.
Every file the library writes goes through it: checkpoints, run metadata, the
data cache and ``.fsp`` files.

**The seal.** Training checkpoints (``torch.save``) and data caches
(``numpy.savez``) are zip archives. A zip archive ends with its
end-of-central-directory record, whose last field is the length of an archive
comment, empty as torch and numpy write them. :func:`seal_zip` puts
``feather-sparse sha256 <64 hex digits>`` into that comment: the SHA-256 of
every byte before the comment-length field. Every zip reader still reads the
file (``torch.load`` and ``numpy.load`` among them), and any change to it fails
:func:`check_zip_seal`: a changed byte before the length field changes the
digest; a change to the length field or the comment, or a truncation, leaves
no well-formed seal at the end. An archive that ends in an empty comment was
written before seals existed: readable, but it cannot be verified.

**JSON files** (a run folder's ``config.json``, a bench run's ``result.json``)
carry their seal as a top-level ``"sha256"`` field: the SHA-256 of the
canonical JSON of the rest (keys sorted, no spaces), so the file stays
readable and any reformatting that keeps the values keeps the seal valid.
:func:`write_sealed_json` writes one, :func:`read_sealed_json` checks it; a
file without the field was written before seals and is read unverified.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import stat
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "JSON_SEAL_KEY",
    "SEAL_PREFIX",
    "DiskFullError",
    "IntegrityError",
    "NotWritableError",
    "check_zip_seal",
    "read_sealed_json",
    "remove_stale_temps",
    "seal_zip",
    "write_atomic",
    "write_sealed_json",
]

#: What a sealed archive's comment starts with; 64 hex digits follow.
SEAL_PREFIX = b"feather-sparse sha256 "
_SEAL_SIZE = len(SEAL_PREFIX) + 64
_EOCD_SIGNATURE = b"PK\x05\x06"  # end-of-central-directory record, 22 bytes + comment
_EOCD_SIZE = 22
#: The top-level field of a sealed JSON file that holds its SHA-256.
JSON_SEAL_KEY = "sha256"
_DISK_FULL = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})
_NOT_WRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})

logger = logging.getLogger(__name__)


class IntegrityError(ValueError):
    """A file failed its integrity check: damaged, truncated or not written by feather-sparse."""


class DiskFullError(OSError):
    """The disk (or quota) filled up during a write; the file written to is unchanged."""


class NotWritableError(OSError):
    """A folder or file cannot be written (permissions, a read-only file system)."""


# ========================================================================= seal
def seal_zip(data: bytes) -> bytes:
    """``data`` (a zip archive without a comment) with its SHA-256 in the archive comment.

    Args:
        data: the bytes of the zip archive.

    Raises:
        ValueError: when ``data`` does not end in an empty-comment zip record.
    """
    if len(data) < _EOCD_SIZE or data[-_EOCD_SIZE:-18] != _EOCD_SIGNATURE or data[-2:] != b"\0\0":
        raise ValueError("seal_zip needs a zip archive that has no comment yet")
    body = data[:-2]  # everything up to the comment-length field
    digest = hashlib.sha256(body).hexdigest().encode("ascii")
    return body + struct.pack("<H", _SEAL_SIZE) + SEAL_PREFIX + digest


def check_zip_seal(data: bytes | memoryview, name: str | os.PathLike[str]) -> bool:
    """Whether ``data`` carries a valid seal (True) or is an unsealed legacy archive (False).

    Args:
        data: the whole file.
        name: the file, for the error message.

    Raises:
        IntegrityError: when the seal is there but does not match (a changed
            byte), or the file ends in neither a seal nor a zip record
            (truncated, damaged, or not a feather-sparse file).
    """
    view = memoryview(data)
    tail = len(view) - _SEAL_SIZE
    if tail >= _EOCD_SIZE and bytes(view[tail : tail + len(SEAL_PREFIX)]) == SEAL_PREFIX:
        record = bytes(view[tail - _EOCD_SIZE : tail])
        if record[:4] != _EOCD_SIGNATURE or record[-2:] != struct.pack("<H", _SEAL_SIZE):
            raise IntegrityError(f"{name}: its checksum record is damaged")
        digest = hashlib.sha256(view[: tail - 2]).hexdigest().encode("ascii")
        if bytes(view[tail + len(SEAL_PREFIX) :]) != digest:
            raise IntegrityError(
                f"{name}: its SHA-256 does not match the one stored in it (the file was changed)"
            )
        return True
    legacy = len(view) >= _EOCD_SIZE and bytes(view[-_EOCD_SIZE:-18]) == _EOCD_SIGNATURE
    if legacy and bytes(view[-2:]) == b"\0\0":
        return False  # written before seals: nothing to verify
    raise IntegrityError(
        f"{name}: it does not end in a checksum (truncated, damaged, or not a feather-sparse file)"
    )


def _json_digest(payload: Mapping[str, Any]) -> str:
    """The SHA-256 of ``payload``'s canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def write_sealed_json(
    path: str | os.PathLike[str], payload: Mapping[str, Any], *, indent: int = 2
) -> None:
    """Write ``payload`` as readable JSON with its SHA-256 in a ``"sha256"`` field, atomically.

    Values JSON cannot hold become strings (``str``), as they read back.

    Args:
        path: the file to write.
        payload: the JSON object to write.
        indent: the JSON indentation.

    Raises:
        ValueError: when ``payload`` already has a ``"sha256"`` field.
        DiskFullError, NotWritableError, OSError: as :func:`write_atomic`.
    """
    if JSON_SEAL_KEY in payload:
        raise ValueError(
            f"write_sealed_json: the payload for {path} already has a {JSON_SEAL_KEY!r} field; "
            "that name is reserved for the checksum, rename the field"
        )
    plain: dict[str, Any] = json.loads(json.dumps(dict(payload), default=str))
    plain[JSON_SEAL_KEY] = _json_digest(plain)
    write_atomic(path, (json.dumps(plain, indent=indent) + "\n").encode("utf-8"))


def read_sealed_json(
    path: str | os.PathLike[str], *, remedy: str = "write it again"
) -> dict[str, Any]:
    """The JSON object in ``path`` without its ``"sha256"`` field, checked against that field.

    A file without the field was written before seals: it is read as it is
    (logged at debug level).

    Args:
        path: the file.
        remedy: what to do about a damaged file, for the error message.

    Raises:
        IntegrityError: the file is not a JSON object, or its SHA-256 does not
            match the one stored in it.
        OSError: the file cannot be read.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise IntegrityError(f"{path}: not valid JSON ({err}); {remedy}") from err
    if not isinstance(data, dict):
        raise IntegrityError(f"{path}: not a JSON object (damaged); {remedy}")
    if JSON_SEAL_KEY not in data:
        logger.debug("%s has no checksum (written before checksums); read unverified", path)
        return data
    stored = data.pop(JSON_SEAL_KEY)
    if stored != _json_digest(data):
        raise IntegrityError(
            f"{path}: its SHA-256 does not match the one stored in it (the file was changed); "
            f"{remedy}"
        )
    return data


# ================================================================ atomic writes
def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def first_line(err: BaseException) -> str:
    """The first line of what ``err`` says (terminal colour codes removed), or its type's
    name when it says nothing: the cause quoted in a one-line error message."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _os_error(err: OSError, path: Path, action: str) -> OSError:
    """``err`` as a one-line error naming the file and the fix (full disk, read-only)."""
    if err.errno in _DISK_FULL:
        out: OSError = DiskFullError(
            f"the disk is full ({err.strerror}) while {action} {path}; "
            f"{path.name} is unchanged; free some space and try again"
        )
    elif err.errno in _NOT_WRITABLE:
        out = NotWritableError(
            f"cannot write in {path.parent} ({err.strerror}); "
            "make the folder writable or choose another one"
        )
    else:
        return err
    out.errno = err.errno  # (no filename: str() stays the one line above)
    return out


# Temporary files are named ".<target>.<pid>-<host>.<random>.tmp" beside the
# target, so that the rename is atomic and a later write can tell the leftovers
# of a killed writer (its pid is gone) from a concurrent writer's file. <host>
# is a tag of the writer's host name: a folder shared between machines (a
# network file system) holds files of writers whose pids mean nothing here,
# and those are never removed from another host. Files named before the tag
# (".<target>.<pid>.<random>.tmp") are taken as this host's.
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
# What follows ".<target>." in such a name: the writer's pid, its host tag (absent in
# files named before the tag), mkstemp's random letters. Nothing else is ever removed.
_TEMP_TAIL = re.compile(r"(\d+)(-[0-9a-f]{8})?\.[a-z0-9_]+\.tmp")
# The empty file a run folder's write check creates and removes at once (train's _prepare).
_PROBE = re.compile(r"\.write-check\.[a-z0-9_]+\.tmp")


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":  # os.kill(pid, 0) would terminate the process on Windows
        return False
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _remove_if_writer_gone(stale: Path, writer: str) -> None:
    """Remove the temporary file ``stale`` unless its writer (``<pid>-<host>`` or a
    bare ``<pid>``) is this process, a live one, or one on another host."""
    pid, _, host = writer.partition("-")
    if host and host != _HOST:  # another machine's writer: its pid means nothing here
        return
    if pid.isdigit() and (int(pid) == os.getpid() or _pid_alive(int(pid))):
        return
    with contextlib.suppress(OSError):
        stale.unlink()
        logger.info("removed %s, left by a writer that was killed", stale)


def remove_stale_temps(path: Path) -> None:
    """Remove the temporary files that writers of ``path`` left when they were killed.

    A temporary file whose writer is still running (another process writing
    the same file) is kept.

    Args:
        path: the file whose writers' temporary files to remove.
    """
    prefix = f".{path.name}."
    for stale in path.parent.glob(f"{glob.escape(prefix)}*.tmp"):
        tail = _TEMP_TAIL.fullmatch(stale.name[len(prefix) :])
        if tail is not None:  # never a file of another name (a user's ".x.draft.tmp")
            _remove_if_writer_gone(stale, tail.group(1) + (tail.group(2) or ""))


def remove_stale_temps_in(folder: Path) -> None:
    """Remove every temporary file in ``folder`` whose writer was killed (see above).

    Only files named as :func:`write_atomic` names its temporary files
    (``.<target>.<pid>-<host>.<random>.tmp``), and a run folder's write check
    (``.write-check.<random>.tmp``), are considered: another ``.*.tmp`` file
    (a user's ``.draft.tmp``) is never removed. The temporary
    files of writers still running (an export writing into a run folder, say)
    are kept.
    """
    for stale in folder.glob(".*.tmp") if folder.is_dir() else ():
        if _PROBE.fullmatch(stale.name):  # a run folder's write check, left by a kill
            _remove_if_writer_gone(stale, "")
            continue
        parts = stale.name.split(".")  # "", <target...>, <pid>-<host>, <random>, "tmp"
        if len(parts) < 5 or not parts[1]:
            continue
        tail = _TEMP_TAIL.fullmatch(".".join(parts[-3:]))
        if tail is not None:
            _remove_if_writer_gone(stale, tail.group(1) + (tail.group(2) or ""))


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # persist the renames themselves (POSIX; best effort)
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _temp_in(folder: Path, name: str) -> tuple[int, str]:
    return tempfile.mkstemp(dir=folder, prefix=f".{name}.{os.getpid()}-{_HOST}.", suffix=".tmp")


def _write_file(fd: int, data: bytes) -> None:
    """Write ``data`` to the open file ``fd``, close it, and make it durable (fsync)."""
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _keep_copy(path: Path, previous: Path) -> None:
    """``previous`` becomes ``path``'s content, atomically (a hard link, else a copy)."""
    fd, tmp = _temp_in(previous.parent, previous.name)
    os.close(fd)
    try:
        os.unlink(tmp)
        try:
            os.link(path, tmp)
        except OSError:  # no hard links on this file system
            shutil.copyfile(path, tmp)
        os.replace(tmp, previous)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mode_for(path: Path) -> int:
    """The permission bits for the new ``path``: the old file's, else ``0666`` less the umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:  # no file there yet
        return 0o666 & ~_umask()


def _named_error(err: OSError, path: Path) -> OSError:
    """:func:`_os_error`, and any other failure as one that names ``path``, not the
    temporary file beside it that the system call was given."""
    out = _os_error(err, path, "writing")
    if out is not err:
        return out
    return type(err)(err.errno, f"cannot write {path}: {err.strerror or first_line(err)}")


def write_atomic(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    keep_previous: str | os.PathLike[str] | None = None,
) -> None:
    """Write ``data`` to ``path`` so that ``path`` is always a whole file, old or new.

    A ``path`` that is a symbolic link is written through: the file it points
    to (followed to the end of a chain) is replaced and the link kept, as
    ``open(path, "wb")`` would. A file written over keeps its permission bits
    (a private ``0600`` model stays private); a new one gets ``0666`` less the
    umask, as ``open`` gives.

    Args:
        path: the file to write; its folder is created.
        data: the bytes.
        keep_previous: if given and ``path`` exists, its current content is
            kept under this name (in the same folder) before ``path`` is
            replaced; both steps are atomic, so at every moment ``path`` is a
            whole file and ``keep_previous`` a whole earlier one.

    Raises:
        DiskFullError: the disk filled up; ``path`` (and ``keep_previous``) are unchanged.
        NotWritableError: the folder cannot be written.
        OSError: any other failure, naming ``path``; ``path`` is unchanged.
    """
    path = Path(path)
    if path.is_symlink():  # write the file it points to, and keep the link
        path = Path(os.path.realpath(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        out = _os_error(err, path, "writing")
        if out is err:
            raise type(err)(
                err.errno, f"cannot create the folder for {path}: {err.strerror}"
            ) from None
        raise out from err
    try:
        fd, tmp_name = _temp_in(path.parent, path.name)
    except OSError as err:
        raise _named_error(err, path) from err
    try:
        _write_file(fd, data)
        os.chmod(tmp_name, _mode_for(path))  # mkstemp makes it private (0600)
        if keep_previous is not None and path.is_file():
            _keep_copy(path, Path(keep_previous))
        os.replace(tmp_name, path)
    except OSError as err:
        Path(tmp_name).unlink(missing_ok=True)
        raise _named_error(err, path) from err
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    remove_stale_temps(path)  # left by a killed writer
    if keep_previous is not None:
        remove_stale_temps(Path(keep_previous))
    _fsync_dir(path.parent)
