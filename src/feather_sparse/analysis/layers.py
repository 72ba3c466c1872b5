"""Per-layer sparsity: how a method spreads its sparsity budget over the layers.

The sparsity of the weight each pruned layer's forward uses (``P_T(w)`` while
a Pruner is attached, the stored weight after ``finalize``), for comparing
how backbones spread a global sparsity budget over layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from feather_sparse.analysis.flops import FLOP_LAYERS, _stored_weight

__all__ = [
    "LayerSparsity",
    "SparsityDistribution",
    "layer_sparsity",
]


@dataclass(frozen=True)
class LayerSparsity:
    """One layer's share of the sparsity.

    Attributes:
        name: the layer's qualified name in the model.
        shape: the weight's shape.
        params: the number of weights.
        nonzeros: the number of non-zero weights.
    """

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
    """How the zeros are spread over the layers.

    Attributes:
        layers: one :class:`LayerSparsity` per pruned layer.
    """

    layers: tuple[LayerSparsity, ...]

    @property
    def params(self) -> int:
        """Total number of weights over the layers."""
        return sum(r.params for r in self.layers)

    @property
    def nonzeros(self) -> int:
        """Total number of non-zero weights over the layers."""
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
    ``finalize``, is what a default Pruner pruned). A weight tied to several
    layers is listed once, under the first layer's name, as the Pruner counts it.
    """
    names = {module: name for name, module in model.named_modules()}
    targets = getattr(pruner, "targets", None)
    if targets:
        modules = [getattr(t, "module", t) for t in targets]
    else:
        modules = [m for m in model.modules() if isinstance(m, FLOP_LAYERS)]
    out = []
    seen: set[int] = set()  # a tied weight (one tensor in several layers) counts once
    with torch.no_grad():
        for m in modules:
            weight = getattr(m, "weight", None)
            stored = _stored_weight(m)
            if isinstance(weight, Tensor) and id(stored) not in seen:
                seen.add(id(stored))
                out.append((names.get(m, type(m).__name__), weight.detach()))
    if not out:
        raise ValueError(f"{type(model).__name__} has no convolution or linear layer")
    return out


def layer_sparsity(model: nn.Module, pruner: Any = None) -> SparsityDistribution:
    """The sparsity of each pruned layer's effective weight.

    Args:
        model: the model, with a Pruner attached or finalized.
        pruner: optional; when given (and it has ``targets``), only its layers
            are listed. Without it, every convolution and linear layer is; a
            weight tied to several layers is listed once (the first layer's
            name), as the Pruner counts it.
    """
    rows = [
        LayerSparsity(name, tuple(w.shape), w.numel(), int(torch.count_nonzero(w)))
        for name, w in _effective_weights(model, pruner)
    ]
    return SparsityDistribution(layers=tuple(rows))
