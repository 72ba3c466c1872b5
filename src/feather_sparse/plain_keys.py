"""Plain ``state_dict`` keys for the layers a Pruner parametrizes.

``torch.nn.utils.parametrize`` moves a layer's weight to the entry
``<layer>.parametrizations.weight.original``, so a ``model.state_dict()``
taken while a Pruner is attached would not load into the plain model — and
loaders that load non-strictly (Hugging Face ``from_pretrained``, its
Trainer) would silently keep those layers' fresh initialisation. While a
Pruner is attached, every layer it parametrizes therefore carries a
``state_dict`` post-hook and a ``load_state_dict`` pre-hook (public
``nn.Module`` hooks) that present the stored dense weight under its plain key
``<layer>.weight``, at the place the plain layer lists it:

* ``model.state_dict()`` has exactly the keys, in the same order, of the
  model without the Pruner; the pruned layers' entries are their dense
  weights, the ones training continues from (the thresholds, step and
  schedule travel in ``pruner.state_dict()``);
* ``model.load_state_dict()`` takes such a state (or a plain model's, or one
  saved with the parametrization keys by an earlier version) and loads it
  into the stored dense weights; a whole tensor for a weight FSDP2 shards
  loads as this rank's part of it (a full state dict, as DCP's
  ``set_model_state_dict(..., StateDictOptions(full_state_dict=True))`` passes);
  what the load reports — its missing keys, its errors — names the weight
  ``<layer>.weight`` too (a ``load_state_dict`` post-hook).

The ``state_dict`` hook runs first of the layer's post-hooks, so the user's
own hooks on the layer see the plain key as on the plain layer.

``torch.distributed.checkpoint``'s ``get_model_state_dict`` resolves every
key of ``model.state_dict()`` to the object it names, attribute by attribute;
``<layer>.weight`` would evaluate the parametrization (the operator on the
whole weight, which fails on FSDP2's sharded storage). Each layer therefore
also tells DCP, through the ``_fqn_modifiers`` method DCP looks up on a
module whose ``state_dict`` hooks rename keys, that its ``weight`` key lives
in its ``parametrizations`` child (:class:`_WeightInParametrizations`).

:meth:`~feather_sparse.Pruner.finalize` and
:meth:`~feather_sparse.Pruner.remove` take the hooks and the lookup off again.
"""

from __future__ import annotations

import copyreg
import functools
import logging
import re
import sys
import weakref
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.utils.weak import WeakIdKeyDictionary

from feather_sparse import distributed

__all__ = ["FQN_MODIFIERS", "ORIGINAL", "SHARDED_MISSING", "Removable", "install"]

#: Where ``parametrize`` keeps a layer's weight, relative to the layer.
ORIGINAL = "parametrizations.weight.original"

#: The key suffix of the value a module's ``get_extra_state()`` gives.
_EXTRA_STATE = "_extra_state"

#: The method ``torch.distributed.checkpoint.state_dict`` calls on a module to map
#: the keys its ``state_dict`` hooks rename (``StateDictOptions``' ``dsd_fqn_modifiers``).
FQN_MODIFIERS = "_fqn_modifiers"

#: Added to a strict load's errors when an FSDP2-sharded layer finds neither of its
#: weight's keys: the likely cause, and what to do instead.
SHARDED_MISSING = (
    "pruned weights are missing from the state loaded into this FSDP2 model (missing keys "
    "ending in .weight above). If the state comes from "
    "set_model_state_dict(..., StateDictOptions(full_state_dict=True, "
    "broadcast_from_rank0=True)): that option hands the ranks other than 0 only the entries "
    "named as parameters, and a pruned weight's key (its plain name) is not one; give every "
    "rank the whole state and leave broadcast_from_rank0 off, or load a sharded checkpoint "
    "with torch.distributed.checkpoint (docs/distributed.md)"
)


class Removable(Protocol):
    """What :func:`install` returns: a hook or attribute to take off again."""

    def remove(self) -> None:
        """Take the hook or attribute off again; a second call does nothing."""
        ...


def _save_hook(
    preceding: frozenset[str],
    module: nn.Module,
    state_dict: dict[str, Any],
    prefix: str,
    local_metadata: Any,
) -> None:
    """Rename ``<prefix>parametrizations.weight.original`` to ``<prefix>weight``, placed
    after the entries of the parameters that precede ``weight`` in the plain layer."""
    key = prefix + ORIGINAL
    if key not in state_dict:
        return
    # This hook runs first of the module's post-hooks, right after its whole
    # subtree is saved, so the module's entries are the last ones; re-insert
    # them (a handful) in the plain layer's order: the parameters before
    # ``weight``, ``weight``, then the rest. An entry that is not the module's
    # (one a ``destination`` held already) ends the walk.
    own = {*module._parameters, *module._buffers, *module._modules, _EXTRA_STATE}
    tail: list[str] = []
    for name in reversed(state_dict):
        if not name.startswith(prefix) or name[len(prefix) :].split(".", 1)[0] not in own:
            break
        tail.append(name)
    if key not in tail:  # not where the module saves it: rename it in its place
        state_dict[prefix + "weight"] = state_dict.pop(key)
        return
    tail.reverse()
    entries = {name: state_dict.pop(name) for name in tail}
    value = entries.pop(key)
    before = [name for name in entries if name[len(prefix) :] in preceding]
    for name in before:
        state_dict[name] = entries.pop(name)
    state_dict[prefix + "weight"] = value
    state_dict.update(entries)


class _PlainLoad:
    """A parametrized layer's ``load_state_dict`` pre-hook and post-hook (picklable).

    The pre-hook (:meth:`pre`) moves a plain ``<prefix>weight`` entry to the
    parametrization's ``original``; the post-hook (:meth:`post`) then names
    the weight by its plain key again in what the load reports — its missing
    keys, and its errors such as a size mismatch — as the plain layer would.
    """

    def __init__(self) -> None:
        #: Set by ``pre`` for ``post`` in the same load: the prefix, the load's
        #: error list and how long it was, and whether the state lacks the
        #: weight of a layer FSDP2 shards.
        self.pending: tuple[str, list[str], int, bool] | None = None

    def pre(
        self,
        module: nn.Module,
        state_dict: MutableMapping[str, Any],
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        """Move a plain ``<prefix>weight`` entry to the parametrization's ``original``.

        Runs before the module and its children load, so the renamed entry then
        reaches the parametrization like any other key. A state with only the
        parametrization key (saved by an earlier version) loads as it is. A whole
        tensor for a weight FSDP2 shards (a full state dict) loads as this rank's
        part of it (:func:`~feather_sparse.distributed.shard_like`).

        Raises:
            RuntimeError: when the state holds both keys with different tensors
                (which to load is ambiguous). Both keys with the module's own
                stored weight under the parametrization key — what
                ``torch.distributed.checkpoint``'s ``set_model_state_dict`` adds
                from ``named_parameters()`` — load the plain key's value.
        """
        self.pending = None
        parametrizations: Any = module._modules.get("parametrizations")
        if parametrizations is None or "weight" not in parametrizations:
            return
        plain, original = prefix + "weight", prefix + ORIGINAL
        stored = parametrizations.weight.original
        if plain not in state_dict:
            if original not in state_dict:  # missing: report it under its plain key
                self.pending = (prefix, error_msgs, len(error_msgs), distributed.is_dtensor(stored))
            return
        if original in state_dict:
            if not _same_tensor(state_dict[original], stored):
                raise RuntimeError(
                    f"the state holds both {plain!r} and {original!r}, the same weight under "
                    "its plain name and its parametrize name: keep one of them (the plain name "
                    "is what model.state_dict() gives while a Pruner is attached)"
                )
            del state_dict[original]
        state_dict[original] = distributed.shard_like(state_dict.pop(plain), stored)
        self.pending = (prefix, error_msgs, len(error_msgs), False)

    def post(self, module: nn.Module, incompatible_keys: Any) -> None:
        """Name the weight ``<prefix>weight`` in the load's missing keys and errors.

        A strict load into an FSDP2-sharded layer whose weight the state lacks
        also gets the likely cause and its fix (:data:`SHARDED_MISSING`).
        """
        if self.pending is None:
            return
        (prefix, error_msgs, start, sharded_absent), self.pending = self.pending, None
        original, plain = prefix + ORIGINAL, prefix + "weight"
        missing = incompatible_keys.missing_keys
        if original in missing:
            missing[missing.index(original)] = plain
        # a key in a message, not the tail of a longer one (``x0.`` for ``0.``)
        named = re.compile(r"(?<![\w.])" + re.escape(original) + r"(?![\w.])")
        for i in range(start, len(error_msgs)):
            error_msgs[i] = named.sub(plain, error_msgs[i])
        if sharded_absent and SHARDED_MISSING not in error_msgs and _strict_load():
            error_msgs.append(SHARDED_MISSING)


def _strict_load() -> bool:
    """Whether the ``nn.Module.load_state_dict`` call running now is strict.

    Its hooks are always told ``strict=True`` (``load_state_dict`` applies
    ``strict`` only after they ran), so this reads the call's own argument;
    False where no such call is found.
    """
    code = nn.Module.load_state_dict.__code__
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return bool(frame.f_locals.get("strict", True))
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _same_tensor(a: Any, b: Tensor) -> bool:
    """Whether ``a`` is ``b`` or a detached alias of all of its memory."""
    if a is b:
        return True
    if not isinstance(a, Tensor) or type(a) is not type(b.data) or a.shape != b.shape:
        return False
    try:
        return bool(a.data_ptr() == b.data_ptr() and a.stride() == b.stride())
    except RuntimeError:  # a tensor subclass without plain storage
        return False


class _WeightInParametrizations:
    """A parametrized layer's answer to DCP's ``_fqn_modifiers()``.

    DCP asks the mapping two questions, and the answers differ here:

    * ``get(name)`` (resolving a ``state_dict`` key): ``"weight"`` is found in
      the child ``parametrizations``, so ``<layer>.weight`` resolves to
      ``<layer>.parametrizations.weight`` without evaluating the parametrized
      weight;
    * ``values()`` (the child names to leave out of the parameters' FQNs):
      none of ours, so the stored weight's FQN stays
      ``<layer>.parametrizations.weight.original``, its ``named_parameters``
      name, by which ``get_optimizer_state_dict`` and
      ``set_optimizer_state_dict`` key its optimizer state.

    A layer that has ``_fqn_modifiers`` of its own keeps its answers for the
    other names.
    """

    def __init__(self, inner: Mapping[str, str]) -> None:
        self.inner = inner

    def get(self, name: str, default: str | None = None) -> str | None:
        if name == "weight":
            return "parametrizations"
        return self.inner.get(name, default)

    def values(self) -> Iterable[str]:
        return self.inner.values()


class _FqnModifiers:
    """The ``_fqn_modifiers`` method installed on a parametrized layer (picklable)."""

    def __init__(self, previous: Callable[[], Mapping[str, str]] | None) -> None:
        self.previous = previous

    def __call__(self) -> _WeightInParametrizations:
        return _WeightInParametrizations({} if self.previous is None else self.previous())


_ABSENT = object()


class _AttributeHandle:
    """Sets an instance attribute of a module; ``remove()`` takes it off again (restoring
    one it replaced)."""

    def __init__(self, module: nn.Module, name: str, value: Any) -> None:
        self.module, self.name, self.value = module, name, value
        self.replaced = module.__dict__.get(name, _ABSENT)
        module.__dict__[name] = value

    def remove(self) -> None:
        if self.module.__dict__.get(self.name) is not self.value:
            return  # removed already, or set anew by someone else
        if self.replaced is _ABSENT:
            del self.module.__dict__[self.name]
        else:
            self.module.__dict__[self.name] = self.replaced


logger = logging.getLogger(__name__)

#: Set once the pickling warning was logged: it is logged once per process.
_PICKLE_WARNED = False


def _ours(hook: Any) -> bool:
    """Whether a ``state_dict``/``load_state_dict`` hook is one :func:`install` added."""
    hook = getattr(hook, "hook", hook)  # torch wraps load pre-hooks in a _WrappedHook
    if isinstance(hook, functools.partial):
        return hook.func is _save_hook
    return isinstance(getattr(hook, "__self__", None), _PlainLoad)


class _Computed:
    """Pickles as ``P_T(w)`` computed at pickling time, from any layer holding the weight.

    One object per stored weight (:data:`_COMPUTED`), so ``pickle`` memoizes it and
    the layers that share a weight (tied) share one tensor in the pickle too; the
    value is computed anew each time the object is pickled, never cached.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module: Callable[[], Any] = weakref.ref(module)

    def __reduce_ex__(self, protocol: Any) -> Any:
        module = self.module()
        if module is None:  # pragma: no cover - the layer pickling us holds the weight
            raise RuntimeError("the layer of a pruned weight was freed while pickling it")
        layer: Any = module
        original = layer.parametrizations.weight.original
        with torch.no_grad():
            value = layer.weight.detach().clone()  # a tensor of its own: the forward's value
        if isinstance(original, nn.Parameter):
            value = nn.Parameter(value, requires_grad=original.requires_grad)
        return value.__reduce_ex__(protocol)


#: The :class:`_Computed` of each parametrized weight, by its stored dense weight
#: (by identity: a tensor's ``==`` is elementwise).
_COMPUTED: Any = WeakIdKeyDictionary()


class _PickleAsPlain:
    """The ``__reduce_ex__`` installed on a parametrized layer (the one ``pickle`` finds).

    ``torch.nn.utils.parametrize`` refuses to pickle a parametrized module, and
    ``torch.save(model, path)`` meets that refusal only after it has emptied the
    file at ``path``: an earlier checkpoint under that name was lost. A layer
    the Pruner parametrizes therefore pickles as the plain layer (its own
    class, no parametrization, none of :func:`install`'s hooks) holding as
    its ``weight`` what the forward computes now, ``P_T(w)`` at the thresholds
    in use — what :func:`~feather_sparse.save_sparse` writes for an attached
    Pruner. Unpickling needs nothing from feather-sparse. ``copy.copy`` and
    ``copy.deepcopy`` look methods up on the class and are not affected.
    Other parametrizations on the layer keep torch's refusal.
    """

    def __init__(self, module: Any, names: Sequence[str]) -> None:
        # A strong reference (a cycle through the module's __dict__): copy.deepcopy
        # of the model then gives the copy's layer a _PickleAsPlain of the copy.
        self.module = module
        self.names = list(names)

    def __call__(self, protocol: Any) -> Any:
        module: Any = self.module
        plists: Any = module._modules.get("parametrizations")
        if plists is None or list(plists.keys()) != ["weight"]:
            return object.__reduce_ex__(module, protocol)  # torch's refusal
        global _PICKLE_WARNED
        if not _PICKLE_WARNED:
            _PICKLE_WARNED = True
            logger.warning(
                "pickling (torch.save(model, ...)) a model with a Pruner attached: each "
                "pruned layer is stored as the plain layer holding what its forward computes "
                "now, P_T(w) at the current thresholds, without the Pruner; to resume training "
                "save model.state_dict() and pruner.state_dict(), and finalize() first for "
                "the target sparsity"
            )
        original: Tensor = plists.weight.original
        computed = _COMPUTED.get(original)
        if computed is None or computed.module() is None:
            computed = _COMPUTED[original] = _Computed(module)
        state = dict(module.__dict__)
        del state["__reduce_ex__"]
        fqn = state.get(FQN_MODIFIERS)
        if isinstance(fqn, _FqnModifiers):
            if fqn.previous is None:
                del state[FQN_MODIFIERS]
            else:
                state[FQN_MODIFIERS] = fqn.previous
        state["_modules"] = type(module._modules)(
            (k, v) for k, v in module._modules.items() if k != "parametrizations"
        )
        where = "_parameters" if isinstance(original, nn.Parameter) else "_buffers"
        entries: dict[str, Any] = {}
        for name in self.names:  # the plain layer's order
            if name == "weight" and where == "_parameters":
                entries[name] = computed
            elif name in module._parameters:
                entries[name] = module._parameters[name]
        entries.update(module._parameters)  # any added since
        state["_parameters"] = type(module._parameters)(entries)
        if where == "_buffers":
            state["_buffers"] = {**module._buffers, "weight": computed}
        for hooks in (
            "_state_dict_hooks",
            "_load_state_dict_pre_hooks",
            "_load_state_dict_post_hooks",
        ):
            state[hooks] = type(state[hooks])(
                (k, h) for k, h in state[hooks].items() if not _ours(h)
            )
        plain = type(module).__bases__[0]  # parametrize derives its class from the layer's
        # object.__new__(plain), then nn.Module.__setstate__(state): no feather-sparse name
        return copyreg._reconstructor, (plain, object, None), state  # type: ignore[attr-defined]


def install(modules: Sequence[tuple[nn.Module, Sequence[str]]]) -> list[Removable]:
    """Give each parametrized module plain ``weight`` keys in ``state_dict`` and loading.

    Args:
        modules: each module with the names of its parameters *before* its
            weight was parametrized (``list(module._parameters)`` then), which
            fixes where ``weight`` goes among its entries. A module listed
            twice gets its hooks once.

    Returns:
        The hooks' handles (and the ``_fqn_modifiers`` attribute's); removing
        them all restores the parametrization keys.
    """
    handles: list[Removable] = []
    seen: set[int] = set()
    for module, names in modules:
        if id(module) in seen:
            continue
        seen.add(id(module))
        names = list(names)
        preceding = frozenset(names[: names.index("weight")] if "weight" in names else ())
        save = module.register_state_dict_post_hook(functools.partial(_save_hook, preceding))
        # First of the module's post-hooks: the user's own ones, registered
        # before the Pruner or after it, see the plain key as on the plain layer.
        hooks: Any = module._state_dict_hooks  # an OrderedDict
        hooks.move_to_end(save.id, last=False)
        load = _PlainLoad()
        handles.append(save)
        handles.append(module.register_load_state_dict_pre_hook(load.pre))
        handles.append(module.register_load_state_dict_post_hook(load.post))
        previous = getattr(module, FQN_MODIFIERS, None)
        handles.append(_AttributeHandle(module, FQN_MODIFIERS, _FqnModifiers(previous)))
        handles.append(_AttributeHandle(module, "__reduce_ex__", _PickleAsPlain(module, names)))
    return handles
