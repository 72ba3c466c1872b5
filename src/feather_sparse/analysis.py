"""Numbers about sparse models: FLOPs, per-layer sparsity, mask stability.

Everything here computes and returns frozen dataclasses; drawing them is
:mod:`feather_sparse.plots`' job and printing them the caller's.

**FLOPs.** A layer's cost is its multiply-accumulates (MACs) for one input
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

**Mask stability** (paper appendix, "Stability of the sparsity mask vs.
gradient scaling"): the Pearson correlation between the binary mask (1 =
weight kept) at the end of each epoch and the final mask.
:class:`MaskStabilityRecorder` is a training-loop epoch callback
(``feather_sparse.train.train(..., callbacks=[recorder])``) that stores each
epoch's masks as packed bits (one bit per weight).

**Per-layer sparsity distribution** (:func:`layer_sparsity`), for comparing
how backbones spread a global sparsity budget over layers.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

__all__ = [
    "FLOP_LAYERS",
    "Curve",
    "FlopsReport",
    "LayerFlops",
    "LayerSparsity",
    "MaskCounts",
    "MaskStability",
    "MaskStabilityRecorder",
    "PackedMask",
    "SparsityDistribution",
    "count_flops",
    "current_masks",
    "layer_sparsity",
    "mask_pearson",
    "mean_std",
    "reference_flops",
]

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_CONV_T = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
#: Layer types whose cost :func:`count_flops` counts.
FLOP_LAYERS: tuple[type[nn.Module], ...] = (*_CONV, *_CONV_T, nn.Linear)


# ============================================================================ FLOPs
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
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    params: int
    nonzeros: int
    uses: int

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
        """Weights in the counted layers."""
        return sum(layer.params for layer in self.layers)

    @property
    def nonzeros(self) -> int:
        """Non-zero weights in the counted layers."""
        return sum(layer.nonzeros for layer in self.layers)

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


def count_flops(
    model: nn.Module,
    input_shape: Sequence[int] | None = None,
    *,
    example: Tensor | None = None,
) -> FlopsReport:
    """Dense and sparse cost of ``model`` per input sample, per layer and in total.

    Runs one forward pass (in eval mode, without gradients; the mode is
    restored) with hooks on every convolution and linear layer. Each layer's
    density is that of the weight its forward uses, so the count is right both
    during training (a Pruner attached: ``P_T(w)``) and after ``finalize``.

    Args:
        model: any model made of ``nn.Conv*``/``nn.Linear`` layers (others are
            run but not counted).
        input_shape: one sample's shape without the batch dimension,
            e.g. ``(3, 32, 32)``; a batch of one zero input is run.
        example: instead of ``input_shape``, a batch of real inputs (costs are
            divided by its batch size).

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
            # every output position (per sample) applies every weight once
            positions = output.numel() // (output.shape[0] * output.shape[1])
        elif isinstance(module, _CONV_T):
            # a transposed conv scatters each input position through every weight
            inp = inputs[0]
            positions = inp.numel() // (inp.shape[0] * inp.shape[1])
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
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)

    rows = []
    with torch.no_grad():
        for module in layers:
            if module not in uses:  # defined but not called in this forward
                continue
            weight: Any = module.weight  # the effective weight (parametrized or not)
            rows.append(
                LayerFlops(
                    name=names[module],
                    kind=type(module).__name__,
                    shape=tuple(weight.shape),
                    params=weight.numel(),
                    nonzeros=int(torch.count_nonzero(weight)),
                    uses=uses[module],
                )
            )
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
    """
    from torch.utils.flop_counter import FlopCounterMode

    x, _ = _example_input(model, input_shape, example)
    was_training = model.training
    counter = FlopCounterMode(display=False)
    try:
        model.eval()
        with torch.no_grad(), counter:
            model(x)
    finally:
        model.train(was_training)
    return counter.get_total_flops() // x.shape[0]


# ================================================================ layer sparsity
@dataclass(frozen=True)
class LayerSparsity:
    """One layer's share of the sparsity."""

    name: str
    shape: tuple[int, ...]
    params: int
    nonzeros: int

    @property
    def sparsity(self) -> float:
        """Fraction of zero weights."""
        return 1.0 - self.nonzeros / self.params if self.params else 0.0


@dataclass(frozen=True)
class SparsityDistribution:
    """How the zeros are spread over the layers."""

    layers: tuple[LayerSparsity, ...]

    @property
    def params(self) -> int:
        return sum(r.params for r in self.layers)

    @property
    def nonzeros(self) -> int:
        return sum(r.nonzeros for r in self.layers)

    @property
    def sparsity(self) -> float:
        """Overall fraction of zero weights."""
        return 1.0 - self.nonzeros / self.params if self.params else 0.0

    def table(self) -> str:
        """The rows as a Markdown table."""
        lines = ["| layer | shape | params | sparsity |", "|---|---|---:|---:|"]
        for r in self.layers:
            shape = "×".join(map(str, r.shape))
            lines.append(f"| {r.name} | {shape} | {r.params:,} | {r.sparsity:.2%} |")
        lines.append(f"| **total** | | {self.params:,} | {self.sparsity:.2%} |")
        return "\n".join(lines)


def _effective_weights(model: nn.Module, pruner: Any = None) -> list[tuple[str, Tensor]]:
    """``(name, weight the forward uses)`` of the pruned layers.

    With a pruner that lists its ``targets`` (the Pruner does), those layers;
    otherwise every convolution and linear layer of ``model`` (which, after
    ``finalize``, is what a default Pruner pruned).
    """
    names = {module: name for name, module in model.named_modules()}
    targets = getattr(pruner, "targets", None)
    if targets:
        modules = [getattr(t, "module", t) for t in targets]
    else:
        modules = [m for m in model.modules() if isinstance(m, FLOP_LAYERS)]
    out = []
    with torch.no_grad():
        for m in modules:
            weight = getattr(m, "weight", None)
            if isinstance(weight, Tensor):
                out.append((names.get(m, type(m).__name__), weight.detach()))
    if not out:
        raise ValueError(f"{type(model).__name__} has no convolution or linear layer")
    return out


def layer_sparsity(model: nn.Module, pruner: Any = None) -> SparsityDistribution:
    """The sparsity of each pruned layer's effective weight.

    Args:
        model: the model, with a Pruner attached or finalized.
        pruner: optional; when given (and it has ``targets``), only its layers
            are listed. Without it, every convolution and linear layer is.
    """
    rows = [
        LayerSparsity(name, tuple(w.shape), w.numel(), int(torch.count_nonzero(w)))
        for name, w in _effective_weights(model, pruner)
    ]
    return SparsityDistribution(layers=tuple(rows))


# ================================================================ mask stability
# popcount of every byte value, for counting set bits in packed masks
_POPCOUNT8 = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)


@dataclass(frozen=True)
class PackedMask:
    """A binary mask stored one bit per entry (``numpy.packbits``, big-endian bits).

    Attributes:
        bits: the packed bytes (padding bits of the last byte are 0).
        numel: number of entries.
        ones: number of set entries (kept weights).
    """

    bits: bytes
    numel: int
    ones: int

    @classmethod
    def from_tensor(cls, mask: Tensor | np.ndarray) -> PackedMask:
        """Pack a boolean (or 0/1) tensor/array of any shape, flattened."""
        if isinstance(mask, Tensor):
            arr = mask.detach().reshape(-1).to("cpu", torch.bool).numpy()
        else:
            arr = np.asarray(mask).reshape(-1).astype(bool)
        packed = np.packbits(arr)
        return cls(bits=packed.tobytes(), numel=int(arr.size), ones=int(arr.sum()))

    def array(self) -> np.ndarray:
        """The packed bytes as a ``uint8`` array (no copy)."""
        return np.frombuffer(self.bits, dtype=np.uint8)

    def unpack(self) -> np.ndarray:
        """The mask as a flat boolean array."""
        return np.unpackbits(self.array(), count=self.numel).astype(bool)


@dataclass(frozen=True)
class MaskCounts:
    """The four counts that determine the Pearson correlation of two binary masks.

    They add up over layers, so a whole-model correlation is the sum of the
    per-layer counts, with no concatenation.

    Attributes:
        n: entries.
        a: entries set in the first mask.
        b: entries set in the second mask.
        both: entries set in both.
    """

    n: int
    a: int
    b: int
    both: int

    def __add__(self, other: MaskCounts) -> MaskCounts:
        return MaskCounts(
            self.n + other.n, self.a + other.a, self.b + other.b, self.both + other.both
        )

    @property
    def pearson(self) -> float:
        """Pearson's r of the two masks as 0/1 vectors (NaN when one is constant).

        For 0/1 vectors ``cov = both/n − (a/n)(b/n)`` and ``var = (a/n)(1 − a/n)``,
        so ``r = (n·both − a·b) / sqrt(a(n − a)·b(n − b))`` — the phi
        coefficient, computed from exact integer counts.
        """
        num = self.n * self.both - self.a * self.b
        den = self.a * (self.n - self.a) * self.b * (self.n - self.b)
        if den == 0:  # a mask with no variance (all kept, or all pruned)
            return math.nan
        return num / math.sqrt(den)

    @property
    def changed(self) -> float:
        """Fraction of entries that differ between the two masks (Hamming distance / n)."""
        return (self.a + self.b - 2 * self.both) / self.n if self.n else 0.0


def _counts(x: PackedMask, y: PackedMask) -> MaskCounts:
    if x.numel != y.numel:
        raise ValueError(f"masks of different sizes: {x.numel} and {y.numel} entries")
    both = int(_POPCOUNT8[np.bitwise_and(x.array(), y.array())].sum())
    return MaskCounts(n=x.numel, a=x.ones, b=y.ones, both=both)


def _as_packed(mask: Tensor | np.ndarray | PackedMask) -> PackedMask:
    return mask if isinstance(mask, PackedMask) else PackedMask.from_tensor(mask)


def mask_pearson(
    x: Tensor | np.ndarray | PackedMask | Sequence[Tensor | np.ndarray | PackedMask],
    y: Tensor | np.ndarray | PackedMask | Sequence[Tensor | np.ndarray | PackedMask],
) -> float:
    """Pearson correlation of two binary masks (lists of masks count as one mask).

    Args:
        x: a boolean tensor/array, a :class:`PackedMask`, or a list of them
            (e.g. one per layer); treated as one flat 0/1 vector.
        y: the same kind and sizes as ``x``.

    Returns:
        r in ``[-1, 1]``; NaN when either mask is constant (its variance is 0,
        e.g. a dense model's all-kept mask).

    Raises:
        ValueError: when the masks differ in size or number.

    Example:
        >>> mask_pearson(torch.tensor([1, 1, 0, 0]), torch.tensor([1, 0, 1, 0]))
        0.0
    """
    xs: list[Any] = list(x) if isinstance(x, (list, tuple)) else [x]
    ys: list[Any] = list(y) if isinstance(y, (list, tuple)) else [y]
    if len(xs) != len(ys):
        raise ValueError(f"different numbers of masks: {len(xs)} and {len(ys)}")
    total = MaskCounts(0, 0, 0, 0)
    for a, b in zip(xs, ys):
        total = total + _counts(_as_packed(a), _as_packed(b))
    return total.pearson


def current_masks(model: nn.Module, pruner: Any = None) -> list[tuple[str, PackedMask]]:
    """``(layer name, packed mask)`` of each pruned layer: 1 where the forward's weight is non-zero.

    Works for any method that changes the weight the forward uses (the
    Feather Pruner's ``P_T(w)`` is zero exactly where ``|w| <= T``), and for
    a finalized or dense model.
    """
    return [(name, PackedMask.from_tensor(w != 0)) for name, w in _effective_weights(model, pruner)]


@dataclass(frozen=True)
class MaskStability:
    """Mask-stability curves of one run.

    Attributes:
        label: what the run was (e.g. ``"θ=0.5"``).
        epochs: the epochs recorded (1-based, as the training loop counts).
        pearson: Pearson r between each epoch's mask and the final (last
            recorded) mask, over all pruned weights; NaN while a mask is
            constant (before pruning starts).
        changed: fraction of mask entries that flipped since the previous
            recorded epoch (NaN for the first).
        sparsity: fraction of pruned weights at each recorded epoch.
        layers: the layer names.
        layer_pearson: per layer, r against that layer's final mask, per epoch.
    """

    label: str
    epochs: tuple[int, ...]
    pearson: tuple[float, ...]
    changed: tuple[float, ...]
    sparsity: tuple[float, ...]
    layers: tuple[str, ...]
    layer_pearson: tuple[tuple[float, ...], ...]

    def first_epoch_above(self, level: float = 0.99) -> int | None:
        """The first epoch from which r stays >= ``level`` to the end (None if never)."""
        found: int | None = None
        for epoch, r in zip(self.epochs, self.pearson):
            if math.isnan(r) or r < level:
                found = None
            elif found is None:
                found = epoch
        return found


class MaskStabilityRecorder:
    """Records the mask at each epoch end; an epoch callback of the training loop.

    Masks are stored packed, one bit per weight (a 1.1 M-weight ResNet-20
    takes 137 kB per epoch).

    Args:
        label: a name for the run, carried into the result.
        every: record every this many epochs (the last call is always kept as
            the final mask, see :meth:`result`).

    Example:
        >>> recorder = MaskStabilityRecorder("θ=0.5")            # doctest: +SKIP
        >>> train(config, run_dir, callbacks=[recorder])          # doctest: +SKIP
        >>> recorder.result().pearson                             # doctest: +SKIP
    """

    def __init__(self, label: str = "", every: int = 1) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.label = label
        self.every = every
        self.epochs: list[int] = []
        self.masks: list[list[PackedMask]] = []
        self.layers: tuple[str, ...] = ()
        self._pending: tuple[int, list[PackedMask]] | None = None

    def __call__(
        self, epoch: int, model: nn.Module, pruner: Any = None, metrics: Any = None
    ) -> None:
        """The training loop's ``EpochCallback`` signature."""
        self.record(epoch, model, pruner)

    def record(self, epoch: int, model: nn.Module, pruner: Any = None) -> None:
        """Store the current masks of ``model`` as those of ``epoch``."""
        named = current_masks(model, pruner)
        names = tuple(n for n, _ in named)
        if self.layers and names != self.layers:
            raise ValueError(
                f"the pruned layers changed between epochs ({len(self.layers)} before, "
                f"{len(names)} now): record one run per recorder"
            )
        self.layers = names
        masks = [m for _, m in named]
        if epoch % self.every == 0:
            self.epochs.append(epoch)
            self.masks.append(masks)
            self._pending = None
        else:  # keep it in case it is the last one (the final mask)
            self._pending = (epoch, masks)

    @property
    def nbytes(self) -> int:
        """Bytes held by the stored masks."""
        stored = [*self.masks, *([self._pending[1]] if self._pending else [])]
        return sum(len(m.bits) for masks in stored for m in masks)

    def result(self) -> MaskStability:
        """The curves, measured against the last recorded mask.

        Raises:
            ValueError: if nothing was recorded.
        """
        epochs, masks = list(self.epochs), list(self.masks)
        if self._pending is not None:
            epochs.append(self._pending[0])
            masks.append(self._pending[1])
        if not masks:
            raise ValueError("no epoch was recorded: pass the recorder to train(callbacks=...)")
        final = masks[-1]
        pearson, changed, sparsity = [], [], []
        per_layer: list[list[float]] = [[] for _ in self.layers]
        prev: list[PackedMask] | None = None
        for current in masks:
            counts = [_counts(m, f) for m, f in zip(current, final)]
            pearson.append(_sum_counts(counts).pearson)
            for i, c in enumerate(counts):
                per_layer[i].append(c.pearson)
            if prev is None:
                changed.append(math.nan)
            else:
                changed.append(_sum_counts(_counts(m, p) for m, p in zip(current, prev)).changed)
            n = sum(m.numel for m in current)
            sparsity.append(1.0 - sum(m.ones for m in current) / n)
            prev = current
        return MaskStability(
            label=self.label,
            epochs=tuple(epochs),
            pearson=tuple(pearson),
            changed=tuple(changed),
            sparsity=tuple(sparsity),
            layers=self.layers,
            layer_pearson=tuple(tuple(r) for r in per_layer),
        )


def _sum_counts(counts: Iterable[MaskCounts]) -> MaskCounts:
    total = MaskCounts(0, 0, 0, 0)
    for c in counts:
        total = total + c
    return total


# ====================================================================== summaries
def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value); NaN for none."""
    vals = [float(v) for v in values]
    if not vals:
        return math.nan, math.nan
    if len(vals) == 1:
        return vals[0], 0.0
    return statistics.fmean(vals), statistics.stdev(vals)


@dataclass(frozen=True)
class Curve:
    """One line of a results plot: mean ± std of a metric against ``x``.

    Attributes:
        label: the legend entry.
        x: the x values (sparsity, θ, p, MFLOPs, ...).
        mean: the mean over seeds at each x.
        std: the standard deviation over seeds at each x (0 for one seed).
    """

    label: str
    x: tuple[float, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        if not len(self.x) == len(self.mean) == len(self.std):
            raise ValueError(
                f"curve {self.label!r}: x, mean and std differ in length "
                f"({len(self.x)}, {len(self.mean)}, {len(self.std)})"
            )
