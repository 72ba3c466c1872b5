"""What a ``.fsp`` file holds: its per-tensor records and its header.

:class:`TensorRecord` describes how one ``state_dict`` entry is stored,
:class:`SparseFileInfo` the whole file; both are read from the header alone,
without decoding a tensor. Also here: the header's (de)serialization
(JSON, xz-compressed with a CRC-64) and the check that a file is this format
and version, and :func:`format_info`, the table ``feather-sparse inspect``
prints. The layout itself is described in :mod:`feather_sparse.export.fsp`.
"""

from __future__ import annotations

import json
import lzma
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from feather_sparse._version import __version__
from feather_sparse.export.codec import _VALUES_CODEC, NM_CODEC, PATTERN_CODECS, _dtype_from_name
from feather_sparse.models import MODEL_SPEC_ATTR  # re-exported: the attribute create_model sets
from feather_sparse.nm.operator import NMPattern

__all__ = [
    "ALIAS_FORMAT_VERSION",
    "BASE_FORMAT_VERSION",
    "DATA_KEY",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "HEADER_KEY",
    "MODEL_SPEC_ATTR",
    "NM_FORMAT_VERSION",
    "SparseFileInfo",
    "TensorRecord",
    "file_version",
    "format_info",
    "human_bytes",
    "smaller_or_larger",
]

#: Name written into (and required from) every sparse checkpoint.
FORMAT_NAME = "feather-sparse"
#: The newest version of the file layout, which this code writes and reads:
#: 2 adds N:M records (``nm+lzma``), 3 adds alias records (a tensor shared by
#: two ``state_dict`` keys, a tied weight, stored once). A file is written at
#: the lowest version that holds its records (:func:`file_version`), so that
#: older readers read every file that needs nothing newer.
FORMAT_VERSION = 3
#: The version that added N:M records.
NM_FORMAT_VERSION = 2
#: The version that added alias records.
ALIAS_FORMAT_VERSION = 3
#: The version of files that hold no N:M record (the layout before N:M).
BASE_FORMAT_VERSION = 1
#: The safetensors entries of a sparse checkpoint.
HEADER_KEY = "feather.header"
DATA_KEY = "feather.data"


def _binary_entropy(density: float) -> float:
    if density <= 0.0 or density >= 1.0:
        return 0.0
    return -(density * math.log2(density) + (1 - density) * math.log2(1 - density))


@dataclass(frozen=True)
class TensorRecord:
    """How one ``state_dict`` entry is stored in a sparse checkpoint.

    Attributes:
        name: the ``state_dict`` key.
        shape: the tensor's shape.
        dtype: the tensor's dtype name (``"float32"``, ...).
        nnz: entries with a non-zero bit pattern (``-0.0`` counts as non-zero).
        crc32: CRC-32 of the entry's stored bytes.
        pattern_codec: the pattern codec's name; ``None`` for a dense entry.
        pattern_bytes: bytes of the compressed pattern (sparse entries).
        values_dtype: dtype name of the stored non-zero values (sparse entries).
        value_planes: stored bytes of each byte plane of the values (sparse entries).
        nm_pattern: ``"2:4"`` for an N:M record (``pattern_codec`` ``nm+lzma``),
            whose values are ``N`` per group, zeros included where a group has fewer.
        alias_of: for an *alias record* (format version 3), the name of the
            earlier entry this one is the same tensor as (a tied weight:
            ``model.state_dict()`` lists one tensor under two keys). It stores
            no bytes; its shape, dtype, ``nnz`` and ``crc32`` repeat that entry's.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    nnz: int
    crc32: int
    pattern_codec: str | None = None
    pattern_bytes: int = 0
    values_dtype: str | None = None
    value_planes: tuple[int, ...] = ()
    nm_pattern: str | None = None
    alias_of: str | None = None

    @property
    def numel(self) -> int:
        """Number of entries."""
        return math.prod(self.shape)

    @property
    def is_sparse(self) -> bool:
        """Whether the entry is stored as pattern + values."""
        return self.pattern_codec is not None

    @property
    def is_alias(self) -> bool:
        """Whether the entry is the same tensor as an earlier one (stored there)."""
        return self.alias_of is not None

    @property
    def encoding(self) -> str:
        """``"dense"``, a pattern codec's name, ``"nm+lzma 2:4"``, or ``"= <name>"`` (an alias)."""
        if self.alias_of is not None:
            return f"= {self.alias_of}"
        if self.nm_pattern is not None:
            return f"{self.pattern_codec} {self.nm_pattern}"
        return self.pattern_codec or "dense"

    @property
    def value_count(self) -> int:
        """Number of stored values: the non-zeros, or ``N`` per group for an N:M record."""
        if self.nm_pattern is not None:
            nm = NMPattern.parse(self.nm_pattern)
            return self.numel // nm.m * nm.n
        return self.nnz

    @property
    def density(self) -> float:
        """Fraction of non-zero entries (1.0 for an empty tensor)."""
        return self.nnz / self.numel if self.numel else 1.0

    @property
    def dense_bytes(self) -> int:
        """Bytes of the tensor stored densely in its own dtype."""
        return self.numel * _dtype_from_name(self.dtype).itemsize

    @property
    def stored_bytes(self) -> int:
        """Bytes the entry takes in the file's data (0 for an alias)."""
        if self.is_alias:
            return 0
        if not self.is_sparse:
            return self.dense_bytes
        return self.pattern_bytes + sum(self.value_planes)

    @property
    def pattern_entropy_bytes(self) -> float:
        """``H(d)·N`` bits, in bytes: no coder stores an i.i.d. pattern in less.

        For an N:M record, ``log2 C(M, N)`` bits per group (the choices of an
        N:M pattern).
        """
        if self.nm_pattern is not None:
            nm = NMPattern.parse(self.nm_pattern)
            return self.numel // nm.m * math.log2(math.comb(nm.m, nm.n)) / 8
        return _binary_entropy(self.density) * self.numel / 8

    @property
    def raw_value_bytes(self) -> int:
        """Bytes of the non-zero values uncompressed (sparse), or of the tensor (dense)."""
        if not self.is_sparse:
            return self.dense_bytes
        assert self.values_dtype is not None
        return self.value_count * _dtype_from_name(self.values_dtype).itemsize

    @property
    def entropy_bound_bytes(self) -> float:
        """``H(d)·N`` bits plus the raw value bytes (dense entries: their bytes; an alias: 0)."""
        if self.is_alias:
            return 0.0
        if not self.is_sparse:
            return float(self.dense_bytes)
        return self.pattern_entropy_bytes + self.raw_value_bytes

    def to_json(self) -> dict[str, Any]:
        """The record as it is stored in the file's JSON header."""
        out: dict[str, Any] = {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "nnz": self.nnz,
            "crc32": self.crc32,
        }
        if self.alias_of is not None:
            out["alias_of"] = self.alias_of
        if self.is_sparse:
            out["pattern"] = {"codec": self.pattern_codec, "bytes": self.pattern_bytes}
            if self.nm_pattern is not None:
                out["pattern"]["nm"] = self.nm_pattern
            out["values"] = {
                "dtype": self.values_dtype,
                "codec": _VALUES_CODEC,
                "planes": list(self.value_planes),
            }
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorRecord:
        """The record :meth:`to_json` wrote, checked.

        Args:
            data: one tensor's entry of the file's JSON header.

        Raises:
            ValueError: for a missing or malformed field or encoding (a corrupted header).
        """
        name = data.get("name", "?") if isinstance(data, Mapping) else "?"
        try:
            pattern, values = data.get("pattern"), data.get("values")
            record = cls(
                name=str(data["name"]),
                shape=tuple(int(d) for d in data["shape"]),
                dtype=str(data["dtype"]),
                nnz=int(data["nnz"]),
                crc32=int(data["crc32"]),
                pattern_codec=None if pattern is None else str(pattern["codec"]),
                pattern_bytes=0 if pattern is None else int(pattern["bytes"]),
                values_dtype=None if values is None else str(values["dtype"]),
                value_planes=() if values is None else tuple(int(n) for n in values["planes"]),
                nm_pattern=None if pattern is None or "nm" not in pattern else str(pattern["nm"]),
                alias_of=None if "alias_of" not in data else str(data["alias_of"]),
            )
            if values is not None and values["codec"] != _VALUES_CODEC:
                raise ValueError(f"unknown values codec {values['codec']!r}")
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"corrupted header: bad record for tensor {name!r} ({err})") from None
        _dtype_from_name(record.dtype)
        if record.is_alias and (record.is_sparse or values is not None):
            raise ValueError(f"corrupted header: bad alias record for tensor {name!r}")
        if record.is_sparse:
            if record.nm_pattern is not None or record.pattern_codec == NM_CODEC:
                try:
                    nm = NMPattern.parse(record.nm_pattern or "")
                except ValueError:
                    nm = None
                if record.pattern_codec != NM_CODEC or nm is None or record.numel % nm.m:
                    raise ValueError(f"corrupted header: bad N:M encoding for tensor {name!r}")
            elif record.pattern_codec not in PATTERN_CODECS:
                raise ValueError(f"corrupted header: bad encoding for tensor {name!r}")
            if record.values_dtype is None:
                raise ValueError(f"corrupted header: bad encoding for tensor {name!r}")
            _dtype_from_name(record.values_dtype)
        return record


@dataclass(frozen=True)
class SparseFileInfo:
    """What a sparse checkpoint holds, read from its header alone.

    Attributes:
        path: the file.
        file_bytes: size of the file.
        format_version: the file's format version.
        library_version: feather-sparse version that wrote it.
        values: the ``values`` precision it was written with.
        model_spec: ``{"name", "kwargs"}`` for ``create_model``, or ``None``.
        metadata: the user's metadata passed to :func:`save_sparse`.
        tensors: one record per ``state_dict`` entry, in order.
    """

    path: str
    file_bytes: int
    format_version: int
    library_version: str
    values: str
    model_spec: dict[str, Any] | None
    metadata: dict[str, Any]
    tensors: tuple[TensorRecord, ...]

    @property
    def stored(self) -> tuple[TensorRecord, ...]:
        """The records that hold bytes: every distinct tensor once (aliases left out)."""
        return tuple(r for r in self.tensors if not r.is_alias)

    @property
    def dense_bytes(self) -> int:
        """Bytes of all tensors stored densely, a tied one once (as ``torch.save`` stores it)."""
        return sum(r.dense_bytes for r in self.stored)

    @property
    def entropy_bound_bytes(self) -> float:
        """``Σ_l H(d_l)·N_l/8 + raw value bytes`` over sparse tensors, plus the dense bytes."""
        return sum(r.entropy_bound_bytes for r in self.stored)

    @property
    def sparsity(self) -> float:
        """Fraction of zeros over the tensors stored sparse, a tied one once (0.0 if none)."""
        return _sparsity(self.stored)


def _sparsity(records: Sequence[TensorRecord]) -> float:
    """Fraction of zeros over the sparse records among ``records`` (0.0 when there are none)."""
    sparse = [r for r in records if r.is_sparse]
    numel = sum(r.numel for r in sparse)
    return 1.0 - sum(r.nnz for r in sparse) / numel if numel else 0.0


def _header_bytes(
    records: Sequence[TensorRecord],
    values: str,
    model_spec: dict[str, Any] | None,
    metadata: Mapping[str, Any],
) -> bytes:
    header = {
        "format": FORMAT_NAME,
        "format_version": file_version(records),
        "library_version": __version__,
        "values": values,
        "model_spec": model_spec,
        "sparsity": _sparsity(records),
        "metadata": dict(metadata),
        "tensors": [r.to_json() for r in records],
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    return lzma.compress(text, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64)


def file_version(records: Sequence[TensorRecord]) -> int:
    """The lowest format version that holds ``records``.

    3 with an alias record, else 2 with an N:M record, else 1.

    Args:
        records: the records of the file's tensors.
    """
    if any(r.is_alias for r in records):
        return ALIAS_FORMAT_VERSION
    if any(r.nm_pattern is not None for r in records):
        return NM_FORMAT_VERSION
    return BASE_FORMAT_VERSION


def _check_format(path: str, fields: Mapping[str, Any], *, container: bool = True) -> None:
    """Raise a clear error unless ``fields`` name this format and a version it reads.

    ``container``: ``fields`` are the safetensors metadata (else the header inside).
    """
    if fields.get("format") != FORMAT_NAME:
        named = fields.get("format")
        if not container:
            what = f"its header names format {named!r}"
        elif named is None:
            what = "a safetensors file another program wrote, with no format name in its metadata"
        else:
            what = f"a safetensors file of format {named!r}"
        raise ValueError(
            f"{path} is not a feather-sparse checkpoint ({what}); "
            "write it with feather_sparse.save_sparse"
        )
    version = str(fields.get("format_version"))
    readable = [str(v) for v in range(BASE_FORMAT_VERSION, FORMAT_VERSION + 1)]
    if version not in readable:
        raise ValueError(
            f"{path} has format version {version} (written by feather-sparse "
            f"{fields.get('library_version', '?')}); this feather-sparse {__version__} reads "
            f"format versions {BASE_FORMAT_VERSION} to {FORMAT_VERSION}"
        )


def _parse_header(path: str, compressed: bytes, file_bytes: int) -> SparseFileInfo:
    try:
        header = json.loads(lzma.decompress(compressed, format=lzma.FORMAT_XZ))
    except (lzma.LZMAError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: the header is corrupted ({err})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header is corrupted (not an object)")
    _check_format(path, header, container=False)
    tensors = header.get("tensors")
    if not isinstance(tensors, list):
        raise ValueError(f"{path}: the header is corrupted (no tensor table)")
    spec = header.get("model_spec")
    records = tuple(TensorRecord.from_json(rec) for rec in tensors)
    _check_aliases(path, records)
    needed, declared = file_version(records), int(header["format_version"])
    if needed > declared:  # a writer gives every file the version its records need
        raise ValueError(
            f"{path}: the header is corrupted (format version {declared}, but its records "
            f"need version {needed})"
        )
    return SparseFileInfo(
        path=path,
        file_bytes=file_bytes,
        format_version=int(header["format_version"]),
        library_version=str(header.get("library_version", "?")),
        values=str(header.get("values", "fp32")),
        model_spec=spec if isinstance(spec, dict) else None,
        metadata=dict(header.get("metadata") or {}),
        tensors=records,
    )


def _check_aliases(path: str, records: Sequence[TensorRecord]) -> None:
    """Raise a ``ValueError`` unless every alias names an earlier stored record like it."""
    earlier: dict[str, TensorRecord] = {}
    names: set[str] = set()
    for r in records:
        if r.name in names:  # a state_dict has each key once
            raise ValueError(f"{path}: the header is corrupted (tensor {r.name!r} is listed twice)")
        names.add(r.name)
        if r.alias_of is not None:
            target = earlier.get(r.alias_of)
            same = target is not None and (
                target.shape,
                target.dtype,
                target.nnz,
                target.crc32,
            ) == (
                r.shape,
                r.dtype,
                r.nnz,
                r.crc32,
            )
            if not same:
                raise ValueError(
                    f"{path}: the header is corrupted (tensor {r.name!r} is an alias of "
                    f"{r.alias_of!r}, which is not an earlier tensor like it)"
                )
        else:
            earlier.setdefault(r.name, r)


def _describe_spec(spec: Mapping[str, Any] | None) -> str:
    if not spec:
        return "no model spec (load it into your model: fs.load_sparse(path, model))"
    kwargs = ", ".join(f"{k}={v!r}" for k, v in dict(spec.get("kwargs") or {}).items())
    return f"{spec.get('name')}({kwargs})"


def smaller_or_larger(dense_bytes: float, file_bytes: float, digits: int = 2) -> str:
    """``"9.00x smaller"`` than dense, or ``"1.92x larger"`` for a file above its dense bytes.

    A factor that would read ``1.00x`` although the sizes differ (a dense
    model: the header adds a little), or one against nothing (an empty model,
    0 dense bytes), is given as the difference instead: ``"96 B larger"``.

    Args:
        dense_bytes: the tensors' bytes stored densely.
        file_bytes: the file's size.
        digits: decimals of the factor.
    """
    larger = file_bytes > dense_bytes
    big, small = (file_bytes, dense_bytes) if larger else (dense_bytes, file_bytes)
    word = "larger" if larger else "smaller"
    if big == small:
        return f"{1:.{digits}f}x smaller"
    factor = f"{big / small:.{digits}f}" if small > 0 else None
    if factor is None or float(factor) == 1.0:
        return f"{human_bytes(big - small)} {word}"
    return f"{factor}x {word}"


def human_bytes(n: float) -> str:
    """``n`` bytes in B, KiB, MiB or GiB, for people to read.

    Args:
        n: a number of bytes.
    """
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def format_info(info: SparseFileInfo) -> str:
    """The per-tensor table and totals printed by ``feather-sparse inspect``.

    Args:
        info: the file's description (:func:`~feather_sparse.export.fsp.inspect_sparse`).
    """
    rows = [("name", "shape", "dtype", "storage", "density", "bytes")]
    for r in info.tensors:
        rows.append(
            (
                r.name,
                "x".join(str(d) for d in r.shape) or "()",
                r.dtype if not r.is_sparse else f"{r.dtype}/{r.values_dtype}",
                r.encoding,
                f"{r.density:.4f}",
                str(r.stored_bytes),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {4, 5}
    lines = [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    bound = info.entropy_bound_bytes
    tied = len(info.tensors) - len(info.stored)
    lines += [
        "",
        f"file: {info.path}  (format {info.format_version}, written by feather-sparse "
        f"{info.library_version}, values {info.values})",
        f"model: {_describe_spec(info.model_spec)}",
        f"tensors: {len(info.tensors)} ({sum(r.is_sparse for r in info.tensors)} sparse"
        + (f", {tied} tied: stored once" if tied else "")
        + f"), sparsity of the sparse ones {info.sparsity:.4f}",
        f"size: {human_bytes(info.file_bytes)} vs {human_bytes(info.dense_bytes)} dense "
        f"({smaller_or_larger(info.dense_bytes, info.file_bytes)}), "
        f"{info.file_bytes / max(bound, 1.0):.3f}x the bound H(d)*N + raw values",
    ]
    sparse = [r for r in info.stored if r.is_sparse]
    if sparse:
        pattern = sum(r.pattern_bytes for r in sparse)
        entropy = sum(r.pattern_entropy_bytes for r in sparse)
        stored = sum(sum(r.value_planes) for r in sparse)  # N:M: zeros filling a group included
        raw = sum(r.raw_value_bytes for r in sparse)
        lines.append(
            f"sparse tensors: patterns {human_bytes(pattern)} ({pattern / max(entropy, 1.0):.3f}x "
            f"H(d)*N), values {human_bytes(stored)} ({stored / max(raw, 1):.3f}x raw)"
        )
    return "\n".join(lines)
