"""Backbones: where the thresholds come from.

Feather is a module that any magnitude-pruning framework can use (§3 of the
paper); the framework — here called the *backbone* — decides, at each update,
one threshold per prunable tensor from the current weights and the sparsity
the schedule requests. The Pruner then hands each threshold to the operator.

A backbone is an object with the methods of :class:`Backbone`. Backbones with
trainable state (ASL+) expose it through :meth:`Backbone.parameters` and
:meth:`Backbone.regularizer`; the others return nothing there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from feather_sparse.registry import Registry
from feather_sparse.selection import kth_magnitude, select_threshold

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["BACKBONES", "Backbone", "GlobalBackbone", "PruneTarget"]


class PruneTarget:
    """One prunable tensor as the backbones see it.

    Args:
        name: the module's qualified name in the model (``"layer1.0.conv1"``).
        module: the module that owns the weight.
    """

    def __init__(self, name: str, module: nn.Module) -> None:
        self.name = name
        self.module = module

    @property
    def weight(self) -> Tensor:
        """The stored (dense, trainable) weight, whether or not a parametrization is attached."""
        parametrizations: Any = getattr(self.module, "parametrizations", None)
        if parametrizations is not None and "weight" in parametrizations:
            original: Tensor = parametrizations["weight"].original
            return original
        weight: Any = self.module.weight
        return weight

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.weight.shape)

    @property
    def numel(self) -> int:
        return self.weight.numel()

    def __repr__(self) -> str:
        return f"PruneTarget({self.name!r}, shape={self.shape})"


class Backbone:
    """Interface of a threshold source. Subclass and register in ``BACKBONES``.

    Lifecycle: the Pruner calls :meth:`setup` once with its targets, then
    :meth:`thresholds` at every update.

    Sharded weights (FSDP2, DTensor): a backbone that sets ``supports_sharding``
    receives each rank's *local shards* in :meth:`thresholds`, with
    ``process_group`` set to the group they are sharded over, and must return
    the same thresholds on every rank (reduce its statistics over the group).
    The Pruner refuses sharded weights for the others.
    """

    name = "backbone"
    #: Whether :meth:`thresholds` handles local shards plus ``process_group``.
    supports_sharding = False
    #: The group the weights given to :meth:`thresholds` are sharded over (None: not sharded).
    process_group: ProcessGroup | None = None

    def setup(self, targets: Sequence[PruneTarget]) -> None:
        """Called once, before the first :meth:`thresholds`, with the prunable tensors."""
        self.targets = list(targets)

    def thresholds(self, weights: Sequence[Tensor], sparsity: float) -> list[Tensor]:
        """One 0-d threshold per weight (same order) for the requested overall ``sparsity``."""
        raise NotImplementedError

    def parameters(self) -> list[nn.Parameter]:
        """Trainable parameters of the backbone (give them to an optimizer); none by default."""
        return []

    def regularizer(self) -> Tensor | None:
        """An extra loss term to add to the task loss, or None."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue identically after a restart."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def config(self) -> dict[str, Any]:
        """A JSON-able description; ``BACKBONES.get(config["name"])(**rest)`` rebuilds it."""
        return {"name": self.name}


class GlobalBackbone(Backbone):
    """One threshold for all prunable tensors: the paper's main backbone.

    ``T`` is the exact k-th smallest magnitude over every prunable weight,
    ``k = round(s·N)`` (:func:`feather_sparse.selection.select_threshold`),
    found without sorting or concatenating, warm-started from the previous
    ``T``. The authors' released code takes the linearly interpolated quantile
    of a full sort instead, which lies between the k-th and (k+1)-th
    magnitudes; both prune the same weights when magnitudes are distinct.

    Args:
        process_group: the ``torch.distributed`` group over which the weights
            are *sharded*, when each rank holds different weights of one model
            (e.g. layers split over ranks by hand): ``T`` is then the exact
            k-th magnitude of their union, the same on every rank, found
            without gathering the weights. Leave it ``None`` for replicated
            weights (DDP: each rank already computes the identical ``T``) and
            for FSDP2/DTensor weights (the Pruner sets their group itself).
    """

    name = "global"
    supports_sharding = True

    def __init__(self, process_group: ProcessGroup | None = None) -> None:
        self.process_group = process_group
        self._last: float | None = None
        self._width = 0.01

    def thresholds(self, weights: Sequence[Tensor], sparsity: float) -> list[Tensor]:
        t = select_threshold(
            weights,
            sparsity,
            hint=self._last,
            hint_width=self._width,
            process_group=self.process_group,
        )
        value = float(t)
        if self._last is not None and self._last > 0 and value > 0:
            # Next window: a few times the last relative move, so a steady ramp
            # lands inside it in one pass, but never narrower than 0.1 %.
            move = abs(value - self._last) / self._last
            self._width = min(0.25, max(1e-3, 4 * move))
        self._last = value
        return [t] * len(weights)


BACKBONES: Registry[type[Backbone]] = Registry("backbone")
BACKBONES.register("global", GlobalBackbone)


def layer_thresholds_at_most(
    weights: Sequence[Tensor],
    max_sparsity: float,
    process_group: ProcessGroup | None = None,
) -> list[Tensor]:
    """Per tensor, the magnitude below which at most ``max_sparsity`` of it lies.

    Used by the Pruner's layer-collapse guard: capping a layer's threshold at
    this value keeps at least ``N_l - floor(max_sparsity·N_l)`` of its weights.
    With ``process_group``, ``weights`` are local shards and ``N_l`` the
    layer's size over all ranks.
    """
    numels = [w.numel() for w in weights]
    if process_group is not None:
        import torch.distributed as dist

        device = weights[0].device if weights else torch.device("cpu")
        total = torch.tensor(numels, dtype=torch.long, device=device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=process_group)
        numels = total.tolist()
    return [
        kth_magnitude([w], math.floor(max_sparsity * n), process_group=process_group)
        for w, n in zip(weights, numels)
    ]
