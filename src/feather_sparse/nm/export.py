"""N:M weights in the formats that store or run them compactly.

- :func:`encode_nm` / :func:`decode_nm`: a compact, bit-exact N:M encoding
  for checkpoints — per group the ``N`` kept values (in position order) and
  their in-group positions, ``ceil(log2 M)`` bits each, packed into bytes
  (2 bits for 2:4, so a 2:4 fp16 weight takes 1.125 bytes per element
  against 2 dense, 56 %; :func:`nm_encoded_bytes` gives the size). The
  ``.fsp`` format wires these in.
- :func:`to_semi_structured`: the 2:4 Linear layers of a finalized model as
  PyTorch's semi-structured sparse tensors
  (``torch.sparse.to_sparse_semi_structured``), which run on the sparse
  tensor cores of NVIDIA GPUs since Ampere (CUDA, float16/bfloat16).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from feather_sparse._text import count
from feather_sparse.nm.operator import NMPattern, group_view

if TYPE_CHECKING:
    from torch.sparse import SparseSemiStructuredTensor

__all__ = ["decode_nm", "encode_nm", "nm_encoded_bytes", "to_semi_structured"]

logger = logging.getLogger(__name__)


def _pack_bits(values: Tensor, bits: int) -> Tensor:
    """Non-negative ints ``< 2**bits`` (1-d) as a little-endian bit stream in uint8 bytes."""
    shifts = torch.arange(bits, device=values.device)
    stream = ((values.to(torch.int64).unsqueeze(1) >> shifts) & 1).reshape(-1)  # (n·bits,)
    pad = (-stream.numel()) % 8
    stream = torch.cat([stream, stream.new_zeros(pad)]).reshape(-1, 8)
    weights = 1 << torch.arange(8, device=values.device)
    return (stream * weights).sum(1).to(torch.uint8)


def _unpack_bits(packed: Tensor, bits: int, count: int) -> Tensor:
    """Inverse of :func:`_pack_bits`: ``count`` ints of ``bits`` bits, as int64."""
    shifts = torch.arange(8, device=packed.device)
    stream = ((packed.to(torch.int64).unsqueeze(1) >> shifts) & 1).reshape(-1)
    stream = stream[: count * bits].reshape(count, bits)
    return (stream << torch.arange(bits, device=packed.device)).sum(1)


def encode_nm(weight: Tensor, pattern: NMPattern | str) -> tuple[Tensor, Tensor]:
    """Encode a weight with at most ``n`` nonzeros per group compactly and bit-exactly.

    The stored positions of a group are its ``n`` largest magnitudes, the
    lower position first among equal ones (so every nonzero is stored, and
    zeros fill the rest); the other ``m − n`` entries must be ``+0.0``, as
    :meth:`~feather_sparse.pruner.Pruner.finalize` leaves them.

    Args:
        weight: a weight whose rows split into groups of ``pattern.m``.
        pattern: the N:M pattern.

    Returns:
        ``(values, indices)``: ``values`` of shape ``(groups, n)`` in
        ``weight``'s dtype; ``indices`` the in-group positions (increasing
        within each group), ``ceil(log2 m)`` bits each, packed little-endian
        into a 1-d uint8 tensor.

    Raises:
        ValueError: if a group holds more than ``n`` nonzeros or a ``−0.0``
            outside its stored positions (the message says where).
    """
    pattern = NMPattern.parse(pattern)
    groups = group_view(weight.detach(), pattern)  # (G, m)
    # The stored positions: every nonzero, then the first zeros by position, n per
    # group. (Not the training ranking, nm_keep_mask: float64 keys drop the lowest
    # mantissa bits, so a subnormal there may rank with the zeros.)
    nonzero = groups != 0  # NaN counts as a value
    counts = nonzero.sum(1, keepdim=True)
    if bool((counts > pattern.n).any()):
        bad = int((counts.squeeze(1) > pattern.n).nonzero()[0, 0])
        raise ValueError(
            f"group {bad} of a weight of shape {tuple(weight.shape)} holds more than "
            f"{pattern.n} nonzeros, so it is not {pattern}-sparse: finalize the N:M Pruner first"
        )
    zero_rank = (~nonzero).cumsum(1, dtype=torch.int32)  # 1, 2, … along each group's zeros
    keep = nonzero | (zero_rank <= pattern.n - counts)
    dropped = groups[~keep]
    if torch.signbit(dropped).any():
        raise ValueError(
            "a pruned position holds -0.0, which this encoding would restore as +0.0: "
            "write +0.0 there (Pruner.finalize does)"
        )
    positions = keep.nonzero()[:, 1]  # row-major: increasing within each group
    values = groups[keep].reshape(-1, pattern.n)
    return values.clone(), _pack_bits(positions, pattern.index_bits)


def _check_nm_shape(shape: tuple[int, ...] | torch.Size, pattern: NMPattern) -> None:
    """Raise unless a weight of ``shape`` splits into whole N:M groups, as :func:`encode_nm` needs.

    A group is ``m`` consecutive weights of one row (``weight.reshape(out, -1)``,
    see :func:`~feather_sparse.nm.group_view`), so the row length, the product
    of the dimensions after the first, must be a multiple of ``m``. A shape
    whose total size alone is a multiple of ``m`` (``(6, 2)`` for 2:4) would
    decode with groups running across rows: wrong weights, with no error.

    Args:
        shape: the weight's shape.
        pattern: the N:M pattern.

    Raises:
        ValueError: naming the shape, its row length and ``m``.
    """
    dims: tuple[int, ...] = tuple(int(d) for d in shape)
    row, numel = math.prod(dims[1:]), math.prod(dims)
    if len(dims) < 1 or (numel > 0 and row % pattern.m):
        rows = f"its rows hold {count(row, 'weight')}" if len(dims) > 1 else "it has no rows"
        raise ValueError(
            f"a weight of shape {dims} does not split into groups of {pattern.m} ({pattern}): "
            f"{rows} (the product of the dimensions after the first must be a multiple of "
            f"{pattern.m}); give the shape of the weight that encode_nm encoded"
        )


def decode_nm(
    values: Tensor, indices: Tensor, shape: tuple[int, ...] | torch.Size, pattern: NMPattern | str
) -> Tensor:
    """The dense weight that :func:`encode_nm` encoded, bit for bit.

    Args:
        values: ``(groups, n)`` kept values.
        indices: the packed in-group positions.
        shape: the weight's shape.
        pattern: the N:M pattern it was encoded with.

    Raises:
        ValueError: if the rows of ``shape`` (``shape[1:]``) are not whole
            groups of ``m``, the sizes do not fit ``shape`` and ``pattern``, or
            the indices are not what :func:`encode_nm` writes: ``n`` positions
            per group, each below ``m``, in increasing order (so none twice).
    """
    pattern = NMPattern.parse(pattern)
    numel = math.prod(shape)
    groups = numel // pattern.m
    if numel % pattern.m or values.shape != (groups, pattern.n):
        raise ValueError(
            f"values of shape {tuple(values.shape)} do not fit a {pattern} weight of shape "
            f"{tuple(shape)} (expected ({groups}, {pattern.n}))"
        )
    _check_nm_shape(shape, pattern)  # the right size, but are the rows whole groups?
    if indices.numel() * 8 < groups * pattern.n * pattern.index_bits:
        raise ValueError(f"{indices.numel()} index bytes are too few for shape {tuple(shape)}")
    positions = _unpack_bits(indices, pattern.index_bits, groups * pattern.n)
    positions = positions.reshape(groups, pattern.n)
    _check_positions(positions, pattern)
    bits = _BITS_DTYPES.get(values.element_size()) if values.is_floating_point() else None
    if bits is None:
        out = torch.zeros(groups, pattern.m, dtype=values.dtype, device=values.device)
        out.scatter_(1, positions.to(values.device), values)
        return out.reshape(shape)
    # Scatter the bit patterns, not the floats: some kernels (bfloat16 on CPU) rewrite a NaN.
    raw = torch.zeros(groups, pattern.m, dtype=bits, device=values.device)
    raw.scatter_(1, positions.to(values.device), values.contiguous().view(bits))
    return raw.view(values.dtype).reshape(shape)


#: The integer dtype of each element size, to read or move a float's bit pattern unchanged
#: (the .fsp codecs use it too).
_BITS_DTYPES: dict[int, torch.dtype] = {
    1: torch.uint8,
    2: torch.int16,
    4: torch.int32,
    8: torch.int64,
}


def _check_positions(positions: Tensor, pattern: NMPattern) -> None:
    """Raise unless every group's positions are below ``m`` and increasing (as encode_nm writes).

    A position of ``m`` or more would index past its group; a repeated one
    would write two values to one entry and silently lose one of them.
    """
    bad = (positions >= pattern.m).any(1)
    if pattern.n > 1:
        bad |= (positions[:, 1:] <= positions[:, :-1]).any(1)
    if bool(bad.any()):
        group = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"indices are corrupted: group {group} has in-group positions "
            f"{positions[group].tolist()}, but a {pattern} encoding holds {pattern.n} different "
            f"positions below {pattern.m}, in increasing order; pass the indices encode_nm "
            "returned for these values"
        )


def nm_encoded_bytes(numel: int, pattern: NMPattern | str, dtype: torch.dtype) -> int:
    """Bytes of :func:`encode_nm`'s output for ``numel`` weights of ``dtype``.

    Args:
        numel: the number of weights.
        pattern: the N:M pattern, or its ``"N:M"`` string.
        dtype: the weights' dtype.
    """
    pattern = NMPattern.parse(pattern)
    kept = numel // pattern.m * pattern.n
    item = torch.empty((), dtype=dtype).element_size()
    return kept * item + math.ceil(kept * pattern.index_bits / 8)


def _semi_structured_backend(
    device: torch.device | None = None,
) -> type[SparseSemiStructuredTensor]:
    """The ``torch.sparse`` semi-structured tensor class that runs on ``device``'s GPU.

    cuSPARSELt where torch has it (``torch.sparse.to_sparse_semi_structured``
    always picks it, and fails on every layer where it is missing), else
    CUTLASS, whose kernels torch builds for compute capability 8.x only.

    Args:
        device: the CUDA device (the current one by default).

    Raises:
        RuntimeError: where no backend runs on that GPU: below compute
            capability 8.0 (no sparse tensor cores), or CUTLASS alone on a
            GPU other than 8.x (an H100 is 9.0); the message names the fix.
    """
    from torch.sparse import (
        SparseSemiStructuredTensor,
        SparseSemiStructuredTensorCUSPARSELT,
        SparseSemiStructuredTensorCUTLASS,
    )

    major, minor = torch.cuda.get_device_capability(device)
    gpu = f"this GPU (compute capability {major}.{minor})"
    if major < 8:
        raise RuntimeError(
            f"{gpu} has no sparse tensor cores: semi-structured 2:4 sparsity needs compute "
            "capability 8.0 or newer (Ampere, Ada, Hopper); keep the dense N:M weights here"
        )
    if torch.backends.cusparselt.is_available() and not SparseSemiStructuredTensor._FORCE_CUTLASS:
        return SparseSemiStructuredTensorCUSPARSELT
    if major != 8:
        raise RuntimeError(
            f"{gpu} needs cuSPARSELt for semi-structured sparsity: torch's CUTLASS kernels "
            f"run on compute capability 8.x only, and this torch ({torch.__version__}) "
            + (
                "has SparseSemiStructuredTensor._FORCE_CUTLASS set: unset it"
                if torch.backends.cusparselt.is_available()
                else "was built without cuSPARSELt: install a CUDA build of torch that has it "
                "(the pip wheels bring nvidia-cusparselt)"
            )
        )
    return SparseSemiStructuredTensorCUTLASS


def to_semi_structured(model: nn.Module) -> list[str]:
    """Replace the weights of the 2:4-sparse Linear layers by semi-structured sparse tensors.

    Every ``nn.Linear`` whose weight has at most 2 nonzeros in each group of 4
    consecutive input weights gets a ``torch.sparse.SparseSemiStructuredTensor``
    weight (the layer's own forward then runs the sparse kernel); other
    layers, and layers whose shapes the kernels do not support, stay dense.
    The kernels are cuSPARSELt's, or CUTLASS's where torch lacks cuSPARSELt
    (on compute capability 8.x only: torch builds CUTLASS's for no other).

    Args:
        model: a finalized model (no Pruner attached) on a CUDA device, in
            float16 or bfloat16 (``model.half()``).

    Returns:
        The names of the converted layers.

    Raises:
        RuntimeError: without a CUDA device, if a Pruner is still attached, or
            where no semi-structured kernel runs on the model's GPU (below
            compute capability 8.0, or a torch without cuSPARSELt on a GPU
            other than 8.x, such as an H100); the model is then left as it was.
        ValueError: for a Linear weight that is not on CUDA or not float16/bfloat16.
    """
    if not torch.cuda.is_available():
        raise RuntimeError(
            "to_semi_structured needs a CUDA GPU: torch.sparse.to_sparse_semi_structured runs "
            "on NVIDIA sparse tensor cores (Ampere or newer) only. On this machine keep the "
            "dense N:M weights (they run and export as they are), or store them compactly "
            "with encode_nm / the .fsp format"
        )
    pattern = NMPattern(2, 4)
    layers: list[tuple[str, nn.Linear]] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if parametrize.is_parametrized(module, "weight"):
            raise RuntimeError(
                f"layer {name!r} still has a Pruner attached: call pruner.finalize() first"
            )
        w = module.weight
        if w.device.type != "cuda" or w.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(
                f"layer {name!r} is {w.dtype} on {w.device}: semi-structured sparsity needs "
                "float16 or bfloat16 weights on CUDA (model.half().cuda())"
            )
        layers.append((name, module))
    # Every GPU is checked before any layer changes: a layer converted for kernels
    # its GPU lacks would fail at the model's next forward.
    backends = {w.device: _semi_structured_backend(w.device) for w in (m.weight for _, m in layers)}
    converted = []
    done: dict[int, nn.Parameter] = {}  # by the dense weight: layers sharing one stay tied
    for name, module in layers:
        w = module.weight
        if id(w) in done:
            module.weight = done[id(w)]
            converted.append(name)
            continue
        if w.shape[1] % 4 or ((group_view(w, pattern) != 0).sum(1) > 2).any():
            continue
        try:
            # the kernels take a contiguous weight only (a transposed one would stay dense)
            sparse = backends[w.device].from_dense(w.detach().contiguous())
        except (RuntimeError, ValueError) as err:  # shapes the kernels do not support
            logger.info("to_semi_structured: %s stays dense (%s)", name, err)
            continue
        module.weight = done[id(w)] = nn.Parameter(sparse, requires_grad=False)
        converted.append(name)
    return converted
