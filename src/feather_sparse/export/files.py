"""Paths export writes to and files it reads: a target checked up front, kinds by first bytes.

Used by :mod:`feather_sparse.export.fsp` to check and recognize ``.fsp`` files
and by :mod:`feather_sparse.export.run` to tell a ``.fsp`` from a training
checkpoint. Errors name the path and what to do; unusable paths are
``OSError`` subclasses (``IsADirectoryError``, ``NotADirectoryError``, and
``FileExistsError`` for a file that must not be replaced). The write itself
is :func:`feather_sparse.integrity.write_atomic`.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable
from pathlib import Path

from feather_sparse.export.header import FORMAT_NAME
from feather_sparse.run_files import CHECKPOINTS_DIR

__all__ = ["check_writable", "sniff"]

# What check_writable calls a safetensors file that another program wrote:
# sniff() tells it from a .fsp only by its first bytes, and it must never be
# replaced by one.
_OTHER_SAFETENSORS = "other-safetensors"
# The kinds of file export writes or finds in the way, for people: the names
# sniff() gives, "onnx" (written, never sniffed) and other safetensors files.
_KINDS = {
    "safetensors": "a sparse checkpoint (.fsp)",
    "zip": "a PyTorch checkpoint (a training run's last.pt, or another torch.save file)",
    "onnx": "an ONNX model",
    _OTHER_SAFETENSORS: "a safetensors file that is not a feather-sparse checkpoint "
    "(a Hugging Face model.safetensors, say)",
}


def check_writable(
    target: Path,
    example: str = "model.fsp",
    *,
    kind: str = "safetensors",
    reads: Iterable[Path] = (),
) -> None:
    """Raise a clear ``OSError`` if ``target`` cannot, or must not, be a file we write.

    An existing file of the same kind is replaced (re-exporting a model
    overwrites the old ``model.fsp``), and so is a file :func:`sniff` cannot
    tell (an ONNX file, a text file). An existing file of another known kind
    is not: writing a ``.fsp`` over a training checkpoint, over a safetensors
    file another program wrote (a Hugging Face ``model.safetensors``), or an
    ONNX model over a ``.fsp``, would destroy it without a word.

    Args:
        target: the file to write.
        example: a file name to suggest when ``target`` is a folder.
        kind: what will be written: ``"safetensors"`` (a ``.fsp``), ``"zip"`` or
            ``"onnx"``.
        reads: the files and folders the command reads from (its source, a
            run's ``checkpoints`` folder): ``target`` must not be one of them
            or lie inside one.

    Raises:
        IsADirectoryError: ``target`` is a folder.
        NotADirectoryError: a parent of ``target`` is a file.
        FileExistsError: ``target`` is (or lies in) something in ``reads``, or
            is an existing file of another kind than ``kind`` (for a ``.fsp``:
            any safetensors file that is not a feather-sparse checkpoint).
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
    _check_not_read(target, reads, example)
    existing = _existing_kind(target)
    if existing is not None and existing != kind:
        raise FileExistsError(
            errno.EEXIST,
            f"{target} already holds {_KINDS.get(existing, existing)}; writing "
            f"{_KINDS.get(kind, kind)} over it would destroy it: give another file name"
            f"{_example(target, example)} (or delete {target} first if it is not needed)",
        )


def _check_not_read(target: Path, reads: Iterable[Path], example: str) -> None:
    """Raise if ``target`` is one of ``reads`` or lies in a folder of ``reads``."""
    where = target.resolve()
    for path in reads:
        source = path.resolve()
        if source.is_dir():
            if source in where.parents:
                what = (
                    "a training run's checkpoints, which --resume needs"
                    if source.name == CHECKPOINTS_DIR
                    else "a folder this command reads"
                )
                raise FileExistsError(
                    errno.EEXIST,
                    f"cannot write {target}: it is inside {path} ({what}); write it "
                    f"elsewhere, e.g. {path.parent / example}",
                )
        elif where == source or (where.exists() and source.exists() and where.samefile(source)):
            raise FileExistsError(
                errno.EEXIST,
                f"cannot write {target}: it is the file being read (writing over it would lose "
                f"the original); give another file name{_example(target, example)}",
            )


def _example(target: Path, example: str) -> str:
    """``", e.g. <folder>/<example>"``, or nothing when that is ``target`` itself."""
    suggestion = target.with_name(example)
    return "" if suggestion == target else f", e.g. {suggestion}"


def _existing_kind(target: Path) -> str | None:
    """The kind of the file at ``target`` (see :func:`sniff`); None if none or unknown.

    A safetensors file whose header names another format than feather-sparse's
    is :data:`_OTHER_SAFETENSORS`; one whose header cannot be read (a damaged
    ``.fsp``, say) counts as a ``.fsp``, which a new export may replace.
    """
    if not target.is_file():
        return None
    try:
        kind = sniff(target)
        if kind == "safetensors" and _safetensors_format(target) not in (None, FORMAT_NAME):
            return _OTHER_SAFETENSORS
    except OSError:  # unreadable: the write will say what is wrong
        return None
    return kind


# A safetensors header longer than this is not read (the format caps it at 100 MB).
_MAX_HEADER_BYTES = 100_000_000


def _safetensors_format(path: Path) -> str | None:
    """The ``format`` a safetensors file's ``__metadata__`` names; None if unreadable.

    A file without that entry (what another program wrote) gives ``""``.
    """
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if length > _MAX_HEADER_BYTES:
            return None
        text = f.read(length)
    if len(text) != length:
        return None
    try:
        header = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(header, dict):
        return None
    metadata = header.get("__metadata__")
    name = metadata.get("format") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else ""


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
