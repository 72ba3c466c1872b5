"""One process at a time per run folder: an advisory lock on a file beside the run.

Two processes training into one run folder (the same command started
twice, a job requeued while the first copy still runs, two sweeps sharing a
runs folder) would interleave their checkpoints, metrics and models, and a
sweep that clears an unfinished run before training it again would delete
the files of a run still being trained. :func:`hold` takes an exclusive
``flock`` on a lock file for as long as the work lasts. The operating
system releases it when the process ends, however it ends, so a killed run
never leaves a stale lock behind. The file records who holds it (pid, host,
start time, command) for the message of the process that finds it taken.

Where the platform or the file system has no ``flock`` (Windows; some
network file systems), the lock is skipped with a warning: nothing else
changes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_NAME", "RunInUseError", "hold"]

logger = logging.getLogger(__name__)

#: The lock file of a training run, inside its folder.
LOCK_NAME = ".lock"

# errno values of a file system that cannot lock: run unlocked, with a warning
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
_NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}


# The lock files this process holds open. A forked child (a DataLoader
# worker) closes its copies at once: an inherited descriptor would keep the
# lock held after this process is killed, for as long as the child lingers.
_HELD: set[int] = set()


def _close_in_child() -> None:
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class RunInUseError(RuntimeError):
    """Another process holds the lock (it is training this run now)."""


def _holder(fd: int) -> str:
    """Who holds the lock, as its file says (best effort: the file may be mid-write)."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode())
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["started"])))
        return f"process {info['pid']} on {info['host']}, since {started}: {info['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def _record(fd: int) -> None:
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.time(),
        "command": " ".join(sys.argv) or "python",
    }
    data = json.dumps(info).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


@contextlib.contextmanager
def hold(lock_file: Path, *, what: str, wait: bool = False) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_file`` (created, with its folder) while the block runs.

    Args:
        lock_file: the lock file.
        what: the thing locked, for the messages (e.g. ``"run folder runs/x"``).
        wait: wait for the holder to finish instead of raising.

    A folder where the lock file cannot be written is not locked: nothing can
    train there either, and reading a finished run back needs no lock (what
    would write reports the folder itself).

    Raises:
        RunInUseError: when another process holds the lock and ``wait`` is False.
    """
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        if err.errno not in _NOT_WRITABLE:
            raise
        logger.debug("%s: no lock (%s)", what, err.strerror)
        yield
        return
    _HELD.add(fd)
    try:
        if fcntl is None:
            logger.warning(
                "no file locks on this platform: a second process on %s is not detected", what
            )
        else:
            _lock(fd, what, wait)
        yield
    finally:
        _HELD.discard(fd)
        os.close(fd)  # releases the lock


def _lock(fd: int, what: str, wait: bool) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        if not wait:
            raise RunInUseError(
                f"{what} is in use by {holder}; wait for it to finish, or choose another folder"
            ) from None
        logger.info("%s is in use by %s: waiting for it", what, holder)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as err:
        if err.errno not in _NO_LOCKS:
            raise
        logger.warning(
            "the file system of %s cannot lock files (%s): a second process on it is not detected",
            what,
            err.strerror,
        )
        return
    _record(fd)
