"""Bit-level codecs of the ``.fsp`` format: sparsity patterns and non-zero values.

Pure functions from arrays to bytes and back, with no knowledge of files:

* sparsity patterns (flattened boolean masks): ``gaps+lzma`` (the run of
  zeros before each non-zero, one byte per run, raw LZMA2) and
  ``bitmask+lzma`` (the packed mask, raw LZMA2), registered in
  :data:`PATTERN_CODECS`; :func:`_encode_pattern` keeps the smaller;
* non-zero values (``planes+zlib``): their bytes split into byte planes, each
  zlib-compressed where that makes it smaller;
* N:M weights (``nm+lzma``, format version 2): a tensor whose every group of
  ``M`` consecutive entries along the reduction dimension holds at most ``N``
  non-zeros is stored as :func:`feather_sparse.nm.encode_nm` writes it — ``N``
  values per group and their packed in-group positions (raw LZMA2) — when
  that is smaller than the unstructured encoding.

The settings below are part of format version 1 (see
:mod:`feather_sparse.export.fsp` for the file layout): changing them changes
what old files decode to. Every decoder raises ``ValueError`` on corrupt input.
"""

from __future__ import annotations

import lzma
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from feather_sparse.nm.export import _BITS_DTYPES, decode_nm, encode_nm
from feather_sparse.nm.operator import NMPattern
from feather_sparse.registry import Registry

__all__ = ["NM_CODEC", "NM_GROUP_SIZES", "PATTERN_CODECS", "PatternCodec"]

_VALUE_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
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
# N:M codec: kept values + packed in-group positions
# ---------------------------------------------------------------------------

#: Name of the N:M encoding in a record (its pattern is written beside it).
NM_CODEC = "nm+lzma"
#: Group sizes tried when looking for an N:M structure: those of the patterns
#: GPUs accelerate (2:4) and their neighbours (1:4, 4:8).
NM_GROUP_SIZES = (4, 8)


def _nm_candidates(nonzero: Tensor, shape: Sequence[int]) -> list[NMPattern]:
    """N:M patterns a tensor with flattened non-zero mask ``nonzero`` satisfies.

    For each ``M`` in :data:`NM_GROUP_SIZES` dividing the reduction dimension
    (``prod(shape[1:])``), ``N`` is the largest count of non-zeros in a group;
    only ``N <= M/2`` is kept (the densest pattern GPUs run), so an
    unstructured tensor rarely qualifies and is not encoded twice for nothing.
    """
    if len(shape) < 2 or not nonzero.numel():
        return []
    row = math.prod(shape[1:])
    out = []
    for m in NM_GROUP_SIZES:
        if row % m:
            continue
        # counted in uint8 (m <= 8): a bool sum widens to int64, ~15x slower
        counts = nonzero.view(torch.uint8).reshape(-1, m).sum(dim=1, dtype=torch.uint8)
        n = int(counts.max())
        if 1 <= n <= m // 2:
            out.append(NMPattern(n, m))
    return out


def _nm_indices_length(numel: int, pattern: NMPattern) -> int:
    """Bytes of the packed in-group positions of a tensor of ``numel`` entries."""
    return math.ceil(numel // pattern.m * pattern.n * pattern.index_bits / 8)


def _encode_nm(t: Tensor, pattern: NMPattern) -> tuple[bytes, Tensor] | None:
    """``(compressed positions, values (groups·n,))`` of ``t``, or ``None`` if not bit-exact.

    :func:`~feather_sparse.nm.encode_nm` keeps each group's ``n`` largest
    magnitudes; a tensor it cannot restore bit for bit (a ``-0.0`` or NaN
    among the dropped entries) is left to the unstructured codecs.
    """
    weight = t.reshape(t.shape[0], -1)
    try:
        values, indices = encode_nm(weight, pattern)
    except ValueError:
        return None
    back = decode_nm(values, indices, tuple(weight.shape), pattern)
    if not torch.equal(_bits(back), _bits(weight)):
        return None
    return _lzma_compress(_raw_bytes(indices)), values.reshape(-1)


def _decode_nm(
    data: bytes, values: Tensor, shape: Sequence[int], pattern: NMPattern, dtype: torch.dtype
) -> Tensor:
    """The tensor of ``shape`` from its compressed positions and ``values`` (in ``dtype``)."""
    numel = math.prod(shape)
    if len(shape) < 2 or numel % pattern.m:
        raise ValueError(f"shape {tuple(shape)} does not split into groups of {pattern.m}")
    raw = _lzma_decompress(data, _nm_indices_length(numel, pattern))
    if len(raw) != _nm_indices_length(numel, pattern):
        raise ValueError("compressed N:M positions are corrupted (wrong length)")
    indices = _from_bytes(raw, torch.uint8, (len(raw),))
    rows = (shape[0], numel // shape[0])
    try:
        out = decode_nm(values.to(dtype).reshape(-1, pattern.n), indices, rows, pattern)
    except (RuntimeError, IndexError) as err:  # positions out of their group
        raise ValueError(f"N:M positions are corrupted ({err})") from None
    return out.reshape(tuple(shape))
