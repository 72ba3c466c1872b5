"""The Pruner: attaches Feather to a model and drives it during training.

Glentis Georgoulakis, Retsinas & Maragos, "Feather: An Elegant Solution to
Effective DNN Sparsification", BMVC 2023. Every prunable weight ``w`` is
replaced, in the layer's forward only, by ``P_T(w)`` (eq. 3) through
``torch.nn.utils.parametrize``; the optimizer keeps updating the dense ``w``
(the straight-through estimator, eq. 1-2) with the pruned weights' gradients
scaled by ``θ`` (eq. 4). The thresholds come from a backbone (§3) at the
sparsity a schedule requests, recomputed after every optimizer step.

Usage, like an LR scheduler::

    pruner = Pruner(model, sparsity=0.9, total_steps=epochs * len(loader))
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(); loss.backward(); optimizer.step()
        pruner.step()
    pruner.finalize()   # bakes P_T(w) into plain weights, exact zeros

Over 600 lines as one cohesive thing, the ``Pruner`` class and the report
types it returns: its settings and their checks are in
:mod:`~feather_sparse.pruner_config`, the DDP/FSDP2 plumbing in
:mod:`~feather_sparse.distributed`.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import math
import re
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from feather_sparse import distributed, plain_keys
from feather_sparse._text import count, plural
from feather_sparse._version import __version__
from feather_sparse.backbones import (
    BACKBONES,
    Backbone,
    PruneTarget,
    layer_thresholds_at_most,
    outside_inference_mode,
)
from feather_sparse.nm import NMBackbone, NMPattern
from feather_sparse.nm import native as nm_native
from feather_sparse.nm.operator import is_transposed_linear
from feather_sparse.ops import (
    OPERATORS,
    Operator,
    OutputCache,
    ThresholdOperator,
    compute_dtype,
)
from feather_sparse.pruner_config import DEFAULT_INCLUDE, FORMAT_VERSION, PrunerConfig, auto_theta
from feather_sparse.rules import as_int, check_sparsity
from feather_sparse.schedules import Schedule

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "DEFAULT_INCLUDE",
    "LayerReport",
    "Pruner",
    "PrunerConfig",
    "PrunerReport",
    "auto_theta",
]

logger = logging.getLogger(__name__)

#: The parametrizations that Pruners registered, to tell a model a Pruner is attached
#: to from a copy of one (``copy.deepcopy`` makes new parametrizations, not listed here).
_REGISTERED: weakref.WeakSet[nn.Module] = weakref.WeakSet()

#: What :meth:`Pruner.state_dict` returns is marked with this, and versioned
#: with :data:`~feather_sparse.pruner_config.FORMAT_VERSION`.
STATE_FORMAT = "feather-sparse-pruner"


class FeatherParametrization(nn.Module):
    """``weight -> operator(weight, threshold, θ)``, registered with ``parametrize``.

    The threshold is a 0-d buffer on the weight's device, written in place by
    the Pruner, so the forward never synchronises with the host and a compiled
    graph sees a tensor input, not a constant (no recompilation when it moves).
    It is not persistent: the Pruner's own ``state_dict`` holds it.

    With ``backbone`` given (backbones that override
    :meth:`~feather_sparse.backbones.Backbone.forward_weight`, e.g. ASL+ and
    Spartan), the forward is ``backbone.forward_weight(index, weight, ...)``.

    FSDP2 hands the forward its gathered, plain weight, but leaves the stored
    weight sharded (a DTensor) outside it; tensor parallelism
    (``parallelize_module``) hands the forward the sharded weight itself. A
    sharded weight maps the operator over this rank's shard and gives a
    DTensor laid out as the stored one
    (:func:`~feather_sparse.distributed.on_local_shard`), differentiable through
    the shard. The unstructured operator is elementwise with one threshold for
    all ranks, so each shard's values are those of the whole weight; so are an
    N:M layer's where each shard holds whole groups (a dim-0 shard holds whole
    rows), which the N:M backbone checks (``check_shard``; at attach for
    tensor parallelism).
    """

    threshold: Tensor
    #: Set by :meth:`Pruner.swapped` while the stored weight holds ``P_T(w)`` itself:
    #: the forward is then the stored weight (a class default: pickles from before it
    #: have no instance value).
    passthrough: bool = False

    def __init__(
        self,
        operator: Operator,
        theta: float,
        threshold: Tensor,
        backbone: Backbone | None = None,
        index: int = 0,
    ) -> None:
        super().__init__()
        self.operator = operator
        self.theta = theta
        self.backbone = backbone
        self.index = index
        self.register_buffer("threshold", threshold, persistent=False)
        # The operator's output memory, reused from step to step on CPU (see OutputCache).
        self.cache = OutputCache()

    def forward(self, weight: Tensor) -> Tensor:
        if self.passthrough:  # inside Pruner.swapped(): the stored weight is P_T(w)
            return weight
        # A sharded weight (FSDP2, outside its forward) is a DTensor. The exact-type
        # tests cost ~15 ns where isinstance(weight, DTensor) costs ~70, and the
        # compiler folds them (no guard, no graph break).
        if (
            type(weight) is not nn.Parameter
            and type(weight) is not Tensor
            and distributed.is_dtensor(weight)
        ):
            return self._sharded(weight)
        if self.backbone is not None:
            return self.backbone.forward_weight(
                self.index, weight, self.threshold, self.operator, self.theta
            )
        if isinstance(self.operator, ThresholdOperator):
            return self.operator(weight, self.threshold, self.theta, cache=self.cache)
        return self.operator(weight, self.threshold, self.theta)

    def _sharded(self, weight: Tensor) -> Tensor:
        """The forward of a sharded weight (a DTensor), mapped over this rank's shard."""
        if isinstance(self.backbone, NMBackbone):  # groups split by the shard cannot be computed
            self.backbone.check_shard(self.index, weight)
        return distributed.on_local_shard(self._shard_forward, weight)

    def _shard_forward(self, local: Tensor) -> Tensor:
        """The forward of one rank's shard, without the output cache (it keeps the
        memory of the whole weight the training forward meets)."""
        if self.backbone is not None:
            return self.backbone.forward_weight(
                self.index, local, self.threshold, self.operator, self.theta
            )
        return self.operator(local, self.threshold, self.theta)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled and deep-copied without the pass-through: a copy made inside a
        ``swapped()`` block is not in it (no block would end it)."""
        state: dict[str, Any] = super().__getstate__()
        state.pop("passthrough", None)
        return state

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Any:
        # ``model.half()``/``model.to(torch.bfloat16)`` after attaching converts every
        # floating buffer; the threshold stays in the operator's compute dtype (float32
        # for half weights), as when the Pruner is attached to a half model, without
        # the round trip through the half type that would change its value.
        before = self.threshold
        module = super()._apply(fn, recurse)
        after = self.threshold
        dtype = compute_dtype(after.dtype)
        if after.dtype != dtype:
            self._buffers["threshold"] = before.to(device=after.device, dtype=dtype)
        return module

    def extra_repr(self) -> str:
        return f"operator={self.operator!r}, theta={self.theta}"


@dataclass(frozen=True)
class LayerReport:
    """One prunable tensor's state, a row of :class:`PrunerReport`.

    Attributes:
        name: the module's qualified name in the model.
        shape: the weight's shape.
        params: its number of weights.
        threshold: the threshold the backbone shows for it (N:M: the mean group
            threshold ``r·T_g``).
        sparsity: the fraction of its weights the forward zeroes (after
            ``finalize``: of exact zeros).
        collapsed: every weight pruned, at a scheduled sparsity above 0: the
            layer outputs only its bias. A layer the user left all zero is not
            flagged while the schedule prunes nothing (sparsity 0).
    """

    name: str
    shape: tuple[int, ...]
    params: int
    threshold: float
    sparsity: float
    collapsed: bool  # every weight pruned: the layer outputs only its bias


@dataclass(frozen=True)
class PrunerReport:
    """Per-layer rows and totals, as returned by :meth:`Pruner.report`.

    Attributes:
        step: the Pruner's step count.
        target_sparsity: the final target ``S``.
        scheduled_sparsity: the sparsity the thresholds in force were computed
            at (the last update's, or the one finalized at).
        sparsity: the fraction of all prunable weights the forward zeroes.
        params: the number of prunable weights.
        layers: one row per prunable tensor.
        pattern: the N:M pattern (``"2:4"``), or None for unstructured pruning.
    """

    step: int
    target_sparsity: float
    scheduled_sparsity: float
    sparsity: float
    params: int
    layers: tuple[LayerReport, ...]
    pattern: str | None = None  # "2:4" for N:M pruning

    @property
    def collapsed(self) -> list[str]:
        """Names of the layers pruned to 100 %."""
        return [row.name for row in self.layers if row.collapsed]

    def table(self) -> str:
        """The rows as a Markdown table (for printing by the caller)."""
        lines = []
        if self.pattern:
            lines += [f"N:M pattern {self.pattern} (threshold: mean over groups)", ""]
        lines += [
            "| layer | shape | params | threshold | sparsity |",
            "|---|---|---:|---:|---:|",
        ]
        for r in self.layers:
            flag = " **collapsed**" if r.collapsed else ""
            shape = "×".join(map(str, r.shape))
            lines.append(
                f"| {r.name} | {shape} | {r.params:,} | {r.threshold:.4g} "
                f"| {r.sparsity:.2%}{flag} |"
            )
        lines.append(f"| **total** | | {self.params:,} | | {self.sparsity:.2%} |")
        return "\n".join(lines)


@dataclass(frozen=True)
class _Ended:
    """What a Pruner leaves queryable after :meth:`Pruner.finalize` or :meth:`Pruner.remove`.

    ``thresholds`` are copies of the 0-d thresholds in effect then (for
    ``finalize``, the ones baked in); ``shown`` the report's threshold per layer
    and ``zeros`` its pruned weights per layer (for ``finalize``, the baked
    weights' exact zeros), or None where they could not be measured.
    """

    how: Literal["finalized", "removed"]
    thresholds: tuple[Tensor, ...]
    shown: tuple[float, ...] | None
    zeros: tuple[int, ...] | None


def _matches(name: str, patterns: Iterable[str], children: bool) -> bool:
    """Whether ``name`` is one of ``patterns`` (a name, or ``"re:<regex>"`` matched in full).

    With ``children``, a plain name also matches every module below it.
    """
    for pat in patterns:
        if pat.startswith("re:"):
            if re.fullmatch(pat[3:], name):
                return True
        elif name == pat or (children and name.startswith(pat + ".")):
            return True
    return False


def _unparametrize(module: nn.Module, leave_parametrized: bool, order: Sequence[str] = ()) -> None:
    """Remove the parametrization of ``module.weight`` without breaking copies of the module.

    ``torch.nn.utils.parametrize`` gives a parametrized module a class of its
    own and, on removal, deletes the ``weight`` property from that class; a
    ``copy.deepcopy`` of the module (an EMA model, a best-so-far snapshot)
    shares the class, so it would lose its ``weight``. The module is first
    moved to a private copy of the class, so that removal touches only it.

    Removal registers ``weight`` again after the module's other parameters;
    ``order`` (the parameter names before the module was parametrized) puts it
    back in its place, so that ``module.parameters()`` and ``state_dict()``
    list them as the plain module did (an optimizer built or loaded later
    pairs them up by that order).
    """
    cls = type(module)
    own = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
    module.__class__ = type(cls.__name__, cls.__bases__, own)
    parametrize.remove_parametrizations(module, "weight", leave_parametrized=leave_parametrized)
    params = module._parameters
    ranked = sorted(params, key=lambda k: order.index(k) if k in order else len(order))
    if list(params) != ranked:
        entries = dict(params)
        params.clear()
        params.update((k, entries[k]) for k in ranked)


def _refuse_copy_of_attached(name: str, module: nn.Module) -> None:
    """Raise if ``module``'s weight carries a Pruner's parametrization that no Pruner
    registered: the layer of a copy (``copy.deepcopy``, a pickled whole model) of a
    model with a Pruner attached, which no Pruner drives.

    Raises:
        ValueError: saying so, and how to make the copy (from the plain keys).
    """
    found = module.parametrizations["weight"]  # type: ignore[index]
    copied = [p for p in found if isinstance(p, FeatherParametrization) and p not in _REGISTERED]
    if copied:
        raise ValueError(
            f"layer {name!r} carries a Pruner's parametrization that no Pruner drives: this "
            "model is a copy (copy.deepcopy, or a whole pickled module) of a model with a "
            "Pruner attached, and it has no Pruner of its own to remove. Build such a copy "
            "(an EMA or teacher model) as a plain model instead, from the attached model's "
            "state_dict(), which has the plain keys: ema = build_model(); "
            "ema.load_state_dict(model.state_dict()); then attach a Pruner to it if it "
            "needs one"
        )


def _check_backbone_free(backbone: Backbone) -> None:
    """Refuse a ``backbone`` object that still serves another Pruner's attached layers:
    a backbone holds its Pruner's layers and state, so one object cannot serve two.

    Raises:
        ValueError: naming the fix (a new Backbone object, or its name).
    """
    for t in getattr(backbone, "targets", ()):
        plist = t.parametrizations()
        if plist is not None and any(isinstance(p, FeatherParametrization) for p in plist):
            raise ValueError(
                f"this {type(backbone).__name__} object already serves another attached "
                f"Pruner (its layer {t.name!r}); a backbone holds its Pruner's layers and "
                "state, so each Pruner needs its own: pass a new object or the backbone's "
                "name (a PrunerConfig reused for several models should name it), or call "
                "remove() or finalize() on the other Pruner first"
            )


def _warn_dense_attention(model: nn.Module, pruned: set[str]) -> None:
    """Say that an ``nn.MultiheadAttention`` whose ``out_proj`` is pruned keeps its Q/K/V
    projections dense: they are its bare ``in_proj_weight`` (or ``q/k/v_proj_weight``),
    not a layer's ``weight``."""
    dense = [
        (name, sum(p.numel() for n, p in m.named_parameters(recurse=False) if "proj_weight" in n))
        for name, m in model.named_modules()
        if isinstance(m, nn.MultiheadAttention) and _join(name, "out_proj") in pruned
    ]
    dense = [(name, n) for name, n in dense if n]
    if dense:
        logger.warning(
            "%s (%s): the Q/K/V projections stay dense "
            "(%s weights): they are the bare parameter in_proj_weight, not a layer's `weight`, "
            "so only out_proj is pruned; models that project Q/K/V with nn.Linear are pruned whole",
            count(len(dense), "nn.MultiheadAttention module"),
            ", ".join(repr(name) for name, _ in dense[:3]) + (", ..." if len(dense) > 3 else ""),
            f"{sum(n for _, n in dense):,}",
        )


#: The recurrent modules (and cells) whose weights no ``include`` selects.
_RECURRENT = (nn.RNNBase, nn.RNNCellBase)


def _recurrent_weights(model: nn.Module, exclude: Sequence[str]) -> list[tuple[str, str, int]]:
    """``(name, class, weights)`` of each recurrent module (``nn.RNN``/``LSTM``/``GRU`` and
    their cells, ``nn.RNNCell``/``LSTMCell``/``GRUCell``) not excluded: they hold their
    weights as ``weight_ih_l0``, ``weight_hh_l0``, … (a cell: ``weight_ih``, ``weight_hh``),
    not as a layer's ``weight``, so no ``include`` selects them and they stay dense."""
    found = []
    for name, m in model.named_modules():
        if not isinstance(m, _RECURRENT) or _matches(name, exclude, children=True):
            continue
        n = sum(
            p.numel()
            for k, p in m.named_parameters(recurse=False)
            if k.startswith("weight_") and p.is_floating_point()
        )
        if n:
            found.append((name, type(m).__name__, n))
    return found


def _recurrent_note(found: list[tuple[str, str, int]]) -> str:
    """How :func:`_recurrent_weights`' modules read in a message."""
    shown = ", ".join(f"nn.{cls} {name or '(the model)'!r}" for name, cls, _ in found[:3])
    cells = sum(cls.endswith("Cell") for _, cls, _ in found)
    if not cells:
        params = "weight_ih_l*/weight_hh_l*"
    elif cells == len(found):
        params = "weight_ih/weight_hh"
    else:
        params = "weight_ih*/weight_hh*"
    return (
        f"{count(len(found), 'recurrent module')} ({shown}{', ...' if len(found) > 3 else ''}) "
        f"keep{'s' if len(found) == 1 else ''} {sum(n for *_, n in found):,} weights dense: "
        f"they are {params} parameters, not a layer's `weight`, and "
        "feather-sparse prunes only a layer's `weight`"
    )


def _find_targets(
    model: nn.Module,
    include: Sequence[type[nn.Module] | str],
    exclude: Sequence[str],
    min_params: int,
) -> list[PruneTarget]:
    """The modules whose ``weight`` the settings select, in ``named_modules`` order.

    Raises:
        ValueError: for a plain name in ``include`` or ``exclude`` that names no
            module of ``model`` (a typo would otherwise prune a layer meant to
            stay dense, or skip one meant to be pruned); ``"re:"`` patterns may
            match nothing.
    """
    types = tuple(i for i in include if isinstance(i, type))
    names = [i for i in include if isinstance(i, str)]
    # The default also takes the (in, out)-stored Linear of Hugging Face's GPT-2 family.
    default = tuple(include) == DEFAULT_INCLUDE
    modules = dict(model.named_modules())
    _check_names_exist(modules, names, "include", children=False, types=True)
    _check_names_exist(modules, exclude, "exclude", children=True)
    _check_names_weighted(modules, names)
    targets = []
    for name, module in modules.items():
        if not (
            isinstance(module, types)
            or (default and is_transposed_linear(module))
            or (names and _matches(name, names, children=False))
        ):
            continue
        if _matches(name, exclude, children=True):
            continue
        weight = getattr(module, "weight", None)
        if not isinstance(weight, Tensor) or not weight.is_floating_point():
            continue
        if weight.numel() < min_params:
            continue
        targets.append(PruneTarget(name, module))
    return targets


def _path(model: nn.Module, name: str) -> list[tuple[nn.Module, str, nn.Module]]:
    """The links from ``model`` down to its submodule ``name``: (parent, key, child)."""
    links = []
    module = model
    for key in name.split(".") if name else ():
        child = module._modules[key]
        assert child is not None  # a name named_modules() gave
        links.append((module, key, child))
        module = child
    return links


def _refuse_other_weight(name: str, module: nn.Module) -> None:
    """Raise when ``module.weight`` is not a plain parameter a Pruner can parametrize.

    Raises:
        ValueError: for a weight that already carries a Pruner (the fix: end
            that Pruner), one that carries torch's own parametrizations
            (``weight_norm``, ``spectral_norm``, ...), or one computed by a
            hook (the older ``torch.nn.utils.weight_norm``); for the last two
            the fix is to leave the layer dense.
    """
    if parametrize.is_parametrized(module, "weight"):
        _refuse_copy_of_attached(name, module)
        plist: Any = module.parametrizations["weight"]  # type: ignore[index]
        if any(isinstance(p, FeatherParametrization) for p in plist):
            raise ValueError(
                f"layer {name!r} already has a parametrization on its weight (a Pruner is "
                "attached): call pruner.remove() or pruner.finalize() on the earlier Pruner first"
            )
        kinds = ", ".join(type(p).__name__ for p in plist)
        raise ValueError(
            f"layer {name!r} has another parametrization on its weight ({kinds}, e.g. from "
            "weight_norm or spectral_norm), which a Pruner cannot prune through: leave the "
            f"layer dense with exclude=[{name!r}], or remove that parametrization first"
        )
    if "weight" not in module._parameters and "weight" not in module._buffers:
        raise ValueError(
            f"the weight of layer {name!r} is not a parameter of its own but computed (the older "
            "torch.nn.utils.weight_norm computes it from weight_g and weight_v, say), so a "
            f"Pruner cannot prune it: leave the layer dense with exclude=[{name!r}], or use "
            "torch.nn.utils.parametrizations.weight_norm on a dense layer"
        )


def _check_keeps_a_weight(sparsity: float, params: int) -> None:
    """Raise when ``sparsity`` of ``params`` weights rounds to all of them.

    ``S < 1`` passes the sparsity rule, but on a small model ``round(S·N) = N``
    (0.999999 of fewer than 500,000 weights) prunes every weight: the model
    without weights that ``S = 1`` is refused for.
    """
    if params and round(sparsity * params) >= params:
        most = (params - 1) / params
        raise ValueError(
            f"sparsity {sparsity} of the model's {params:,} prunable weights prunes all of "
            f"them (round(S·N) = N), leaving a model without weights: choose a sparsity of at "
            f"most {math.floor(most * 1e6) / 1e6} to keep a weight"
        )


def _check_names_weighted(modules: dict[str, nn.Module], names: Sequence[str]) -> None:
    """Raise for a plain ``include`` name of a module without a floating-point ``weight``.

    An ``include`` name selects that one module, not the layers below it (an
    ``exclude`` name covers them: leaving a block dense is the common wish,
    pruning every weight below one, norms included, is not), so naming a
    container would prune nothing of it.
    """
    for name in names:
        module = modules.get(name)
        weight = getattr(module, "weight", None)
        if module is None or (isinstance(weight, Tensor) and weight.is_floating_point()):
            continue
        layers = [
            n
            for n, m in modules.items()
            if n.startswith(name + ".") and isinstance(m, DEFAULT_INCLUDE)
        ]
        shown = ", ".join(repr(n) for n in layers[:4]) + (", ..." if len(layers) > 4 else "")
        fix = (
            f"name its layers ({shown}) or give a pattern such as 're:{re.escape(name)}\\..*'"
            if layers
            else "it holds no Linear or convolution either: check the name"
        )
        raise ValueError(
            f"include names {name!r}, a {type(module).__name__} without a floating-point "
            f"weight of its own; an include name selects that module only, so it would prune "
            f"nothing: {fix}"
        )


def _check_names_exist(
    modules: dict[str, nn.Module],
    patterns: Sequence[str],
    what: str,
    children: bool,
    types: bool = False,
) -> None:
    """Raise for a plain name in ``patterns`` that matches no module (see :func:`_matches`).

    With ``types`` (``include``, which also takes layer classes), a name that is
    the name of a layer class (``"Linear"``) gets the fix: pass the class.
    """
    missing = [
        pat
        for pat in patterns
        if not pat.startswith("re:")
        and pat not in modules
        and not (children and any(name.startswith(pat + ".") for name in modules))
    ]
    if not missing:
        return
    hints = []
    classes: list[str] = []
    for pat in missing:
        layer_type = _layer_type(pat, modules.values()) if types else None
        if layer_type is not None:
            classes.append(layer_type)
            hints.append(f"{pat!r} (a layer type, not a module name)")
            continue
        close = difflib.get_close_matches(pat, [n for n in modules if n], n=3)
        guess = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        hints.append(f"{pat!r}{guess}")
    fixes = []
    if classes:
        fixes.append(
            f"a string in {what} is a module name; for a layer type pass the class, "
            f"e.g. include=[{', '.join(classes)}]"
        )
    if len(classes) < len(missing):
        fixes.append(
            "give names as model.named_modules() lists them, or a 're:' pattern where "
            "matching nothing is fine"
        )
    raise ValueError(f"{what} names no module of the model: {', '.join(hints)}; {'; '.join(fixes)}")


def _layer_type(name: str, modules: Iterable[nn.Module]) -> str | None:
    """How to write the layer class called ``name`` (``"nn.Linear"``), if ``name`` is the
    name of a ``torch.nn`` layer class or of the class of one of ``modules``; else None."""
    cls = getattr(nn, name, None)
    if isinstance(cls, type) and issubclass(cls, nn.Module):
        return _type_name(cls)
    for module in modules:
        if type(module).__name__ == name:
            return _type_name(type(module))
    return None


def _type_name(cls: type) -> str:
    """A layer class as code names it: ``nn.Linear`` for ``torch.nn``'s, else its module path."""
    if getattr(nn, cls.__name__, None) is cls:
        return f"nn.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _tied(
    model: nn.Module, targets: Sequence[PruneTarget], exclude: Sequence[str]
) -> tuple[list[PruneTarget], list[tuple[PruneTarget, int]]]:
    """One target per weight tensor, and the other layers holding a target's weight.

    A weight shared by several modules (tied embeddings and output layers,
    a layer reused under two names) is one tensor: it is pruned once, with
    one threshold, and every module holding it as its ``weight`` gets the
    same parametrization, so all of them see ``P_T(w)`` during training as
    after :meth:`Pruner.finalize` (which bakes it in once).

    Returns:
        ``(targets, tied)``: the targets, the first of each weight kept;
        ``tied`` the other holders, each with the index of its target.

    Raises:
        ValueError: when a module holds a target's weight under another name
            than ``weight`` (it could not see the pruned weight), or an
            excluded layer shares a pruned layer's weight.
    """
    holders: dict[int, list[tuple[str, nn.Module, str]]] = {}
    for name, module in model.named_modules():
        for attr, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((name, module, attr))
    unique: list[PruneTarget] = []
    tied: list[tuple[PruneTarget, int]] = []
    seen: set[int] = set()
    for t in targets:
        key = id(t.weight)
        if key in seen:
            continue
        seen.add(key)
        for name, module, attr in holders.get(key, []):
            if module is t.module and attr == "weight":
                continue
            where = _join(name, attr)
            if isinstance(module, parametrize.ParametrizationList):
                owner = name.rsplit(".", 2)[0]  # <owner>.parametrizations.weight
                raise ValueError(
                    f"the weight of layer {t.name!r} is also the weight of {owner!r}, "
                    "which already has a parametrization on it (a Pruner is attached, or another "
                    "parametrization is): call pruner.remove() or pruner.finalize() on the earlier "
                    "Pruner first"
                )
            if attr != "weight":
                raise ValueError(
                    f"the weight of layer {t.name!r} is also held as {where!r}, which would not "
                    f"see it pruned: untie the two, or leave the layer dense (exclude=[{t.name!r}])"
                )
            if _matches(name, exclude, children=True):
                raise ValueError(
                    f"layer {name!r} is excluded but shares its weight with {t.name!r}, which is "
                    "pruned: a tied weight is pruned everywhere or nowhere; exclude both or neither"
                )
            tied.append((PruneTarget(name, module), len(unique)))
            logger.info("layer %r shares its weight with %r: pruned with it", name, t.name)
        unique.append(t)
    return unique, tied


class Pruner:
    """Prune a model to an unstructured sparsity during training, with Feather.

    The settings (every argument but ``model``, ``total_steps`` and
    ``process_group``) are documented in full once, as the fields of the same
    names of :class:`~feather_sparse.pruner_config.PrunerConfig`; the lines
    below sum them up. They make a ``PrunerConfig``, which checks them; it is
    kept as ``pruner.pruner_config``, and :meth:`from_config` takes one
    directly.

    Args:
        model: any ``nn.Module``; its prunable weights get a parametrization,
            nothing else changes (the modules, their forward, the parameters the
            optimizer holds).
        sparsity: final target sparsity ``S`` in ``[0, 1)``; required unless
            ``pattern`` implies it.
        total_steps: number of :meth:`step` calls in the whole training
            (``epochs × batches per epoch``); the schedule is laid out on it.
            May be left out with an N:M ``pattern`` applied from the first step.
        operator: ``"feather"`` (default), ``"soft"``, ``"hard"``, another
            registered name, or an :class:`~feather_sparse.ops.Operator`.
        p: the operator's power in ``[1, inf]``, overriding ``operator``'s.
        theta: gradient scale ``θ`` of the pruned weights in ``[0, 1]``, or
            ``"auto"`` (the paper's rule).
        backbone: how thresholds are chosen: ``"global"`` (default), another
            registered name, ``{"name": ..., **options}``, or a
            :class:`~feather_sparse.backbones.Backbone`.
        schedule: the sparsity requested at each step (default: cubic from 0
            to ``S`` over the first half of training; with a ``pattern``, the
            full pattern from the first step).
        update_every: recompute the thresholds every this many steps.
        include: layer types, module names or ``"re:"`` patterns to prune.
        exclude: module names or ``"re:"`` patterns never to prune.
        min_params: skip weights with fewer elements.
        max_layer_sparsity: cap on each layer's sparsity (None: no cap).
        theta_rule: the boundary of ``theta="auto"``: ``"paper"`` or ``"released"``.
        check_finite: raise at :meth:`step` if a weight holds NaN or inf.
        process_group: for *sharded* weights only — the ``torch.distributed``
            group the prunable weights are sharded over. When the weights are
            DTensors (FSDP2 ``fully_shard``) each rank selects
            on its local shard and the counts are all-reduced over this group,
            so every rank gets the exact global threshold without gathering the
            weights; ``None`` takes the group from the weights' device mesh
            (for weights sharded on several mesh dimensions, as by FSDP2 over
            tensor parallelism, the group spanning them, made once).
            Plain (replicated) weights, as under DDP, never use it: every rank
            computes the identical threshold locally, with no communication.
        pattern: ``"N:M"`` (``"2:4"``, ``"4:8"``, …) for N:M sparsity, or None
            (unstructured).

    Raises:
        ValueError: for invalid arguments, a model with no prunable layer (or
            only layers with no weights), a model already pruned, or weights on
            the meta device (not yet materialised). Nothing in the model is
            modified then.
    """

    def __init__(
        self,
        model: nn.Module,
        sparsity: float | None = None,
        total_steps: int | None = None,
        operator: str | Operator = "feather",
        p: float | None = None,
        theta: float | str = "auto",
        backbone: str | Backbone | dict[str, Any] = "global",
        schedule: Schedule | Callable[[int], float] | str | dict[str, Any] | None = None,
        update_every: int = 1,
        include: Sequence[type[nn.Module] | str] = DEFAULT_INCLUDE,
        exclude: Sequence[str] = (),
        min_params: int = 0,
        max_layer_sparsity: float | None = None,
        theta_rule: str = "paper",
        check_finite: bool = True,
        process_group: ProcessGroup | None = None,
        pattern: str | NMPattern | None = None,
    ) -> None:
        config = PrunerConfig(
            sparsity,
            operator=operator,
            p=p,
            theta=theta,
            theta_rule=theta_rule,
            backbone=backbone,
            schedule=schedule,
            update_every=update_every,
            include=include,
            exclude=exclude,
            min_params=min_params,
            max_layer_sparsity=max_layer_sparsity,
            check_finite=check_finite,
            pattern=pattern,
        )
        with outside_inference_mode():
            self._attach(model, config, total_steps, process_group)

    @classmethod
    def from_config(
        cls,
        model: nn.Module,
        config: PrunerConfig,
        total_steps: int | None = None,
        process_group: ProcessGroup | None = None,
    ) -> Pruner:
        """A Pruner on ``model`` with the settings of ``config`` (checked when it was made).

        Args:
            model: as for the constructor.
            config: the settings.
            total_steps: number of :meth:`step` calls in the whole training
                (may be left out when ``config.needs_total_steps`` is False).
            process_group: as for the constructor (sharded weights only).

        Raises:
            ValueError: as the constructor does for the model and ``total_steps``.
        """
        pruner = cls.__new__(cls)
        with outside_inference_mode():
            pruner._attach(model, config, total_steps, process_group)
        return pruner

    def _attach(
        self,
        model: nn.Module,
        config: PrunerConfig,
        total_steps: int | None,
        process_group: ProcessGroup | None,
    ) -> None:
        # --- check the model before touching it (the settings were checked) ---
        if total_steps is None:
            if config.pattern is not None and config.needs_total_steps:
                raise ValueError(
                    "total_steps is needed to lay out a dense warm-up or a ramp "
                    "(epochs × batches per epoch)"
                )
            if config.needs_total_steps:
                raise ValueError(
                    "total_steps is required (epochs × batches per epoch): the schedule is laid "
                    "out on it"
                )
            total_steps = 1  # the full N:M pattern at every step: the length does not matter
        steps = as_int(total_steps)
        if steps is None or steps <= 0:
            raise ValueError(
                "total_steps must be a positive int (epochs × batches per epoch), "
                f"got {total_steps!r}"
            )
        total_steps = steps
        include, exclude, min_params = config.include, config.exclude, config.min_params
        self.operator = config.make_operator()
        self.backbone = config.make_backbone()
        self.schedule = config.make_schedule()
        targets = _find_targets(model, include, exclude, min_params)
        recurrent = _recurrent_weights(model, exclude)
        if not targets:
            note = f" ({_recurrent_note(recurrent)})" if recurrent else ""
            raise ValueError(
                f"no prunable layer found in {type(model).__name__}: include={_names(include)}, "
                f"exclude={list(exclude)}, min_params={min_params} matched no module with a "
                f"floating-point `weight`{note}; widen `include` or relax `exclude`/`min_params`"
            )
        for t in targets:  # before a weight is read through PruneTarget
            _refuse_other_weight(t.name, t.module)
        if not any(t.numel for t in targets):  # the sparsity of no weights is 0/0
            raise ValueError(
                f"the prunable layers of {type(model).__name__} "
                f"({', '.join(repr(t.name) for t in targets)}) hold no weights (every one has a "
                "dimension of size 0), so there is nothing to prune: check the model's sizes, "
                "or widen `include`"
            )
        _warn_dense_attention(model, {t.name for t in targets})
        if recurrent:  # the sparsity asked for applies to the other layers alone
            logger.warning(
                "%s; the sparsity applies to the other layers (exclude=%r silences this)",
                _recurrent_note(recurrent),
                [name for name, *_ in recurrent if name],
            )
        targets, tied = _tied(model, targets, exclude)
        _check_keeps_a_weight(config.final_sparsity, sum(t.numel for t in targets))
        distributed.refuse_sharded_model(model, [t.weight for t in targets])
        ddp_indices = distributed.ddp_reducer_indices(model)
        devices = {t.weight.device for t in targets}
        if any(device.type == "meta" for device in devices):
            raise ValueError(
                "the prunable weights are on the meta device (they hold no values yet), and a "
                "Pruner measures them when it attaches: materialise the model first "
                "(model.to_empty(device=...), then initialise or load its weights) and create "
                "the Pruner after"
            )
        if len(devices) > 1 and self.backbone.name.startswith("global"):
            raise ValueError(
                f"prunable weights live on several devices ({sorted(map(str, devices))}); the "
                "global threshold needs them on one device"
            )

        self.model = model
        self.pruner_config = config
        self.sparsity = config.final_sparsity
        self.total_steps = total_steps
        self.theta = config.theta_value
        self.theta_rule = config.theta_rule
        self.update_every = config.update_every
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        self.min_params = min_params
        self.max_layer_sparsity = config.max_layer_sparsity
        self.check_finite = config.check_finite
        self.process_group = process_group
        self.targets = targets
        #: Other layers holding a target's weight (tied weights), with the target's index.
        self.tied = tied
        self._step = 0
        self._ended: _Ended | None = None  # set by finalize() or remove()
        self._swap: bool | None = None  # True inside swapped()
        self._warned_collapse: set[str] = set()
        _check_backbone_free(self.backbone)
        self.backbone.setup(targets)
        # ASL+'s learned thresholds live outside the model, hence outside DDP.
        distributed.average_grads_under_ddp(model, self.backbone)

        # --- attach: thresholds for step 0, then the parametrizations --------
        thresholds = self._compute_thresholds(self.scheduled_sparsity(0))
        # Route the forward through the backbone only when it changes it.
        hook = self.backbone if _overrides(self.backbone, "forward_weight") else None
        # each layer's parameter names before parametrize removes ``weight`` from them
        layouts = {
            id(t.module): list(t.module._parameters) for t in [*targets, *(a for a, _ in tied)]
        }
        attached: list[PruneTarget] = []
        try:
            params = []
            for index, (t, value) in enumerate(zip(targets, thresholds)):
                buf = (
                    value.detach()
                    .to(device=t.weight.device, dtype=compute_dtype(t.weight.dtype))
                    .clone()
                )
                param = FeatherParametrization(self.operator, self.theta, buf, hook, index)
                parametrize.register_parametrization(t.module, "weight", param)
                _REGISTERED.add(param)
                attached.append(t)
                params.append(param)
            for alias, index in tied:  # the same parametrization: one threshold, one weight
                parametrize.register_parametrization(alias.module, "weight", params[index])
                attached.append(alias)
        except Exception:
            for t in attached:  # leave the model as we found it
                _unparametrize(t.module, False, layouts[id(t.module)])
            distributed.reconnect_ddp(ddp_indices, [t.weight for t in attached])
            raise
        distributed.reconnect_ddp(ddp_indices, [t.weight for t in targets])
        #: Plain ``<layer>.weight`` keys in the model's state_dict while attached.
        self._key_hooks = plain_keys.install([(t.module, layouts[id(t.module)]) for t in attached])
        #: Each parametrized layer's parameter names before it was parametrized.
        self._layouts = layouts
        #: Each parametrized layer's path from the model: (parent, key, child) links.
        self._paths = [(t.name, _path(model, t.name)) for t in attached]
        self._current = self.scheduled_sparsity(0)
        logger.info(
            "%s attached to %d tensors (%s weights)%s, target sparsity %.4g, theta %.3g",
            _method_label(self.operator),
            len(targets),
            f"{self.num_params:,}",
            _backbone_label(self.backbone),
            self.sparsity,
            self.theta,
        )

    # ------------------------------------------------------------------ queries
    @property
    def num_params(self) -> int:
        """Number of prunable weights ``N``."""
        return sum(t.numel for t in self.targets)

    @property
    def current_step(self) -> int:
        """Number of :meth:`step` calls so far."""
        return self._step

    def scheduled_sparsity(self, step: int | None = None) -> float:
        """The sparsity the schedule requests at ``step``.

        Args:
            step: the step to ask about; None: the current step.

        Raises:
            ValueError: if the schedule returns a sparsity outside ``[0, 1)``.
        """
        step = self._step if step is None else step
        if isinstance(self.schedule, Schedule):
            s = self.schedule(step, self.total_steps, self.sparsity)
        else:
            s = float(self.schedule(step))
        if not 0.0 <= s < 1.0:  # 1 would prune every weight; also rejects NaN
            raise ValueError(
                f"the schedule returned sparsity {s} at step {step}; it must be in [0, 1) "
                "(1 would prune every weight)"
            )
        return s

    def _parametrization(self, target: PruneTarget) -> FeatherParametrization:
        plist: Any = target.parametrizations()
        p = None if plist is None else plist._modules.get("0")  # plist[0], without indexing
        if not isinstance(p, FeatherParametrization):
            raise RuntimeError(
                f"layer {target.name!r} no longer carries this Pruner's parametrization (it was "
                "removed or replaced outside the Pruner, e.g. by parametrize."
                "remove_parametrizations): create a new Pruner on the model"
            )
        return p

    def thresholds(self) -> list[Tensor]:
        """The current 0-d threshold of each prunable tensor (the live buffers).

        After :meth:`finalize`, copies of the thresholds that were baked in;
        after :meth:`remove`, copies of those in effect when it was removed.
        """
        if self._ended is not None:
            return [t.clone() for t in self._ended.thresholds]
        return self._buffers()

    def _buffers(self) -> list[Tensor]:
        """The live threshold buffers of the attached parametrizations."""
        # the buffers dictionary itself: nn.Module.__getattr__ costs microseconds per layer
        buffers: list[Any] = [self._parametrization(t)._buffers["threshold"] for t in self.targets]
        return buffers

    def parametrized_layers(self) -> list[PruneTarget]:
        """Every layer with a parametrization: the targets, then the layers tied to them."""
        return [*self.targets, *(alias for alias, _ in self.tied)]

    def weights(self) -> list[Tensor]:
        """The stored dense weights (what the optimizer updates)."""
        return [t.weight for t in self.targets]

    def _local_weights(
        self, whole_groups: bool = False
    ) -> tuple[list[Tensor], ProcessGroup | None]:
        """This rank's part of each prunable weight and the group it is sharded over.

        See :func:`feather_sparse.distributed.local_weights`; plain tensors
        (also under DDP) are whole weights with group None. ``whole_groups``:
        an N:M layer whose shards split its groups is gathered whole onto the
        group's first rank (a collective; see :meth:`_gathers`).
        """
        weights = self.weights()
        gather = [self._gathers(i, w) for i, w in enumerate(weights)] if whole_groups else None
        return distributed.local_weights(weights, self.process_group, gather)

    def _gathers(self, index: int, weight: Tensor) -> bool:
        """Whether layer ``index``'s pruned weight must be computed from the whole
        ``weight``: an N:M layer sharded (FSDP2) so that its shards split its groups
        (GPT-2's ``Conv1D`` cut at a row off a multiple of M; a ``shard_placement_fn``
        sharding its inputs). The same answer on every rank."""
        return isinstance(self.backbone, NMBackbone) and self.backbone.splits_groups(index, weight)

    def _layer_zeros(
        self, local: tuple[list[Tensor], ProcessGroup | None] | None = None
    ) -> list[int]:
        if self._ended is not None:
            return list(self._recorded(self._ended.zeros))
        weights, group = self._local_weights(whole_groups=True) if local is None else local
        counts = torch.stack(
            [
                torch.count_nonzero(self.backbone.pruned_mask(i, w, th, operator=self.operator))
                for i, (w, th) in enumerate(zip(weights, self.thresholds()))
            ]
        )
        distributed.all_reduce_sum(counts, group)
        return [int(c) for c in counts.tolist()]

    def _shown_thresholds(
        self, local: tuple[list[Tensor], ProcessGroup | None] | None = None
    ) -> list[float]:
        """The threshold the report shows for each layer (the backbone's choice); N:M's
        mean over the groups of the whole weights (a collective for sharded weights)."""
        weights, group = self._local_weights(whole_groups=True) if local is None else local
        if isinstance(self.backbone, NMBackbone):
            return self.backbone.report_thresholds(weights, self._buffers(), group)
        return [
            self.backbone.report_threshold(i, w, th)
            for i, (w, th) in enumerate(zip(weights, self._buffers()))
        ]

    def _recorded(self, values: tuple[Any, ...] | None) -> tuple[Any, ...]:
        """A record of the final state (see :class:`_Ended`), or the error saying it is missing."""
        if values is None:
            assert self._ended is not None
            raise RuntimeError(
                f"this Pruner was {self._ended.how} before it could measure its pruned weights, "
                "so it has no report; thresholds() and config() still give its settings"
            )
        return values

    def sparsity_achieved(self) -> float:
        """The fraction of prunable weights the forward currently zeroes.

        After :meth:`finalize`, the fraction of exact zeros it left in the
        weights; after :meth:`remove`, what the forward zeroed just before (the
        model's weights are dense again).
        """
        self._refuse_while_swapped("sparsity_achieved()")
        return sum(self._layer_zeros()) / self.num_params

    def report(self) -> PrunerReport:
        """Per-layer name, shape, params, threshold and sparsity; flags collapsed layers.

        After :meth:`finalize` it reports the baked model: each layer's exact
        zeros as finalize left them and the thresholds baked in (scheduled
        sparsity: the one finalized at). After :meth:`remove`, the state just
        before it (the model's weights are dense again).
        """
        self._refuse_while_swapped("report()")
        if self._ended is None:
            self._check_in_model("report()")
        local = None if self._ended is not None else self._local_weights(whole_groups=True)
        zeros = self._layer_zeros(local)
        if self._ended is None:
            shown = self._shown_thresholds(local)
        else:
            shown = list(self._recorded(self._ended.shown))
        rows = []
        for t, z, threshold in zip(self.targets, zeros, shown):
            rows.append(
                LayerReport(
                    name=t.name,
                    shape=t.shape,
                    params=t.numel,
                    threshold=threshold,
                    sparsity=z / t.numel if t.numel else 0.0,  # an empty layer prunes nothing
                    # at sparsity 0 nothing is pruned: all-zero is the user's init
                    collapsed=0 < t.numel == z and self._current > 0,
                )
            )
        report = PrunerReport(
            step=self._step,
            target_sparsity=self.sparsity,
            scheduled_sparsity=self._current,
            sparsity=sum(zeros) / self.num_params,
            params=self.num_params,
            layers=tuple(rows),
            pattern=str(self.backbone.pattern) if isinstance(self.backbone, NMBackbone) else None,
        )
        self._warn_collapsed(report.collapsed)
        return report

    def _warn_collapsed(self, names: Iterable[str]) -> None:
        new = [n for n in names if n not in self._warned_collapse]
        if new:
            self._warned_collapse.update(new)
            logger.warning(
                "layer collapse: %s pruned to 100 %% (every weight below the global threshold); "
                "such a layer passes no signal. Consider max_layer_sparsity=0.99, gradient "
                "clipping, or excluding the layer.",
                ", ".join(repr(n) for n in new),
            )

    # ------------------------------------------------------------------ updates
    def _compute_thresholds(self, sparsity: float) -> list[Tensor]:
        weights, group = self._local_weights()
        if group is not None:
            if not self.backbone.supports_sharding:
                able = [n for n in BACKBONES.names() if BACKBONES.get(n).supports_sharding]
                if type(self.backbone).supports_sharding:  # this backbone's options turn it off
                    if distributed.fsdp_managed(self.model, self.weights()):
                        why = "is kept per shard, but FSDP2's forward sees the gathered weights"
                    else:  # tensor parallelism: the weights were DTensors at attach
                        why = (
                            "would be kept per shard under tensor parallelism, and the "
                            "Pruner's state_dict() holds no sharded masks: a checkpoint would "
                            "save one rank's masks for all"
                        )
                    raise ValueError(
                        f"backbone {self.backbone.config()!r} does not support sharded "
                        "(FSDP2/DTensor) weights with these options (a frozen one-shot N:M mask "
                        f"{why}); use another N:M method (pattern='2:4' recomputes each "
                        "group's mask at every forward, on each shard), or DDP"
                    )
                raise ValueError(
                    f"backbone {self.backbone.name!r} does not support sharded (FSDP2/DTensor) "
                    f"weights; use one that does ({', '.join(able)})"
                )
            if getattr(self, "_agreed_group", None) != id(group):
                self._check_ranks_agree(group, weights[0].device)
            self.backbone.process_group = group
        # The global backbone's search measures max |w| per tensor on the way,
        # so its finite check comes after the search at no cost; any other
        # backbone is checked before, with one read-only pass per tensor.
        after = self.check_finite and self.backbone.measures_abs_max
        maxima = None
        if self.check_finite and not after:
            maxima = self._abs_maxima(weights, group, measured=None)
            self._check_finite(maxima)
        self.backbone.advance(self._step, self.total_steps, self.sparsity)
        try:
            thresholds = self.backbone.thresholds(weights, sparsity)
        except ValueError:
            if after:  # a NaN weight can make the search fail: name the layer instead
                self._check_finite(self._abs_maxima(weights, group, measured=None))
            raise
        if after:
            maxima = self._abs_maxima(weights, group, measured=self.backbone.abs_max())
            self._check_finite(maxima)
        if len(thresholds) != len(weights):
            raise RuntimeError(
                f"backbone {self.backbone.name!r} returned {len(thresholds)} thresholds for "
                f"{len(weights)} tensors"
            )
        if self.max_layer_sparsity is not None:
            caps = layer_thresholds_at_most(weights, self.max_layer_sparsity, group)
            thresholds = [torch.minimum(t, c.to(t)) for t, c in zip(thresholds, caps)]
        if maxima is not None and sparsity > 0 and self.backbone.thresholds_are_magnitudes:
            # Collapse check for free: a layer is fully pruned when T_l >= max |w_l|.
            ts = torch.stack([t.detach().float().reshape(()).to(maxima.device) for t in thresholds])
            if bool((ts >= maxima).any()):
                flags = (ts >= maxima).tolist()
                self._warn_collapsed(  # an empty layer has nothing to collapse
                    t.name for t, f in zip(self.targets, flags) if f and t.numel
                )
        return thresholds

    def _check_ranks_agree(self, group: ProcessGroup, device: torch.device) -> None:
        """Once per group, at the first selection over it (under FSDP2 the first
        ``step()`` after ``fully_shard``): every rank holds the same settings and
        step (one all-reduce), and FSDP2 does not cast the weights down for the
        forward. Before any other collective of the step, so that a rank given
        other settings raises instead of leaving the others waiting in a
        collective it never reaches."""
        settings = dict(self.config())
        settings["shapes"] = [list(t.shape) for t in self.targets]
        settings["step"] = self._step
        distributed.check_same_settings(settings, group, device)
        distributed.refuse_lowered_param_dtype(self.model, self.weights())
        self._agreed_group = id(group)

    @staticmethod
    def _abs_maxima(
        weights: Sequence[Tensor], group: ProcessGroup | None, measured: Tensor | None
    ) -> Tensor:
        """``max |w|`` per tensor (over all shards), NaN where a tensor holds a NaN.

        ``measured``: the backbone's own measurement of this rank's tensors,
        if it made one; else one read-only pass per tensor (``aminmax``
        propagates NaN and inf; ``|w|.amax()`` would also write a full-size
        temporary).
        """
        maxima = measured if measured is not None else _abs_max_each(weights)
        if group is not None:
            maxima = distributed.all_reduce_max(maxima, group)
        return maxima

    def _check_finite(self, maxima: Tensor) -> None:
        values = maxima.tolist()  # one read of a few floats; the test is plain Python
        if not all(map(math.isfinite, values)):
            bad = [t.name for t, m in zip(self.targets, values) if not math.isfinite(m)]
            why = (
                "the model held them before training: check how it was built or loaded"
                if self._step == 0
                else "training diverged; lower the learning rate or clip gradients"
            )
            raise RuntimeError(
                f"non-finite weights (NaN or inf) in {plural(len(bad), 'layer')} "
                f"{', '.join(bad)} at step {self._step}: {why}"
            )

    @torch.no_grad()
    def _write_thresholds(self, thresholds: Sequence[Tensor]) -> None:
        # same device as the weight: no host round trip; one call for all buffers
        _copy_each(self._buffers(), list(thresholds))

    def step(self) -> None:
        """Advance one training step; call after ``optimizer.step()``.

        Recomputes the thresholds for the next forward from the current
        weights at the schedule's sparsity (every ``update_every`` steps).

        Raises:
            RuntimeError: if a weight is NaN or inf (naming the layer), or the
                Pruner was finalized or removed.
        """
        self._check_attached("step()")
        self._step += 1
        if self._step % self.update_every == 0:
            self._update()  # checked just now: the model's layers are walked once a step

    def update(self, sparsity: float | None = None) -> None:
        """Recompute the thresholds now, at ``sparsity``.

        Args:
            sparsity: the sparsity to prune to, in ``[0, 1)``; None: the one the
                schedule requests at the current step.
        """
        self._check_attached("update()")
        self._update(sparsity)

    def _update(self, sparsity: float | None = None) -> None:
        """:meth:`update` once the Pruner is known to be attached."""
        s = self.scheduled_sparsity() if sparsity is None else check_sparsity(sparsity)
        with outside_inference_mode():
            self._write_thresholds(self._compute_thresholds(s))
        self._current = s

    # --------------------------------------------------------- extra training terms
    def parameters(self) -> list[nn.Parameter]:
        """Trainable parameters of the backbone (e.g. ASL+'s per-layer thresholds); may be empty."""
        return self.backbone.parameters()

    def regularizer(self) -> Tensor:
        """The backbone's extra loss term (0 for the global backbone); add it to the task loss."""
        reg = self.backbone.regularizer()
        if reg is None:
            return torch.zeros((), device=self.targets[0].weight.device)
        return reg

    def swapped(self) -> contextlib.AbstractContextManager[bool]:
        """A block for one step's forwards and backwards on ``P_T(w)`` in the stored weights.

        The same gradients as the usual step, with fewer operations per layer::

            with pruner.swapped():
                loss_fn(model(x), y).backward()
            optimizer.step()
            pruner.step()

        Yields whether the weights were swapped; where the gradient is not the
        identity (θ < 1, SR-STE's decay, ASL+, Spartan, ST-3) or the weights
        cannot be written whole (sharded, non-contiguous), the block runs the
        usual step and yields False. Inside it the stored weights hold
        ``P_T(w)``; the dense ones come back when it ends. See
        :mod:`feather_sparse.swap`.

        Raises:
            RuntimeError: if nested, if the Pruner was finalized or removed, or
                if a stored weight was written inside the block (an optimizer
                step there; the weights of before the block are restored).
        """
        from feather_sparse.swap import swapped  # here: swap imports this module

        return swapped(self)

    # ------------------------------------------------------------------ ending
    @torch.no_grad()
    def finalize(self, sparsity: float | None = None) -> float:
        """Bake ``P_T(w)`` into the weights and detach; returns the achieved sparsity.

        The thresholds are recomputed from the final weights at the target
        sparsity (or ``sparsity``), the thresholded weights — shrunk values,
        not merely masked ones — are written into the same ``Parameter``
        objects, and the parametrizations are removed, leaving a plain model
        with exact zeros.

        With ``max_layer_sparsity`` set, the cap may leave fewer zeros than
        the target asks; the returned sparsity says how many.

        Args:
            sparsity: the sparsity to bake, in ``[0, 1)``; None: the target ``S``.

        Raises:
            RuntimeError: if the Pruner was already finalized or removed, or
                the weights are sharded by FSDP2 (its modules cannot drop the
                parametrization; see ``docs/distributed.md`` for the recipe);
                after baking, if fewer zeros than the target remain without a
                ``max_layer_sparsity`` cap (an internal error, to report).
            ValueError: for a ``sparsity`` outside [0, 1), or, for an N:M
                pattern, other than the pattern's (the model and the Pruner are
                left as they were).
        """
        self._check_attached("finalize()")
        distributed.check_unsharded(self.model, self.weights(), "finalize")
        target = self.sparsity if sparsity is None else check_sparsity(sparsity)
        if _overrides(self.backbone, "check_final"):  # what will be baked, while undoable
            before = self.state_dict()
            try:
                self.update(target)
                for i, t in enumerate(self.targets):
                    self.backbone.check_final(i, self._parametrization(t)(t.weight))
            except Exception:
                self.load_state_dict(before)  # refused: the Pruner goes on as it was
                raise
        else:
            self.update(target)
        # The report's thresholds, while the dense weights they are measured on are there.
        thresholds = tuple(t.detach().clone() for t in self._buffers())
        shown = tuple(self._shown_thresholds())
        self._release_keys()
        # A tied layer lets go of the shared weight first; its target then bakes
        # P_T(w) into that one tensor, in place, once.
        for alias, _ in self.tied:
            _unparametrize(alias.module, False, self._layouts[id(alias.module)])
        for t in self.targets:
            layout = _memory_format(t.weight)  # the stored weight's, before baking
            _unparametrize(t.module, True, self._layouts[id(t.module)])
            # The N:M pass of small layers computes them into one buffer, and the
            # baked weight is a view of it: give each weight storage of its own, so
            # that saving or moving one layer carries that layer alone.
            weight = t.weight
            if weight.untyped_storage().nbytes() != weight.numel() * weight.element_size():
                weight.data = weight.data.clone()
            if layout is not None and not weight.is_contiguous(memory_format=layout):
                weight.data = weight.data.contiguous(memory_format=layout)  # e.g. channels_last
        self._ended = _Ended("finalized", thresholds, shown, None)  # baked: prunes no more
        self.backbone.release()
        weights, group = self._local_weights()
        counts = torch.stack([torch.count_nonzero(w == 0) for w in weights])
        distributed.all_reduce_sum(counts, group)
        self._ended = _Ended("finalized", thresholds, shown, tuple(counts.tolist()))
        zeros = int(counts.sum())
        achieved = zeros / self.num_params
        expected = round(target * self.num_params)
        if self.max_layer_sparsity is None and zeros < expected:
            raise RuntimeError(
                f"finalize left {zeros} zeros, fewer than the {expected} requested: "
                "please report this bug"
            )
        if self.max_layer_sparsity is None and zeros > expected + 1:
            logger.warning(
                "finalize: %d zeros where %d were requested (%+d): weights tied at the threshold "
                "magnitude or exact zeros are all pruned",
                zeros,
                expected,
                zeros - expected,
            )
        logger.info("finalized at sparsity %.6f (target %.6f)", achieved, target)
        return achieved

    @torch.no_grad()
    def remove(self) -> None:
        """Detach without baking: the model gets its dense weights back.

        :meth:`report`, :meth:`sparsity_achieved` and :meth:`thresholds` then
        describe the state just before (what the forward zeroed, the
        thresholds in effect); the calls that change or save the pruning are
        refused.
        """
        self._check_attached("remove()")
        distributed.check_unsharded(self.model, self.weights(), "remove")
        thresholds = tuple(t.detach().clone() for t in self._buffers())
        shown: tuple[float, ...] | None = None
        zeros: tuple[int, ...] | None = None
        try:  # a record for the queries; never in the way of giving the weights back
            shown, zeros = tuple(self._shown_thresholds()), tuple(self._layer_zeros())
        except Exception:  # e.g. a backbone left half-loaded by a refused state
            logger.debug("remove: the pruned state could not be measured", exc_info=True)
        self._release_keys()
        for t in self.parametrized_layers():
            _unparametrize(t.module, False, self._layouts[id(t.module)])
        self._ended = _Ended("removed", thresholds, shown, zeros)
        self.backbone.release()

    def _release_keys(self) -> None:
        """Take the plain-key ``state_dict`` hooks off the layers (before they go plain)."""
        for handle in self._key_hooks:
            handle.remove()
        self._key_hooks = []

    def _check_attached(self, call: str, hint: str = "") -> None:
        """Raise when the Pruner no longer drives the model: ``call`` changes or saves it.

        Raises:
            RuntimeError: naming ``call``, what finalize or remove did, what can
                still be asked, and ``hint`` (what to do instead).
        """
        self._refuse_while_swapped(call)
        if self._ended is None:
            if call != "remove()":  # remove() gives back what it can: the way out
                self._check_in_model(call)
            return
        if self._ended.how == "finalized":
            what = "finalized (the pruned weights are baked into the model)"
            still = "describe the baked model"
        else:
            what = "removed (the model holds its dense weights again)"
            still = "describe the state it was removed in"
        raise RuntimeError(
            f"{call} is refused: this Pruner was {what} and prunes no more; report(), "
            f"sparsity_achieved(), thresholds() and config() still {still}. "
            + (hint or "To prune the model again, create a new Pruner on it")
        )

    def _refuse_while_swapped(self, call: str) -> None:
        """Raise inside :meth:`swapped`, whose stored weights hold ``P_T(w)``, not ``w``."""
        if self._swap is not None:
            raise RuntimeError(
                f"{call} is refused inside pruner.swapped(): until the block ends the stored "
                "weights hold the pruned values, not the dense ones; call it after the block"
            )

    def _check_in_model(self, call: str) -> None:
        """Raise when a parametrized layer is no longer where it was in the model.

        ``model.head = nn.Linear(...)`` after attaching leaves the Pruner
        pruning the old, detached layer while the model trains the new one
        dense: every later number would describe a layer the model does not use.

        Raises:
            RuntimeError: naming ``call``, the layer and the fix.
        """
        for index, (name, links) in enumerate(self._paths):
            if all(parent._modules.get(key) is child for parent, key, child in links):
                continue
            # Moved, not replaced (wrapped for activation checkpointing, put into a new
            # container): the layer is still in the model, under another name.
            layer = links[-1][2] if links else self.model
            moved = next((n for n, m in self.model.named_modules() if m is layer), None)
            if moved is not None:
                self._paths[index] = (name, _path(self.model, moved))
                continue
            raise RuntimeError(
                f"{call} is refused: layer {name!r} is not the one the Pruner attached to "
                "(it, or a module holding it, was replaced in the model after the Pruner "
                "attached), so the Pruner would prune a layer the model no longer uses. "
                "Change the model before attaching: call pruner.remove(), change the "
                "model, then create a new Pruner on it"
            )

    # ------------------------------------------------------------------ state
    @torch.no_grad()
    def dense_state_dict(self, pruned: bool = False, full: bool = False) -> dict[str, Tensor]:
        """The model's ``state_dict`` with plain keys (``conv.weight``), for the dense model.

        While the Pruner is attached, ``model.state_dict()`` itself has the
        plain keys (module :mod:`~feather_sparse.plain_keys`), so with the
        defaults this is that dictionary; ``pruned`` and ``full`` change values.

        Args:
            pruned: False gives the stored dense weights (what training
                continues from); True gives ``P_T(w)``, what the forward uses now,
                in tensors of their own (editing them changes nothing in the model;
                a tied weight is one tensor under each of its keys, as in ``state_dict``).
            full: True gathers every sharded value (an FSDP2 DTensor) into a
                whole plain tensor, ready to load into an unsharded model; this
                is then a **collective**: call it on every rank. Values that are
                not sharded (FSDP2 leaves buffers plain) come as they are.

        Raises:
            RuntimeError: after :meth:`finalize` (the model's own ``state_dict``
                then holds the pruned weights) or :meth:`remove` (it holds the
                dense ones).
        """
        self._check_attached(
            "dense_state_dict()", "The model's own state_dict() now holds its plain weights"
        )
        # The model's state_dict has the plain keys already (module plain_keys).
        out: dict[str, Tensor] = self.model.state_dict()
        if pruned:
            # Every name of every parametrized module: state_dict lists a module
            # registered under two names twice (named_modules lists it once).
            layers = {id(t.module): t for t in self.parametrized_layers()}
            computed: dict[int, Tensor] = {}  # by parametrization: a tied weight once
            for name, module in self.model.named_modules(remove_duplicate=False):
                if id(module) in layers:
                    key = _join(name, "weight")
                    param = self._parametrization(layers[id(module)])
                    if id(param) in computed:  # tied holders share one tensor, as in state_dict
                        out[key] = computed[id(param)]
                        continue
                    value = out[key]
                    if self._gathers(param.index, value):  # shards that split N:M groups
                        whole = param(distributed.full_tensor(value))  # a collective
                        value = whole if full else distributed.shard_like(whole, value)
                    else:
                        value = distributed.on_local_shard(param, value)
                    # a tensor of its own: the forward may be a view of a cache (nm.fused)
                    out[key] = computed[id(param)] = value.detach().clone()
        if full:
            out = {key: distributed.full_tensor(value) for key, value in out.items()}
        return out

    def config(self) -> dict[str, Any]:
        """The constructor's arguments, JSON-able, so a run can be rebuilt exactly."""
        schedule = (
            self.schedule.config()
            if isinstance(self.schedule, Schedule)
            else {"name": "<callable>"}
        )
        return {
            "sparsity": self.sparsity,
            "total_steps": self.total_steps,
            "operator": self.operator.config(),
            "theta": self.pruner_config.theta,
            "theta_rule": self.theta_rule,
            "theta_resolved": self.theta,
            "backbone": self.backbone.config(),
            "schedule": schedule,
            "update_every": self.update_every,
            "exclude": list(self.exclude),
            "min_params": self.min_params,
            "max_layer_sparsity": self.max_layer_sparsity,
            "pattern": self.pruner_config.pattern,
            "check_finite": self.check_finite,
            "targets": [t.name for t in self.targets],
        }

    def state_dict(self) -> dict[str, Any]:
        """Step, thresholds, backbone state and config: everything to resume identically.

        Raises:
            RuntimeError: after :meth:`finalize` or :meth:`remove`: there is no
                training left to resume (save the state before them).
        """
        self._check_attached(
            "state_dict()",
            "To resume training later, save pruner.state_dict() before finalize() or remove()",
        )
        return {
            "format": STATE_FORMAT,
            "format_version": FORMAT_VERSION,
            "version": __version__,
            "step": self._step,
            "current_sparsity": self._current,
            "thresholds": [t.detach().clone() for t in self.thresholds()],
            "backbone": self.backbone.state_dict(),
            "config": self.config(),
        }

    # Fields that must agree between a saved state and this Pruner.
    _MUST_MATCH = (
        "sparsity",
        "total_steps",
        "operator",
        "theta_resolved",
        "backbone",
        "schedule",
        "update_every",
        "max_layer_sparsity",
        "targets",
    )

    def _differing_settings(self, saved: Mapping[str, Any]) -> list[str]:
        """The fields of :attr:`_MUST_MATCH` on which a saved config differs from this
        Pruner's, in that order (``total_steps`` only where the schedule uses it: not
        for an N:M pattern from the first step)."""
        mine = self.config()
        return [
            key
            for key in self._MUST_MATCH
            if (key != "total_steps" or self.pruner_config.needs_total_steps)
            and saved.get(key) != mine.get(key)
        ]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; the next step continues identically.

        Args:
            state: a dict :meth:`state_dict` returned.

        Raises:
            ValueError: if the state is not a Pruner state, or was saved with a
                different configuration (the message names the field).
        """
        self._check_attached("load_state_dict()")
        _check_state(state)  # the whole layout, before anything is applied
        saved, mine = state["config"], self.config()
        differing = self._differing_settings(saved)
        if differing:
            key = differing[0]
            raise ValueError(
                f"Pruner state was saved with {key}={saved.get(key)!r}, but this Pruner has "
                f"{key}={mine.get(key)!r}; construct the Pruner with the saved settings "
                "(Pruner.from_state_dict does this)"
            )
        thresholds = state["thresholds"]
        if len(thresholds) != len(self.targets):
            raise ValueError(
                f"state holds {len(thresholds)} thresholds, this Pruner has {len(self.targets)}"
            )
        if isinstance(self.backbone, NMBackbone):  # an N:M "threshold" is the ramp r
            for i, t in enumerate(thresholds):  # (_check_state refused r < 0 and NaN)
                if float(t) > 1.0:
                    raise ValueError(
                        f"not a valid Pruner state: thresholds[{i}] ({self.targets[i].name!r}) "
                        f"is an N:M ramp, at most 1, got {float(t)!r} (the state is damaged, "
                        "or was not written by this Pruner's kind); nothing was loaded"
                    )
        with outside_inference_mode():
            # may still refuse: nothing else set yet
            self.backbone.load_state_dict(state["backbone"])
            self._write_thresholds([t.reshape(()) for t in thresholds])
        self._step = state["step"]
        self._current = float(state["current_sparsity"])

    @classmethod
    def from_state_dict(cls, model: nn.Module, state: dict[str, Any], **overrides: Any) -> Pruner:
        """Rebuild a Pruner on ``model`` from a saved state (config included), then load it.

        Args:
            model: the same architecture, with its dense weights loaded.
            state: what :meth:`state_dict` returned.
            **overrides: constructor arguments to use instead of the saved ones
                (needed for a custom callable schedule, which cannot be saved).

        Raises:
            ValueError: for a state that is not a valid Pruner state, a ``model``
                without the layers it was saved from (naming them), or a
                configuration the state does not fit (see :meth:`load_state_dict`).
        """
        _check_state(state)
        cfg = state["config"]
        if "include" not in overrides:
            _check_saved_layers(model, cfg["targets"])
        op = cfg["operator"]
        kwargs: dict[str, Any] = {
            "sparsity": cfg["sparsity"],
            "total_steps": cfg["total_steps"],
            "operator": op["name"],
            "p": op.get("p"),
            "theta": cfg["theta"],
            "theta_rule": cfg["theta_rule"],
            "backbone": cfg["backbone"],
            "schedule": cfg["schedule"],
            "update_every": cfg["update_every"],
            "include": cfg["targets"],
            "max_layer_sparsity": cfg["max_layer_sparsity"],
            "pattern": cfg.get("pattern"),  # absent from states saved before N:M
            "check_finite": cfg.get("check_finite", True),  # absent before it was saved
        }
        if cfg["schedule"].get("name") == "<callable>" and "schedule" not in overrides:
            raise ValueError("this Pruner used a custom schedule callable: pass schedule=... again")
        kwargs.update(overrides)
        pruner = cls(model, **kwargs)
        try:
            pruner.load_state_dict(state)
        except Exception:
            pruner.remove()  # the caller never gets this Pruner: leave the model as it was
            raise
        return pruner

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A copy of the Pruner made with its model (copy.deepcopy of both, a pickle of
        # both) drives the copied parametrizations: a new Pruner there is refused as
        # a second Pruner, not as a copy of an attached model.
        self.__dict__.update(state)
        self._swap = None  # a copy is not inside its original's swapped() block
        if "targets" in state and state.get("_ended") is None:
            for t in self.parametrized_layers():
                plist: Any = t.parametrizations()
                param = None if plist is None else plist._modules.get("0")
                if isinstance(param, FeatherParametrization):
                    _REGISTERED.add(param)

    def __repr__(self) -> str:
        return (
            f"Pruner(sparsity={self.sparsity}, step={self._step}/{self.total_steps}, "
            f"operator={self.operator!r}, theta={self.theta}, backbone={self.backbone.name!r}, "
            f"tensors={len(self.targets)}, params={self.num_params:,})"
        )


def _check_saved_layers(model: nn.Module, names: Sequence[str]) -> None:
    """Raise unless ``model`` has every layer a Pruner state was saved with.

    Raises:
        ValueError: naming the saved layers and the ones ``model`` lacks.
    """
    modules = dict(model.named_modules())
    missing = [name for name in names if name not in modules]
    if not missing:
        return

    def listed(items: Sequence[str]) -> str:
        shown = ", ".join(map(repr, items[:6]))
        return shown + (f", ... ({len(items)} in all)" if len(items) > 6 else "")

    lacks = (
        "the model given has none of them"
        if len(missing) == len(names)
        else f"the model given lacks {listed(missing)}"
    )
    raise ValueError(
        f"this Pruner state was saved from a model with prunable layers {listed(names)}; "
        f"{lacks}: pass a model of the architecture the state was saved from (the same "
        "layer names, as model.named_modules() gives them)" + _wrapper_hint(modules, names)
    )


def _wrapper_hint(modules: Mapping[str, nn.Module], names: Sequence[str]) -> str:
    """Why saved layer names may differ by a wrapper's prefix (DDP's or ``torch.compile``'s
    ``module.``/``_orig_mod.``), and the fix; empty when that is not the cause."""
    for prefix in ("module.", "_orig_mod."):
        if all(n.startswith(prefix) and n[len(prefix) :] in modules for n in names):
            return (
                f"; its names start with {prefix!r}: it was saved from a Pruner attached to a "
                "wrapper (DDP, torch.compile); pass the same wrapper, or attach to the model "
                "inside it when saving"
            )
        if all(prefix + n in modules for n in names):
            return (
                f"; the model given is a wrapper (its layers start with {prefix!r}): pass the "
                "model inside it (ddp.module, compiled._orig_mod), as when the state was saved"
            )
    return ""


def _check_state(state: Any) -> None:
    """Raise unless ``state`` is a Pruner state this version can read.

    States saved before ``format_version`` existed (version 0) have the same
    layout as version 1 and load as they are.
    """
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ValueError("not a feather-sparse Pruner state_dict (missing format marker)")
    version = state.get("format_version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(
            f"this Pruner state has format version {version!r}, newer than the {FORMAT_VERSION} "
            f"this feather-sparse ({__version__}) reads; upgrade feather-sparse to load it"
        )

    def bad(field: str, why: str) -> ValueError:
        return ValueError(
            f"not a valid Pruner state: {field} {why} (the state is damaged, or was not written "
            "by Pruner.state_dict); nothing was loaded"
        )

    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise bad("'step'", f"must be an int >= 0, got {step!r}")
    current = state.get("current_sparsity")
    if (
        isinstance(current, bool)
        or not isinstance(current, (int, float))
        or not 0.0 <= current < 1.0
    ):
        raise bad("'current_sparsity'", f"must be a number in [0, 1), got {current!r}")
    thresholds = state.get("thresholds")
    if not isinstance(thresholds, (list, tuple)):
        raise bad("'thresholds'", f"must be a list of tensors, got {type(thresholds).__name__}")
    for i, t in enumerate(thresholds):
        if not isinstance(t, Tensor) or t.numel() != 1 or not t.is_floating_point():
            raise bad(f"thresholds[{i}]", f"must be a one-element float tensor, got {t!r}")
        value = float(t)
        if not (math.isfinite(value) and value >= 0.0):
            raise bad(f"thresholds[{i}]", f"must be finite and >= 0, got {value}")
    if not isinstance(state.get("backbone"), dict):
        raise bad("'backbone'", "must be a dict (the backbone's own state)")
    config = state.get("config")
    if not isinstance(config, dict):
        raise bad("'config'", "must be a dict (Pruner.config())")
    missing = [key for key in _STATE_CONFIG_KEYS if key not in config]
    if missing:
        raise bad("'config'", f"lacks {', '.join(missing)}")
    if not isinstance(config["operator"], dict) or "name" not in config["operator"]:
        raise bad("config['operator']", "must be a dict with a 'name'")
    if not isinstance(config["schedule"], dict):
        raise bad("config['schedule']", "must be a dict")
    targets = config["targets"]
    if not isinstance(targets, list) or not all(isinstance(n, str) for n in targets):
        raise bad("config['targets']", "must be a list of layer names")


#: What :meth:`Pruner.from_state_dict` reads from a state's ``config``.
_STATE_CONFIG_KEYS = (
    "sparsity",
    "total_steps",
    "operator",
    "theta",
    "theta_rule",
    "backbone",
    "schedule",
    "update_every",
    "targets",
    "max_layer_sparsity",
)


#: ``torch._foreach_copy_`` (one call copying every layer's threshold), where this torch has it.
_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)


def _copy_each(into: Sequence[Tensor], values: Sequence[Tensor]) -> None:
    """``into[i].copy_(values[i])`` for every ``i``, in one call where torch has it."""
    if _FOREACH_COPY is not None:
        _FOREACH_COPY(list(into), list(values))
        return
    for buf, value in zip(into, values):
        buf.copy_(value)


def _abs_max_each(weights: Sequence[Tensor]) -> Tensor:
    """``max |w|`` of each tensor as one float32 vector (see :func:`_abs_max`).

    For non-empty tensors of one dtype and device — the usual case — the
    minima and maxima are stacked and combined in two kernels instead of
    three per tensor: the Pruner runs this at every step.
    """
    if not weights:
        return torch.zeros(0, dtype=torch.float32)
    native = nm_native.abs_max_many(weights)  # one call, in place (float32 CPU weights)
    if native is not None:
        return native
    first = weights[0]
    if any(w.numel() == 0 or w.dtype != first.dtype or w.device != first.device for w in weights):
        return torch.stack([_abs_max(w) for w in weights])
    lo, hi = (torch.stack(x) for x in zip(*(torch.aminmax(w) for w in weights)))
    return torch.maximum(lo.neg_(), hi).float()


def _abs_max(w: Tensor) -> Tensor:
    """``max |w|`` as float32 (0 for an empty shard), NaN if ``w`` holds a NaN.

    ``torch.aminmax`` reads ``w`` once and writes nothing of its size.
    """
    if w.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=w.device)
    lo, hi = torch.aminmax(w)
    return torch.maximum(-lo.float(), hi.float())


def _overrides(obj: object, method: str) -> bool:
    """Whether ``obj``'s class overrides ``Backbone.<method>``."""
    return getattr(type(obj), method) is not getattr(Backbone, method)


def _memory_format(w: Tensor) -> torch.memory_format | None:
    """``channels_last`` (or ``channels_last_3d``) when ``w`` is stored so and not plainly
    contiguous; None otherwise (the baked weight's layout is then left as torch makes it)."""
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    fmt = formats.get(w.dim())
    if fmt is not None and w.is_contiguous(memory_format=fmt) and not w.is_contiguous():
        return fmt
    return None


#: How the attach log names the registered operators; another is named ``"<name> pruner"``.
_OPERATOR_LABELS = {
    "feather": "Feather pruner",
    "hard": "hard-threshold pruner",
    "soft": "soft-threshold pruner",
    "st3": "ST-3 pruner",
}


def _method_label(operator: Operator) -> str:
    """What the attach log calls the pruner: by its operator, with ``p`` where not the
    name's own (``"Feather pruner"``, ``"hard-threshold pruner"``, ``"Feather pruner (p=2)"``)."""
    label = _OPERATOR_LABELS.get(operator.name, f"{operator.name} pruner")
    own = OPERATORS.get(operator.name) if operator.name in OPERATORS else None
    if isinstance(operator, ThresholdOperator) and getattr(own, "p", None) != operator.p:
        label += f" (p={operator.p:g})"
    return label


def _backbone_label(backbone: Backbone) -> str:
    """The backbone for the attach log: nothing for the default global one."""
    if isinstance(backbone, NMBackbone):
        return f", N:M pattern {backbone.pattern}"
    if backbone.name == "global":
        return ""
    return f", backbone {backbone.name!r}"


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _names(include: Sequence[type[nn.Module] | str]) -> str:
    """``include`` as code writes it: ``[nn.Conv2d, nn.Linear, 'fc']`` (classes as classes)."""
    return "[" + ", ".join(_type_name(i) if isinstance(i, type) else repr(i) for i in include) + "]"
