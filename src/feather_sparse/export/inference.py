"""Sparse inference: CSR-backed Linear and 1×1 convolution layers, and the conversion.

:func:`to_sparse_inference` swaps sufficiently sparse ``nn.Linear`` layers (and
1×1 convolutions) of a finalized model for :class:`SparseLinear` /
:class:`SparsePointwiseConv`, which multiply with ``torch.sparse`` CSR weights
(int32 indices).
"""

from __future__ import annotations

import copy
import functools
import logging
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from feather_sparse._modes import evaluating

__all__ = ["SparseLinear", "SparsePointwiseConv", "to_sparse_inference"]

logger = logging.getLogger(__name__)


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


def _csr_problem(value: object, current: Tensor) -> str | None:
    """Why ``value`` cannot replace the CSR weight ``current`` of a sparse layer, or None.

    Any number of non-zeros is accepted: another model of the same
    architecture, pruned or trained elsewhere, has other ones.
    """
    if not isinstance(value, Tensor):
        return f"is a {type(value).__name__}, not a tensor"
    if value.layout != torch.sparse_csr:
        return (
            f"is a {str(value.layout).removeprefix('torch.')} tensor, not a CSR one (the "
            "state_dict of a model before to_sparse_inference loads into that model, before "
            "converting it)"
        )
    if tuple(value.shape) != tuple(current.shape):
        return f"has shape {tuple(value.shape)}, the layer {tuple(current.shape)}"
    if not value.is_floating_point():
        return f"holds {str(value.dtype).removeprefix('torch.')} values, not floating-point ones"
    return None


def _rebuilt_csr(value: Tensor, like: Tensor) -> Tensor:
    """``value`` as a new CSR tensor in ``like``'s dtype and device, int32 indices, checked."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse CSR tensor support is in beta.*")
        return torch.sparse_csr_tensor(
            value.crow_indices().to(device=like.device, dtype=torch.int32, copy=True),
            value.col_indices().to(device=like.device, dtype=torch.int32, copy=True),
            value.values().detach().to(device=like.device, dtype=like.dtype, copy=True),
            size=tuple(value.shape),
            dtype=like.dtype,
            device=like.device,
            check_invariants=True,  # from a file: indices in range, rows in order
        )


def _check_sparse_entries(
    module: nn.Module, state_dict: Mapping[str, Any], prefix: str, *_: object
) -> None:
    """Before anything is loaded into a converted model, check every sparse layer's CSR weight.

    Registered by :func:`to_sparse_inference` on the model it returns (a
    load-state-dict pre-hook, so it runs before any tensor is copied): a
    weight that cannot load is refused with the model unchanged, not after
    the layers before it were overwritten.

    Raises:
        RuntimeError: naming each sparse weight that cannot load, and why.
    """
    problems = []
    for name, layer in module.named_modules():
        if not isinstance(layer, _CsrWeightLayer):
            continue
        key = f"{prefix}{name}.weight_csr" if name else f"{prefix}weight_csr"
        if key in state_dict:
            problem = _csr_problem(state_dict[key], layer.weight_csr)
            if problem is not None:
                problems.append(f"{key} {problem}")
    if problems:
        raise RuntimeError(
            f"Error(s) in loading state_dict for {type(module).__name__}: "
            f"{'; '.join(problems)}; nothing was loaded"
        )


class _CsrWeightLayer(nn.Module):
    """What the sparse layers share: a CSR ``weight_csr`` that loads and copies whatever its nnz.

    torch copies a loaded tensor into the buffer in place, which a CSR tensor
    allows only with the same number of non-zeros; and ``copy.deepcopy``
    cannot reach a CSR tensor's storage. Both are done here through the CSR
    components (row pointers, column indices, values).
    """

    weight_csr: Tensor
    bias_column: Tensor | None

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        key = prefix + "weight_csr"
        if key not in state_dict:
            args = (local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
            super()._load_from_state_dict(state_dict, prefix, *args)
            return
        value = state_dict[key]
        problem = _csr_problem(value, self.weight_csr)
        new = None
        if problem is None:
            try:
                new = _rebuilt_csr(value, self.weight_csr)
            except (RuntimeError, ValueError) as err:
                problem = f"is not a valid CSR tensor ({str(err).splitlines()[0][:200]})"
        if problem is not None:
            error_msgs.append(f"the sparse weight {key} {problem}")
            return  # nothing of this layer is loaded
        rest = {k: v for k, v in state_dict.items() if k != key}
        super()._load_from_state_dict(
            rest, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        if key in missing_keys:
            missing_keys.remove(key)
        assert new is not None
        self.weight_csr = new

    def __deepcopy__(self, memo: dict[int, Any]) -> _CsrWeightLayer:
        """A copy whose CSR weight is rebuilt from copies of its components."""
        cls = type(self)
        copied = cls.__new__(cls)
        memo[id(self)] = copied
        csr = self._buffers["weight_csr"]
        state = {k: v for k, v in self.__dict__.items() if k != "_buffers"}
        buffers = {k: v for k, v in self._buffers.items() if k != "weight_csr"}
        copied.__dict__.update(copy.deepcopy(state, memo))
        copied.__dict__["_buffers"] = copy.deepcopy(buffers, memo)
        if csr is not None:
            copied._buffers["weight_csr"] = torch.sparse_csr_tensor(
                csr.crow_indices().clone(),
                csr.col_indices().clone(),
                csr.values().clone(),
                size=tuple(csr.shape),
                dtype=csr.dtype,
                device=csr.device,
                check_invariants=False,  # a copy of a valid one
            )
            memo[id(csr)] = copied._buffers["weight_csr"]
        return copied


class SparseLinear(_CsrWeightLayer):
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
        """Convert an ``nn.Linear`` (its current weight, parametrized or not).

        Args:
            linear: the layer to convert.
        """
        return cls(linear.weight.detach(), None if linear.bias is None else linear.bias.detach())

    @property
    def nnz(self) -> int:
        """Number of stored non-zeros."""
        return int(self.weight_csr.values().numel())

    def forward(self, x: Tensor) -> Tensor:
        """``x @ W^T + b`` over the last dimension, as ``nn.Linear`` computes it.

        Args:
            x: input of shape ``(..., in_features)``.
        """
        rows = x.reshape(-1, self.in_features)  # (n, in)
        out = _csr_matmul(self.weight_csr, self.bias_column, rows.t())  # (out, n)
        return out.t().contiguous().reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        """The sizes, bias and weight density, shown by ``repr``."""
        density = self.nnz / max(self.in_features * self.out_features, 1)
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias_column is not None}, density={density:.4f}"
        )


class SparsePointwiseConv(_CsrWeightLayer):
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
        """Convert an eligible convolution (see :func:`_is_pointwise_conv`).

        Args:
            conv: the convolution to convert.

        Raises:
            ValueError: if it is not a 1×1, unpadded, single-group convolution.
        """
        if not _is_pointwise_conv(conv):
            raise ValueError(f"{conv} is not a 1x1, unpadded, single-group convolution")
        bias = None if conv.bias is None else conv.bias.detach()
        return cls(conv.weight.detach(), bias, conv.stride)

    @property
    def nnz(self) -> int:
        """Number of stored non-zeros."""
        return int(self.weight_csr.values().numel())

    def forward(self, x: Tensor) -> Tensor:
        """The convolution of ``x``, as the dense 1×1 convolution computes it.

        Args:
            x: input of shape ``(N, in_channels, *spatial)`` or, unbatched,
                ``(in_channels, *spatial)``.
        """
        spatial_dims = len(self.stride)
        batched = x.dim() == spatial_dims + 2
        if not batched:
            x = x.unsqueeze(0)
        if any(s != 1 for s in self.stride):
            index = (slice(None), slice(None), *(slice(None, None, s) for s in self.stride))
            x = x[index]
        n, spatial = x.shape[0], x.shape[2:]
        columns = x.movedim(1, 0).reshape(self.in_channels, -1)  # (in, N·spatial)
        out = _csr_matmul(self.weight_csr, self.bias_column, columns)  # (out, N·spatial)
        out = out.reshape(self.out_channels, n, *spatial).movedim(0, 1).contiguous()
        return out if batched else out.squeeze(0)

    def extra_repr(self) -> str:
        """The channels, stride, bias and weight density, shown by ``repr``."""
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


_CONV_TYPES: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
#: PyTorch modules that read their layers' ``.weight`` instead of calling them:
#: ``nn.MultiheadAttention`` its ``out_proj`` always, ``nn.TransformerEncoderLayer``
#: (and ``nn.TransformerEncoder`` through it) every layer on its inference fast path.
_READ_BY_OWNER: tuple[type[nn.Module], ...] = (nn.MultiheadAttention, nn.TransformerEncoderLayer)


def _why_not_plain(module: nn.Module, owner: nn.Module | None) -> str | None:
    """Why ``module`` (an ``nn.Linear`` or 1×1 convolution) must keep its own class, or None.

    Only a layer whose call computes exactly what its weight and bias say is
    replaced: its class keeps the forward of ``nn.Linear`` (or of
    ``nn.Conv1d/2d/3d``), no instance attribute replaces that forward, it
    carries no forward hooks or pre-hooks of its own, and no ``owner`` (one of
    :data:`_READ_BY_OWNER` holding it) reads its weight instead of calling it.
    """
    if owner is not None:
        return f"it belongs to an nn.{type(owner).__name__}, which reads its weight directly"
    cls = type(module)
    if isinstance(module, nn.Linear):
        own_forward = cls.forward is not nn.Linear.forward
    else:
        base = next(b for b in _CONV_TYPES if isinstance(module, b))
        own_forward = cls.forward is not base.forward or (
            cls._conv_forward is not base._conv_forward  # type: ignore[attr-defined]
        )
    if own_forward:
        return f"its class {cls.__qualname__} has its own forward"
    if "forward" in vars(module):
        return "its forward was replaced on the instance"
    if module._forward_hooks or module._forward_pre_hooks:
        return "it carries forward hooks, which the sparse layer would not run"
    return None


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

    Only a layer whose call computes ``x Wᵀ + b`` (or the plain convolution)
    is replaced, so the converted model computes what the model did. These
    stay dense whatever their sparsity, and the log (level INFO, as for every
    layer left dense) names each with the reason: a subclass that defines its
    own ``forward`` (a subclass that keeps ``nn.Linear``'s forward is
    converted), a layer whose ``forward`` was replaced on the instance, a
    layer carrying forward hooks or pre-hooks, and the layers inside an
    ``nn.MultiheadAttention`` or ``nn.TransformerEncoderLayer`` (these read
    ``out_proj.weight``, and on the encoder layer's inference fast path
    ``linear1.weight``/``linear2.weight``, instead of calling the layer).

    With ``example_input``, the decision is measured instead of guessed:
    each eligible layer is timed dense and sparse on the input it actually
    receives (median of ``repeats``) and converted only if sparse is faster
    (a layer that the input does not reach stays dense).
    That forward runs in eval mode (each module's mode is restored after), so
    it does not update BatchNorm's running statistics.

    The converted layers are inference-only (no gradients to the weights).
    The converted model deep-copies (``copy.deepcopy``; a CSR tensor alone
    does not), and its ``state_dict`` loads into another model converted
    from the same architecture whatever the number of non-zeros of each
    layer; a sparse weight of another shape (or not a CSR tensor) is refused
    with a ``RuntimeError`` before anything of the model is loaded.

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
        TypeError: if ``min_sparsity`` is not a number or ``min_weights`` or
            ``repeats`` not an int.
        ValueError: if ``min_sparsity`` is outside ``[0, 1]`` or ``repeats < 1``.

    Example:
        >>> sparse_model = to_sparse_inference(model.eval(), min_sparsity=0.9)  # doctest: +SKIP
    """
    if isinstance(min_sparsity, bool) or not isinstance(min_sparsity, int | float):
        raise TypeError(f"min_sparsity must be a number in [0, 1] (e.g. 0.9), got {min_sparsity!r}")
    for name, value in (("min_weights", min_weights), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if not 0.0 <= min_sparsity <= 1.0:
        raise ValueError(f"min_sparsity must be in [0, 1], got {min_sparsity}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if not inplace:
        model = copy.deepcopy(model)

    owners = {  # each layer inside a module that reads its weight, and that module
        id(sub): owner
        for owner in model.modules()
        if isinstance(owner, _READ_BY_OWNER)
        for sub in owner.modules()
    }
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
        # The zeros counted, then one division (Python's int / int is correctly rounded, so
        # exactly s zeros read as s): 1.0 - 7000/100000 rounds twice, to 0.9299999999999999.
        zeros = numel - int(torch.count_nonzero(weight.detach()))
        sparsity = zeros / numel
        if sparsity >= min_sparsity:
            reason = _why_not_plain(module, owners.get(id(module)))
            if reason is None:
                candidates[name] = module
            else:
                logger.info("%s stays dense: %s", name, reason)

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
        # In eval mode: a training-mode forward would update BatchNorm's running statistics.
        try:
            with evaluating(model), torch.inference_mode():
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
    if not getattr(model, "_feather_checks_sparse_loads", False) and any(
        isinstance(m, _CsrWeightLayer) for m in model.modules()
    ):
        model.register_load_state_dict_pre_hook(_check_sparse_entries)
        object.__setattr__(model, "_feather_checks_sparse_loads", True)
    return model
