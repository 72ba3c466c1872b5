"""Backbones: where the thresholds come from.

Feather is a module that any magnitude-pruning framework can use (§3 of the
paper); the framework — here called the *backbone* — decides, at each update,
one threshold per prunable tensor from the current weights and the sparsity
the schedule requests. The Pruner then hands each threshold to the operator.

Registered backbones (``BACKBONES``):

- ``"global"`` — one threshold for every tensor, the paper's main backbone.
- ``"uniform"`` — GMP (Zhu & Gupta 2017, "To prune, or not to prune"): every
  tensor pruned at the same ratio, optionally keeping the first conv dense.
- ``"global-flops"`` — ST-3σ (Vanderschueren & De Vleeschouwer 2023): one
  global ranking of ``|w| / s_l`` with ``s_l = 1/sqrt(sum of dimensions)``.
- ``"asl+"`` — ASL (Retsinas, Elafrou, Goumas & Maragos 2021, "Weight Pruning
  via Adaptive Sparsity Loss") with the paper's enhancements (§3): trainable
  per-layer thresholds, a Gaussian sparsity loss whose target follows the
  schedule, and an exact sorting-based correction.
- ``"spartan"`` is registered by :mod:`feather_sparse.baselines`.

A backbone is an object with the methods of :class:`Backbone`. Backbones with
trainable state (ASL+) expose it through :meth:`Backbone.parameters` and
:meth:`Backbone.regularizer`; the others return nothing there. Three optional
hooks serve backbones that need more than one 0-d threshold per tensor (ASL+,
Spartan); their defaults are exactly the plain behaviour:
:meth:`Backbone.advance` (where training stands), :meth:`Backbone.forward_weight`
(what the layer's forward uses) and :meth:`Backbone.pruned_mask` (which
weights count as pruned).

Over 600 lines as one cohesive thing: the interface and the paper's four
backbones, each a small class, with the registry at the bottom.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from feather_sparse.ops import Operator
from feather_sparse.registry import Registry
from feather_sparse.selection import PassStats, kth_magnitude, scaled_magnitudes, select_threshold

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "BACKBONES",
    "ASLPlusBackbone",
    "Backbone",
    "GlobalBackbone",
    "GlobalFlopsBackbone",
    "PruneTarget",
    "UniformBackbone",
    "allocate",
    "flops_scale",
]


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
        plist: Any = self.parametrizations()
        if plist is not None:
            # ``original`` is a Parameter, or a buffer where the weight was a plain tensor
            original = plist._parameters.get("original")
            return plist.original if original is None else original
        weight: Any = self.module.weight
        return weight

    def parametrizations(self) -> nn.Module | None:
        """The ``ParametrizationList`` of the module's ``weight``, or None when not parametrized.

        Read from the modules' own dictionaries: ``nn.Module.__getattr__``
        costs microseconds per lookup, and the Pruner reads every weight at
        every step (tens of layers: a measurable part of a small model's step).
        """
        parametrizations = self.module._modules.get("parametrizations")
        if parametrizations is None:
            return None
        return parametrizations._modules.get("weight")

    @property
    def shape(self) -> tuple[int, ...]:
        """The weight's shape."""
        return tuple(self.weight.shape)

    @property
    def numel(self) -> int:
        """The number of elements of the weight."""
        return self.weight.numel()

    def __repr__(self) -> str:
        return f"PruneTarget({self.name!r}, shape={self.shape})"


class Backbone:
    """Interface of a threshold source. Subclass and register in ``BACKBONES``.

    Lifecycle: the Pruner calls :meth:`setup` once with its targets, then, at
    every update (the first one while attaching), :meth:`advance` followed by
    :meth:`thresholds`.

    Sharded weights (FSDP2, DTensor): a backbone that sets ``supports_sharding``
    receives each rank's *local shards* in :meth:`thresholds`, with
    ``process_group`` set to the group they are sharded over, and must return
    the same thresholds on every rank (reduce its statistics over the group).
    The Pruner refuses sharded weights for the others.
    """

    name = "backbone"
    #: Whether :meth:`thresholds` handles local shards plus ``process_group``.
    supports_sharding = False
    #: Whether :meth:`abs_max` reports what :meth:`thresholds` measured.
    measures_abs_max = False
    #: Whether the 0-d thresholds are magnitudes (compared with ``max |w|`` to
    #: detect layer collapse); the N:M backbone's are ramp factors instead.
    thresholds_are_magnitudes = True
    #: The group the weights given to :meth:`thresholds` are sharded over (None: not sharded).
    process_group: ProcessGroup | None = None

    def setup(self, targets: Sequence[PruneTarget]) -> None:
        """Called once, before the first :meth:`thresholds`, with the prunable tensors.

        Args:
            targets: the Pruner's prunable tensors, in the order of its thresholds.
        """
        self.targets = list(targets)

    def advance(self, step: int, total_steps: int, final_sparsity: float) -> None:
        """Told where training stands, just before every :meth:`thresholds` call.

        Args:
            step: the Pruner's step count (0 while attaching).
            total_steps: the length of training the schedule is laid out on.
            final_sparsity: the Pruner's final target ``S``.

        Backbones with schedules of their own (Spartan's β, its frozen-mask
        phase) or initialised from ``S`` (ASL+) read them here; by default
        nothing happens.
        """

    def thresholds(self, weights: Sequence[Tensor], sparsity: float) -> list[Tensor]:
        """One 0-d threshold per weight (same order) for the requested overall ``sparsity``.

        Args:
            weights: the stored weights of the targets (local shards when
                ``process_group`` is set), in the order :meth:`setup` gave them.
            sparsity: the fraction of all their weights to prune, in ``[0, 1]``.

        Returns:
            One 0-d threshold tensor per weight.
        """
        raise NotImplementedError

    def forward_weight(
        self, index: int, weight: Tensor, threshold: Tensor, operator: Operator, theta: float
    ) -> Tensor:
        """The weight that tensor ``index`` uses in its layer's forward.

        Default: ``operator(weight, threshold, theta)``. The Pruner calls this
        hook only when a backbone overrides it, so the plain path costs nothing.

        Args:
            index: the tensor's position among the targets.
            weight: its stored (dense, trainable) weight.
            threshold: its 0-d threshold from :meth:`thresholds`.
            operator: the Pruner's thresholding operator.
            theta: the gradient scale ``θ`` for the pruned weights.
        """
        return operator(weight, threshold, theta)

    def abs_max(self) -> Tensor | None:
        """Each tensor's ``max |w|`` as measured by the last :meth:`thresholds` call, or None.

        A backbone whose search reads every weight anyway can report it here
        for free (and set ``measures_abs_max = True``); the Pruner then skips
        its own pass for the finite-weight and layer-collapse checks and
        checks after the search instead of before. Default: None (the Pruner
        measures).
        """
        return None

    def pruned_mask(
        self, index: int, weight: Tensor, threshold: Tensor, operator: Operator | None = None
    ) -> Tensor:
        """Which entries of tensor ``index`` the forward zeroes; default ``|w| <= T``.

        ``operator`` is the one the forward applies (the Pruner passes its own), for
        a backbone whose answer depends on it (N:M: on its ``p``); the default
        ignores it.

        Args:
            index: the tensor's position among the targets.
            weight: its stored weight.
            threshold: its 0-d threshold.
            operator: the operator the forward applies, or None.

        Returns:
            A boolean tensor of ``weight``'s shape, True where the entry is zeroed.
        """
        return weight.abs() <= threshold

    def report_threshold(self, index: int, weight: Tensor, threshold: Tensor) -> float:
        """The threshold shown for tensor ``index`` in the Pruner's report; default ``T``.

        Args:
            index: the tensor's position among the targets.
            weight: its stored weight.
            threshold: its 0-d threshold.
        """
        return float(threshold)

    def check_final(self, index: int, weight: Tensor) -> None:
        """Check the weight tensor ``index`` is about to bake (raise if wrong); by default nothing.

        Called by :meth:`~feather_sparse.pruner.Pruner.finalize` before anything
        is baked, so that an error leaves the Pruner attached.

        Args:
            index: the tensor's position among the targets.
            weight: its stored weight.
        """

    def release(self) -> None:
        """Drop memory kept between forwards (on ``finalize``/``remove``); default nothing."""

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
        """Restore what :meth:`state_dict` returned.

        Args:
            state: a dict :meth:`state_dict` returned.
        """

    def config(self) -> dict[str, Any]:
        """A JSON-able description; ``BACKBONES.get(config["name"])(**rest)`` rebuilds it."""
        return {"name": self.name}


class _WarmStart:
    """The previous threshold and a window width, to warm-start the exact selection.

    Affects speed only, never a result (see :func:`feather_sparse.selection.kth_magnitude`).
    """

    def __init__(self) -> None:
        self.hint: float | None = None
        self.width = 0.01

    def update(self, value: float) -> None:
        if self.hint is not None and self.hint > 0 and value > 0:
            # Next window: a few times the last relative move, so a steady ramp
            # lands inside it in one pass, but never narrower than 0.1 %.
            move = abs(value - self.hint) / self.hint
            self.width = min(0.25, max(1e-3, 4 * move))
        self.hint = value


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
    measures_abs_max = True

    def __init__(self, process_group: ProcessGroup | None = None) -> None:
        self.process_group = process_group
        self._warm = _WarmStart()
        self._stats = PassStats()

    def thresholds(self, weights: Sequence[Tensor], sparsity: float) -> list[Tensor]:
        t = select_threshold(
            weights,
            sparsity,
            hint=self._warm.hint,
            hint_width=self._warm.width,
            process_group=self.process_group,
            stats=self._stats,
        )
        self._warm.update(float(t))
        return [t] * len(weights)

    def abs_max(self) -> Tensor | None:
        """``max |w|`` per tensor from the selection's first pass (None if none ran)."""
        out, self._stats.abs_max = self._stats.abs_max, None
        return out


def on_device(kept: list[Tensor], index: int, device: torch.device) -> Tensor:
    """``kept[index]`` on ``device``, moved there (and stored so) when it is elsewhere.

    A backbone's own per-layer state (a frozen mask, a rescale factor) is not a
    buffer of the model, so a model moved after attaching (``model.to("cuda")``)
    would meet it on the old device; the forward passes its weight's device
    here. Per layer: a model split over devices keeps each layer's state where
    its weight is. The copy is made outside ``torch.inference_mode`` (a forward
    in an evaluation block may be the first after the move): the next training
    forward saves it for its backward.
    """
    value = kept[index]
    if value.device != device:
        with outside_inference_mode():
            value = kept[index] = value.to(device)
    return value


def outside_inference_mode() -> contextlib.AbstractContextManager[Any]:
    """Leave ``torch.inference_mode``, where it is on, while a Pruner or a backbone makes
    or writes the tensors it keeps (thresholds, a backbone's state).

    A tensor made in inference mode can neither be written in place outside it nor be
    saved for the backward of a training forward, so a Pruner attached, stepped or loaded
    inside an evaluation block would break the next training step. Checking costs
    nanoseconds; entering the context (microseconds) only happens in inference mode.
    """
    if torch.is_inference_mode_enabled():
        return torch.inference_mode(False)
    return contextlib.nullcontext()


def move_in_place(param: nn.Parameter, device: torch.device) -> None:
    """Move ``param`` and its gradient to ``device``, keeping the object.

    What ``model.to(device)`` does to the model's own parameters, for a
    backbone's trainable state (ASL+'s thresholds), which the move does not
    reach: the optimizer holding ``param`` goes on training the same object.
    ``param.data`` is replaced where torch allows it (between CPU and CUDA, as
    ``nn.Module.to`` does), else the tensors are swapped
    (:func:`torch.utils.swap_tensors`, e.g. to the meta device). Optimizer
    state made before the move (momentum) stays where it was, as for the
    model's own parameters.
    """
    with outside_inference_mode(), torch.no_grad():
        moved = param.to(device)
        grad = None if param.grad is None else param.grad.to(device)
        if torch._has_compatible_shallow_copy_type(param, moved):
            param.data = moved
        else:
            torch.utils.swap_tensors(param, nn.Parameter(moved, param.requires_grad))
        param.grad = grad


def damaged_state(what: str) -> ValueError:
    """The error for a backbone state that is not what its ``state_dict`` writes.

    A backbone's ``load_state_dict`` checks the whole state before it changes
    anything, so the message can promise that nothing was loaded.

    Args:
        what: the entry and what is wrong with it ("the ASL+ backbone's 'sigma'
            must be finite and >= 0, got nan").

    Returns:
        The ``ValueError`` to raise.
    """
    return ValueError(
        f"not a valid Pruner state: {what} (the state is damaged, or was not written by "
        "Pruner.state_dict); nothing was loaded"
    )


def other_model_state(what: str) -> ValueError:
    """The error for a backbone state that does not fit the layers (their number or shapes).

    Args:
        what: the entry and how it differs from the layers ("the Spartan backbone's
            'frozen_masks' entry of layer '2' has shape (8, 64), the layer needs (8, 32)").

    Returns:
        The ``ValueError`` to raise.
    """
    return ValueError(f"Pruner state: {what}: it was saved from another model; nothing was loaded")


def allocate(shares: Sequence[float], sizes: Sequence[int], total: int) -> list[int]:
    """Split ``total`` pruned weights among tensors in proportion to ``shares``, exactly.

    Real counts ``y_l = a·shares_l`` capped at ``sizes_l`` (water-filling: the
    excess of a capped tensor goes to the others in the same proportions), with
    ``a`` chosen so that ``Σ y_l = total``; then whole counts by the largest
    remainder, so that ``Σ k_l = total`` exactly and each ``k_l`` is ``y_l``
    rounded down or up. Tensors with a zero share get nothing unless the others
    cannot hold ``total``; then what is left goes to them by size.

    Args:
        shares: non-negative weights, one per tensor.
        sizes: the tensors' element counts (the caps).
        total: how many to allocate, clipped to ``[0, Σ sizes]``.

    Returns:
        One count per tensor, ``0 <= k_l <= sizes_l``, summing to ``total``.

    Example:
        >>> allocate([1.0, 1.0, 0.0], [10, 30, 5], 20)  # equal shares, the first capped
        [10, 10, 0]
    """
    if len(shares) != len(sizes):
        raise ValueError(f"got {len(shares)} shares for {len(sizes)} tensors")
    if any(not (x >= 0 and math.isfinite(x)) for x in shares):
        raise ValueError(f"shares must be finite and >= 0, got {list(shares)}")
    total = max(0, min(int(total), sum(sizes)))
    real = [0.0] * len(sizes)
    full: set[int] = set()
    left = float(total)
    top = max(shares, default=0.0)
    # Scaled so the largest is 1: sums and ratios then neither overflow nor underflow.
    weights = [x / top for x in shares] if top > 0 else [0.0] * len(shares)
    while left > 0:
        open_ = [i for i in range(len(sizes)) if i not in full]
        if not open_:
            break
        mass = sum(weights[i] for i in open_)
        if mass <= 0:  # only zero shares remain open: fill them by size
            weights = [float(sizes[i]) if i not in full else 0.0 for i in range(len(sizes))]
            mass = sum(weights[i] for i in open_)
        want = {i: left * (weights[i] / mass) for i in open_}
        over = [i for i in open_ if want[i] >= sizes[i]]
        if not over:
            for i in open_:
                real[i] = want[i]
            break
        for i in over:  # cap them and share out the rest again
            real[i] = float(sizes[i])
            full.add(i)
            left -= sizes[i]
    counts = [max(0, min(sizes[i], math.floor(real[i]))) for i in range(len(sizes))]
    # Largest remainder (Hamilton's method) to reach the total exactly; ties go
    # to the earlier tensor. (Removing also covers float rounding in the caps.)
    order = sorted(range(len(sizes)), key=lambda i: (-(real[i] - counts[i]), i))
    missing = total - sum(counts)
    for i in order:
        if missing <= 0:
            break
        if counts[i] < sizes[i]:
            counts[i] += 1
            missing -= 1
    for i in reversed(order):
        if missing >= 0:
            break
        if counts[i] > 0:
            counts[i] -= 1
            missing += 1
    return counts


def _is_conv(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.conv._ConvNd)


class UniformBackbone(Backbone):
    """Every tensor pruned at the same ratio: GMP (Zhu & Gupta 2017).

    Each tensor gets its own exact threshold, the k_l-th smallest of its
    magnitudes, with ``k_l`` the tensor's share of ``K = round(s·N)`` (largest
    remainder, :func:`allocate`): every tensor is within one weight of ratio
    ``s`` and the total is exactly ``K``, as the Pruner guarantees for every
    backbone.

    Args:
        keep_first_dense: leave the first convolution (the first prunable
            conv in ``model.named_modules()`` order, i.e. registration order;
            the first prunable tensor if there is no conv) dense, as the paper
            does with GMP (it has very few weights). The
            other tensors then share the whole budget equally, at ratio
            ``s·N / (N − N_first)``, so the overall sparsity is still ``s``
            (Zhu & Gupta prune each layer at ``s``; the paper compares methods
            at equal overall sparsity). Only if the others cannot hold the
            budget (``s`` above ``1 − N_first/N``) is the first conv pruned too.
    """

    name = "uniform"
    supports_sharding = True  # the counts are of whole tensors; each selection is sharded

    def __init__(self, keep_first_dense: bool = False) -> None:
        if not isinstance(keep_first_dense, bool):
            raise ValueError(f"keep_first_dense must be True or False, got {keep_first_dense!r}")
        self.keep_first_dense = keep_first_dense
        self.dense_index: int | None = None

    def setup(self, targets: Sequence[PruneTarget]) -> None:
        super().setup(targets)
        self.sizes = [t.numel for t in targets]
        self._warm = [_WarmStart() for _ in targets]
        self.dense_index = None
        if self.keep_first_dense:
            convs = [i for i, t in enumerate(targets) if _is_conv(t.module)]
            self.dense_index = convs[0] if convs else 0

    def thresholds(self, weights: Sequence[Tensor], sparsity: float) -> list[Tensor]:
        shares = [float(n) for n in self.sizes]
        if self.dense_index is not None:
            shares[self.dense_index] = 0.0
        counts = allocate(shares, self.sizes, round(sparsity * sum(self.sizes)))
        return _layer_kth(weights, counts, self._warm, self.process_group)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "keep_first_dense": self.keep_first_dense}


def _layer_kth(
    weights: Sequence[Tensor],
    counts: Sequence[int],
    warm: list[_WarmStart],
    process_group: ProcessGroup | None = None,
) -> list[Tensor]:
    """Per tensor, the exact ``counts[l]``-th smallest magnitude (0 when nothing is pruned).

    With ``process_group``, ``weights`` are this rank's shards of the tensors.
    """
    out = []
    for w, k, ws in zip(weights, counts, warm):
        t = kth_magnitude([w], k, hint=ws.hint, hint_width=ws.width, process_group=process_group)
        if k > 0:
            ws.update(float(t))
        out.append(t)
    return out


def flops_scale(shape: Sequence[int]) -> float:
    """ST-3σ's ``s_l = 1/sqrt(sum of the weight's dimension sizes)``.

    For a conv weight ``(C_out, C_in/groups, k_h, k_w)`` the sum is
    ``C_out + C_in/groups + k_h + k_w``; for a linear one ``out + in``.
    Under the usual fan-in initialisation ``|w|`` scales like ``s_l``, so
    ranking ``|w|/s_l`` removes the width effect that makes plain global
    pruning spare the early, narrow, FLOP-heavy layers.

    Args:
        shape: the weight's shape.
    """
    return 1.0 / math.sqrt(sum(shape))


class GlobalFlopsBackbone(Backbone):
    """FLOPs-biased global ranking (ST-3σ, Vanderschueren & De Vleeschouwer 2023).

    Scores ``|w| / s_l`` with ``s_l`` from :func:`flops_scale`; ``T*`` is the
    exact k-th smallest score over all tensors, ``k = round(s·N)``, found by
    :func:`feather_sparse.selection.select_threshold` on the unscaled tensors
    with per-tensor scales (no scaled copy, no concatenation), and
    ``T_l = T*·s_l``.

    ``T*·s_l`` rounded to a float need not separate exactly the weights whose
    rounded score is ``<= T*``; so ``T_l`` is taken as the largest ``|w_l|``
    whose score is ``<= T*`` (one reduction per tensor), which prunes exactly
    the ``k`` weights the global ranking selected.
    """

    name = "global-flops"

    def __init__(self) -> None:
        self._warm = _WarmStart()

    def setup(self, targets: Sequence[PruneTarget]) -> None:
        super().setup(targets)
        self.scales = [flops_scale(t.shape) for t in targets]  # s_l

    def thresholds(self, weights: Sequence[Tensor], sparsity: float) -> list[Tensor]:
        inverse = [1.0 / s for s in self.scales]  # the score of w is |w|·(1/s_l)
        t_star = select_threshold(
            weights, sparsity, hint=self._warm.hint, hint_width=self._warm.width, scales=inverse
        )
        self._warm.update(float(t_star))
        dtype = t_star.dtype
        out = []
        for w, c in zip(weights, inverse):
            if w.numel() == 0:  # a layer without weights (nn.Linear(8, 0)): nothing to prune
                out.append(torch.zeros((), dtype=dtype, device=t_star.device))
                continue
            score = scaled_magnitudes(w, c, dtype)
            magnitude = scaled_magnitudes(w, 1.0, dtype)
            out.append(torch.where(score <= t_star, magnitude, 0.0).amax())
        return out


class _ThresholdSurrogate(torch.autograd.Function):
    """Identity on the thresholded weight ``ŵ``; gives the threshold ASL's surrogate gradient.

    ``∂L/∂T = −Σ_{|w| <= T} g·w / T`` with ``g = ∂L/∂ŵ`` (0 while ``T = 0``);
    ``ŵ``'s own gradient passes through unchanged, so the operator's
    straight-through backward for the weights is untouched.
    """

    generate_vmap_rule = True  # torch.func.vmap: per-sample gradients (tests/test_higher_order.py)

    @staticmethod
    def forward(out: Tensor, weight: Tensor, t: Tensor) -> Tensor:
        return out.view_as(out)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        _, weight, t = inputs
        ctx.save_for_backward(weight, t)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, Tensor]:
        weight, t = ctx.saved_tensors
        dtype = torch.promote_types(torch.promote_types(weight.dtype, t.dtype), torch.float32)
        t_c = t.detach().to(dtype)
        pruned_sum = (grad.to(dtype) * weight.to(dtype)).masked_fill_(weight.abs() > t_c, 0.0).sum()
        grad_t = torch.where(t_c > 0, -pruned_sum / t_c.clamp_min(torch.finfo(dtype).tiny), 0.0)
        return grad, None, grad_t.to(t.dtype)


class ASLPlusBackbone(Backbone):
    """ASL+: per-layer thresholds learned through a Gaussian sparsity loss, made exact.

    ASL (Retsinas et al. 2021) with the paper's additions (§3): the schedule's
    sparsity as the loss's target and a sorting-based correction. The loss,
    the threshold's gradient and why the correction has this form are in the
    guide, ``docs/guide/concepts.md`` ("ASL+: learned thresholds, made exact").

    Give :meth:`parameters` to the optimizer with their own learning rate
    (ASL uses ``lr/100``, :data:`ASL_LR_SCALE`) and no weight decay, and add
    :meth:`regularizer` to the loss::

        optimizer.add_param_group({"params": pruner.parameters(),
                                   "lr": lr * fs.ASL_LR_SCALE, "weight_decay": 0.0})
        loss = task_loss + pruner.regularizer()

    Args:
        lam: the weight ``λ`` of the sparsity loss (ASL: 10).
        init: initial ``r_l`` for every layer; ``None`` (default) uses ASL's
            ``√2·erfinv(0.6·S)`` with ``S`` the Pruner's final target.
        r_max: upper clamp of ``r_l`` (ASL: 5, i.e. at most 99.99994 % of a
            layer from the Gaussian model).
    """

    name = "asl+"

    def __init__(self, lam: float = 10.0, init: float | None = None, r_max: float = 5.0) -> None:
        if not (lam >= 0 and math.isfinite(lam)):
            raise ValueError(f"lam must be a finite number >= 0, got {lam}")
        if not r_max > 0:
            raise ValueError(f"r_max must be > 0, got {r_max}")
        if init is not None and not math.isfinite(init):
            raise ValueError(f"init must be a finite number or None, got {init}")
        self.lam = float(lam)
        self.init = None if init is None else float(init)
        self.r_max = float(r_max)
        self.r: list[nn.Parameter] = []
        self._initialized = False
        self._target = 0.0

    def setup(self, targets: Sequence[PruneTarget]) -> None:
        super().setup(targets)
        self.sizes = [t.numel for t in targets]
        self.r = [
            nn.Parameter(torch.zeros((), device=t.weight.device, dtype=torch.float32))
            for t in targets
        ]
        self._sigma = [torch.ones((), device=t.weight.device) for t in targets]
        self._warm = [_WarmStart() for _ in targets]
        self._initialized = False
        self._sizes_on: Tensor | None = None  # self.sizes as a tensor (see _size_tensor)

    def advance(self, step: int, total_steps: int, final_sparsity: float) -> None:
        if self._initialized:
            return
        if self.init is not None:
            value = self.init
        else:  # ASL's start: a little below the target, √2·erfinv(0.6·S)
            x = torch.tensor(0.6 * final_sparsity, dtype=torch.float64)
            value = float(math.sqrt(2.0) * torch.special.erfinv(x))
        with torch.no_grad():
            for r in self.r:
                r.fill_(value)
        self._initialized = True

    def _follow(self, index: int, device: torch.device) -> None:
        """Layer ``index``'s ``r_l`` and ``σ_l`` on ``device``, its weight's.

        A model moved after attaching (``model.to("cuda")``) moves its own
        parameters in place; ``r_l`` is a parameter of this backbone, in the
        user's optimizer, so it is moved the same way (:func:`move_in_place`)
        at the layer's next forward, :meth:`regularizer` or :meth:`parameters`.
        """
        if self.r[index].device != device:
            move_in_place(self.r[index], device)
        on_device(self._sigma, index, device)

    def _follow_all(self) -> None:
        for i, t in enumerate(self.targets):
            self._follow(i, t.weight.device)

    def implied_sparsities(self) -> list[float]:
        """Per layer, ``erf(clamp(r_l)/√2)``: the sparsity the Gaussian model gives ``r_l``."""
        r = _stack([p.detach() for p in self.r]).double().clamp(0.0, self.r_max)
        values: list[float] = torch.special.erf(r / math.sqrt(2.0)).tolist()
        return values

    def thresholds(self, weights: Sequence[Tensor], sparsity: float) -> list[Tensor]:
        self._target = float(sparsity)
        with torch.no_grad():
            # σ_l = 0 for a layer without weights: its r_l then gets no gradient (the
            # std of nothing is NaN, which would make r_l NaN at the first optimizer step)
            self._sigma = [
                w.float().std(correction=0) if w.numel() else w.new_zeros((), dtype=torch.float32)
                for w in weights
            ]
        counts = self.allocation(sparsity)
        return _layer_kth(weights, counts, self._warm)

    def allocation(self, sparsity: float) -> list[int]:
        """Pruned weights per layer at overall ``sparsity``: the correction (class docstring).

        Args:
            sparsity: the overall fraction of weights to prune.
        """
        implied = self.implied_sparsities()
        total = sum(self.sizes)
        target = round(sparsity * total)
        pruned = [s * n for s, n in zip(implied, self.sizes)]  # what the Gaussian model prunes
        if target <= sum(pruned):  # too many pruned: scale the sparsities down
            return allocate(pruned, self.sizes, target)
        kept = [n - p for n, p in zip(self.sizes, pruned)]  # too few: scale the densities down
        return [n - k for n, k in zip(self.sizes, allocate(kept, self.sizes, total - target))]

    def forward_weight(
        self, index: int, weight: Tensor, threshold: Tensor, operator: Operator, theta: float
    ) -> Tensor:
        self._follow(index, weight.device)
        out = operator(weight, threshold, theta)
        r = self.r[index].clamp(0.0, self.r_max)
        if not r.requires_grad:  # no_grad (evaluation): the plain forward
            return out
        # Value: the exact T_l. Gradient: as if T_l were b_l = clamp(r_l)·σ_l.
        t = threshold + self._sigma[index].to(threshold) * (r - r.detach()).to(threshold)
        tied: Tensor = _ThresholdSurrogate.apply(out, weight, t)
        return tied

    def parameters(self) -> list[nn.Parameter]:
        self._follow_all()  # an optimizer made after a model.to(device) gets them there
        return list(self.r)

    def regularizer(self) -> Tensor:
        """``λ·(D − (1 − s(t)))²`` with the schedule's current ``s(t)`` as the target.

        On the first layer's device when the layers are on several.
        """
        self._follow_all()
        r = _stack(self.r)
        sizes = self._size_tensor(r)
        sparsity = (torch.special.erf(r / math.sqrt(2.0)) * sizes).sum() / sizes.sum()
        # D − (1 − s) = (1 − sparsity) − (1 − s) = s − sparsity
        return self.lam * (self._target - sparsity) ** 2

    def _size_tensor(self, like: Tensor) -> Tensor:
        """The layers' sizes as a tensor of ``like``'s dtype and device, made once for
        them: ``torch.tensor(..., device=...)`` at every step would copy from the host
        and, on a GPU, wait for the device in every training step's loss."""
        sizes = getattr(self, "_sizes_on", None)
        if sizes is None or sizes.device != like.device or sizes.dtype != like.dtype:
            sizes = self._sizes_on = torch.tensor(self.sizes, dtype=like.dtype, device=like.device)
        return sizes

    def state_dict(self) -> dict[str, Any]:
        return {
            "r": _stack([p.detach() for p in self.r]).cpu().clone(),
            "sigma": _stack([s.detach().float() for s in self._sigma]).cpu().clone(),
            "target": self._target,
            "initialized": self._initialized,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``r_l``, ``σ_l``, the loss's target and whether ``r_l`` started.

        The whole state is checked before anything is changed: ``r_l`` are the
        Parameters the optimizer trains, written in place.

        Args:
            state: a dict :meth:`state_dict` returned.

        Raises:
            ValueError: when the state holds another number of layers (a state
                saved from another model), or is not what :meth:`state_dict` writes
                (an entry missing; ``r`` and ``sigma`` a 1-d float tensor of finite
                values, ``sigma`` >= 0; ``target`` a number in [0, 1);
                ``initialized`` a bool): the state is damaged. Nothing is changed then.
        """
        missing = [key for key in ("r", "sigma", "target", "initialized") if key not in state]
        if missing:
            raise damaged_state(f"the ASL+ backbone's state lacks {', '.join(map(repr, missing))}")
        r, sigma, target, initialized = (state[k] for k in ("r", "sigma", "target", "initialized"))
        for key, saved in (("r", r), ("sigma", sigma)):
            if not isinstance(saved, Tensor) or saved.dim() != 1 or not saved.is_floating_point():
                got = (
                    f"a {saved.dtype} tensor of shape {tuple(saved.shape)}"
                    if isinstance(saved, Tensor)
                    else type(saved).__name__
                )
                raise damaged_state(
                    f"the ASL+ backbone's {key!r} is {got}, where state_dict() writes a 1-d "
                    "float tensor, one value per layer"
                )
        if r.numel() != len(self.r):
            raise other_model_state(
                f"the ASL+ backbone holds {r.numel()} thresholds, this model has {len(self.r)}"
            )
        if sigma.numel() != r.numel():  # both are written for every layer
            raise damaged_state(
                f"the ASL+ backbone's 'sigma' holds {sigma.numel()} values for its "
                f"{r.numel()} thresholds"
            )
        # r_l is clamped where it is used, but NaN passes a clamp; σ_l is a std
        for key, saved, good, written in (
            ("r", r, torch.isfinite(r), "a finite number"),
            ("sigma", sigma, torch.isfinite(sigma) & (sigma >= 0), "a finite number >= 0"),
        ):
            bad = (~good).nonzero().flatten().tolist()
            if bad:
                raise damaged_state(
                    f"the ASL+ backbone's {key!r} entry of layer {self.targets[bad[0]].name!r} "
                    f"is {saved[bad[0]].item()!r}, where state_dict() writes {written}"
                )
        if (
            isinstance(target, bool)
            or not isinstance(target, (int, float))
            or not 0.0 <= target < 1.0
        ):
            raise damaged_state(
                f"the ASL+ backbone's 'target' must be a number in [0, 1), got {target!r}"
            )
        if not isinstance(initialized, bool):
            raise damaged_state(
                f"the ASL+ backbone's 'initialized' must be a bool, got {initialized!r}"
            )
        with torch.no_grad():  # in place: the optimizer keeps the same Parameter objects
            for p, value in zip(self.r, r):
                p.copy_(value)
        # copies: not the caller's tensors (which may be inference tensors, from a
        # torch.load in inference mode, and could not be saved for the backward)
        self._sigma = [s.to(p.device, copy=True) for s, p in zip(sigma, self.r)]
        self._target = float(target)
        self._initialized = initialized

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "lam": self.lam, "init": self.init, "r_max": self.r_max}


def _stack(values: Sequence[Tensor]) -> Tensor:
    """``torch.stack`` on the first value's device, for layers spread over several."""
    device = values[0].device
    return torch.stack([v.to(device) for v in values])


#: ASL trains its thresholds with the base learning rate times this (lr/100).
ASL_LR_SCALE = 0.01

BACKBONES: Registry[type[Backbone]] = Registry("backbone")
BACKBONES.register("global", GlobalBackbone)
BACKBONES.register("uniform", UniformBackbone)
BACKBONES.register("global-flops", GlobalFlopsBackbone)
BACKBONES.register("asl+", ASLPlusBackbone)


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
