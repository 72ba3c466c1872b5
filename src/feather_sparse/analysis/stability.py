"""Mask stability: how the binary sparsity mask changes from epoch to epoch.

The paper's appendix ("Stability of the sparsity mask vs. gradient scaling")
measures the Pearson correlation between the binary mask (1 = weight kept) at
the end of each epoch and the final mask.
:class:`MaskStabilityRecorder` is a training-loop epoch callback
(``feather_sparse.train.train(..., callbacks=[recorder])``) that stores each
epoch's masks as packed bits (one bit per weight).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from feather_sparse.analysis.layers import _effective_weights

__all__ = [
    "MaskCounts",
    "MaskStability",
    "MaskStabilityRecorder",
    "PackedMask",
    "current_masks",
    "mask_pearson",
]

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
        """Pack a boolean (or 0/1) tensor/array of any shape, flattened.

        Args:
            mask: the mask; non-zero entries count as set.
        """
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

    Args:
        model: the model, with a Pruner attached or finalized, or dense.
        pruner: optional; when given (and it has ``targets``), only its layers are
            listed. Without it, every convolution and linear layer is.
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
        """The first epoch from which r stays >= ``level`` to the end (None if never).

        Args:
            level: the Pearson r to reach and keep.
        """
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
        """Store the current masks of ``model`` as those of ``epoch``.

        Args:
            epoch: the epoch the masks belong to (1-based).
            model: the model being trained.
            pruner: optional; when given, only its layers are recorded (see
                :func:`current_masks`).
        """
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
