"""Training steps on the pruned weights written into the stored ones: ``Pruner.swapped()``.

A Pruner computes each layer's forward weight ``P_T(w)`` inside the layer's
parametrization, at every access, and joins it to the stored weight ``w``
with an autograd node, so that the gradient reaches ``w`` (scaled by θ on
the pruned weights). With θ = 1 that node is the identity: the gradient of
``w`` is the gradient of ``P_T(w)``. So a training step can instead put
``P_T(w)`` into the stored weights once, run its forwards and backwards on
the plain layers — no operator, no node per layer and access — and give
the dense weights back before the optimizer updates them::

    with pruner.swapped():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
    optimizer.step()
    pruner.step()

Only layers of at most :data:`SWAP_MAX_NUMEL` weights are swapped; a larger
layer keeps its usual forward inside the block (for it swapping costs more
than it saves), and where no layer is that small the block yields ``False``.
The checks of the weights below apply to the layers it would write.
The gradients, hence the training, are bit for bit those of the usual step
(``tests/test_swap.py``); on a CPU the step is cheaper
(``benchmarks/bench_nm_step.py``, docs/benchmarks-nm.md): the forward weights
of every layer are computed once per step, together where the backbone
computes them together (the N:M backbone's fused pass), and each layer's
forward and backward meet a plain weight. Nothing is copied: each stored
weight takes the memory of its ``P_T(w)`` for the block (``.data``, which
keeps the tensor's identity, its gradient accumulator and its version
counter) and its own memory back at the end, the dense values untouched
there; and inside the block a swapped layer reads ``weight`` from its own
dictionary instead of through ``torch.nn.utils.parametrize``'s property
(the model's parameter names and state-dict keys do not change).

Where a step's gradient is not the identity — θ < 1, SR-STE's decay,
backbones with a forward of their own (ASL+'s learned thresholds, Spartan's
soft masks), an operator other than ``P_T`` — and where the stored weight
cannot be written as a whole (sharded FSDP2/DTensor weights, weights not in
the standard contiguous layout, whose forward weight the layer would meet
in another layout), inside a ``torch.compile``d or ``torch.func`` call and in
inference mode, the block runs the usual step: it yields ``False`` and
changes nothing.

Inside the block the stored weights hold ``P_T(w)``: ``model.state_dict()``
and code reading ``layer.parametrizations.weight.original`` see the pruned
values there, and the Pruner refuses ``step()``, ``update()``,
``finalize()``, ``remove()``, its state dicts, ``report()`` and
``sparsity_achieved()`` until the block ends. The
block must hold the forwards and backwards only: the dense weights come
back when it ends, so an optimizer step (or any write into a
stored weight) inside it would be undone — the block then raises, naming
the layers, with the dense weights of before the block restored. (A write
is recognised by the weight's version counter, which an optimizer step and
any in-place operation move; a write through ``.data`` is not seen.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor, nn

from feather_sparse.backbones import PruneTarget
from feather_sparse.nm.backbone import NMBackbone
from feather_sparse.nm.fused import _PLAIN  # types written as a whole (not a DTensor)
from feather_sparse.ops import ThresholdOperator
from feather_sparse.pruner import FeatherParametrization, Pruner, _copy_each, _overrides

__all__ = ["SWAP_MAX_NUMEL", "swap_refusal", "swapped"]

#: Layers of more weights than this keep the usual forward inside the block.
#: Swapping saves a fixed cost per layer and access; for a large layer with one
#: forward per step it was a loss: the 50M-parameter MLP's step (four layers of
#: 12.5M weights) took 1.91-2.19× the dense step with every layer swapped,
#: against 1.45-1.48× as usual, in three runs (docs/benchmarks.md).
#: Read at each block: set it before a block to move the line.
SWAP_MAX_NUMEL = 1 << 17


def swap_refusal(pruner: Pruner) -> str | None:
    """Why ``pruner.swapped()`` would run the usual step, or None where it swaps.

    Args:
        pruner: an attached Pruner.
    """
    return _plan(pruner)[0]


def _plan(pruner: Pruner) -> tuple[str | None, list[_Swap]]:
    """:func:`swap_refusal`'s answer and, where it is None, the layers the block writes."""
    backbone = pruner.backbone
    if not isinstance(pruner.operator, ThresholdOperator):
        return f"the operator {pruner.operator.name!r} has a backward of its own", []
    if _overrides(backbone, "forward_weight"):
        # a backbone whose forward is its own: only the N:M one keeps the identity
        if not isinstance(backbone, NMBackbone):
            return f"the {backbone.name!r} backbone computes a forward of its own", []
        if backbone.decay != 0.0:
            return "SR-STE's decay adds to the gradient", []
    layers = [pruner._parametrization(t) for t in pruner.targets]
    if any(p.theta != 1.0 for p in layers):
        return "θ < 1 scales the pruned weights' gradients", []
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return "inside a compiled or torch.func call", []
    if torch.is_inference_mode_enabled():
        return "in inference mode", []
    swaps = []
    for t, layer in zip(pruner.targets, layers):
        if not 0 < t.numel <= SWAP_MAX_NUMEL:
            continue  # a larger layer keeps the usual forward inside the block
        weight = t.weight
        if type(weight) not in _PLAIN:
            return f"the weight of {t.name!r} is sharded or wrapped ({type(weight).__name__})", []
        if not weight.is_contiguous():
            return f"the weight of {t.name!r} is not in the contiguous layout", []
        # a tied layer shares its target's parametrization: it passes through with it
        swaps.append(_Swap(t, weight, layer))
    if not swaps:
        return f"no layer has at most {SWAP_MAX_NUMEL:,} weights (larger ones are not swapped)", []
    return None, swaps


class _Swap(NamedTuple):
    """A layer the block writes: its target, stored weight and parametrization."""

    target: PruneTarget
    weight: Tensor
    layer: FeatherParametrization


@contextlib.contextmanager
def swapped(pruner: Pruner) -> Iterator[bool]:
    """Run the block's forwards and backwards on ``P_T(w)`` written into the stored weights.

    See the module docstring. Yields whether the weights were swapped (False:
    the usual step, see :func:`swap_refusal`).

    Args:
        pruner: an attached Pruner.

    Raises:
        RuntimeError: when entered inside another ``swapped()`` block of the
            same Pruner, or when a stored weight was written inside the block
            (an optimizer step there: the dense weights of before the block
            are restored, the write is lost, and the message names the layers).
    """
    if pruner._swap is not None:
        raise RuntimeError(
            "pruner.swapped() entered inside another pruner.swapped() block of the same "
            "Pruner: one block holds a step's forwards and backwards"
        )
    pruner._check_attached("swapped()")
    refusal, swaps = _plan(pruner)
    if refusal is not None:
        yield False
        return
    targets = [s.target for s in swaps]
    layers = [s.layer for s in swaps]
    stored = [s.weight for s in swaps]
    with torch.no_grad():
        # computed as the forward computes them: the N:M backbone's fused layers in one
        # call (a module call, checks and a cache lookup per layer saved), any other
        # through its layer
        done = _fused_forwards(pruner, layers)
        written = [done[p.index] if p.index in done else p(w) for p, w in zip(layers, stored)]
    # The stored weights take the memory of P_T(w), and give it back at the end: no copy
    # either way, and the dense values stay untouched in their own memory. ``.data``
    # keeps each weight's identity (the optimizer's, autograd's gradient accumulator)
    # and its version counter.
    dense = [w.data for w in stored]
    versions = [w._version for w in stored]
    direct: list[tuple[type, property, nn.Module]] = []
    try:  # from the first weight swapped: an interruption anywhere restores all
        for w, value in zip(stored, written):
            w.data = value
        for p in layers:  # a plain attribute: nn.Module.__setattr__ costs microseconds
            vars(p)["passthrough"] = True
        _read_directly(pruner, {id(p) for p in layers}, direct)
        pruner._swap = True
        yield True
    finally:  # an error inside the block ends it too
        # An in-place write (an optimizer step) moves a weight's version counter: a check
        # on the host, which never waits for a GPU. A weight replaced (model.to(...) making
        # new tensors) takes the dense values back converted, with no write of its own.
        now = [t.weight for t in targets]
        changed = [
            t.name
            for t, w, n, v in zip(targets, stored, now, versions)
            if n is w and w._version != v
        ]
        _read_through(direct)
        _restore(pruner, layers, stored, now, dense)
        if changed:  # into memory a cached forward may hand out again: recompute those
            pruner.backbone.release()
    if changed:
        raise RuntimeError(
            f"pruner.swapped(): the stored weights of {', '.join(repr(n) for n in changed)} "
            "were written inside the block (an optimizer step there?). The block holds the "
            "forwards and backwards only, and gives the dense weights back when it ends: the "
            "write was undone and the weights are those of before the block; call "
            "optimizer.step() after it"
        )


def _fused_forwards(pruner: Pruner, layers: list[FeatherParametrization]) -> dict[int, Tensor]:
    """The N:M backbone's fused forwards of ``layers`` by target index (empty otherwise)."""
    backbone, operator = pruner.backbone, pruner.operator
    if not (isinstance(backbone, NMBackbone) and isinstance(operator, ThresholdOperator)):
        return {}
    if any(layer.operator is not operator for layer in layers):
        return {}
    return backbone.swap_forwards(
        [layer.index for layer in layers], [layer.threshold for layer in layers], operator.p
    )


def _restore(
    pruner: Pruner,
    layers: list[FeatherParametrization],
    stored: list[Tensor],
    now: list[Tensor],
    dense: list[Tensor],
) -> None:
    """End the block: the usual forward again, the dense weights back. A stored weight
    the layer still holds, in its dtype and device, takes its dense memory back (``now``:
    the weights the layers hold); one the model converted or replaced inside the block
    (``model.double()``, ``model.to(...)``) has the dense values copied into it,
    converted as ``copy_`` does."""
    for p in layers:
        vars(p)["passthrough"] = False
    converted_into, converted = [], []
    for w, n, value in zip(stored, now, dense):
        if n is w and w.dtype == value.dtype and w.device == value.device:
            w.data = value
        else:
            converted_into.append(n)
            converted.append(value)
    if converted:
        with torch.no_grad():
            _copy_each(converted_into, converted)
    pruner._swap = None


#: The parametrized tensor the Pruner attaches to (``PruneTarget.parametrizations``).
_NAME = "weight"


class _Through:
    """Stands in, inside the block, for the property through which ``torch.nn.utils.
    parametrize`` hands a parametrized module its ``weight``: a descriptor without a
    setter, so a module holding its weight in its own dictionary reads it from there
    (a dictionary lookup, where the property calls two modules: tens of microseconds per
    layer and forward on a CPU), and any other module of the class (a deep copy shares
    it) reads through the property as before."""

    def __init__(self, prop: property) -> None:
        self.prop = prop

    def __get__(self, module: object, owner: type | None = None) -> object:
        return self.prop if module is None else self.prop.__get__(module, owner)


def _read_directly(
    pruner: Pruner, swapped_layers: set[int], done: list[tuple[type, property, nn.Module]]
) -> None:
    """Let every module whose only parametrization is one the block passes through read
    its stored weight (``P_T(w)`` now) directly, recording in ``done`` (before each
    change) what :func:`_read_through` undoes.

    A module with another parametrization chained, or whose class does not hold the
    parametrization's property as ``torch.nn.utils.parametrize`` makes it, keeps reading
    through the pass-through.
    """
    classes: dict[type, property] = {}
    for t in pruner.parametrized_layers():  # tied layers too: the same parametrization
        module = t.module
        plist = t.parametrizations()
        cls = type(module)
        prop = classes.get(cls, cls.__dict__.get(_NAME))
        if (
            plist is None
            or len(plist._modules) != 1
            or id(plist._modules.get("0")) not in swapped_layers
            or not isinstance(prop, property)
            or _NAME in module.__dict__
        ):
            continue
        done.append((cls, prop, module))
        if cls not in classes:
            classes[cls] = prop
            setattr(cls, _NAME, _Through(prop))
        module.__dict__[_NAME] = t.weight


def _read_through(done: list[tuple[type, property, nn.Module]]) -> None:
    """Undo :func:`_read_directly`: every module reads through its parametrization again."""
    for cls, prop, module in done:
        module.__dict__.pop(_NAME, None)
        setattr(cls, _NAME, prop)
