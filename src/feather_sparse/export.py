"""Deployment of pruned models: compressed sparse checkpoints, sparse inference, ONNX.

The paper's selling point is "the lightness of the resulting pruned networks"
(Glentis Georgoulakis et al., BMVC 2023, §1). This module makes that lightness
real on disk and at inference time:

* :func:`save_sparse` / :func:`load_sparse` write and read a *sparse
  checkpoint* (``.fsp``): a `safetensors <https://github.com/huggingface/safetensors>`_
  file in which every sparse tensor is stored as a compressed sparsity pattern
  plus its non-zero values, and everything else as is.
* :func:`to_sparse_inference` swaps sufficiently sparse ``nn.Linear`` layers
  (and 1×1 convolutions) for CSR-backed layers (``torch.sparse``, int32
  indices).
* :func:`export_onnx` writes the finalized dense-format model to ONNX and
  :func:`verify_onnx` checks it in ``onnxruntime``.
* ``feather-sparse export`` and ``feather-sparse inspect`` are the command-line
  front ends (:func:`add_cli_arguments`, :func:`run_cli`).

File format (version 1)
-----------------------
A safetensors file (no pickle; a JSON header with offsets) holding two uint8
entries:

* ``feather.header``: the JSON description, xz-compressed (its CRC-64 is
  checked on read): format name and version, library version, model spec, user
  metadata, and one record per ``state_dict`` entry, in order — name, shape,
  dtype, non-zero count, CRC-32 of its bytes, and for sparse entries how the
  pattern and values are coded. The safetensors ``__metadata__`` repeats the
  format name and versions so that a wrong file is named without decoding.
* ``feather.data``: every entry's bytes, one after the other.

Packing everything into two entries keeps the per-tensor overhead at a few
compressed header bytes instead of ~250 bytes of plain JSON per tensor, which
for small models was as large as the weights themselves.

Which tensors are stored sparse: **every floating-point tensor (parameter or
buffer, any shape) that has at least one zero entry and whose sparse encoding
is smaller than its dense bytes**; integer, boolean and complex tensors, and
floating tensors without zeros, are stored as is (raw little-endian bytes).
"Zero" means an all-zero bit pattern, so ``-0.0`` (and NaN) are kept as values
and the round trip is bit-exact.

A sparse tensor is stored as its pattern followed by its values:

* the pattern (positions of the non-zeros in flattened C order) is compressed
  with one of two codecs, whichever is smaller (the record names it):

  - ``gaps+lzma``: the run of zeros before each non-zero, one byte per run
    (a run ``g`` is ``g // 255`` bytes of 255 followed by the byte ``g % 255``),
    compressed with raw LZMA2. Adaptive LZMA turns these bytes into close to
    the entropy of the pattern: within 1.5–3 % of ``H(d)·N`` bits at 90–99 %
    sparsity for i.i.d. patterns of millions of entries, 4–13 % for layers of
    a few thousand (``benchmarks/bench_export_size.py``).
  - ``bitmask+lzma``: the packed bit mask (little bit order) compressed with raw
    LZMA2; smaller at low sparsity.

* the values (``planes+zlib``): the non-zero values' bytes split into byte
  planes (all lowest bytes, then all second bytes, ...), each plane
  zlib-compressed when that makes it smaller. The planes holding sign and
  exponent compress well — the survivors of magnitude pruning span few
  binades — while low mantissa planes are noise and stay raw. Lossless, so the
  file usually lands *below* the bound ``H(d)·N + 32·nnz`` bits that raw fp32
  values would need.

Every entry's bytes carry a CRC-32, checked on load, so a corrupted file raises
an error naming the tensor instead of producing a silently wrong model.

``values`` precision: ``"fp32"`` is lossless — non-zeros keep their tensor's own
dtype (float32 stays float32; float16, bfloat16 and float64 tensors keep
theirs). ``"fp16"`` / ``"bf16"`` store the non-zeros of float32/float64 tensors
in that dtype (halving the value bytes); 16-bit tensors keep their own dtype,
and dense tensors are always stored as is.
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import json
import logging
import lzma
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from feather_sparse._version import __version__
from feather_sparse.registry import Registry

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "PATTERN_CODECS",
    "PatternCodec",
    "SparseFileInfo",
    "SparseLinear",
    "SparsePointwiseConv",
    "TensorRecord",
    "add_cli_arguments",
    "export_onnx",
    "format_info",
    "inspect_sparse",
    "load_sparse",
    "load_sparse_state_dict",
    "run_cli",
    "save_sparse",
    "to_sparse_inference",
    "verify_onnx",
]

logger = logging.getLogger(__name__)

#: Name written into (and required from) every sparse checkpoint.
FORMAT_NAME = "feather-sparse"
#: Version of the file layout this code writes and reads.
FORMAT_VERSION = 1
#: The safetensors entries of a sparse checkpoint.
HEADER_KEY = "feather.header"
DATA_KEY = "feather.data"
#: Name of the attribute ``create_model`` sets on the models it builds.
MODEL_SPEC_ATTR = "feather_model_spec"
#: Format name of the training loop's checkpoints (``RUN_DIR/checkpoints/last.pt``).
_TRAIN_CHECKPOINT_FORMAT = "feather-sparse-checkpoint"

_VALUE_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
# Integer dtypes of the same width, used to read a float's bit pattern.
_BITS_DTYPES: dict[int, torch.dtype] = {
    1: torch.uint8,
    2: torch.int16,
    4: torch.int32,
    8: torch.int64,
}


# ---------------------------------------------------------------------------
# Bytes and dtypes
# ---------------------------------------------------------------------------


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"corrupted header: unknown dtype {name!r}")
    return dtype


def _safetensors(module: str) -> Any:
    """Import (a part of) safetensors, the optional container library."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(
            "sparse checkpoints need the safetensors package: pip install 'feather-sparse[export]'"
        ) from None


def _check_byte_order() -> None:
    if sys.byteorder != "little":  # the raw bytes in the file are little-endian
        raise RuntimeError("feather-sparse checkpoints need a little-endian machine")


def _raw_bytes(t: Tensor) -> bytes:
    """A CPU tensor's bytes in memory order (C-contiguous)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _from_bytes(data: bytes, dtype: torch.dtype, shape: Sequence[int]) -> Tensor:
    if not data:  # torch.frombuffer rejects empty buffers
        return torch.empty(tuple(shape), dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(tuple(shape))


def _bits(t: Tensor) -> Tensor:
    """The tensor's bit pattern as an integer tensor of the same width (flattened)."""
    return t.reshape(-1).view(_BITS_DTYPES[t.element_size()])


# ---------------------------------------------------------------------------
# Sparsity-pattern codecs
# ---------------------------------------------------------------------------

# Raw LZMA2 (no .xz container: every tensor's bytes carry a CRC-32 already) at
# the default preset; PRESET_EXTREME gained < 0.1 % on these data at 2x the
# time. No literal context (lc = lp = pb = 0): run bytes and mask bytes are
# close to i.i.d., and context models only cost adaptation (3-10 % on layers
# of 6k-25k weights). These settings are part of format version 1: raw LZMA2
# decodes only with the filters it was written with.
_LZMA_FILTERS: list[dict[str, int]] = [
    {"id": lzma.FILTER_LZMA2, "preset": 6, "lc": 0, "lp": 0, "pb": 0}
]
# Where each codec can win on i.i.d. patterns (measured: the bit mask is
# smaller above ~15 % density, the run bytes below); both are tried in between.
_GAPS_MAX_DENSITY = 0.25
_BITMASK_MIN_DENSITY = 0.1
_RUN_BYTE = 255


def _lzma_compress(data: bytes) -> bytes:
    return lzma.compress(data, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)


def _lzma_decompress(data: bytes, max_length: int) -> bytes:
    decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    try:
        out = decompressor.decompress(data, max_length=max_length + 1)
    except lzma.LZMAError as err:
        raise ValueError(f"compressed pattern is corrupted ({err})") from None
    if len(out) > max_length or not decompressor.eof or decompressor.unused_data:
        raise ValueError("compressed pattern is corrupted (wrong length)")
    return out


def _encode_bitmask(mask: np.ndarray) -> bytes:
    return _lzma_compress(np.packbits(mask, bitorder="little").tobytes())


def _decode_bitmask(data: bytes, numel: int, nnz: int) -> np.ndarray:
    n_bytes = (numel + 7) // 8
    raw = _lzma_decompress(data, n_bytes)
    if len(raw) != n_bytes:
        raise ValueError("compressed pattern is corrupted (wrong length)")
    bits = np.frombuffer(raw, dtype=np.uint8)
    return np.unpackbits(bits, count=numel, bitorder="little").astype(bool)


def _encode_gaps(mask: np.ndarray) -> bytes:
    positions = np.flatnonzero(mask)
    gaps = np.diff(positions, prepend=-1) - 1  # zeros before each non-zero
    full, rest = np.divmod(gaps, _RUN_BYTE)
    lengths = full + 1
    out = np.full(int(lengths.sum()), _RUN_BYTE, dtype=np.uint8)
    out[np.cumsum(lengths) - 1] = rest  # the terminating byte of each run
    return _lzma_compress(out.tobytes())


def _decode_gaps(data: bytes, numel: int, nnz: int) -> np.ndarray:
    max_bytes = nnz + (numel - nnz) // _RUN_BYTE + 1
    raw = np.frombuffer(_lzma_decompress(data, max_bytes), dtype=np.uint8)
    ends = np.flatnonzero(raw != _RUN_BYTE)
    if len(ends) != nnz or (len(raw) and raw[-1] == _RUN_BYTE):
        raise ValueError("compressed pattern is corrupted (wrong number of non-zeros)")
    # A run's value is the sum of its bytes (255 per continuation byte + the rest).
    totals = np.cumsum(raw, dtype=np.int64)[ends]
    gaps = np.diff(totals, prepend=0)
    positions = np.cumsum(gaps + 1) - 1
    if nnz and positions[-1] >= numel:
        raise ValueError("compressed pattern is corrupted (position out of range)")
    mask = np.zeros(numel, dtype=bool)
    mask[positions] = True
    return mask


@dataclass(frozen=True)
class PatternCodec:
    """A lossless coder for a flattened boolean sparsity pattern.

    Attributes:
        encode: ``mask -> bytes``.
        decode: ``(bytes, numel, nnz) -> mask``; raises ``ValueError`` on corrupt input.
        min_density: the codec is only tried at or above this density ...
        max_density: ... and at or below this one (where it can win; trying
            it elsewhere only costs time).
    """

    encode: Callable[[np.ndarray], bytes]
    decode: Callable[[bytes, int, int], np.ndarray]
    min_density: float = 0.0
    max_density: float = 1.0


#: Pattern codecs by the name written into the file header.
PATTERN_CODECS: Registry[PatternCodec] = Registry("pattern codec")
PATTERN_CODECS.register(
    "bitmask+lzma", PatternCodec(_encode_bitmask, _decode_bitmask, min_density=_BITMASK_MIN_DENSITY)
)
PATTERN_CODECS.register(
    "gaps+lzma", PatternCodec(_encode_gaps, _decode_gaps, max_density=_GAPS_MAX_DENSITY)
)


def _encode_pattern(mask: np.ndarray) -> tuple[str, bytes]:
    """The smallest encoding of ``mask`` among the registered codecs."""
    density = float(mask.mean()) if mask.size else 0.0
    best: tuple[str, bytes] | None = None
    for name in PATTERN_CODECS.names():
        codec: PatternCodec = PATTERN_CODECS.get(name)
        if not codec.min_density <= density <= codec.max_density:
            continue
        data = codec.encode(mask)
        if best is None or len(data) < len(best[1]):
            best = (name, data)
    if best is None:  # no codec claims this density: fall back to the bit mask
        best = ("bitmask+lzma", _encode_bitmask(mask))
    return best


# ---------------------------------------------------------------------------
# Value codec: byte planes + zlib
# ---------------------------------------------------------------------------

_VALUES_CODEC = "planes+zlib"
_ZLIB_LEVEL = 6  # level 9 gained < 1 % on weight planes at 20x the time


def _encode_values(values: Tensor) -> tuple[tuple[int, ...], bytes]:
    """Byte planes of ``values``, each zlib-compressed where smaller.

    Returns:
        The stored length of each plane (a plane is compressed exactly when its
        length is below the number of values) and the concatenated planes.
    """
    n, itemsize = values.numel(), values.element_size()
    planes = values.contiguous().view(torch.uint8).reshape(n, itemsize).t().contiguous()
    lengths: list[int] = []
    chunks: list[bytes] = []
    for plane in planes.numpy():  # (itemsize, n): plane i holds byte i of every value
        raw = plane.tobytes()
        packed = zlib.compress(raw, _ZLIB_LEVEL)
        chunk = packed if len(packed) < len(raw) else raw
        lengths.append(len(chunk))
        chunks.append(chunk)
    return tuple(lengths), b"".join(chunks)


def _decode_values(data: bytes, lengths: Sequence[int], n: int, dtype: torch.dtype) -> Tensor:
    if len(lengths) != dtype.itemsize or sum(lengths) != len(data):
        raise ValueError("stored values do not match their header record")
    planes = np.empty((dtype.itemsize, n), dtype=np.uint8)
    offset = 0
    for i, length in enumerate(lengths):
        chunk = data[offset : offset + length]
        offset += length
        if length != n:  # compressed (only ever stored so when strictly smaller)
            decompressor = zlib.decompressobj()
            try:
                chunk = decompressor.decompress(chunk, n + 1)
            except zlib.error as err:
                raise ValueError(f"stored values are corrupted ({err})") from None
            if len(chunk) != n or not decompressor.eof:
                raise ValueError("stored values are corrupted (wrong length)")
        planes[i] = np.frombuffer(chunk, dtype=np.uint8)
    return _from_bytes(np.ascontiguousarray(planes.T).tobytes(), dtype, (n,))


# ---------------------------------------------------------------------------
# File description (header)
# ---------------------------------------------------------------------------


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

    @property
    def numel(self) -> int:
        """Number of entries."""
        return math.prod(self.shape)

    @property
    def is_sparse(self) -> bool:
        """Whether the entry is stored as pattern + values."""
        return self.pattern_codec is not None

    @property
    def encoding(self) -> str:
        """``"dense"`` or the pattern codec's name."""
        return self.pattern_codec or "dense"

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
        """Bytes the entry takes in the file's data."""
        if not self.is_sparse:
            return self.dense_bytes
        return self.pattern_bytes + sum(self.value_planes)

    @property
    def pattern_entropy_bytes(self) -> float:
        """``H(d)·N`` bits, in bytes: no coder stores an i.i.d. pattern in less."""
        return _binary_entropy(self.density) * self.numel / 8

    @property
    def raw_value_bytes(self) -> int:
        """Bytes of the non-zero values uncompressed (sparse), or of the tensor (dense)."""
        if not self.is_sparse:
            return self.dense_bytes
        assert self.values_dtype is not None
        return self.nnz * _dtype_from_name(self.values_dtype).itemsize

    @property
    def entropy_bound_bytes(self) -> float:
        """``H(d)·N`` bits plus the raw value bytes (dense entries: their bytes)."""
        if not self.is_sparse:
            return float(self.dense_bytes)
        return self.pattern_entropy_bytes + self.raw_value_bytes

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "nnz": self.nnz,
            "crc32": self.crc32,
        }
        if self.is_sparse:
            out["pattern"] = {"codec": self.pattern_codec, "bytes": self.pattern_bytes}
            out["values"] = {
                "dtype": self.values_dtype,
                "codec": _VALUES_CODEC,
                "planes": list(self.value_planes),
            }
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorRecord:
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
            )
            if values is not None and values["codec"] != _VALUES_CODEC:
                raise ValueError(f"unknown values codec {values['codec']!r}")
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"corrupted header: bad record for tensor {name!r} ({err})") from None
        _dtype_from_name(record.dtype)
        if record.is_sparse:
            if record.values_dtype is None or record.pattern_codec not in PATTERN_CODECS:
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
    def dense_bytes(self) -> int:
        """Bytes of all tensors stored densely (a plain state_dict's payload)."""
        return sum(r.dense_bytes for r in self.tensors)

    @property
    def entropy_bound_bytes(self) -> float:
        """``Σ_l H(d_l)·N_l/8 + raw value bytes`` over sparse tensors, plus the dense bytes."""
        return sum(r.entropy_bound_bytes for r in self.tensors)

    @property
    def sparsity(self) -> float:
        """Fraction of zeros over the tensors stored sparse (0.0 when there are none)."""
        numel = sum(r.numel for r in self.tensors if r.is_sparse)
        nnz = sum(r.nnz for r in self.tensors if r.is_sparse)
        return 1.0 - nnz / numel if numel else 0.0


def _header_bytes(
    records: Sequence[TensorRecord],
    values: str,
    model_spec: dict[str, Any] | None,
    metadata: Mapping[str, Any],
) -> bytes:
    sparse = [r for r in records if r.is_sparse]
    numel = sum(r.numel for r in sparse)
    header = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "library_version": __version__,
        "values": values,
        "model_spec": model_spec,
        "sparsity": 1.0 - sum(r.nnz for r in sparse) / numel if numel else 0.0,
        "metadata": dict(metadata),
        "tensors": [r.to_json() for r in records],
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    return lzma.compress(text, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64)


def _check_format(path: str, fields: Mapping[str, Any]) -> None:
    """Raise a clear error unless ``fields`` name this format and version."""
    if fields.get("format") != FORMAT_NAME:
        raise ValueError(
            f"{path} is not a feather-sparse checkpoint (format {fields.get('format')!r}); "
            "write it with feather_sparse.save_sparse"
        )
    version = str(fields.get("format_version"))
    if version != str(FORMAT_VERSION):
        raise ValueError(
            f"{path} has format version {version} (written by feather-sparse "
            f"{fields.get('library_version', '?')}); this feather-sparse {__version__} reads "
            f"format version {FORMAT_VERSION} only"
        )


def _parse_header(path: str, compressed: bytes, file_bytes: int) -> SparseFileInfo:
    try:
        header = json.loads(lzma.decompress(compressed, format=lzma.FORMAT_XZ))
    except (lzma.LZMAError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: the header is corrupted ({err})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header is corrupted (not an object)")
    _check_format(path, header)
    tensors = header.get("tensors")
    if not isinstance(tensors, list):
        raise ValueError(f"{path}: the header is corrupted (no tensor table)")
    spec = header.get("model_spec")
    return SparseFileInfo(
        path=path,
        file_bytes=file_bytes,
        format_version=int(header["format_version"]),
        library_version=str(header.get("library_version", "?")),
        values=str(header.get("values", "fp32")),
        model_spec=spec if isinstance(spec, dict) else None,
        metadata=dict(header.get("metadata") or {}),
        tensors=tuple(TensorRecord.from_json(rec) for rec in tensors),
    )


# ---------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------


def _model_spec(model: nn.Module) -> dict[str, Any] | None:
    spec = getattr(model, MODEL_SPEC_ATTR, None)
    if spec is None:
        return None
    try:
        # Round-trip through JSON so what we return is exactly what loads back.
        out: dict[str, Any] = json.loads(json.dumps(spec))
    except (TypeError, ValueError):
        logger.warning(
            "model spec %r is not JSON-serializable; the file will need a model to load into", spec
        )
        return None
    return out


def _encode_tensor(name: str, tensor: Tensor, values: str) -> tuple[TensorRecord, bytes]:
    """The record and the stored bytes of one state_dict tensor."""
    t = tensor.detach().cpu().contiguous()
    raw = _raw_bytes(t)
    floating = t.is_floating_point() and t.element_size() in _BITS_DTYPES
    nonzero = _bits(t) != 0 if floating else None
    nnz = int(nonzero.sum()) if nonzero is not None else int(torch.count_nonzero(t))
    shape, dtype = tuple(t.shape), _dtype_name(t.dtype)
    dense = (TensorRecord(name, shape, dtype, nnz, crc32=zlib.crc32(raw)), raw)
    if nonzero is None or t.numel() == 0 or nnz == t.numel():
        return dense

    value_dtype = t.dtype
    if t.element_size() > 2 and values != "fp32":
        value_dtype = _VALUE_DTYPES[values]
    kept = t.reshape(-1)[nonzero]
    stored_values = kept.to(value_dtype)
    if value_dtype != t.dtype:
        overflow = torch.isinf(stored_values) & torch.isfinite(kept)
        if bool(overflow.any()):
            raise ValueError(
                f"tensor {name!r}: values={values!r} overflows (largest |value| "
                f"{float(kept.abs().max()):.4g}); use values='bf16' or 'fp32'"
            )
    codec, pattern = _encode_pattern(nonzero.numpy())
    planes, value_bytes = _encode_values(stored_values)
    payload = pattern + value_bytes
    if len(payload) >= len(raw):
        return dense
    record = TensorRecord(
        name,
        shape,
        dtype,
        nnz,
        crc32=zlib.crc32(payload),
        pattern_codec=codec,
        pattern_bytes=len(pattern),
        values_dtype=_dtype_name(value_dtype),
        value_planes=planes,
    )
    return record, payload


def save_sparse(
    model: nn.Module | Mapping[str, Tensor],
    path: str | os.PathLike[str],
    *,
    values: str = "fp32",
    metadata: Mapping[str, Any] | None = None,
) -> SparseFileInfo:
    """Write a model's ``state_dict`` as a compressed sparse checkpoint.

    Sparse floating tensors are stored as a compressed pattern plus their
    non-zero values, everything else as is (see the module docstring for the
    format). With ``values="fp32"`` the round trip through :func:`load_sparse`
    is bit-exact. Call ``Pruner.finalize()`` first: a model that still carries
    parametrizations is saved with its raw (unthresholded, dense) tensors.

    Args:
        model: the model (or a ``state_dict``). When it came from
            ``create_model`` its ``feather_model_spec`` is stored, so
            ``load_sparse(path)`` can rebuild it.
        path: the file to write (conventionally ``*.fsp``); written atomically.
        values: precision of the stored non-zeros: ``"fp32"`` (lossless),
            ``"fp16"`` or ``"bf16"``.
        metadata: extra JSON-serializable information stored in the header
            (read it back with :func:`inspect_sparse`).

    Returns:
        The description of the written file.

    Raises:
        ValueError: for an unknown ``values``, metadata that is not
            JSON-serializable, or values that overflow float16.

    Example:
        >>> model = nn.Linear(64, 64)
        >>> with torch.no_grad():
        ...     model.weight[model.weight.abs() < 0.1] = 0
        >>> info = save_sparse(model, tmp_path / "model.fsp")  # doctest: +SKIP
        >>> load_sparse(tmp_path / "model.fsp", nn.Linear(64, 64))  # doctest: +SKIP
    """
    _check_byte_order()
    if values not in _VALUE_DTYPES:
        raise ValueError(f"values must be one of {sorted(_VALUE_DTYPES)}, got {values!r}")
    metadata = dict(metadata or {})
    try:
        json.dumps(metadata)
    except (TypeError, ValueError) as err:
        raise ValueError(f"metadata must be JSON-serializable: {err}") from None

    if isinstance(model, nn.Module):
        if any(parametrize.is_parametrized(m) for m in model.modules()):
            logger.warning(
                "the model still has parametrizations (a Pruner not finalized?); "
                "their raw dense tensors are saved. Call pruner.finalize() first."
            )
        state = model.state_dict()
        spec = _model_spec(model)
    else:
        state, spec = dict(model), None

    records: list[TensorRecord] = []
    chunks: list[bytes] = []
    for name, tensor in state.items():
        if not isinstance(tensor, Tensor):
            raise ValueError(f"state_dict entry {name!r} is not a tensor ({type(tensor).__name__})")
        record, payload = _encode_tensor(name, tensor, values)
        records.append(record)
        chunks.append(payload)

    header = _header_bytes(records, values, spec, metadata)
    entries = {
        HEADER_KEY: _from_bytes(header, torch.uint8, (len(header),)),
        DATA_KEY: _from_bytes(b"".join(chunks), torch.uint8, (sum(map(len, chunks)),)),
    }
    save_file = _safetensors("safetensors.torch").save_file
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(
            entries,
            tmp,
            metadata={
                "format": FORMAT_NAME,
                "format_version": str(FORMAT_VERSION),
                "library_version": __version__,
            },
        )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    info = _parse_header(str(target), header, target.stat().st_size)
    logger.info(
        "wrote %s: %d bytes (%.1fx smaller than dense, %.3fx the entropy bound)",
        target,
        info.file_bytes,
        info.dense_bytes / max(info.file_bytes, 1),
        info.file_bytes / max(info.entropy_bound_bytes, 1.0),
    )
    return info


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def _read(path: str | os.PathLike[str], with_data: bool) -> tuple[SparseFileInfo, bytes]:
    """The file's description and (when asked) its data bytes, with clear errors."""
    safetensors = _safetensors("safetensors")
    safe_open, SafetensorError = safetensors.safe_open, safetensors.SafetensorError
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"sparse checkpoint {str(p)!r} does not exist")
    try:
        with safe_open(str(p), framework="pt", device="cpu") as f:
            _check_format(str(p), f.metadata() or {})
            keys = set(f.keys())
            if not {HEADER_KEY, DATA_KEY} <= keys:
                raise ValueError(f"{p}: the file is corrupted (entries {sorted(keys)})")
            info = _parse_header(str(p), _raw_bytes(f.get_tensor(HEADER_KEY)), p.stat().st_size)
            data = _raw_bytes(f.get_tensor(DATA_KEY)) if with_data else b""
    except SafetensorError as err:
        raise ValueError(
            f"{p} is not a readable feather-sparse checkpoint (truncated or corrupted?): {err}"
        ) from None
    if with_data and len(data) != sum(r.stored_bytes for r in info.tensors):
        raise ValueError(f"{p}: the file is corrupted (data size does not match the header)")
    return info, data


def inspect_sparse(path: str | os.PathLike[str]) -> SparseFileInfo:
    """Describe a sparse checkpoint from its header (no tensor is decoded).

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: if it is not a feather-sparse checkpoint of this format
            version, or is truncated or corrupted.
    """
    return _read(path, with_data=False)[0]


def _decode_record(record: TensorRecord, payload: bytes) -> Tensor:
    """Rebuild one tensor from its stored bytes, verifying the checksum."""
    if zlib.crc32(payload) != record.crc32:
        raise ValueError(
            f"tensor {record.name!r} is corrupted (checksum mismatch); "
            "the file was damaged after writing"
        )
    dtype = _dtype_from_name(record.dtype)
    if not record.is_sparse:
        return _from_bytes(payload, dtype, record.shape)
    assert record.pattern_codec is not None and record.values_dtype is not None
    codec: PatternCodec = PATTERN_CODECS.get(record.pattern_codec)
    try:
        mask = codec.decode(payload[: record.pattern_bytes], record.numel, record.nnz)
        values = _decode_values(
            payload[record.pattern_bytes :],
            record.value_planes,
            record.nnz,
            _dtype_from_name(record.values_dtype),
        )
    except ValueError as err:
        raise ValueError(f"tensor {record.name!r}: {err}") from None
    if int(mask.sum()) != record.nnz:
        raise ValueError(f"tensor {record.name!r}: pattern does not have {record.nnz} non-zeros")
    bits = torch.zeros(record.numel, dtype=_BITS_DTYPES[dtype.itemsize])
    # Copy bit patterns (not float values) so that NaN payloads survive.
    bits[torch.from_numpy(mask)] = _bits(values.to(dtype))
    return bits.view(dtype).reshape(record.shape)


def load_sparse_state_dict(
    path: str | os.PathLike[str],
) -> tuple[dict[str, Tensor], SparseFileInfo]:
    """Read a sparse checkpoint into a dense ``state_dict`` (CPU tensors).

    Returns:
        The ``state_dict`` (entries in their saved order and dtypes) and the
        file's description.

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: for a truncated or corrupted file or another format version.
    """
    _check_byte_order()
    info, data = _read(path, with_data=True)
    state: dict[str, Tensor] = {}
    offset = 0
    for record in info.tensors:
        size = record.stored_bytes
        state[record.name] = _decode_record(record, data[offset : offset + size])
        offset += size
    return state, info


def _describe_spec(spec: Mapping[str, Any] | None) -> str:
    if not spec:
        return "unknown model"
    kwargs = ", ".join(f"{k}={v!r}" for k, v in dict(spec.get("kwargs") or {}).items())
    return f"{spec.get('name')}({kwargs})"


def _check_architecture(
    model: nn.Module, state: Mapping[str, Tensor], info: SparseFileInfo
) -> None:
    """Raise a ``ValueError`` naming every difference between file and model."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in expected
        if k in state and state[k].shape != expected[k].shape
    ]
    if not (missing or unexpected or shapes):
        return

    def listing(items: list[str]) -> str:
        return ", ".join(items[:5]) + (f" (+{len(items) - 5} more)" if len(items) > 5 else "")

    problems = []
    if shapes:
        problems.append(f"shape mismatch: {listing(shapes)}")
    if missing:
        problems.append(f"missing from the file: {listing(missing)}")
    if unexpected:
        problems.append(f"not in the model: {listing(unexpected)}")
    hint = ""
    if any("parametrizations." in k for k in missing + unexpected):
        hint = " (one side has parametrizations: finalize the Pruner or load into a plain model)"
    model_spec = getattr(model, MODEL_SPEC_ATTR, None)
    raise ValueError(
        f"{info.path} does not match the model's architecture "
        f"(file: {_describe_spec(info.model_spec)}, model: "
        f"{_describe_spec(model_spec) if model_spec else type(model).__name__}): "
        + "; ".join(problems)
        + hint
    )


def load_sparse(path: str | os.PathLike[str], model: nn.Module | None = None) -> nn.Module:
    """Load a sparse checkpoint into ``model``, or into a model rebuilt from the file.

    The architecture is checked first: every missing, unexpected or
    differently shaped tensor is named in the error. Tensors are copied into
    the model's own parameters and buffers (keeping its device); the model's
    train/eval mode is left as it is.

    Args:
        path: a file written by :func:`save_sparse`.
        model: the model to load into. ``None`` rebuilds it with
            ``create_model`` from the model spec stored in the file.

    Returns:
        The model with the checkpoint's weights.

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: for a truncated or corrupted file, another format version,
            a model of another architecture, or ``model=None`` with a file
            that has no model spec.
    """
    state, info = load_sparse_state_dict(path)
    if model is None:
        spec = info.model_spec
        if not spec or "name" not in spec:
            raise ValueError(
                f"{info.path} has no model spec (the model did not come from create_model); "
                "pass the model to load into: load_sparse(path, model)"
            )
        from feather_sparse.models import create_model

        model = create_model(str(spec["name"]), **dict(spec.get("kwargs") or {}))
    _check_architecture(model, state, info)
    model.load_state_dict(state, strict=True)
    return model


# ---------------------------------------------------------------------------
# Sparse inference
# ---------------------------------------------------------------------------


def _to_csr_int32(weight: Tensor) -> Tensor:
    """A 2-D dense tensor as CSR with int32 indices (half the index bytes of int64)."""
    with warnings.catch_warnings():
        # torch flags CSR support as beta on every conversion; it is what we want.
        warnings.filterwarnings("ignore", message=".*[Ss]parse CSR tensor support is in beta.*")
        csr = weight.detach().to_sparse_csr()
    return torch.sparse_csr_tensor(
        csr.crow_indices().to(torch.int32),
        csr.col_indices().to(torch.int32),
        csr.values(),
        size=tuple(csr.shape),
        dtype=weight.dtype,
        device=weight.device,
        check_invariants=False,  # built by to_sparse_csr, valid by construction
    )


def _csr_matmul(weight_csr: Tensor, bias_column: Tensor | None, columns: Tensor) -> Tensor:
    """``W @ columns (+ bias)`` with ``W`` in CSR: ``(out, in) @ (in, n) -> (out, n)``."""
    if bias_column is None:
        return torch.mm(weight_csr, columns)
    return torch.addmm(bias_column, weight_csr, columns)


class SparseLinear(nn.Module):
    """Inference-only ``nn.Linear`` whose weight is a CSR tensor (int32 indices).

    ``y = x Wᵀ + b`` is computed as ``(W xᵀ + b)ᵀ`` so the sparse operand is
    on the left, the layout ``torch.sparse`` (MKL on CPU, cuSPARSE on CUDA)
    multiplies fastest. Output is contiguous, like ``nn.Linear``'s.

    Args:
        weight: the dense ``(out_features, in_features)`` weight.
        bias: the ``(out_features,)`` bias or ``None``.
    """

    weight_csr: Tensor
    bias_column: Tensor | None

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        if weight.dim() != 2:
            raise ValueError(f"SparseLinear needs a 2-D weight, got shape {tuple(weight.shape)}")
        self.out_features, self.in_features = (int(d) for d in weight.shape)
        self.register_buffer("weight_csr", _to_csr_int32(weight))
        column = None if bias is None else bias.detach().reshape(-1, 1).clone()
        self.register_buffer("bias_column", column)

    @classmethod
    def from_dense(cls, linear: nn.Linear) -> SparseLinear:
        """Convert an ``nn.Linear`` (its current weight, parametrized or not)."""
        return cls(linear.weight.detach(), None if linear.bias is None else linear.bias.detach())

    @property
    def nnz(self) -> int:
        """Number of stored non-zeros."""
        return int(self.weight_csr.values().numel())

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)  # (n, in)
        out = _csr_matmul(self.weight_csr, self.bias_column, rows.t())  # (out, n)
        return out.t().contiguous().reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        density = self.nnz / max(self.in_features * self.out_features, 1)
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias_column is not None}, density={density:.4f}"
        )


class SparsePointwiseConv(nn.Module):
    """Inference-only 1×1 convolution (1-D, 2-D or 3-D) with a CSR weight.

    A 1×1 convolution with no padding and one group is a matrix product over
    channels: ``(out, in) @ (in, N·spatial)``; a stride subsamples the input
    first.

    Args:
        weight: the dense ``(out, in, 1, ...)`` weight.
        bias: the ``(out,)`` bias or ``None``.
        stride: the convolution's stride per spatial dimension.
    """

    weight_csr: Tensor
    bias_column: Tensor | None

    def __init__(self, weight: Tensor, bias: Tensor | None, stride: Sequence[int]) -> None:
        super().__init__()
        if any(k != 1 for k in weight.shape[2:]) or len(stride) != weight.dim() - 2:
            raise ValueError(f"not a 1x1 convolution weight: shape {tuple(weight.shape)}")
        self.out_channels, self.in_channels = int(weight.shape[0]), int(weight.shape[1])
        self.stride = tuple(int(s) for s in stride)
        self.register_buffer("weight_csr", _to_csr_int32(weight.detach().flatten(1)))
        column = None if bias is None else bias.detach().reshape(-1, 1).clone()
        self.register_buffer("bias_column", column)

    @classmethod
    def from_dense(cls, conv: nn.Conv1d | nn.Conv2d | nn.Conv3d) -> SparsePointwiseConv:
        """Convert an eligible convolution (see :func:`_is_pointwise_conv`)."""
        if not _is_pointwise_conv(conv):
            raise ValueError(f"{conv} is not a 1x1, unpadded, single-group convolution")
        bias = None if conv.bias is None else conv.bias.detach()
        return cls(conv.weight.detach(), bias, conv.stride)

    @property
    def nnz(self) -> int:
        """Number of stored non-zeros."""
        return int(self.weight_csr.values().numel())

    def forward(self, x: Tensor) -> Tensor:
        spatial_dims = len(self.stride)
        batched = x.dim() == spatial_dims + 2
        if not batched:
            x = x.unsqueeze(0)
        if any(s != 1 for s in self.stride):
            x = x[(slice(None), slice(None), *(slice(None, None, s) for s in self.stride))]
        n, spatial = x.shape[0], x.shape[2:]
        columns = x.movedim(1, 0).reshape(self.in_channels, -1)  # (in, N·spatial)
        out = _csr_matmul(self.weight_csr, self.bias_column, columns)  # (out, N·spatial)
        out = out.reshape(self.out_channels, n, *spatial).movedim(0, 1).contiguous()
        return out if batched else out.squeeze(0)

    def extra_repr(self) -> str:
        density = self.nnz / max(self.in_channels * self.out_channels, 1)
        return (
            f"{self.in_channels}, {self.out_channels}, stride={self.stride}, "
            f"bias={self.bias_column is not None}, density={density:.4f}"
        )


def _is_pointwise_conv(module: nn.Module) -> bool:
    if not isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d):
        return False
    padding = module.padding
    no_padding = padding == "valid" or (
        not isinstance(padding, str) and all(int(p) == 0 for p in padding)
    )
    return all(k == 1 for k in module.kernel_size) and module.groups == 1 and no_padding


def _median_seconds(fn: Callable[[], Any], repeats: int, device: torch.device) -> float:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()  # warm-up
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _replace_module(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def to_sparse_inference(
    model: nn.Module,
    min_sparsity: float = 0.9,
    *,
    min_weights: int = 65536,
    example_input: Tensor | tuple[Tensor, ...] | None = None,
    repeats: int = 5,
    inplace: bool = False,
) -> nn.Module:
    """Replace sparse-enough Linear and 1×1 conv layers by CSR-backed ones.

    A layer is eligible when it is an ``nn.Linear``, or an ``nn.Conv1d/2d/3d``
    with a 1×1 kernel, no padding and one group, with a float32/float64
    weight of at least ``min_weights`` entries and at least ``min_sparsity``
    exact zeros. (3×3 and other convolutions always stay dense: on CPU the
    sparse path did not pay for them in our measurements.) The defaults come
    from ``benchmarks/bench_sparse_inference.py``: below ~90 % sparsity, or
    for layers with fewer than ~64 k weights, the CSR call's fixed cost
    outweighs the saved multiply-adds on CPU.

    With ``example_input``, the decision is measured instead of guessed:
    each eligible layer is timed dense and sparse on the input it actually
    receives (median of ``repeats``) and converted only if sparse is faster.

    The converted layers are inference-only (no gradients to the weights).

    Args:
        model: the (finalized) model.
        min_sparsity: least fraction of zero weights for a layer to convert.
        min_weights: least number of weights for a layer to convert.
        example_input: a representative input batch (or tuple of inputs) to
            time each eligible layer on; ``None`` keeps the static rules.
        repeats: timing repeats per layer with ``example_input``.
        inplace: modify ``model`` itself instead of a deep copy.

    Returns:
        The converted model (``model`` itself when ``inplace``).

    Raises:
        ValueError: if ``min_sparsity`` is outside ``[0, 1]`` or ``repeats < 1``.

    Example:
        >>> sparse_model = to_sparse_inference(model.eval(), min_sparsity=0.9)  # doctest: +SKIP
    """
    if not 0.0 <= min_sparsity <= 1.0:
        raise ValueError(f"min_sparsity must be in [0, 1], got {min_sparsity}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if not inplace:
        model = copy.deepcopy(model)

    candidates: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        if not (isinstance(module, nn.Linear) or _is_pointwise_conv(module)):
            continue
        weight = module.weight
        if not isinstance(weight, Tensor) or weight.dtype not in (torch.float32, torch.float64):
            continue
        numel = weight.numel()
        if numel < max(min_weights, 1):
            continue
        sparsity = 1.0 - int(torch.count_nonzero(weight.detach())) / numel
        if sparsity >= min_sparsity:
            candidates[name] = module

    def convert(module: nn.Module) -> nn.Module:
        if isinstance(module, nn.Linear):
            return SparseLinear.from_dense(module)
        assert isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d)
        return SparsePointwiseConv.from_dense(module)

    seen_inputs: dict[str, Tensor] = {}
    if example_input is not None and candidates:
        hooks = [
            module.register_forward_pre_hook(
                lambda _m, args, name=name: seen_inputs.setdefault(name, args[0])
            )
            for name, module in candidates.items()
        ]
        try:
            with torch.inference_mode():
                inputs = example_input if isinstance(example_input, tuple) else (example_input,)
                model(*inputs)
        finally:
            for hook in hooks:
                hook.remove()

    for name, module in candidates.items():
        sparse = convert(module)
        if name in seen_inputs:
            x = seen_inputs[name]
            with torch.inference_mode():
                dense_s = _median_seconds(functools.partial(module, x), repeats, x.device)
                sparse_s = _median_seconds(functools.partial(sparse, x), repeats, x.device)
            if sparse_s >= dense_s:
                logger.info(
                    "%s stays dense: sparse %.3g s vs dense %.3g s", name, sparse_s, dense_s
                )
                continue
        elif example_input is not None:
            logger.info("%s stays dense: it did not run on the example input", name)
            continue
        _replace_module(model, name, sparse)
        logger.info("%s -> %s", name, sparse)
    return model


# ---------------------------------------------------------------------------
# ONNX
# ---------------------------------------------------------------------------

# torch's exporters cap the opset below the newest the onnx package knows:
# the torch.export-based one (needs onnxscript) at 23, the legacy TorchScript
# one at 20 in torch 2.13. Fallbacks in case the private constants move.
_DYNAMO_MAX_OPSET = 23
_LEGACY_MAX_OPSET = 20


def _onnx_exporter() -> tuple[str, int]:
    """Which torch ONNX exporter works offline here, and its highest opset."""
    constants = importlib.import_module("torch.onnx._constants")
    try:
        importlib.import_module("onnxscript")
    except ImportError:
        return "legacy", int(
            getattr(constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", _LEGACY_MAX_OPSET)
        )
    return "dynamo", int(getattr(constants, "ONNX_MAX_OPSET", _DYNAMO_MAX_OPSET))


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike[str],
    example_input: Tensor,
    *,
    opset: int | None = None,
) -> int:
    """Write the (finalized, dense-format) model to ONNX with a dynamic batch size.

    Uses torch's ``torch.export``-based exporter when ``onnxscript`` is
    installed and the legacy TorchScript exporter (``dynamo=False``) otherwise;
    both work offline. The default opset is the newest that both the
    installed ``onnx`` package and the chosen exporter support (onnx 1.23
    knows opset 28; torch 2.13 exports at most 23, or 20 with the legacy
    exporter).

    Args:
        model: the model (put in eval mode for the export).
        path: the ``.onnx`` file to write.
        example_input: an input batch with a batch size of at least 2 (the
            batch dimension is exported as dynamic).
        opset: the ONNX opset; ``None`` picks the default above.

    Returns:
        The opset written.

    Raises:
        ValueError: if ``onnx`` is not installed or ``opset`` is too new.
    """
    try:
        onnx = importlib.import_module("onnx")
    except ImportError:
        raise ValueError(
            "ONNX export needs the onnx package: pip install 'feather-sparse[onnx]'"
        ) from None
    exporter, exporter_max = _onnx_exporter()
    newest = min(int(onnx.defs.onnx_opset_version()), exporter_max)
    opset = newest if opset is None else int(opset)
    if opset > newest:
        raise ValueError(f"opset {opset} is newer than this setup exports ({exporter}: {newest})")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    try:
        with warnings.catch_warnings():
            # Noise from torch's own exporter internals (torch 2.13), not actionable here.
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            if exporter == "legacy":  # the fallback is deprecated in torch; we know
                warnings.simplefilter("ignore", DeprecationWarning)
            if exporter == "dynamo":
                program = torch.onnx.export(
                    model,
                    (example_input,),
                    dynamo=True,
                    opset_version=opset,
                    input_names=["input"],
                    output_names=["output"],
                    dynamic_shapes=({0: torch.export.Dim("batch")},),
                    verbose=False,
                )
                assert program is not None
                program.save(str(target))
            else:
                torch.onnx.export(
                    model,
                    (example_input,),
                    str(target),
                    dynamo=False,
                    opset_version=opset,
                    input_names=["input"],
                    output_names=["output"],
                    dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                )
    finally:
        model.train(was_training)
    logger.info("wrote %s (opset %d, %s exporter)", target, opset, exporter)
    return opset


def verify_onnx(model: nn.Module, path: str | os.PathLike[str], inputs: Tensor) -> float:
    """Run the ONNX file in ``onnxruntime`` and compare with the PyTorch model.

    Returns:
        The largest absolute difference between the two outputs.

    Raises:
        ValueError: if ``onnxruntime`` is not installed.
    """
    try:
        ort = importlib.import_module("onnxruntime")
    except ImportError:
        raise ValueError(
            "verifying ONNX needs onnxruntime: pip install 'feather-sparse[onnx]'"
        ) from None
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: inputs.detach().cpu().numpy()}
    onnx_out = torch.from_numpy(session.run(None, feed)[0])
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            torch_out = model(inputs).detach().cpu()
    finally:
        model.train(was_training)
    if onnx_out.shape != torch_out.shape:
        raise ValueError(f"ONNX output shape {tuple(onnx_out.shape)} != {tuple(torch_out.shape)}")
    return float((onnx_out.float() - torch_out.float()).abs().max()) if onnx_out.numel() else 0.0


# ---------------------------------------------------------------------------
# Command line: feather-sparse export | inspect
# ---------------------------------------------------------------------------


def add_cli_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    """Arguments of ``feather-sparse export`` and ``feather-sparse inspect``."""
    if command == "inspect":
        parser.add_argument("file", type=Path, help="a sparse checkpoint (.fsp)")
        return
    parser.add_argument(
        "source",
        type=Path,
        help="a training run folder, a training checkpoint (.pt) or a sparse checkpoint (.fsp)",
    )
    parser.add_argument("-o", "--output", type=Path, help="sparse checkpoint to write (.fsp)")
    parser.add_argument(
        "--values",
        choices=sorted(_VALUE_DTYPES),
        default="fp32",
        help="precision of the stored non-zeros (fp32 is lossless; default: fp32)",
    )
    parser.add_argument("--onnx", type=Path, help="also write the dense-format model as ONNX")
    parser.add_argument("--opset", type=int, help="ONNX opset (default: newest supported)")
    parser.add_argument(
        "--input-shape",
        help="shape of one input sample for ONNX, e.g. 1,40 (default: the model's own)",
    )


def _run_checkpoint(source: Path) -> Path:
    """The file to export from a run folder or a file path."""
    if source.is_dir():
        for candidate in (source / "checkpoints" / "last.pt", source / "model.fsp"):
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(
            f"{source} is not a training run folder: "
            "neither checkpoints/last.pt nor model.fsp exists"
        )
    if not source.is_file():
        raise FileNotFoundError(f"{source} does not exist")
    return source


def _is_safetensors(path: Path) -> bool:
    with path.open("rb") as f:
        head = f.read(9)
    # 8-byte little-endian header length, then the JSON header.
    return len(head) == 9 and head[8:9] == b"{"


def _model_from_training_checkpoint(path: Path) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the model of a training checkpoint and bake its pruning in."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(f"{path} is not a readable training checkpoint: {err}") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "config" not in ckpt:
        raise ValueError(f"{path} is not a feather-sparse training checkpoint (no model/config)")
    if ckpt.get("format", _TRAIN_CHECKPOINT_FORMAT) != _TRAIN_CHECKPOINT_FORMAT:
        raise ValueError(
            f"{path} has format {ckpt.get('format')!r}, not {_TRAIN_CHECKPOINT_FORMAT!r}"
        )
    spec = (ckpt["config"] or {}).get("model")
    if not isinstance(spec, dict) or "name" not in spec:
        raise ValueError(f"{path}: its config has no model entry {{'name', 'kwargs'}}")
    from feather_sparse.models import create_model

    model = create_model(str(spec["name"]), **dict(spec.get("kwargs") or {}))
    model.load_state_dict(ckpt["model"], strict=True)
    if ckpt.get("pruner") is not None:
        from feather_sparse.pruner import Pruner

        # The Pruner rebuilt from its saved config and state; finalize()
        # recomputes T at the target sparsity and writes P_T(w) into the weights.
        Pruner.from_state_dict(model, ckpt["pruner"]).finalize()
    metadata = {
        "source": str(path),
        "epoch": ckpt.get("epoch"),
        "step": ckpt.get("step"),
        "config": ckpt["config"],
    }
    try:
        json.dumps(metadata)
    except (TypeError, ValueError):
        metadata["config"] = None
    return model.eval(), metadata


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(",") if part.strip())
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise ValueError(f"--input-shape must be positive sizes like 1,40; got {text!r}")
    return shape


def _input_shape(model: nn.Module, text: str | None) -> tuple[int, ...]:
    if text:
        return _parse_shape(text)
    spec = getattr(model, MODEL_SPEC_ATTR, None)
    if spec:
        from feather_sparse.models import model_info

        return tuple(model_info(str(spec["name"])).input_shape)
    raise ValueError("the model has no registered input shape; pass --input-shape")


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def format_info(info: SparseFileInfo) -> str:
    """The per-tensor table and totals printed by ``feather-sparse inspect``."""
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
    lines += [
        "",
        f"file: {info.path}  (format {info.format_version}, written by feather-sparse "
        f"{info.library_version}, values {info.values})",
        f"model: {_describe_spec(info.model_spec)}",
        f"tensors: {len(info.tensors)} ({sum(r.is_sparse for r in info.tensors)} sparse), "
        f"sparsity of the sparse ones {info.sparsity:.4f}",
        f"size: {_human_bytes(info.file_bytes)} vs {_human_bytes(info.dense_bytes)} dense "
        f"({info.dense_bytes / max(info.file_bytes, 1):.2f}x smaller), "
        f"{info.file_bytes / max(bound, 1.0):.3f}x the bound H(d)*N + raw values",
    ]
    sparse = [r for r in info.tensors if r.is_sparse]
    if sparse:
        pattern = sum(r.pattern_bytes for r in sparse)
        entropy = sum(r.pattern_entropy_bytes for r in sparse)
        stored = sum(sum(r.value_planes) for r in sparse)
        raw = sum(r.raw_value_bytes for r in sparse)
        lines.append(
            f"sparse tensors: patterns {_human_bytes(pattern)} ({pattern / max(entropy, 1.0):.3f}x "
            f"H(d)*N), values {_human_bytes(stored)} ({stored / max(raw, 1):.3f}x raw)"
        )
    return "\n".join(lines)


def run_cli(command: str, args: argparse.Namespace) -> int:
    """Run ``feather-sparse export`` or ``feather-sparse inspect``; returns the exit code."""
    if command == "inspect":
        print(format_info(inspect_sparse(args.file)))
        return 0
    if args.output is None and args.onnx is None:
        raise ValueError("nothing to write: give -o model.fsp and/or --onnx model.onnx")
    source = _run_checkpoint(args.source)
    if _is_safetensors(source):
        model = load_sparse(source)
        metadata: dict[str, Any] = dict(inspect_sparse(source).metadata)
    else:
        model, metadata = _model_from_training_checkpoint(source)
    model.eval()
    if args.output is not None:
        info = save_sparse(model, args.output, values=args.values, metadata=metadata)
        print(
            f"wrote {info.path}: {_human_bytes(info.file_bytes)} "
            f"({info.dense_bytes / max(info.file_bytes, 1):.2f}x smaller than dense, "
            f"sparsity {info.sparsity:.4f})"
        )
    if args.onnx is not None:
        example = torch.randn(2, *_input_shape(model, args.input_shape))
        opset = export_onnx(model, args.onnx, example, opset=args.opset)
        message = f"wrote {args.onnx} (opset {opset})"
        try:
            diff = verify_onnx(model, args.onnx, example)
        except ValueError as err:  # onnxruntime missing: the export itself succeeded
            message += f"; not verified: {err}"
        else:
            message += f"; onnxruntime matches PyTorch to {diff:.2e}"
        print(message)
    sys.stdout.flush()
    return 0
