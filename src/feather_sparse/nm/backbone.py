"""The N:M backbone: plugs the per-group operator into the Pruner.

``Pruner(model, pattern="2:4")`` is ``Pruner(model, sparsity=0.5,
backbone=NMBackbone("2:4"), schedule="constant")``: the backbone's 0-d
"threshold" of each tensor is the *ramp* ``r = s(t) / S`` (the scheduled
sparsity over the pattern's), and its forward computes every group's own
threshold ``T_g`` from the current weights (:func:`~feather_sparse.nm.operator.nm_threshold`),
scaled by ``r``. The schedule therefore decides how the pattern is reached:

- ``"constant"`` (default): the full pattern from the first step;
- ``{"name": "constant", "start": 0.1}``: dense for the first 10 % of the
  steps, then the full pattern;
- ``"cubic"`` (or ``"linear"``): the group thresholds grow from 0 to ``T_g``
  along the ramp, keeping every weight above ``r·T_g`` besides the ``N`` ranked ones.

Because ``T_g`` comes from the weights at each forward, every forward is
exactly N:M (at ``r = 1``) whatever ``update_every``, and a resumed run
needs nothing but the step (the ramp buffers are in the Pruner's state).

Sharding: groups lie within one output row, so a dim-0 shard (FSDP2) holds
whole groups and each rank prunes its own; :meth:`thresholds` needs no
statistics of the weights, hence no communication. A shard that cuts through
the groups (:meth:`NMBackbone.splits_groups`: a Linear stored ``(in, out)``,
or a shard along the inputs, cut off a multiple of ``M``) cannot be computed
alone: under FSDP2, whose forward gathers the whole weight, the Pruner's
other collectives (S-STE's β, the report, ``dense_state_dict``) gather such
a layer whole; under tensor parallelism, whose forward computes shard by
shard, it is refused at attach.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from feather_sparse.backbones import (
    BACKBONES,
    Backbone,
    PruneTarget,
    damaged_state,
    on_device,
    other_model_state,
)
from feather_sparse.distributed import (
    all_reduce_sum,
    is_dtensor,
    shard_cuts,
    to_local,
    whole_on_first,
)
from feather_sparse.nm import fused as _fused
from feather_sparse.nm.fused import FusedNMForward
from feather_sparse.nm.operator import (
    NMPattern,
    _NMThresholdSTE,
    check_layout,
    group_thresholds,
    group_view,
    layer_order,
    nm_keep_mask,
    nm_threshold,
)
from feather_sparse.ops import Operator, ThresholdOperator, apply_function, compute_dtype
from feather_sparse.schedules import ConstantSchedule, Schedule

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["DEFAULT_NM_SCHEDULE", "DEFAULT_PATTERN", "NMBackbone", "NMSettings", "nm_settings"]

#: How a convolution with a kernel of more than one element is grouped (see NMBackbone).
CONV_ORDERS = ("flat", "channels")

#: How the pattern is reached by default: from the first step (see
#: docs/results/nm-ramp.md for the ablation behind the choice).
DEFAULT_NM_SCHEDULE: Schedule = ConstantSchedule()

#: The pattern of an N:M backbone or method given without one.
DEFAULT_PATTERN = "2:4"


class NMBackbone(Backbone):
    """Per-group thresholds of an N:M pattern (see the module docstring).

    Three options make the N:M baselines (:mod:`feather_sparse.nm.methods`)
    settings of this one backbone:

    - ``decay`` ``λ`` (SR-STE): the backward adds ``λ·(1 − mask)⊙w`` to the
      weight's gradient;
    - ``rescale`` (S-STE): the forward is multiplied by a per-tensor
      ``β = ⟨w, S(w)⟩ / ⟨S(w), S(w)⟩`` with ``S`` the soft (p = 1) N:M
      threshold (summed in float64, rounded to float32 once: the same on
      shards as in one process), computed when the pattern is first applied
      and fixed once a training step has run (updates before the first step
      take it again);
    - ``freeze`` (one-shot): the N:M magnitude mask taken when the pattern is
      first applied (again at each update before the first step) is kept for
      the rest of training; the forward is then plain masking (``p`` unused).

    A β or mask taken before the first step from weights of another dtype
    than the forward meets (``model.half()`` after attaching) is taken again
    from the converted weight at that layer's forward, so training is the same
    as for a model converted before attaching (eager forwards; a β or mask
    loaded from a state is kept as loaded).

    ``conv_order`` says how a convolution with a kernel larger than one
    element is grouped. ``"flat"`` (the default): ``m`` consecutive entries of
    the row ``weight.reshape(out, -1)``, i.e. of ``(in_channels/groups, k…)``
    with the kernel innermost. ``"channels"``: ``m`` consecutive input channels
    at each kernel position, i.e. of ``(k…, in_channels/groups)``, the order of
    an implicit GEMM over channels-last data, in which NVIDIA's sparse
    convolution kernels take 2:4 and NVIDIA's ASP and the SR-STE code group
    convolutions. Linear layers and 1×1 convolutions are the same either way.

    Args:
        pattern: ``"2:4"``, ``"1:4"``, ``"4:8"``, … or an
            :class:`~feather_sparse.nm.operator.NMPattern`.
        decay: SR-STE's ``λ`` (0: off), a finite real number ``>= 0`` (NumPy's
            numbers too; not a bool).
        rescale: S-STE's fixed per-tensor ``β`` (``True`` or ``False``).
        freeze: fix the mask when the pattern is first reached (``True`` or ``False``).
        conv_order: ``"flat"`` or ``"channels"`` (see above).

    Raises:
        ValueError: for a bad pattern, a ``decay`` that is not a finite number
            ``>= 0``, a ``rescale`` or ``freeze`` that is not a bool, or an unknown
            ``conv_order``; naming the option and the value given.
    """

    name = "nm"
    supports_sharding = True
    thresholds_are_magnitudes = False

    def __init__(
        self,
        pattern: str | NMPattern = DEFAULT_PATTERN,
        decay: float = 0.0,
        rescale: bool = False,
        freeze: bool = False,
        conv_order: str = "flat",
    ) -> None:
        self.pattern = NMPattern.parse(pattern)
        # Checked, never coerced: bool("false") is True, float(True) is 1.0, and an
        # infinite λ writes NaN into every weight at the first optimizer step.
        if (
            isinstance(decay, bool)
            or not isinstance(decay, numbers.Real)
            or not (math.isfinite(decay) and decay >= 0.0)
        ):
            raise ValueError(
                f"decay must be >= 0, a finite number (0: off; SR-STE uses 2e-4), got {decay!r}"
            )
        for option, value in (("rescale", rescale), ("freeze", freeze)):
            if not isinstance(value, bool | np.bool_):  # NumPy's bool too, as numbers are
                raise ValueError(f"{option} must be True or False, got {value!r}")
        rescale, freeze = bool(rescale), bool(freeze)
        if not isinstance(conv_order, str) or conv_order not in CONV_ORDERS:
            raise ValueError(
                f"conv_order must be one of {', '.join(CONV_ORDERS)}, got {conv_order!r}"
            )
        self.conv_order: str = conv_order
        #: Per layer: how its groups run through its weight (layer_order; set up with the layers).
        self._orders: list[str] = []
        self.decay: float = float(decay)
        self.rescale: bool = rescale
        self.freeze: bool = freeze
        # A frozen mask would be kept per local shard: FSDP2's forward sees the gathered
        # weights, and the Pruner's state holds no sharded masks (tensor parallelism).
        self.supports_sharding = not self.freeze
        self._beta: list[Tensor] | None = None
        self._masks: list[Tensor] | None = None
        self._fused: FusedNMForward | None = None
        self._at_start: bool = True  # no training step yet: β and a frozen mask are still open
        #: The ramp of the last :meth:`thresholds` (below 1: a sparsity below the pattern's).
        self._ramp: float = 1.0
        #: Per layer, the stored weight (its id) and dtype that β and a frozen mask were
        #: taken from before the first step (None: nothing to take again; see :meth:`_retake`).
        self._taken: list[tuple[int, torch.dtype]] | None = None

    def setup(self, targets: Sequence[PruneTarget]) -> None:
        orders = [layer_order(t.module, t.weight, self.conv_order) for t in targets]
        for t, order in zip(targets, orders):
            check_layout(t.name, t.module, t.weight, self.pattern, order)
            # Distributed before attaching (FSDP2 is refused earlier): tensor parallelism,
            # whose forward computes each rank's shard alone
            if is_dtensor(t.weight):
                self._refuse_split_shards(t, order)
        super().setup(targets)
        self._orders = orders
        # a layer not grouped flat computes alone (its groups are not runs of its storage)
        eligible = [
            0 < t.weight.numel() <= _fused.FUSE_MAX_NUMEL and order == "flat"
            for t, order in zip(targets, orders)
        ]
        if sum(eligible) < 2:  # a pass of one layer is that layer alone
            eligible = [False] * len(targets)
        alone = _fused.CACHE_ALONE
        cached = any(eligible) or alone
        self._fused = FusedNMForward(self.pattern, eligible, alone) if cached else None

    def advance(self, step: int, total_steps: int, final_sparsity: float) -> None:
        self._at_start = step == 0
        if step:  # trained since: what was taken is fixed
            self._taken = None
        if not math.isclose(final_sparsity, self.pattern.sparsity, abs_tol=1e-12):
            raise ValueError(
                f"the {self.pattern} pattern prunes {self.pattern.sparsity:g} of the weights, "
                f"but the Pruner's sparsity is {final_sparsity:g}: leave sparsity out "
                f"(pattern={str(self.pattern)!r} implies it)"
            )

    def thresholds(self, weights: Sequence[Tensor], sparsity: float) -> list[Tensor]:
        ramp = sparsity / self.pattern.sparsity
        if ramp > 1.0 + 1e-9:
            raise ValueError(
                f"sparsity {sparsity:g} exceeds the {self.pattern} pattern's "
                f"{self.pattern.sparsity:g}; an N:M pattern fixes the sparsity"
            )
        if ramp >= 1.0:
            # Fixed once training has started; before the first step every update takes
            # them again (the recipe for DDP calls update() once the ranks hold the same
            # weights, which must then get the same β and mask).
            if self.rescale and (self._beta is None or self._at_start):
                self._beta = self._rescale_factors(weights)
                self.release()  # forwards cached without β are stale
            if self.freeze and (self._masks is None or self._at_start):
                self._masks = [self._frozen_mask(i, w) for i, w in enumerate(weights)]
                self.release()  # masked layers take the plain path from now on
            if self._at_start and (self.rescale or self.freeze):
                # the stored weights (``weights`` are detached views): a forward meets those
                self._taken = [(id(t.weight), w.dtype) for t, w in zip(self.targets, weights)]
        # One 0-d tensor per device (the Pruner copies each into its layer's buffer),
        # filled there: a copy from the host would wait for a GPU at every step.
        value = min(ramp, 1.0)
        self._ramp = value  # what check_final tells apart: a finalize below the pattern
        on: dict[torch.device, Tensor] = {}
        for w in weights:
            if w.device not in on:
                on[w.device] = torch.full((), value, dtype=torch.float32, device=w.device)
        return [on[w.device] for w in weights]

    @torch.no_grad()
    def _rescale_factors(
        self, weights: Sequence[Tensor], indices: Sequence[int] | None = None
    ) -> list[Tensor]:
        """S-STE's ``β = ⟨w, S(w)⟩ / ⟨S(w), S(w)⟩`` per tensor (sums over all shards);
        ``indices``: the layers ``weights`` are (default: all, in order).

        Both sums are taken in float64 and β is rounded to float32 once, so that a
        sharded β (per-rank partial sums, all-reduced) equals the one-process β: the
        products of float32 (or half) values are exact in float64 and every term is
        ``≥ 0`` (``S(w)`` has the sign of ``w``), so the sums' rounding, which depends
        on their order, stays orders of magnitude below β's last float32 bit.
        """
        sums = []
        for i, w in zip(range(len(weights)) if indices is None else indices, weights):
            if self.process_group is not None and self.splits_groups(i, self.targets[i].weight):
                w = whole_on_first(self.targets[i].weight, self.process_group)  # a collective
            w = self._grouped(i, w)
            s = nm_threshold(w, self.pattern, p=1.0).to(compute_dtype(w.dtype))
            here = torch.device("cpu") if w.device.type == "mps" else w.device  # no float64 on MPS
            w64, s64 = w.to(here, torch.float64), s.to(here, torch.float64)
            sums.append(torch.stack([(w64 * s64).sum(), (s64 * s64).sum()]))
        both = torch.stack(sums)  # (tensors, 2), float64
        if self.process_group is not None:
            import torch.distributed as dist

            dist.all_reduce(both, group=self.process_group)
        # An all-zero tensor has S = 0: β = 1 leaves it as it is.
        beta = torch.where(both[:, 1] > 0, both[:, 0] / both[:, 1].clamp_min(1e-300), 1.0)
        return [b.to(device=w.device, dtype=torch.float32) for b, w in zip(beta, weights)]

    @torch.no_grad()
    def _frozen_mask(self, index: int, weight: Tensor) -> Tensor:
        """One-shot's N:M magnitude mask of tensor ``index``, shaped like ``weight``."""
        grouped = self._grouped(index, weight)
        return self._ungrouped(index, nm_keep_mask(grouped, self.pattern)[0].reshape(grouped.shape))

    def _retake(self, index: int, weight: Tensor) -> None:
        """β and the frozen mask of layer ``index`` taken again from ``weight``, when they
        were taken before the first step from weights of another dtype.

        ``model.half()`` (or ``.to(torch.bfloat16)``, ``.double()``) after attaching
        converts the weights but reaches no state of the backbone; taken from the
        converted weight at its first forward, they are what attaching to the converted
        model gives. Only for the weight they were taken from, converted in place as
        ``nn.Module.to`` does (not a tensor ``torch.func.functional_call`` puts in its
        place), and unsharded weights (a sharded β sums over the ranks).
        """
        if self._taken is None or self.process_group is not None:
            return
        if id(weight) != self._taken[index][0]:
            return
        inference = torch.is_inference_mode_enabled()  # kept tensors are made outside it
        with torch.inference_mode(False) if inference else contextlib.nullcontext():
            if self._beta is not None:
                self._beta[index] = self._rescale_factors([weight], [index])[0]
            if self._masks is not None:
                self._masks[index] = self._frozen_mask(index, weight)
        self._taken[index] = (id(weight), weight.dtype)
        self.release()  # forwards cached with the old β

    def forward_weight(
        self, index: int, weight: Tensor, threshold: Tensor, operator: Operator, theta: float
    ) -> Tensor:
        if not isinstance(operator, ThresholdOperator):
            raise ValueError(
                f"N:M pruning applies the thresholding operators (feather, soft, hard), "
                f"not {operator!r}"
            )
        # compiling first: the check would be traced and guarded (a recompile after step 1)
        if (
            not torch.compiler.is_compiling()
            and self._taken is not None
            and self._taken[index][1] != weight.dtype
        ):
            self._retake(index, weight)
        moved = (self._masks is not None or self._beta is not None) and self._follow(
            index, weight.device
        )
        if self._orders and self._orders[index] != "flat":  # groups not runs of the storage
            grouped = nm_threshold(
                self._grouped(index, weight),
                self.pattern,
                threshold,
                operator.p,
                theta,
                decay=self.decay,
                mask=None if self._masks is None else self._grouped(index, self._masks[index]),
                scale=None if self._beta is None else self._beta[index],
            )
            return self._ungrouped(index, grouped)
        fused = self._fused
        if fused is not None and self._masks is None and fused.usable(index, weight):
            if moved and self._beta is not None:  # the pass computes every small layer at once
                for i in range(len(self._beta)):
                    on_device(self._beta, i, weight.device)
            pre = fused.get(index, weight, threshold, operator.p, self._stored, self._beta)
            if pre is not None:
                # small layers only: the join costs two passes over the weight and
                # keeps a new tensor for the backward; a large layer's Function
                # node costs less than that (and its forward is a view of the cache)
                plain = theta == 1.0 and self.decay == 0.0 and self._beta is None
                if plain and fused.eligible[index] and weight.numel() <= _fused.JOIN_MAX_NUMEL:
                    return _straight_through(pre[0], weight)
                out: Tensor = apply_function(
                    _NMThresholdSTE,
                    weight,
                    threshold.detach(),
                    self.pattern,
                    float(operator.p),
                    float(theta),
                    self.decay,
                    None,
                    None,
                    pre,
                )[0]
                return out
        return nm_threshold(
            weight,
            self.pattern,
            threshold,
            operator.p,
            theta,
            decay=self.decay,
            mask=None if self._masks is None else self._masks[index],
            scale=None if self._beta is None else self._beta[index],
        )

    def swap_forwards(
        self, indices: Sequence[int], thresholds: Sequence[Tensor], p: float
    ) -> dict[int, Tensor]:
        """The fused layers' forwards among ``indices`` in one call (``Pruner.swapped()``).

        What :meth:`forward_weight` gives each of them with θ = 1 under
        ``no_grad``, by :meth:`FusedNMForward.forwards`; empty where the
        layers need more than the plain fused forward (frozen masks, S-STE's
        β, SR-STE's decay). Only fused layers are answered (grouped flat, small
        enough: see ``setup``); the caller asks for the others layer by layer.
        ``swapped()`` has already refused tracing, ``torch.func`` and
        inference mode.

        Args:
            indices: the layers (positions among the targets).
            thresholds: their ramp buffers, in the same order.
            p: the operator's power.
        """
        fused = self._fused
        if fused is None or self._masks is not None or self._beta is not None or self.decay != 0.0:
            return {}
        return fused.forwards(indices, thresholds, p, self._stored())

    def splits_groups(self, index: int, weight: Tensor) -> bool:
        """Whether some rank's shard of layer ``index``'s ``weight`` cuts through its groups.

        The same answer on every rank (it reads the layout, not this rank's
        shard), so a collective that gathers such a layer is called everywhere.
        False for a plain tensor. A dim-0 shard holds whole rows, hence whole
        groups; a cut along a dimension the groups run through keeps them whole
        when it falls on a group boundary of every row. A layout that
        :func:`~feather_sparse.distributed.shard_cuts` cannot tell counts as a split
        (gathering is always right).

        Args:
            index: the layer's position among the targets.
            weight: its stored weight: a plain tensor or a DTensor.
        """
        if not is_dtensor(weight):
            return False
        return _splits_groups(weight, self._orders[index] if self._orders else "flat", self.pattern)

    def _refuse_split_shards(self, target: PruneTarget, order: str) -> None:
        """Raise if the weight of ``target``, distributed before attaching, is in shards
        that split its groups (see :meth:`setup`).

        Raises:
            ValueError: naming the layer, its shards and the fixes.
        """
        weight: Any = target.weight
        if not _splits_groups(weight, order, self.pattern):
            return
        row = math.prod(_in_group_order(torch.empty(weight.shape, device="meta"), order).shape[1:])
        m = self.pattern.m
        raise ValueError(
            f"layer {target.name!r}: its weight {tuple(weight.shape)} is distributed "
            f"(placements {tuple(weight.placements)}) in shards that split its {self.pattern} "
            f"groups (this rank's shard: {tuple(to_local(weight).shape)}). Under tensor "
            "parallelism the forward computes the pruned weight shard by shard, so each shard "
            f"must hold whole groups of M = {m} consecutive inputs: shard this layer along its "
            f"outputs (ColwiseParallel), use a number of processes that cuts its {row} inputs "
            f"at multiples of {m}, or leave it dense (exclude=[{target.name!r}]). (FSDP2, "
            "whose forward gathers the whole weight, takes such layers: there, attach the "
            "Pruner before fully_shard)"
        )

    def check_shard(self, index: int, weight: Tensor) -> None:
        """Raise unless every rank's shard of layer ``index``'s sharded weight holds whole groups.

        Then the forward of each shard alone is the whole weight's forward there.
        The rule is :meth:`splits_groups`'s, read from the layout, so every rank
        gives the same answer: a rank whose own shard holds whole groups raises
        too when another rank's does not (it raised alone before, on 3 or more
        ranks), so that no rank goes on to a collective the others never reach.

        Args:
            index: the layer's position among the targets.
            weight: its stored weight, a DTensor.

        Raises:
            ValueError: naming the layer, the shards and what to do instead.
        """
        d: Any = weight  # a DTensor
        if not self.splits_groups(index, d):
            return
        local, m, name = to_local(d), self.pattern.m, self.targets[index].name
        raise ValueError(
            f"layer {name!r}: the shards of its weight {tuple(d.shape)} (placements "
            f"{tuple(d.placements)}; this rank's shard {tuple(local.shape)}) cut through its "
            f"groups: some rank's shard splits its {self.pattern} groups, so its pruned weight "
            "cannot be computed from the shards outside the forward (the forward gathers the "
            "whole weight and is not affected). Shard the layer along a dimension its groups "
            "do not run through (fully_shard(..., shard_placement_fn=...)), or on a number of "
            f"processes that cuts it at multiples of M = {m}"
        )

    def _follow(self, index: int, device: torch.device) -> bool:
        """Layer ``index``'s kept state (its frozen mask, its β) on ``device`` (see
        :func:`~feather_sparse.backbones.on_device`); whether any of it had to move."""
        moved = False
        for kept in (self._masks, self._beta):
            if kept is not None and kept[index].device != device:
                on_device(kept, index, device)
                moved = True
        return moved

    def _stored(self) -> list[Tensor]:
        return [t.weight for t in self.targets]

    def release(self) -> None:
        """Drop the fused forwards' cache (:mod:`feather_sparse.nm.fused`)."""
        if self._fused is not None:
            self._fused.clear()

    def _grouped(self, index: int, w: Tensor) -> Tensor:
        """Tensor ``index``'s ``w`` in its group order (rows of outputs, the reduction
        innermost): input channels innermost for a convolution grouped by channels,
        transposed for a Linear stored ``(in, out)``, else ``w`` itself."""
        return _in_group_order(w, self._orders[index] if self._orders else "flat")

    def _ungrouped(self, index: int, x: Tensor) -> Tensor:
        """The inverse of :meth:`_grouped`: back to the weight's own layout."""
        order = self._orders[index] if self._orders else "flat"
        if order == "channels":
            return x.movedim(-1, 1)
        return x.t() if order == "transposed" else x

    def keep_mask(self, weight: Tensor, threshold: Tensor, index: int = 0) -> Tensor:
        """Positions the forward keeps, shaped like ``weight`` (``N`` per group at ramp 1).

        Args:
            weight: the stored weight of tensor ``index``.
            threshold: its 0-d threshold, the ramp ``r``.
            index: the tensor's position among the targets.
        """
        if self._masks is not None:
            self._follow(index, weight.device)
            return self._masks[index]
        grouped = self._grouped(index, weight)
        keep, t = nm_keep_mask(grouped, self.pattern)
        if float(threshold) < 1.0:
            x = group_view(grouped.detach(), self.pattern).abs().to(t.dtype)
            keep = keep | (x > t * threshold.to(t.dtype))
        return self._ungrouped(index, keep.reshape(grouped.shape))

    def pruned_mask(
        self, index: int, weight: Tensor, threshold: Tensor, operator: Operator | None = None
    ) -> Tensor:
        """The weights the forward zeroes, shaped like ``weight``.

        For a finite ``p`` every ``|w| <= r·T_g`` (a kept weight tied with ``T_g``
        too); for the hard or a fixed mask the positions not kept; and zero
        weights, wherever they are.

        ``p`` is the operator's: ``operator`` if given, else the one the forward of
        layer ``index`` applies (see :meth:`_power`).

        Args:
            index: the tensor's position among the targets.
            weight: its stored weight.
            threshold: its 0-d threshold, the ramp ``r``.
            operator: the operator the forward applies, or None (the attached one).

        Raises:
            ValueError: when ``p`` is needed (no frozen mask), ``operator`` is None
                and the layer has none attached.
        """
        if self._masks is None and not math.isinf(self._power(index, operator)):
            grouped = self._grouped(index, weight)
            t = group_thresholds(grouped, self.pattern)
            t = t * threshold.to(t.dtype)
            x = group_view(grouped.detach(), self.pattern).abs().to(t.dtype)
            return self._ungrouped(index, (x <= t).reshape(grouped.shape))
        return ~self.keep_mask(weight, threshold, index) | (weight.detach() == 0)

    def _power(self, index: int, operator: Operator | None) -> float:
        """The ``p`` of ``operator``, or of the operator attached to layer ``index``.

        Raises:
            ValueError: when no operator is given and the layer has none attached.
        """
        if operator is None:  # the attached parametrization's own operator: no copy to drift
            plist = self.targets[index].parametrizations()
            attached = None if plist is None else plist._modules.get("0")
            operator = getattr(attached, "operator", None)
        p = getattr(operator, "p", None)
        if p is None:
            raise ValueError(
                f"layer {self.targets[index].name!r} has no operator attached, and which of "
                "its weights an N:M forward zeroes depends on the operator's p: pass "
                "operator= (the thresholding operator the forward applies, pruner.operator)"
            )
        return float(p)

    def report_threshold(self, index: int, weight: Tensor, threshold: Tensor) -> float:
        """The mean group threshold ``r·T_g`` of tensor ``index``.

        Args:
            index: the tensor's position among the targets.
            weight: its stored weight.
            threshold: its 0-d threshold, the ramp ``r``.
        """
        return self.report_thresholds([weight], [threshold], None, [index])[0]

    @torch.no_grad()
    def report_thresholds(
        self,
        weights: Sequence[Tensor],
        thresholds: Sequence[Tensor],
        group: ProcessGroup | None = None,
        indices: Sequence[int] | None = None,
    ) -> list[float]:
        """The mean group threshold ``r·T_g`` of each tensor, summed over the ranks.

        Args:
            weights: this rank's parts of the tensors ``indices``.
            thresholds: their 0-d thresholds, the ramps ``r``.
            group: the group the parts are summed over when they are shards (one
                all-reduce: every rank calls it); None: whole tensors.
            indices: the tensors' positions among the targets; None: all, in order.

        Returns:
            One mean threshold per tensor.
        """
        sums = []
        for i, w in zip(range(len(weights)) if indices is None else indices, weights):
            if w.numel() == 0:  # an empty part (another rank holds the weight)
                sums.append(torch.zeros(2, dtype=torch.float64, device=w.device))
                continue
            _, t = nm_keep_mask(self._grouped(i, w), self.pattern)
            count = t.new_tensor(t.numel(), dtype=torch.float64)
            sums.append(torch.stack([t.double().sum(), count]))
        if not sums:
            return []
        both = all_reduce_sum(torch.stack(sums), group)  # (tensors, 2): Σ T_g, groups
        return [
            float(s / n) * float(r) if n else 0.0 for (s, n), r in zip(both.tolist(), thresholds)
        ]

    def check_final(self, index: int, weight: Tensor) -> None:
        """Raise unless every group of ``weight`` holds at most ``n`` nonzeros.

        Args:
            index: the tensor's position among the targets.
            weight: the weight about to be baked.

        Raises:
            RuntimeError: when ``weight`` holds NaN or inf (a NaN weight makes its
                whole group NaN for a finite ``p``; the Pruner's ``check_finite``
                stops such weights unless turned off), naming the layer.
            ValueError: when the pattern is not fully applied (a ``finalize`` at a
                sparsity below the pattern's, refused also where a frozen one-shot
                mask holds every group to ``n``), or a group would keep more than
                ``n`` nonzeros (a frozen mask that keeps more than ``n`` of ``m``).
        """
        with torch.no_grad():
            grouped = self._grouped(index, weight.detach())
            counts = (group_view(grouped, self.pattern) != 0).sum(dim=1)
        if counts.numel() and int(counts.max()) > self.pattern.n:
            name = self.targets[index].name
            if not bool(torch.isfinite(grouped).all()):  # NaN counts as a nonzero
                raise RuntimeError(
                    f"non-finite weights (NaN or inf) in layer {name!r}: the {self.pattern} "
                    "pattern cannot be baked into it (a group holding a NaN has no threshold). "
                    "A Pruner made with check_finite=False lets such weights through training; "
                    "repair or reload the weights (a checkpoint from before training diverged) "
                    "and call finalize() again"
                )
            kept = f"layer {name!r} would keep {int(counts.max())} nonzeros in a group"
            allows = f"more than the {self.pattern} pattern allows"
            if self._ramp < 1.0:  # finalize(sparsity=...) below the pattern's
                below = self._ramp * self.pattern.sparsity
                raise ValueError(
                    f"{kept} at sparsity {below:g}, {allows}: an N:M Pruner bakes its "
                    f"pattern's sparsity {self.pattern.sparsity:g} and no other (call "
                    "finalize() without sparsity=)"
                )
            if self._masks is not None:  # a loaded mask is checked: changed after loading
                raise ValueError(
                    f"{kept}, {allows}: its frozen one-shot mask keeps more than "
                    f"{self.pattern.n} of every {self.pattern.m} weights, which no mask this "
                    "Pruner takes or loads does; reload the Pruner's state from a checkpoint "
                    "(load_state_dict refuses a damaged mask)"
                )
            raise ValueError(  # at the full pattern every group keeps n: not reachable
                f"{kept} at the pattern's full sparsity, {allows}: please report this bug"
            )
        if self._ramp < 1.0 - 1e-9:  # held to n by a frozen mask (or by the weights): the
            # pattern would be baked, not the sparsity asked for (above the pattern's,
            # thresholds() refused already; within 1e-9 of it: the pattern's, rounded)
            raise ValueError(
                f"finalize(sparsity={self._ramp * self.pattern.sparsity:g}) is refused: an N:M "
                f"Pruner bakes its {self.pattern} pattern's sparsity "
                f"{self.pattern.sparsity:g} and no other (call finalize() without sparsity=); "
                "nothing was baked"
            )

    def state_dict(self) -> dict[str, Any]:
        """β and the frozen masks, in a structure fixed from :meth:`setup` on.

        ``"beta"`` (with ``rescale``) is one 0-d float32 tensor per layer and
        ``"masks"`` (with ``freeze``) one bool tensor shaped like each layer's
        weight, each ``None`` when the option is off; ``"taken"`` says whether
        they hold values yet (False: placeholders, β = 1 and all-False masks, until
        the pattern is first reached). The same keys and tensors whether or not
        they are taken let ``torch.distributed.checkpoint`` load a state saved
        after they were taken into a fresh Pruner's state.
        """
        taken = self._beta is not None or self._masks is not None

        def entry(on: bool, kept: list[Tensor] | None, placeholder: Any) -> list[Tensor] | None:
            if kept is not None:
                return [k.clone() for k in kept]
            return [placeholder(t) for t in self.targets] if on else None

        return {
            "beta": entry(self.rescale, self._beta, _beta_placeholder),
            "masks": entry(self.freeze, self._masks, _mask_placeholder),
            "taken": taken,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore β and the frozen masks, checked against this Pruner's layers first.

        Reads what :meth:`state_dict` writes and the states of earlier versions,
        which had no ``"taken"`` and ``None`` for β and masks not taken yet.

        Args:
            state: a dict :meth:`state_dict` returned.

        Raises:
            ValueError: naming the layer, when a saved mask or β does not fit it
                (a state saved from another model), or is not what :meth:`state_dict`
                writes (a bool mask, which once taken keeps exactly ``n`` of every
                group of ``m`` in the layer's group order; a float β, finite and > 0;
                a bool ``"taken"``, and with it β and the masks of the options that are
                on): the state is damaged. Nothing is changed then.
        """

        def on(key: str, saved: Any) -> list[Tensor] | None:
            if saved is None:
                return None
            if not isinstance(saved, (list, tuple)) or len(saved) != len(self.targets):
                raise other_model_state(
                    f"the N:M backbone's {key!r} holds "
                    f"{len(saved) if isinstance(saved, (list, tuple)) else type(saved).__name__} "
                    f"entries for {len(self.targets)} layers"
                )
            for s, t in zip(saved, self.targets):
                want = tuple(t.weight.shape) if key == "masks" else ()
                if not isinstance(s, Tensor) or tuple(s.shape) != want:
                    got = tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__
                    raise other_model_state(
                        f"the N:M backbone's {key!r} entry of layer {t.name!r} "
                        f"has shape {got}, the layer needs {want}"
                    )
                if key == "masks":
                    bad, got, written = s.dtype != torch.bool, str(s.dtype), "a bool mask"
                else:  # a NaN, zero or negative β would scale the layer's forward unseen
                    value = float(s) if s.is_floating_point() else math.nan
                    bad, got = not (math.isfinite(value) and value > 0), repr(s.item())
                    written = "a float β, finite and > 0"
                if bad:
                    raise damaged_state(
                        f"the N:M backbone's {key!r} entry of layer {t.name!r} is {got}, "
                        f"where state_dict() writes {written}"
                    )
            return [s.to(t.weight.device) for s, t in zip(saved, self.targets)]

        beta, masks = on("beta", state.get("beta")), on("masks", state.get("masks"))
        taken = state.get("taken", beta is not None or masks is not None)  # earlier: None
        if not isinstance(taken, bool):
            raise damaged_state(
                f"the N:M backbone's 'taken' is {taken!r}, where state_dict() writes a bool"
            )
        # States with "taken" hold β and the masks whenever their option is on (placeholders
        # until taken): None there is damage, not an earlier version's "not taken yet".
        if "taken" in state:
            for key, enabled, saved in (
                ("beta", self.rescale, beta),
                ("masks", self.freeze, masks),
            ):
                if enabled and saved is None:
                    raise damaged_state(
                        f"the N:M backbone's {key!r} is {state.get(key, 'missing')}, where "
                        "state_dict() writes one entry per layer"
                    )
        if taken and masks is not None:  # a taken mask keeps exactly n of every m: the forward's
            for i, (mask, t) in enumerate(zip(masks, self.targets)):
                counts = group_view(self._grouped(i, mask), self.pattern).sum(dim=1)
                wrong = counts != self.pattern.n
                if bool(wrong.any()):
                    raise damaged_state(
                        f"the N:M backbone's 'masks' entry of layer {t.name!r} keeps "
                        f"{int(counts[wrong][0])} of {self.pattern.m} weights in a group, where "
                        f"state_dict() writes a mask of the {self.pattern} pattern, exactly "
                        f"{self.pattern.n} of every {self.pattern.m}"
                    )
        self._beta, self._masks = (beta, masks) if taken else (None, None)
        self._taken = None  # kept as loaded
        self.release()

    def config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "pattern": str(self.pattern)}
        if self.decay:
            out["decay"] = self.decay
        if self.rescale:
            out["rescale"] = True
        if self.freeze:
            out["freeze"] = True
        if self.conv_order != "flat":  # written only when set: older configs read as "flat"
            out["conv_order"] = self.conv_order
        return out


BACKBONES.register("nm", NMBackbone)


def _in_group_order(w: Tensor, order: str) -> Tensor:
    """``w`` in the group order of a layer grouped ``order`` (see NMBackbone._grouped)."""
    if order == "channels":
        return w.movedim(1, -1)
    return w.t() if order == "transposed" else w


def _group_dim(dim: int, ndim: int, order: str) -> int:
    """Where dimension ``dim`` of a weight goes in its group order (see :func:`_in_group_order`)."""
    if order == "transposed":
        return 1 - dim
    if order == "channels" and dim >= 1:
        return ndim - 1 if dim == 1 else dim - 1
    return dim


def _splits_groups(weight: Any, order: str, pattern: NMPattern) -> bool:
    """Whether the shards of the DTensor ``weight`` (grouped ``order``) cut through groups.

    In the group order, groups are ``m`` consecutive entries of a row (dims 1…).
    A cut at index ``c`` of dimension ``g >= 1`` falls at flat offset
    ``c · inner`` within each block of that dimension (``inner`` the size of
    the dimensions after it), and blocks repeat every ``size_g · inner``: the
    cut lies on group boundaries everywhere iff both are multiples of ``m``.
    """
    shape = _in_group_order(torch.empty(weight.shape, device="meta"), order).shape
    cuts = shard_cuts(weight)
    if cuts is None:
        # A layout shard_cuts cannot place (FSDP2's _StridedShard of a dimension tensor
        # parallelism shards too): its cuts are unknown, so it keeps the groups whole only
        # when every dimension it shards is the rows'.
        # (_StridedShard is no Shard subclass: read the dimension it names; a placement
        # that names none may cut anywhere.)
        for placement in weight.placements:
            if placement.is_replicate() or placement.is_partial():
                continue
            dim = getattr(placement, "dim", None)
            if not isinstance(dim, int) or _group_dim(dim % weight.dim(), len(shape), order):
                return True
        return False
    m = pattern.m
    for dim, offsets in cuts.items():
        g = _group_dim(dim, len(shape), order)
        if g == 0 or not offsets:  # rows: a group never crosses one
            continue
        inner = math.prod(shape[g + 1 :])
        if any(c * inner % m for c in offsets) or (g > 1 and shape[g] * inner % m):
            return True
    return False


def _beta_placeholder(target: PruneTarget) -> Tensor:
    """S-STE's β of a layer in a state before it is taken (see NMBackbone.state_dict)."""
    return torch.ones((), dtype=torch.float32, device=target.weight.device)


def _mask_placeholder(target: PruneTarget) -> Tensor:
    """A frozen mask in a state before it is taken (see NMBackbone.state_dict)."""
    weight = target.weight
    return torch.zeros(weight.shape, dtype=torch.bool, device=weight.device)


def _straight_through(value: Tensor, weight: Tensor) -> Tensor:
    """``value`` in the forward, the identity from its gradient to ``weight``'s.

    The plain straight-through estimator (θ = 1, no decay) of a forward
    computed already, with two C++ autograd nodes instead of a Python
    Function (its node costs tens of microseconds per layer and step, forward and
    backward, on a model of many small layers), for the small layers of the
    fused pass. The value is bit for bit
    ``value``: ``weight − weight.detach()`` is +0 for every finite weight, and
    ``value`` (an N:M forward without a rescale) holds no −0 that adding +0
    would flip. A non-finite weight gives NaN there, as the operator does for
    p < ∞ (for p = ∞ it passes ±inf); the Pruner stops at such a weight.
    """
    if not (weight.requires_grad and torch.is_grad_enabled()):
        return value.view_as(value)  # a fresh view: never the cached object itself
    return value + (weight - weight.detach())


@dataclass(frozen=True)
class NMSettings:
    """What an N:M pattern makes of a Pruner's settings (see :func:`nm_settings`).

    Attributes:
        pattern: the parsed pattern.
        sparsity: the sparsity it implies, ``(m − n) / m``.
        backbone: the N:M backbone, or its config for the Pruner to build.
        schedule: the schedule given, else :data:`DEFAULT_NM_SCHEDULE`.
    """

    pattern: NMPattern
    sparsity: float
    backbone: NMBackbone | dict[str, Any]
    schedule: Any


def _backbone_pattern(backbone: Any) -> str | NMPattern | None:
    """The pattern an N:M backbone setting names (``None``: not the N:M backbone)."""
    if isinstance(backbone, NMBackbone):
        return backbone.pattern
    if isinstance(backbone, str) and backbone.strip().lower() == NMBackbone.name:
        return DEFAULT_PATTERN
    if isinstance(backbone, Mapping) and str(backbone.get("name", "")).lower() == NMBackbone.name:
        pattern: str | NMPattern = backbone.get("pattern", DEFAULT_PATTERN)
        return pattern
    return None


def nm_settings(
    pattern: str | NMPattern | None,
    sparsity: float | None,
    backbone: Any,
    schedule: Any,
    max_layer_sparsity: float | None,
) -> NMSettings | None:
    """Resolve the settings an N:M ``pattern`` implies, or raise naming the conflict.

    ``pattern`` ``None`` with an N:M backbone takes the backbone's pattern;
    ``None`` with any other backbone is unstructured pruning (returns ``None``).
    The backbone becomes ``{"name": "nm", "pattern": ..., **options}`` (a
    fresh one for every Pruner); an :class:`NMBackbone` object passes through.

    Args:
        pattern: the Pruner's ``pattern`` (``"2:4"``, an
            :class:`~feather_sparse.nm.operator.NMPattern`), or None.
        sparsity: the Pruner's ``sparsity``; None or the pattern's own.
        backbone: the Pruner's ``backbone``: ``"global"`` or the N:M backbone
            (its name, a config mapping or an :class:`NMBackbone`); any other
            contradicts a pattern, and without one means unstructured pruning.
        schedule: the Pruner's ``schedule``; None: :data:`DEFAULT_NM_SCHEDULE`.
        max_layer_sparsity: the Pruner's ``max_layer_sparsity``; must be None.

    Raises:
        ValueError: for a malformed pattern, or a ``sparsity``, backbone or
            ``max_layer_sparsity`` that contradicts it.
    """
    if pattern is None:
        pattern = _backbone_pattern(backbone)
        if pattern is None:
            return None
    nm = NMPattern.parse(pattern)
    if sparsity is not None and (
        isinstance(sparsity, bool)
        or not isinstance(sparsity, (int, float))
        or not math.isclose(float(sparsity), nm.sparsity, abs_tol=1e-12)
    ):
        raise ValueError(
            f"pattern={str(nm)!r} prunes {nm.sparsity:g} of the weights, but sparsity={sparsity!r} "
            "was given: leave sparsity out (the pattern implies it)"
        )
    if max_layer_sparsity is not None:
        raise ValueError("max_layer_sparsity does not apply to an N:M pattern (leave it out)")
    explicit = (
        backbone.pattern
        if isinstance(backbone, NMBackbone)
        else backbone.get("pattern")
        if isinstance(backbone, Mapping)
        else None
    )
    if explicit is not None and NMPattern.parse(explicit) != nm:
        raise ValueError(f"backbone {backbone!r} has another pattern than pattern={str(nm)!r}")
    resolved: NMBackbone | dict[str, Any]
    if isinstance(backbone, NMBackbone):
        resolved = backbone
    elif isinstance(backbone, str) and backbone.strip().lower() in ("global", NMBackbone.name):
        resolved = {"name": NMBackbone.name, "pattern": str(nm)}
    elif isinstance(backbone, Mapping) and _backbone_pattern(backbone) is not None:
        resolved = {**backbone, "name": NMBackbone.name, "pattern": str(nm)}
        # check the options as every backbone's are checked: a misspelled or mistyped one
        # is a ValueError listing the options (a lazy import: pruner_config imports this module)
        from feather_sparse.pruner_config import _build

        _build("backbone", NMBackbone, {k: v for k, v in resolved.items() if k != "name"})
    else:
        raise ValueError(
            f"pattern={str(nm)!r} brings its own per-group thresholds; backbone={backbone!r} "
            "cannot be combined with it (leave backbone out)"
        )
    return NMSettings(
        pattern=nm,
        sparsity=nm.sparsity,
        backbone=resolved,
        schedule=DEFAULT_NM_SCHEDULE if schedule is None else schedule,
    )
