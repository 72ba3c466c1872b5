"""FLOPs of a sparse model: multiply-accumulates per sample, dense and with zeros skipped.

A layer's cost is its multiply-accumulates (MACs) for one input
sample; a sparse layer costs its MACs times the density of the weight its
forward uses (``P_T(w)`` while a Pruner is attached, the stored weight
after ``finalize``). Each weight of a convolution is applied once per output
position (once per *input* position for a transposed convolution) and each
weight of a linear layer once per input row, so ``MACs = uses × params`` and
the sparse count ``uses × nonzeros`` is exact under this convention.

Convention: **the tables of this library report FLOPs as MACs** (one
multiply-accumulate = one FLOP), the convention of the pruning literature the
paper compares against (STR, ST-3; dense ResNet-50 at 224 px is "4.1 GFLOPs",
which is its MAC count). The paper's numbers use it too: GMP at 99 % uniform
sparsity keeps 1 % of ResNet-50's 4.09 G MACs, i.e. ~41 M, the "41 MFLOPs" it
quotes (§ "Accuracy vs. FLOP measurements" of the appendix; counting two
FLOPs per MAC would make it ~82 M). :attr:`FlopsReport.torch_flops` gives the
strict count, ``2 × MACs``, which is what ``torch.utils.flop_counter``
reports; :func:`reference_flops` runs that counter for validation.

Only convolutions (1-3-D, transposed too) and linear layers are counted:
normalisation, activations, pooling and additions are a small fraction of a
CNN's cost and are not affected by weight sparsity; functional matmuls
outside ``nn.Linear`` are not attributed to any layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from feather_sparse._modes import evaluating

__all__ = [
    "FLOP_LAYERS",
    "FlopsReport",
    "LayerFlops",
    "count_flops",
    "reference_flops",
]

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_CONV_T = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
#: Layer types whose cost :func:`count_flops` counts.
FLOP_LAYERS: tuple[type[nn.Module], ...] = (*_CONV, *_CONV_T, nn.Linear)


@dataclass(frozen=True)
class LayerFlops:
    """One layer's cost for one input sample.

    Attributes:
        name: the module's qualified name.
        kind: its class name (``"Conv2d"``).
        shape: the weight's shape.
        params: weights in the layer.
        nonzeros: non-zero entries of the weight the forward uses.
        uses: how often each weight is applied per sample (output positions of
            a convolution, rows of a linear layer's input).
        tied_to: the name of an earlier row whose layer holds the same weight
            tensor (a tied weight), else None. Its MACs count (the layer
            computes), its weights not again in the report's totals.
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    params: int
    nonzeros: int
    uses: int
    tied_to: str | None = None

    @property
    def macs(self) -> int:
        """Dense multiply-accumulates per sample (``uses × params``)."""
        return self.uses * self.params

    @property
    def sparse_macs(self) -> int:
        """Multiply-accumulates with zero weights skipped (``uses × nonzeros``)."""
        return self.uses * self.nonzeros

    @property
    def density(self) -> float:
        """Fraction of non-zero weights."""
        return self.nonzeros / self.params if self.params else 0.0


@dataclass(frozen=True)
class FlopsReport:
    """Per-layer and total cost of a model for one sample of ``input_shape``.

    FLOPs are reported as MACs (see the module docstring); ``torch_flops`` is
    the ``2 × MACs`` count of ``torch.utils.flop_counter``.

    Attributes:
        input_shape: the shape of one sample, without the batch dimension.
        layers: one :class:`LayerFlops` per counted layer, in the model's module
            order (layers the forward did not call are left out).
    """

    input_shape: tuple[int, ...]
    layers: tuple[LayerFlops, ...]

    @property
    def dense_macs(self) -> int:
        """MACs of the dense model (every weight counted)."""
        return sum(layer.macs for layer in self.layers)

    @property
    def sparse_macs(self) -> int:
        """MACs with zero weights skipped."""
        return sum(layer.sparse_macs for layer in self.layers)

    @property
    def torch_flops(self) -> int:
        """Dense FLOPs as ``torch.utils.flop_counter`` counts them: ``2 × dense_macs``."""
        return 2 * self.dense_macs

    @property
    def density(self) -> float:
        """``sparse_macs / dense_macs``: the fraction of the dense cost left."""
        return self.sparse_macs / self.dense_macs if self.dense_macs else 0.0

    @property
    def params(self) -> int:
        """Weights in the counted layers, a tied weight once."""
        return sum(layer.params for layer in self.layers if layer.tied_to is None)

    @property
    def nonzeros(self) -> int:
        """Non-zero weights in the counted layers, a tied weight once."""
        return sum(layer.nonzeros for layer in self.layers if layer.tied_to is None)

    def table(self) -> str:
        """The rows as a Markdown table (MFLOPs = million MACs)."""
        lines = [
            "| layer | kind | shape | density | dense MFLOPs | sparse MFLOPs |",
            "|---|---|---|---:|---:|---:|",
        ]
        for r in self.layers:
            shape = "×".join(map(str, r.shape))
            lines.append(
                f"| {r.name} | {r.kind} | {shape} | {r.density:.2%} "
                f"| {r.macs / 1e6:.4g} | {r.sparse_macs / 1e6:.4g} |"
            )
        lines.append(
            f"| **total** | | | {self.nonzeros / max(1, self.params):.2%} "
            f"| {self.dense_macs / 1e6:.4g} | {self.sparse_macs / 1e6:.4g} |"
        )
        return "\n".join(lines)


def _example_input(
    model: nn.Module, input_shape: Sequence[int] | None, example: Tensor | None
) -> tuple[Tensor, tuple[int, ...]]:
    if (input_shape is None) == (example is None):
        raise ValueError(
            "give exactly one of input_shape (one sample's shape, without the batch "
            "dimension, e.g. (3, 32, 32)) or example (a batch of inputs)"
        )
    if example is not None:
        if example.ndim < 1 or example.shape[0] < 1:
            raise ValueError("example must be a batch of at least one input (batch first)")
        return example, tuple(example.shape[1:])
    shape = tuple(int(s) for s in input_shape or ())
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(
            f"input_shape must be a non-empty shape of positive sizes without the batch "
            f"dimension (e.g. (3, 32, 32)), got {input_shape!r}"
        )
    param = next(iter(model.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    return torch.zeros((1, *shape), device=device, dtype=dtype), shape


def _stored_weight(module: nn.Module) -> Any:
    """The tensor ``module`` keeps its weight in: the parametrization's ``original``
    while one is attached, else ``module.weight``. Layers sharing one weight (tied)
    share this tensor, which is how the analysis counts such a weight once."""
    plist = getattr(getattr(module, "parametrizations", None), "weight", None)
    if plist is not None:  # not module.weight: that would compute the parametrization
        return plist.original
    return getattr(module, "weight", None)


def count_flops(
    model: nn.Module,
    input_shape: Sequence[int] | None = None,
    *,
    example: Tensor | None = None,
) -> FlopsReport:
    """Dense and sparse cost of ``model`` per input sample, per layer and in total.

    Runs one forward pass (in eval mode, without gradients; every module's
    own mode is restored) with hooks on every convolution and linear layer. Each layer's
    density is that of the weight its forward uses, so the count is right both
    during training (a Pruner attached: ``P_T(w)``) and after ``finalize``.
    Costs are per sample of the model's input: a layer applied to several
    pieces of each sample folded into its batch (``(B·T, C, L)`` frames) counts
    all of them, and a layer called twice counts both calls.

    Args:
        model: any model made of ``nn.Conv*``/``nn.Linear`` layers (others are
            run but not counted).
        input_shape: one sample's shape without the batch dimension,
            e.g. ``(3, 32, 32)``; a batch of one zero input is run.
        example: instead of ``input_shape``, a batch of real inputs (costs are
            divided by its batch size). Work that does not depend on the batch
            (a learned query projected once per forward, shape ``(1, Q, d)``) is
            shared by the batch's samples and so counts ``1/B`` of its uses
            here, rounded down (a query of 6 rows with a batch of 4: 1 use a
            sample, where one sample alone takes 6); ``input_shape`` gives the
            cost of one sample alone.

    Returns:
        A :class:`FlopsReport` (MACs per sample; see the module docstring).

    Raises:
        ValueError: for a bad shape, or a model with no counted layer.

    Example:
        >>> conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        >>> count_flops(conv, (3, 16, 16)).dense_macs  # 16·16 positions × 8·3·3·3 weights
        55296
    """
    x, shape = _example_input(model, input_shape, example)
    batch = x.shape[0]
    uses: dict[nn.Module, int] = {}

    def hook(module: nn.Module, inputs: tuple[Any, ...], output: Tensor) -> None:
        if isinstance(module, _CONV):
            # every output position applies every weight once; per sample, so divided
            # by the batch, not the call's first dimension (frames folded into it count)
            positions = output.numel() // (batch * module.out_channels)
        elif isinstance(module, _CONV_T):
            # a transposed conv scatters each input position through every weight
            inp = inputs[0]
            positions = inp.numel() // (batch * module.in_channels)
        else:  # nn.Linear: one use per row of the (..., in_features) input
            positions = output.numel() // (batch * output.shape[-1])
        uses[module] = uses.get(module, 0) + positions

    names = {module: name for name, module in model.named_modules()}
    layers = [m for m in model.modules() if isinstance(m, FLOP_LAYERS)]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} has no convolution or linear layer to count FLOPs of"
        )
    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        with evaluating(model), torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()

    rows = []
    holders: dict[int, str] = {}  # the stored weight's id -> the first row holding it
    with torch.no_grad():
        for module in layers:
            if module not in uses:  # defined but not called in this forward
                continue
            weight: Any = module.weight  # the effective weight (parametrized or not)
            stored = id(_stored_weight(module))
            rows.append(
                LayerFlops(
                    name=names[module],
                    kind=type(module).__name__,
                    shape=tuple(weight.shape),
                    params=weight.numel(),
                    nonzeros=int(torch.count_nonzero(weight)),
                    uses=uses[module],
                    tied_to=holders.get(stored),
                )
            )
            holders.setdefault(stored, names[module])
    return FlopsReport(input_shape=shape, layers=tuple(rows))


def reference_flops(
    model: nn.Module,
    input_shape: Sequence[int] | None = None,
    *,
    example: Tensor | None = None,
) -> int:
    """FLOPs per sample of a forward pass by ``torch.utils.flop_counter.FlopCounterMode``.

    The independent check of :func:`count_flops` on a dense model: for a model
    of convolutions and linear layers it equals ``count_flops(...).torch_flops``
    (= 2 × MACs; the counter ignores weight sparsity and bias additions).

    Args:
        model: the model to run (in eval mode, without gradients; every module's own
            mode is restored).
        input_shape: one sample's shape without the batch dimension; a batch of one
            zero input is run.
        example: instead of ``input_shape``, a batch of real inputs (the count is
            divided by its batch size).
    """
    from torch.utils.flop_counter import FlopCounterMode

    x, _ = _example_input(model, input_shape, example)
    counter = FlopCounterMode(display=False)
    with evaluating(model), torch.no_grad(), counter:
        model(x)
    return counter.get_total_flops() // x.shape[0]
