"""The ``.fsp`` sparse checkpoint: write, read and describe files.

:func:`save_sparse` / :func:`load_sparse` write and read a *sparse
checkpoint* (``.fsp``): a `safetensors <https://github.com/huggingface/safetensors>`_
file in which every sparse tensor is stored as a compressed sparsity pattern
plus its non-zero values, and everything else as is. The codecs are in
:mod:`feather_sparse.export.codec`, the header's records in
:mod:`feather_sparse.export.header`.

File format (versions 1 to 3)
-----------------------------
A safetensors file (no pickle; a JSON header with offsets) holding two uint8
entries:

* ``feather.header``: the JSON description, xz-compressed (its CRC-64 is
  checked on read): format name and version, library version, model spec, user
  metadata, and one record per ``state_dict`` entry, in order — name, shape,
  dtype, non-zero count, CRC-32 of its bytes, and for sparse entries how the
  pattern and values are coded. The safetensors ``__metadata__`` repeats the
  format name and versions so that a wrong file is named without decoding.
* ``feather.data``: every entry's bytes, one after the other.

The container is laid out by this module (the safetensors layout, with the
``__metadata__`` entries sorted; safetensors' own writer orders them anew
on every call), so saving the same model always writes the same bytes.

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
an error naming the file and the tensor instead of producing a silently wrong
model. The safetensors ``__metadata__`` has no checksum of its own, so it must
repeat the (checksummed) header exactly. Files are written atomically (see
:func:`feather_sparse.integrity.write_atomic`).

An **N:M weight** (format version 2; a file without one is written as
version 1): a tensor of two or more dimensions whose every group of ``M``
consecutive entries along the reduction dimension (``M`` = 4 or 8, dividing
``prod(shape[1:])``) holds at most ``N <= M/2`` non-zeros is also encoded as
:func:`feather_sparse.nm.encode_nm` does — ``N`` values per group, zeros
included where a group has fewer, then the in-group positions packed in
``ceil(log2 M)`` bits each and compressed with raw LZMA2 (codec ``nm+lzma``;
the record names the pattern) — and stored so when that is smaller than the
unstructured encoding; only encodings that decode bit for bit are used.

A **tied weight** (format version 3; a file without one is written at the
lowest version that holds it): an entry that is the same tensor as an earlier
one — the same storage, offset, shape, strides and dtype, as an LM head tied
to its token embedding lists it — is stored once. Its record names the
earlier entry (``alias_of``), repeats its shape, dtype, non-zero count and
CRC-32, and stores no bytes; loading gives the one tensor under both keys, as
``model.state_dict()`` did. Overlapping views that differ (a slice of another
entry, or ``z.conj()`` of an entry ``z``) are stored each on its own.

``values`` precision: ``"fp32"`` is lossless — non-zeros keep their tensor's own
dtype (float32 stays float32; float16, bfloat16 and float64 tensors keep
theirs). ``"fp16"`` / ``"bf16"`` store the non-zeros of float32/float64 tensors
in that dtype (halving the value bytes); 16-bit tensors keep their own dtype,
and dense tensors are always stored as is.
"""

from __future__ import annotations

import dataclasses
import errno
import importlib
import json
import logging
import os
import sys
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from feather_sparse import models
from feather_sparse._version import __version__
from feather_sparse.distributed import is_dtensor
from feather_sparse.export.codec import (
    _BITS_DTYPES,
    _VALUE_DTYPES,
    NM_CODEC,
    PATTERN_CODECS,
    PatternCodec,
    _bits,
    _decode_nm,
    _decode_values,
    _dtype_from_name,
    _dtype_name,
    _encode_nm,
    _encode_pattern,
    _encode_values,
    _from_bytes,
    _nm_candidates,
    _raw_bytes,
)
from feather_sparse.export.files import check_writable, is_onnx, sniff
from feather_sparse.export.header import (
    DATA_KEY,
    FORMAT_NAME,
    HEADER_KEY,
    MODEL_SPEC_ATTR,
    SparseFileInfo,
    TensorRecord,
    _check_format,
    _describe_spec,
    _header_bytes,
    _parse_header,
    file_version,
    smaller_or_larger,
)
from feather_sparse.integrity import write_atomic
from feather_sparse.nm.operator import NMPattern

__all__ = ["inspect_sparse", "load_sparse", "load_sparse_state_dict", "save_sparse"]

logger = logging.getLogger(__name__)


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


# ---------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------


def _container_metadata(library_version: str, format_version: int) -> dict[str, str]:
    """The safetensors ``__metadata__`` of a ``.fsp``: names the format without decoding."""
    return {
        "format": FORMAT_NAME,
        "format_version": str(format_version),
        "library_version": library_version,
    }


def _container(blobs: Mapping[str, bytes | Sequence[bytes]], metadata: Mapping[str, str]) -> bytes:
    """A safetensors file of 1-d uint8 tensors, the same bytes for the same input.

    A blob may be given as its parts (a sequence of ``bytes``), joined in the
    one concatenation that makes the file: a model's data is then held twice
    at most while it is written (its parts and the file), not three times.

    safetensors' own writer orders the ``__metadata__`` entries differently
    from one call to the next (it keeps them in a hash map), so the same model
    gave files that differed in a few header bytes. The layout is the
    safetensors format: the header's length as a little-endian u64, the JSON
    header (padded with spaces to a multiple of 8 bytes), then the tensors'
    bytes. The tensors are in name order, as safetensors orders tensors of one
    dtype, and the metadata entries sorted by key.
    """
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    names = sorted(blobs)
    parts: list[bytes] = []
    for name in names:
        blob = blobs[name]
        pieces = [blob] if isinstance(blob, bytes) else list(blob)
        size = sum(len(piece) for piece in pieces)
        header[name] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
        parts.extend(pieces)
    text = json.dumps(header, separators=(",", ":")).encode("ascii")
    text += b" " * (-len(text) % 8)
    return b"".join([len(text).to_bytes(8, "little"), text, *parts])


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


def _unwrap_compiled(model: nn.Module) -> nn.Module:
    """The module a ``torch.compile`` wrapper (``OptimizedModule``) holds, else ``model``.

    A compiled model's ``state_dict`` prefixes every key with ``_orig_mod.``,
    which no plain model (nor the one its spec rebuilds) has.
    """
    # No compiled model can exist unless torch._dynamo was imported: never import it here.
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(eval_frame, "OptimizedModule", None)
    while optimized is not None and isinstance(model, optimized):
        inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
    return model


def _meta_model(spec: Mapping[str, Any]) -> nn.Module | None:
    """The model ``spec`` names, built on the ``meta`` device (shapes, no memory);
    None when it cannot be built there (the reason is logged at debug level)."""
    try:
        with torch.device("meta"):
            return models.create_model(str(spec["name"]), **dict(spec.get("kwargs") or {}))
    except Exception:
        logger.debug("%s cannot be built on the meta device", _describe_spec(spec), exc_info=True)
        return None


def _module_tree(model: nn.Module) -> dict[str, str]:
    """Each module of ``model`` by qualified name: its class and ``extra_repr``.

    What a module computes beyond its tensors (an activation, a stride, a
    padding) shows here; a Pruner's parametrizations do not (a parametrized
    layer is described by its own class, without the ``parametrizations`` it
    holds), nor a ``forward`` wrapped on the instance (``torch.autocast`` by
    accelerate, say: the same architecture, run another way).
    """
    tree: dict[str, str] = {}

    def walk(module: nn.Module, prefix: str) -> None:
        cls = parametrize.type_before_parametrizations(module)
        extra = module.extra_repr()
        tree[prefix] = f"{cls.__qualname__}({extra})"
        skip = "parametrizations" if parametrize.is_parametrized(module) else None
        for name, child in module._modules.items():
            if child is not None and name != skip:
                walk(child, f"{prefix}.{name}" if prefix else name)

    walk(model, "")
    return tree


def _tree_differences(expected: Mapping[str, str], actual: Mapping[str, str]) -> list[str]:
    """What differs between the spec's module tree (``expected``) and the model's."""
    changed = [
        f"{k or '(the model itself)'}: model {actual[k]} vs spec {expected[k]}"
        for k in expected
        if k in actual and actual[k] != expected[k]
    ]
    missing = [k for k in expected if k not in actual]
    added = [k for k in actual if k not in expected]

    problems = []
    if changed:
        problems.append(f"module changed: {_listing(changed)}")
    if missing:
        problems.append(f"module missing from the model: {_listing(missing)}")
    if added:
        problems.append(f"module not in the spec: {_listing(added)}")
    return problems


def _fitting_spec(model: nn.Module, state: Mapping[str, Tensor]) -> dict[str, Any] | None:
    """The model's spec, if the model it rebuilds is this one; else None.

    The rebuilt model must have ``state``'s keys and shapes and the same
    module tree: each module's qualified name, class and ``extra_repr`` (so
    an activation swapped for another, or a changed stride, is seen too). A
    model changed after ``create_model`` built it (a new head, say) no longer
    fits its spec: the file is written without one, with a warning that names
    the differences, so that it never claims an architecture it does not have.
    A spec that cannot be built here (a model registered elsewhere) is kept as
    it is.
    """
    spec = _model_spec(model)
    if spec is None or "name" not in spec:
        return spec
    try:
        skeleton = _meta_model(spec)
        if skeleton is None:  # cannot be built on meta: build it for real
            skeleton = models.create_model(str(spec["name"]), **dict(spec.get("kwargs") or {}))
    except Exception:  # unknown here (another registry), or not buildable: keep it unchecked
        logger.debug("cannot check model spec %s", _describe_spec(spec), exc_info=True)
        return spec
    expected = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    problems = _differences(expected, shapes, names=("spec", "model"))
    problems += _tree_differences(_module_tree(skeleton), _module_tree(model))
    if not problems:
        return spec
    logger.warning(
        "the model no longer matches how create_model built it (%s): %s; the file is written "
        "without that model spec, so load it into the model itself: load_sparse(path, model)",
        _describe_spec(spec),
        "; ".join(problems),
    )
    return None


# Non-floating dtypes a .fsp stores (raw bytes); every floating and complex dtype is stored too.
_STORED_INTEGER_DTYPES = frozenset(
    {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
)


def _listing(items: list[str]) -> str:
    """The first five of ``items``, and how many more."""
    return ", ".join(items[:5]) + (f" (+{len(items) - 5} more)" if len(items) > 5 else "")


def _refuse_sharded(named: Iterable[tuple[str, Tensor]]) -> None:
    """Raise when a tensor is a ``DTensor`` (FSDP2, tensor parallelism): each rank holds a part.

    Raises:
        ValueError: naming the tensor and the way to save a sharded model.
    """
    for name, tensor in named:
        if is_dtensor(tensor):
            raise ValueError(
                f"{name!r} is sharded across processes (a DTensor: FSDP2 or tensor "
                "parallelism), and each rank holds only its part; gather whole tensors on "
                "every rank first (pruner.dense_state_dict(pruned=True, full=True) while a "
                "Pruner is attached; after finalize, torch.distributed.checkpoint's "
                "get_model_state_dict with full_state_dict=True), then save that state_dict "
                "from rank 0 (docs/distributed.md)"
            )


def _check_storable(name: str, tensor: Tensor) -> None:
    """Raise a ``TypeError`` naming the entry if the format cannot store ``tensor``."""
    _refuse_sharded([(name, tensor)])
    if tensor.layout != torch.strided:
        raise TypeError(
            f"state_dict entry {name!r} is a {str(tensor.layout).removeprefix('torch.')} tensor; "
            "a .fsp stores dense (strided) tensors and finds their zeros itself: pass "
            "tensor.to_dense()"
        )
    dtype = tensor.dtype
    if not (tensor.is_floating_point() or tensor.is_complex() or dtype in _STORED_INTEGER_DTYPES):
        raise TypeError(
            f"state_dict entry {name!r} has dtype {_dtype_name(dtype)}, which a .fsp does not "
            "store; it stores floating-point, complex, bool, uint8 and int8 to int64 tensors: "
            "convert it first, e.g. tensor.to(torch.int64)"
        )
    if tensor.device.type == "meta":
        raise TypeError(
            f"state_dict entry {name!r} is on the meta device (shapes, no values): "
            "load or initialise the weights before saving them"
        )


def _pruner_hint(model: object) -> str:
    """What to save instead, when ``model`` is a Pruner (imported lazily: errors only)."""
    from feather_sparse.pruner import Pruner

    if isinstance(model, Pruner):
        return "; to save a Pruner's model, call pruner.finalize() and save pruner.model"
    return ""


def _pruned_weights(model: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """The tensors a Pruner's parametrization holds in ``model``, by plain name.

    Maps ``<layer>.weight`` to the layer and ``"weight"``, for every name under
    which the layer is registered (a layer shared by two names is listed
    twice, as ``state_dict`` lists it). Other parametrizations are not listed.
    """
    from feather_sparse.pruner import FeatherParametrization  # lazily, as _pruner_hint

    out: dict[str, tuple[nn.Module, str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if not parametrize.is_parametrized(module):
            continue
        plists: Any = module.parametrizations
        for tensor_name, plist in plists.items():
            if any(isinstance(p, FeatherParametrization) for p in plist):
                out[f"{name}.{tensor_name}" if name else tensor_name] = (module, tensor_name)
    return out


def _attached_message(names: list[str]) -> str:
    """``"the model still has a Pruner attached (layers a, b, …; never finalized)"``."""
    layers = [name.rpartition(".")[0] or name for name in names]
    shown = ", ".join(layers[:3]) + (", …" if len(layers) > 3 else "")
    return f"the model still has a Pruner attached (layers {shown}; never finalized)"


def _zero_fraction(tensors: list[Tensor]) -> float:
    tensors = list({id(t): t for t in tensors}.values())  # a tied weight once
    zeros = sum(int(torch.count_nonzero(t == 0)) for t in tensors)
    return zeros / max(sum(t.numel() for t in tensors), 1)


@torch.no_grad()
def _state_as_finalized(model: nn.Module) -> tuple[dict[str, Tensor], list[str]]:
    """``model.state_dict()`` with the keys ``Pruner.finalize()`` would leave, and what changed.

    Each weight a Pruner's parametrization holds — listed under its plain
    name ``<layer>.weight`` while the Pruner is attached (module
    :mod:`~feather_sparse.plain_keys`), or as
    ``<layer>.parametrizations.weight.original`` and the rest of that
    parametrization's entries when those hooks are gone — is given under its
    plain name as what the forward computes from it now — ``P_T(w)`` at the
    thresholds in use, in a tensor of its own — where the first of those
    entries was. The model is not changed.

    Returns:
        The ``state_dict``, and the plain names of the weights computed so
        (empty when no Pruner is attached).
    """
    state = model.state_dict()
    pruned = _pruned_weights(model)
    if not pruned:
        return state, []
    # "<layer>.parametrizations.weight." starts every entry of that parametrization
    prefixes = {
        plain.removesuffix(tensor_name) + f"parametrizations.{tensor_name}.": plain
        for plain, (_, tensor_name) in pruned.items()
    }
    out: dict[str, Tensor] = {}
    computed: dict[int, Tensor] = {}  # by the original's id: a tied weight is computed once
    for key, value in state.items():
        plain = key if key in pruned else None  # the dense weight under its plain key
        if plain is None:
            plain = next((p for prefix, p in prefixes.items() if key.startswith(prefix)), None)
        if plain is None:
            out[key] = value
        elif plain not in out:
            module, tensor_name = pruned[plain]
            plist: Any = getattr(module.parametrizations, tensor_name)
            original = id(getattr(plist, "original", plist))
            if original not in computed:
                # a tensor of its own: the operator may reuse its output memory
                computed[original] = getattr(module, tensor_name).detach().clone()
            # tied holders get the one tensor, as the plain model's state_dict gives them
            out[plain] = computed[original]
    return out, list(pruned)


def _storage_key(tensor: Tensor) -> tuple[Any, ...] | None:
    """What makes two ``state_dict`` entries one tensor (a tied weight), or ``None``.

    Two entries are stored once when they view the same memory the same way:
    the same storage, offset, shape, strides, dtype and device, and the same
    conjugate and negative bits (``z.conj()`` reads ``z``'s memory as other
    values). Overlapping views that differ (a slice of another entry) are
    stored each on its own; so are empty tensors and tensor subclasses (a
    ``DTensor``'s storage is its shard's).
    """
    if type(tensor) not in (Tensor, nn.Parameter) or tensor.numel() == 0:
        return None
    return (
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
        tensor.device,
        tensor.is_conj(),  # z.conj() views z's memory but holds other values
        tensor.is_neg(),  # so does z.conj().imag (a negative view)
    )


def _encode_tensor(name: str, tensor: Tensor, values: str) -> tuple[TensorRecord, bytes]:
    """The record and the stored bytes of one state_dict tensor."""
    t = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous()  # values, not views
    raw = _raw_bytes(t)
    floating = t.is_floating_point() and t.element_size() in _BITS_DTYPES
    nonzero = _bits(t) != 0 if floating else None
    nnz = int(torch.count_nonzero(t if nonzero is None else nonzero))
    shape, dtype = tuple(t.shape), _dtype_name(t.dtype)
    dense = (TensorRecord(name, shape, dtype, nnz, crc32=zlib.crc32(raw)), raw)
    if nonzero is None or t.numel() == 0 or nnz == t.numel():
        return dense

    value_dtype = t.dtype
    if t.element_size() > 2 and values != "fp32":
        value_dtype = _VALUE_DTYPES[values]
        # A value the stored precision rounds to +0 is stored as a zero, so that the
        # record counts the non-zeros load_sparse gives back (its integrity check).
        nonzero &= _bits(t.to(value_dtype)) != 0
        nnz = int(torch.count_nonzero(nonzero))
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
    best: tuple[str, str | None, bytes, tuple[int, ...], bytes]
    best = (codec, None, pattern, planes, value_bytes)
    for nm in _nm_candidates(nonzero, shape):  # N:M weights: values + in-group positions
        encoded = _encode_nm(t, nm)
        if encoded is None:
            continue
        positions, nm_values = encoded
        nm_planes, nm_value_bytes = _encode_values(nm_values.to(value_dtype))
        if len(positions) + len(nm_value_bytes) < len(best[2]) + len(best[4]):
            best = (NM_CODEC, str(nm), positions, nm_planes, nm_value_bytes)
    codec, nm_pattern, pattern, planes, value_bytes = best
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
        nm_pattern=nm_pattern,
    )
    return record, payload


#: Most threads :func:`save_sparse` encodes tensors in (fewer when
#: ``torch.get_num_threads()`` is lower, e.g. under ``OMP_NUM_THREADS=1``).
#: Each thread holds one tensor's encoding buffers at a time.
SAVE_THREADS = 4


def _encode_tensors(
    entries: list[tuple[str, Tensor, tuple[Any, ...] | None]], values: str
) -> dict[str, tuple[TensorRecord, bytes]]:
    """:func:`_encode_tensor` of each entry that is not the same tensor as an earlier one.

    In up to :data:`SAVE_THREADS` threads: the compressors (lzma, zlib) and
    torch's kernels release the GIL, and each tensor is encoded alone, so the
    records and bytes are those of one thread. An error is that of the first
    failing entry in order, as it would be encoded one by one.
    """
    seen: set[tuple[Any, ...]] = set()
    todo: list[tuple[str, Tensor]] = []
    for name, tensor, key in entries:
        if key is None or key not in seen:
            todo.append((name, tensor))
            if key is not None:
                seen.add(key)
    threads = min(SAVE_THREADS, torch.get_num_threads(), len(todo))
    if threads <= 1:
        return {name: _encode_tensor(name, tensor, values) for name, tensor in todo}
    with ThreadPoolExecutor(threads, thread_name_prefix="save_sparse") as pool:
        results = pool.map(lambda item: _encode_tensor(item[0], item[1], values), todo)
        return {name: result for (name, _), result in zip(todo, results, strict=True)}


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
    is bit-exact.

    Call ``Pruner.finalize()`` first. A model whose Pruner is still attached
    is saved as its forward computes now, with a warning: each pruned weight
    is ``P_T(w)`` at the thresholds in use (exact zeros), under its plain name
    (``<layer>.weight``), so that the file loads into the plain model, as it
    would after ``finalize()`` — which, unlike this, recomputes the thresholds
    at the target sparsity. Other parametrizations are saved as they are
    (the model's own ``state_dict`` keys).

    Args:
        model: the model (or a ``state_dict``); a model wrapped by
            ``torch.compile`` is saved as the model it wraps (plain keys).
            When it came from ``create_model`` its ``feather_model_spec`` is
            stored, so ``load_sparse(path)`` can rebuild it; a model changed
            since (a new head, say), whose tensors that spec no longer
            builds, is saved without it, with a warning (load it with
            ``load_sparse(path, model)``).
        path: the file to write (conventionally ``*.fsp``); written atomically.
        values: precision of the stored non-zeros: ``"fp32"`` (lossless),
            ``"fp16"`` or ``"bf16"``.
        metadata: extra JSON-serializable information stored in the header
            (read it back with :func:`inspect_sparse`).

    Returns:
        The description of the written file.

    Raises:
        TypeError: if ``model`` is neither an ``nn.Module`` nor a mapping,
            ``metadata`` is not a mapping, or a tensor is of a kind the format
            does not store (a sparse layout, or an unsigned dtype wider than 8
            bits); the message names it.
        ValueError: for an unknown ``values``, metadata that is not
            JSON-serializable, values that overflow float16, or a ``path``
            named as an ONNX model (``*.onnx``: ONNX is written by
            :func:`~feather_sparse.export.export_onnx`).
        OSError: if ``path`` is a directory, cannot be written (for a full
            disk, ``errno.ENOSPC``) or holds a file that is not a ``.fsp``
            (``FileExistsError``: a training checkpoint, an ONNX model, a text
            file, a file of unknown kind; an empty file is replaced); an
            existing file at ``path`` is then left as it was.

    Example:
        >>> model = nn.Linear(64, 64)
        >>> with torch.no_grad():
        ...     model.weight[model.weight.abs() < 0.1] = 0
        >>> info = save_sparse(model, tmp_path / "model.fsp")  # doctest: +SKIP
        >>> load_sparse(tmp_path / "model.fsp", nn.Linear(64, 64))  # doctest: +SKIP
    """
    _check_byte_order()
    if not isinstance(model, nn.Module | Mapping):
        raise TypeError(
            "model must be an nn.Module or a state_dict (a mapping of names to tensors), got "
            f"{type(model).__name__}" + _pruner_hint(model)
        )
    if values not in _VALUE_DTYPES:
        raise ValueError(f"values must be one of {sorted(_VALUE_DTYPES)}, got {values!r}")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise TypeError(
            "metadata must be a mapping of names to JSON values, e.g. {'epoch': 3}, got "
            f"{type(metadata).__name__} {metadata!r}"
        )
    metadata = dict(metadata or {})
    try:
        json.dumps(metadata)
    except (TypeError, ValueError) as err:
        raise ValueError(f"metadata must be JSON-serializable: {err}") from None
    check_writable(path)  # the name as given: "out/" names a folder
    target = Path(path)

    if isinstance(model, nn.Module):
        model = _unwrap_compiled(model)  # torch.compile: the keys of the model itself
        _refuse_sharded(
            (name, t) for name, t in (*model.named_parameters(), *model.named_buffers())
        )
        state, attached = _state_as_finalized(model)
        if attached:
            logger.warning(
                "%s: %s; saved as its forward computes now: P_T(w) at the thresholds in use "
                "(sparsity %.4f of those weights) under the plain names, so the file loads into "
                "the plain model (pruner.finalize() first bakes the target sparsity)",
                target,
                _attached_message(attached),
                _zero_fraction([state[name] for name in attached]),
            )
        spec = _fitting_spec(model, state)
    else:
        state, spec = dict(model), None

    entries: list[tuple[str, Tensor, tuple[Any, ...] | None]] = []
    for name, tensor in state.items():
        if not isinstance(tensor, Tensor):
            raise ValueError(f"state_dict entry {name!r} is not a tensor ({type(tensor).__name__})")
        _check_storable(name, tensor)
        entries.append((name, tensor, _storage_key(tensor)))
    encoded = _encode_tensors(entries, values)

    records: list[TensorRecord] = []
    chunks: list[bytes] = []
    stored: dict[tuple[Any, ...], TensorRecord] = {}  # by _storage_key: tied weights once
    for name, _, key in entries:
        if key is not None and key in stored:  # the same tensor as an earlier entry
            first = stored[key]
            record = TensorRecord(
                name, first.shape, first.dtype, first.nnz, first.crc32, alias_of=first.name
            )
            payload = b""
        else:
            record, payload = encoded[name]
            if key is not None:
                stored[key] = record
        records.append(record)
        chunks.append(payload)

    header = _header_bytes(records, values, spec, metadata)
    _safetensors("safetensors")  # the reader needs it: fail before writing, as documented
    data = _container(
        {HEADER_KEY: header, DATA_KEY: chunks},
        _container_metadata(__version__, file_version(records)),
    )
    write_atomic(target, data)
    info = _parse_header(str(target), header, target.stat().st_size)
    logger.info(
        "wrote %s: %d bytes (%s than dense, %.3fx the bound H(d)*N + raw values)",
        target,
        info.file_bytes,
        smaller_or_larger(info.dense_bytes, info.file_bytes, digits=1),
        info.file_bytes / max(info.entropy_bound_bytes, 1.0),
    )
    return info


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def _read(
    path: str | os.PathLike[str], with_data: bool, content: bytes | None = None
) -> tuple[SparseFileInfo, bytes]:
    """The file's description and (when asked) its data bytes, with clear errors.

    ``content``, when given, is the file's bytes, read already: they are parsed
    with the same checks, and the file is not opened again (so that a caller
    that hashes them records the hash of exactly what was loaded).
    """
    p = Path(path)
    if content is not None:
        safetensors = _safetensors("safetensors")
        try:
            return _parse_container(p, with_data, *_entries_of(safetensors, content))
        except safetensors.SafetensorError as err:
            raise ValueError(
                f"{p} is not a readable feather-sparse checkpoint (truncated or corrupted?): {err}"
            ) from None
    if p.is_dir():
        raise IsADirectoryError(
            errno.EISDIR,
            f"{p} is a folder, not a sparse checkpoint; give the .fsp file "
            f"(a training run keeps it as {p / 'model.fsp'})",
        )
    if not p.exists():
        raise FileNotFoundError(f"sparse checkpoint {str(p)!r} does not exist")
    if not p.is_file():
        raise ValueError(f"{p} is not a regular file, so not a sparse checkpoint")
    kind = sniff(p)
    if kind == "zip":
        raise ValueError(
            f"{p} is a PyTorch checkpoint, not a sparse checkpoint; "
            f"make one with: feather-sparse export {p} -o model.fsp"
        )
    if kind is None and is_onnx(p):
        raise ValueError(
            f"{p} is an ONNX model, not a sparse checkpoint: give a .fsp file "
            "(feather-sparse export RUN -o model.fsp writes one); an ONNX model runs in onnxruntime"
        )
    if kind != "safetensors":
        raise ValueError(
            f"{p} is not a readable feather-sparse checkpoint (truncated or corrupted, or another "
            "kind of file): it does not start with a safetensors header"
        )
    # after the checks that need no safetensors: a missing path, a folder or another
    # kind of file is named as such, also where the package is not installed
    safetensors = _safetensors("safetensors")
    safe_open, SafetensorError = safetensors.safe_open, safetensors.SafetensorError
    try:
        with safe_open(str(p), framework="pt", device="cpu") as f:
            return _parse_container(
                p,
                with_data,
                f.metadata() or {},
                set(f.keys()),
                lambda key: _raw_bytes(f.get_tensor(key)),
                p.stat().st_size,
            )
    except SafetensorError as err:
        raise ValueError(
            f"{p} is not a readable feather-sparse checkpoint (truncated or corrupted?): {err}"
        ) from None


def _entries_of(
    safetensors: Any, content: bytes
) -> tuple[dict[str, str], set[str], Callable[[str], bytes], int]:
    """What :func:`_parse_container` reads, from a whole file's bytes in memory.

    ``safetensors.deserialize`` checks the container as ``safe_open`` does
    (the same reader) and raises its ``SafetensorError`` for a damaged one;
    the ``__metadata__`` is then read from the JSON header it accepted.
    """
    entries = {name: bytes(entry["data"]) for name, entry in safetensors.deserialize(content)}
    length = int.from_bytes(content[:8], "little")
    outer = json.loads(content[8 : 8 + length]).get("__metadata__") or {}
    return outer, set(entries), entries.__getitem__, len(content)


def _parse_container(
    p: Path,
    with_data: bool,
    outer: dict[str, str],
    keys: set[str],
    blob: Callable[[str], bytes],
    size: int,
) -> tuple[SparseFileInfo, bytes]:
    """The checks of a ``.fsp``'s container: its metadata, entries, header and data size.

    Args:
        p: the file, for the messages.
        with_data: read the data bytes too.
        outer: the safetensors ``__metadata__``.
        keys: the names of the safetensors entries.
        blob: the bytes of an entry, by name.
        size: the file's size in bytes.
    """
    _check_format(str(p), outer)
    if not {HEADER_KEY, DATA_KEY} <= keys:
        raise ValueError(f"{p}: the file is corrupted (entries {sorted(keys)})")
    info = _parse_header(str(p), blob(HEADER_KEY), size)
    # The safetensors metadata has no checksum of its own: it must repeat
    # the checksummed header exactly, or a damaged byte there goes unseen.
    if outer != _container_metadata(info.library_version, info.format_version):
        raise ValueError(
            f"{p}: the file is corrupted (its safetensors metadata {outer} does not "
            "match its header)"
        )
    data = blob(DATA_KEY) if with_data else b""
    if with_data and len(data) != sum(r.stored_bytes for r in info.tensors):
        raise ValueError(f"{p}: the file is corrupted (data size does not match the header)")
    return info, data


def inspect_sparse(path: str | os.PathLike[str]) -> SparseFileInfo:
    """Describe a sparse checkpoint from its header (no tensor is decoded).

    Args:
        path: the ``.fsp`` file.

    Raises:
        FileNotFoundError: if the file does not exist.
        IsADirectoryError: if ``path`` is a folder.
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
    if record.nm_pattern is not None:
        return _decode_nm_record(record, payload, dtype)
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


def _decode_nm_record(record: TensorRecord, payload: bytes, dtype: torch.dtype) -> Tensor:
    """Rebuild an N:M record: ``N`` values per group and their packed in-group positions."""
    assert record.nm_pattern is not None and record.values_dtype is not None
    try:
        values = _decode_values(
            payload[record.pattern_bytes :],
            record.value_planes,
            record.value_count,
            _dtype_from_name(record.values_dtype),
        )
        out = _decode_nm(
            payload[: record.pattern_bytes],
            values,
            record.shape,
            NMPattern.parse(record.nm_pattern),
            dtype,
        )
    except ValueError as err:
        raise ValueError(f"tensor {record.name!r}: {err}") from None
    if int((_bits(out) != 0).sum()) != record.nnz:
        raise ValueError(f"tensor {record.name!r}: N:M values do not have {record.nnz} non-zeros")
    return out


def _decode_all(info: SparseFileInfo, data: bytes) -> dict[str, Tensor]:
    """Every tensor of the file; a damaged one is an error naming the file and the tensor."""
    state: dict[str, Tensor] = {}
    offset = 0
    for record in info.tensors:
        size = record.stored_bytes
        if record.alias_of is not None:  # the same tensor under a second key, as saved
            state[record.name] = state[record.alias_of]
            continue
        try:
            state[record.name] = _decode_record(record, data[offset : offset + size])
        except ValueError as err:
            raise ValueError(f"{info.path}: {err}") from None
        offset += size
    return state


def load_sparse_state_dict(
    path: str | os.PathLike[str],
) -> tuple[dict[str, Tensor], SparseFileInfo]:
    """Read a sparse checkpoint into a dense ``state_dict`` (CPU tensors).

    Args:
        path: the ``.fsp`` file.

    Returns:
        The ``state_dict`` (entries in their saved order and dtypes) and the
        file's description.

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: for a truncated or corrupted file or another format version.
    """
    _check_byte_order()
    info, data = _read(path, with_data=True)
    return _decode_all(info, data), info


def _differences(
    expected: Mapping[str, tuple[int, ...]],
    declared: Mapping[str, tuple[int, ...]],
    names: tuple[str, str] = ("model", "file"),
) -> list[str]:
    """What differs between a model's tensors (``expected``) and a file's (``declared``).

    Both map ``state_dict`` keys to shapes; the answer is empty when they agree.
    ``names`` are what the two sides are called in the answer.
    """
    ours, theirs = names
    missing = [k for k in expected if k not in declared]
    unexpected = [k for k in declared if k not in expected]
    shapes = [
        f"{k}: {theirs} {declared[k]} vs {ours} {expected[k]}"
        for k in expected
        if k in declared and declared[k] != expected[k]
    ]

    problems = []
    if shapes:
        problems.append(f"shape mismatch: {_listing(shapes)}")
    if missing:
        problems.append(f"missing from the {theirs}: {_listing(missing)}")
    if unexpected:
        problems.append(f"not in the {ours}: {_listing(unexpected)}")
    return problems


def _check_architecture(model: nn.Module, info: SparseFileInfo, hint: str = "") -> None:
    """Raise a ``ValueError`` naming every difference between the file's tensors and the model's.

    Reads shapes only, so ``model`` may live on the ``meta`` device.
    """
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    declared = {r.name: r.shape for r in info.tensors}
    problems = _differences(expected, declared)
    if not problems:
        return
    if any("parametrizations." in k for k in set(expected) ^ set(declared)):
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
    the model's own parameters and buffers (keeping its device and dtypes);
    the model's train/eval mode is left as it is. A model wrapped by
    ``torch.compile`` is loaded through the model it wraps.

    A model built on the ``meta`` device (``with torch.device("meta"):``, to
    build a large model without allocating it) gets the file's tensors instead,
    on the CPU and in the model's own dtypes, as
    ``load_state_dict(..., assign=True)`` gives them (tied weights stay tied);
    move it with ``model.to(device)`` afterwards. A meta tensor the file does
    not hold (a non-persistent buffer) cannot be filled: such a model is
    refused before anything changes.

    Args:
        path: a file written by :func:`save_sparse`.
        model: the model to load into. ``None`` rebuilds it with
            ``create_model`` from the model spec stored in the file, in the
            dtypes of the file's tensors (a float64 or float16 model comes
            back as it was saved, bit for bit).

    Returns:
        The model with the checkpoint's weights.

    Raises:
        TypeError: if ``model`` is neither an ``nn.Module`` nor ``None``.
        FileNotFoundError: if the file does not exist.
        IsADirectoryError: if ``path`` is a folder.
        ValueError: for a truncated or corrupted file, another format version,
            a model of another architecture (checked before the model is
            built when ``model`` is ``None``), ``model=None`` with a file
            that has no model spec, or whose spec does not build its tensors,
            or a model with a tensor on the meta device that the file does not
            hold.
    """
    return _load_sparse(path, model)


def _load_sparse(
    path: str | os.PathLike[str], model: nn.Module | None, content: bytes | None = None
) -> nn.Module:
    """:func:`load_sparse`; from ``content``, the file's bytes read already, when given."""
    _check_byte_order()
    if model is not None and not isinstance(model, nn.Module):
        hint = (
            f"; to build a registered model by name, pass create_model({model!r})"
            if isinstance(model, str)
            else ""
        )
        raise TypeError(
            "model must be the nn.Module to load into, or None to rebuild the model from the "
            f"file's model spec; got {type(model).__name__}{hint}"
        )
    info, data = _read(path, with_data=True, content=content)
    info = _without_compile_prefix(info)
    if model is None:
        model = _model_from_spec(info)
    target = _unwrap_compiled(model)
    _check_architecture(target, info)
    state = _decode_all(info, data)
    _materialize_meta(target, state, info.path)
    target.load_state_dict(state, strict=True)
    return model


def _materialize_meta(model: nn.Module, state: Mapping[str, Tensor], path: str) -> None:
    """Give each ``meta`` parameter and buffer of ``model`` its file tensor, in place.

    A model built on the meta device (shapes, no memory) has nothing to copy
    into: each such tensor is replaced by the file's, on the CPU and in the
    model's own dtype, as ``load_state_dict(..., assign=True)`` would, except
    that a tensor the model shares between modules (tied weights) stays one
    tensor, and one the model does not share is never tied by the file.
    A meta tensor that the file does not hold (a non-persistent buffer) cannot
    be given values: the model is refused before anything is changed.
    """
    slots_of: list[tuple[dict[str, Any], str, str]] = []  # (slots, attribute, state key)
    for module_name, module in model.named_modules(remove_duplicate=False):
        owner = module_name + "." if module_name else ""
        for slots in [module._parameters, module._buffers]:
            for name, tensor in slots.items():
                if isinstance(tensor, Tensor) and tensor.is_meta:
                    slots_of.append((slots, name, owner + name))
    if not slots_of:
        return
    unfilled = sorted({key for _, _, key in slots_of if key not in state})
    if unfilled:
        shown = ", ".join(unfilled[:5]) + (
            f" (+{len(unfilled) - 5} more)" if len(unfilled) > 5 else ""
        )
        raise ValueError(
            f"cannot load {path} into a model on the meta device: {shown} "
            f"{'is' if len(unfilled) == 1 else 'are'} on the meta device and not stored in the "
            "file (non-persistent buffers), so nothing would give them values; build the model "
            "on a real device (or call model.to_empty(device='cpu') and initialise those "
            "buffers) before load_sparse"
        )
    new: dict[int, Tensor] = {}  # by the meta tensor: a tied one gets one real tensor
    used: set[int] = set()  # the memory of file tensors given out already (aliases share it)
    for slots, name, key in slots_of:
        meta = slots[name]
        if id(meta) not in new:
            value = state[key].detach()
            value = value.to(meta.dtype) if value.dtype != meta.dtype else value
            memory = value.untyped_storage().data_ptr()
            if memory in used:
                value = value.clone()  # the file ties what this model keeps apart
            else:
                used.add(memory)
            if isinstance(meta, nn.Parameter):
                value = nn.Parameter(value, requires_grad=meta.requires_grad)
            new[id(meta)] = value
        slots[name] = new[id(meta)]


_COMPILED_PREFIX = "_orig_mod."


def _without_compile_prefix(info: SparseFileInfo) -> SparseFileInfo:
    """``info`` with the ``_orig_mod.`` prefix dropped when every tensor name has it.

    Files saved from a model wrapped by ``torch.compile``, before
    :func:`save_sparse` unwrapped it, name every tensor so; they load into the
    plain model.
    """
    if not info.tensors or not all(r.name.startswith(_COMPILED_PREFIX) for r in info.tensors):
        return info
    tensors = tuple(
        dataclasses.replace(
            r,
            name=r.name.removeprefix(_COMPILED_PREFIX),
            alias_of=None if r.alias_of is None else r.alias_of.removeprefix(_COMPILED_PREFIX),
        )
        for r in info.tensors
    )
    return dataclasses.replace(info, tensors=tensors)


def _model_from_spec(info: SparseFileInfo) -> nn.Module:
    """Build the model the file's spec names, once its tensors are known to fit it.

    The spec is first built on the ``meta`` device (shapes, no memory) and
    checked against the tensors the header declares, so a spec that does not
    fit (a width that makes a 600 MB model, say) fails before anything is
    allocated. The model is then built, and its floating-point parameters and
    buffers given the dtypes of the file's tensors, so that loading is bit-exact.
    """
    spec = info.model_spec
    if not spec or "name" not in spec:
        raise ValueError(
            f"{info.path} has no model spec (the model did not come from create_model, or was "
            "changed since); pass the model to load into: load_sparse(path, model)"
        )

    name, kwargs = str(spec["name"]), dict(spec.get("kwargs") or {})
    skeleton = _meta_model(spec)
    if skeleton is not None:  # else the check runs after the real build
        _check_architecture(
            skeleton,
            info,
            hint=" (the file's model spec does not fit its own tensors: the model was changed "
            "after create_model built it, a new head say, or the header was edited; load it "
            "into the model it was saved from: load_sparse(path, model))",
        )
    try:
        model = models.create_model(name, **kwargs)
    except TypeError as err:
        raise ValueError(
            f"{info.path}: its model spec {_describe_spec(spec)} cannot be built ({err})"
        ) from None
    _cast_to_file_dtypes(model, info)
    return model


def _cast_to_file_dtypes(model: nn.Module, info: SparseFileInfo) -> None:
    """Give each floating parameter and buffer of ``model`` its file tensor's dtype, in place.

    ``create_model`` builds in the default dtype (float32); a model saved in
    float64, float16 or bfloat16 (or partly so) is loaded back in its own
    dtypes instead of being rounded into float32. Tensors the file stores in
    the model's dtype are left alone, so a float32 model is built as before.
    """
    dtypes = {r.name: _dtype_from_name(r.dtype) for r in info.tensors}
    cast: dict[int, Tensor] = {}  # a buffer shared by two modules is cast once, kept shared
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        for slots in (module._parameters, module._buffers):
            for name, tensor in slots.items():
                dtype = dtypes.get(prefix + name)
                if tensor is None or dtype is None or tensor.dtype == dtype:
                    continue
                if not (tensor.is_floating_point() and dtype.is_floating_point):
                    continue  # load_state_dict converts (or refuses) as it always did
                with torch.no_grad():
                    if isinstance(tensor, nn.Parameter):
                        tensor.data = tensor.data.to(dtype)  # the same Parameter object
                    else:
                        if id(tensor) not in cast:
                            cast[id(tensor)] = tensor.to(dtype)
                        slots[name] = cast[id(tensor)]
