"""Paths export writes to and files it reads: a target checked up front, kinds by content.

Used by :mod:`feather_sparse.export.fsp` to check and recognize ``.fsp`` files
and by :mod:`feather_sparse.export.run` to tell a ``.fsp`` from a training
checkpoint. Errors name the path and what to do; unusable paths are
``OSError`` subclasses (``IsADirectoryError``, ``NotADirectoryError``, and
``FileExistsError`` for a file that must not be replaced), a name that says
the other format a ``ValueError``. The write itself is
:func:`feather_sparse.integrity.write_atomic`.

A writer replaces only a file of the kind it writes: a ``.fsp`` a ``.fsp``,
an ONNX model an ONNX model (recognized by its protobuf fields, see
:func:`is_onnx`), and an ONNX model's external weights
(``<model>.onnx.data``) the weights that model names; anything else — a
training checkpoint, another program's safetensors file, a text file, a file
of unknown kind — is refused. An empty file holds nothing and may be replaced.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from feather_sparse.export.header import FORMAT_NAME
from feather_sparse.run_files import CHECKPOINTS_DIR

__all__ = ["ONNX_DATA", "SUFFIXES", "check_writable", "is_onnx", "sniff"]

# What check_writable calls a safetensors file that another program wrote:
# sniff() tells it from a .fsp only by its first bytes, and it must never be
# replaced by one.
_OTHER_SAFETENSORS = "other-safetensors"
# What _existing_kind calls a file it cannot tell (never replaced), and an empty
# file (always replaced: it holds nothing to lose).
_UNKNOWN = "unknown"
_EMPTY = "empty"
# What check_writable writes beside an ONNX model that keeps its weights apart:
# raw tensor bytes, told only by the model that names the file.
ONNX_DATA = "onnx-data"
# The kinds of file export writes or finds in the way, for people: the names
# sniff() gives, "onnx", the weights beside one, other safetensors files and
# files of unknown kind.
_KINDS = {
    "safetensors": "a sparse checkpoint (.fsp)",
    "zip": "a PyTorch checkpoint (a training run's last.pt, or another torch.save file)",
    "onnx": "an ONNX model",
    ONNX_DATA: "the external weights of an ONNX model",
    _OTHER_SAFETENSORS: "a safetensors file that is not a feather-sparse checkpoint "
    "(a Hugging Face model.safetensors, say)",
    _UNKNOWN: "a file of unknown kind",
}
# The suffixes each writer's files conventionally have, and the suffixes that
# name the other format (a slip: ``-o model.onnx`` for ``--onnx model.onnx``).
SUFFIXES = {"safetensors": (".fsp", ".safetensors"), "onnx": (".onnx",)}
_OTHER_FORMAT = {"safetensors": "onnx", "onnx": "safetensors"}
_WRITER = {
    "safetensors": "save_sparse (-o on the command line)",
    "onnx": "export_onnx (--onnx on the command line)",
}


def check_writable(
    target: str | os.PathLike[str],
    example: str = "model.fsp",
    *,
    kind: str = "safetensors",
    reads: Iterable[Path] = (),
) -> None:
    """Raise a clear error if ``target`` cannot, or must not, be a file we write.

    Only an existing file of the kind written is replaced (re-exporting a
    model overwrites the old ``model.fsp``; an ONNX export the old ONNX
    model), and an empty file. Any other file is not: writing a ``.fsp`` over
    a training checkpoint, over a safetensors file another program wrote (a
    Hugging Face ``model.safetensors``) or over an ONNX model, an ONNX model
    over a ``.fsp``, or either over a text file or a file of unknown kind,
    would destroy it without a word. A new file whose name says the other
    format (a ``.fsp`` named ``model.onnx``, an ONNX model named
    ``model.fsp``) is refused too: the name would mislead every later reader.

    Args:
        target: the file to write.
        example: a file name to suggest (when ``target`` is a folder, say).
        kind: what will be written: ``"safetensors"`` (a ``.fsp``), ``"onnx"``,
            or :data:`ONNX_DATA` (the weights beside the ONNX model
            ``target`` less its ``.data`` suffix).
        reads: the files and folders the command reads from (its source, a
            run's ``checkpoints`` folder): ``target`` must not be one of them
            or lie inside one.

    Raises:
        IsADirectoryError: ``target`` is a folder, or a name that ends in a
            path separator (``"out/"``: a folder, existing or not).
        NotADirectoryError: a parent of ``target`` is a file.
        FileExistsError: ``target`` is (or lies in) something in ``reads``, or
            is an existing, non-empty file of another kind than ``kind`` (for a
            ``.fsp``: any safetensors file that is not a feather-sparse
            checkpoint; for ONNX weights: a file the ONNX model beside it does
            not name) or of unknown kind.
        ValueError: ``target``'s suffix names the other format (``.onnx`` for a
            ``.fsp``; ``.fsp`` or ``.safetensors`` for an ONNX model).
    """
    raw = os.fspath(target)
    target = Path(raw)
    if raw.endswith(tuple(sep for sep in (os.sep, os.altsep, "/") if sep)) and raw.strip("/\\"):
        raise IsADirectoryError(
            errno.EISDIR,
            f"{raw} names a folder (it ends in a path separator); give a file name, "
            f"e.g. {target / example}",
        )
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
    if existing == _UNKNOWN and kind == ONNX_DATA and _named_by_onnx_model(target):
        existing = ONNX_DATA
    if existing not in (None, _EMPTY, kind):
        what = _KINDS.get(existing, existing)
        if kind == ONNX_DATA:
            what += f", which {_onnx_model_of(target).name} does not name as its weights"
        raise FileExistsError(
            errno.EEXIST,
            f"{target} already holds {what}; writing {_KINDS.get(kind, kind)} over it would "
            f"destroy it: give another file name{_example(target, example)} (or delete "
            f"{target} first if it is not needed)" + _other_writer(existing, kind),
        )
    _check_name(target, kind, example)


def _other_writer(existing: str, kind: str) -> str:
    """Which writer makes the file in the way, when it is what the other one writes."""
    return (
        f"; {_WRITER[existing]} writes {_KINDS[existing]}"
        if _OTHER_FORMAT.get(kind) == existing
        else ""
    )


def _check_name(target: Path, kind: str, example: str) -> None:
    """Raise a ``ValueError`` if ``target``'s suffix names the other format than ``kind``."""
    other = _OTHER_FORMAT.get(kind)
    if other is None or target.suffix.lower() not in SUFFIXES[other]:
        return
    raise ValueError(
        f"{target} is named as {_KINDS[other]}, but this writes {_KINDS[kind]}: name it "
        f"{target.with_suffix(Path(example).suffix)}; {_WRITER[other]} writes {_KINDS[other]}"
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
    """``", e.g. <suggestion>"``: ``target`` with ``example``'s suffix, else ``<folder>/<example>``;
    nothing when both are ``target`` itself."""
    for suggestion in (target.with_suffix(Path(example).suffix), target.with_name(example)):
        if suggestion != target:
            return f", e.g. {suggestion}"
    return ""


def _existing_kind(target: Path) -> str | None:
    """The kind of the file at ``target``: see :func:`sniff`, ``"onnx"``, or the kinds below.

    None when there is no file (or it cannot be read: the write will say what
    is wrong), :data:`_EMPTY` for an empty file and :data:`_UNKNOWN` for one
    that is none of these. A safetensors file whose header names another
    format than feather-sparse's is :data:`_OTHER_SAFETENSORS`; one whose
    header cannot be read (a damaged ``.fsp``, say) counts as a ``.fsp``,
    which a new export may replace.
    """
    if not target.is_file():
        return None
    try:
        if target.stat().st_size == 0:
            return _EMPTY
        kind = sniff(target)
        if kind == "safetensors":
            name = _safetensors_format(target)
            if name == _NOT_SAFETENSORS:
                kind = None  # a "{" as its ninth byte, by chance
            elif name not in (None, FORMAT_NAME):
                return _OTHER_SAFETENSORS
        if kind is None and is_onnx(target):
            return "onnx"
    except OSError:  # unreadable: the write will say what is wrong
        return None
    return kind or _UNKNOWN


def _onnx_model_of(weights: Path) -> Path:
    """The ONNX model whose external weights ``weights`` would be: its name less ``.data``."""
    return weights.with_name(weights.name.removesuffix(".data"))


def _named_by_onnx_model(weights: Path) -> bool:
    """Whether the ONNX model ``weights`` less its ``.data`` suffix keeps its weights in it.

    Read with the ``onnx`` package (which writing such a pair needs), without
    loading the weights; False when there is no such model or it cannot be read.
    """
    model = _onnx_model_of(weights)
    if model == weights or not model.is_file():
        return False
    try:
        onnx = importlib.import_module("onnx")
        proto = onnx.load(str(model), load_external_data=False)
    except Exception:  # no onnx package, or not a readable model: not its weights
        return False
    return any(
        entry.key == "location" and entry.value == weights.name
        for tensor in proto.graph.initializer  # where torch's exporter puts the weights
        if tensor.data_location == onnx.TensorProto.EXTERNAL
        for entry in tensor.external_data
    )


# A safetensors header longer than this is not read (the format caps it at 100 MB).
_MAX_HEADER_BYTES = 100_000_000


# What _safetensors_format says of a file whose first 8 bytes are no header
# length (text with a "{" as its ninth character, say): not safetensors at all.
_NOT_SAFETENSORS = "\0not safetensors"


def _safetensors_format(path: Path) -> str | None:
    """The ``format`` a safetensors file's ``__metadata__`` names; None if unreadable.

    A file without that entry (what another program wrote) gives ``""``; one
    whose header length is beyond what the format allows, :data:`_NOT_SAFETENSORS`.
    """
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if length > _MAX_HEADER_BYTES:
            return _NOT_SAFETENSORS
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

    Args:
        path: the file.

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


# The top-level fields of an ONNX ModelProto (onnx/onnx.proto) and their
# protobuf wire types (0: varint, 2: length-delimited). A model names its IR
# version (1), its graph (7) and at least one opset (8).
_ONNX_FIELDS = {1: 0, 2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 7: 2, 8: 2, 14: 2, 20: 2, 25: 2, 26: 2}
_ONNX_REQUIRED = frozenset({1, 7, 8})
# A model has a handful of top-level fields (a few dozen with many functions):
# a file with more is not read to its end.
_MAX_ONNX_FIELDS = 10_000


def _varint(f: BinaryIO) -> int | None:
    """The protobuf varint at ``f``'s position (at most 10 bytes); None if cut short or too long."""
    value = 0
    for shift in range(0, 70, 7):
        byte = f.read(1)
        if not byte:
            return None
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
    return None


def is_onnx(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an ONNX model, by its top-level protobuf fields.

    Cheap and without the ``onnx`` package: the fields are walked to the last
    byte of the file (nested messages are skipped, not parsed), each with the
    wire type ONNX gives it, and the IR version, the graph and an opset must
    be among them. A text file, a ``.fsp``, a truncated ONNX file or raw
    weights fail the walk.

    Args:
        path: the file.
    """
    size = os.path.getsize(path)
    seen: set[int] = set()
    with open(path, "rb") as f:
        for _ in range(_MAX_ONNX_FIELDS):
            if f.tell() == size:
                return size > 0 and _ONNX_REQUIRED.issubset(seen)
            tag = _varint(f)
            if tag is None:
                return False
            field, wire = tag >> 3, tag & 7
            if field == 0 or _ONNX_FIELDS.get(field, wire) != wire:
                return False
            if wire == 0:
                value = _varint(f)
                if value is None or (field == 1 and value == 0):
                    return False
            elif wire == 2:
                length = _varint(f)
                if length is None:
                    return False
                f.seek(length, os.SEEK_CUR)
            elif wire in (1, 5):  # fixed 64 / 32 bits (an unknown field)
                f.seek(8 if wire == 1 else 4, os.SEEK_CUR)
            else:  # groups (3, 4) are not in ONNX; 6, 7 are no wire type
                return False
            if f.tell() > size:
                return False
            seen.add(field)
    return False
