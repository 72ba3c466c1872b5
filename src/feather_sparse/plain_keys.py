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
  into the stored dense weights.

:meth:`~feather_sparse.Pruner.finalize` and
:meth:`~feather_sparse.Pruner.remove` take the hooks off again.
"""

from __future__ import annotations

import functools
from collections.abc import MutableMapping, Sequence
from typing import Any

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

__all__ = ["ORIGINAL", "install"]

#: Where ``parametrize`` keeps a layer's weight, relative to the layer.
ORIGINAL = "parametrizations.weight.original"


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
    # This hook runs after the module's whole subtree is saved, so its entries
    # are the last ones; re-insert them (a handful) in the plain layer's order:
    # the parameters before ``weight``, ``weight``, then the rest.
    tail: list[str] = []
    for name in reversed(state_dict):
        if not name.startswith(prefix):
            break
        tail.append(name)
    tail.reverse()
    entries = {name: state_dict.pop(name) for name in tail}
    value = entries.pop(key)
    before = [name for name in entries if name[len(prefix) :] in preceding]
    for name in before:
        state_dict[name] = entries.pop(name)
    state_dict[prefix + "weight"] = value
    state_dict.update(entries)


def _load_hook(
    module: nn.Module, state_dict: MutableMapping[str, Any], prefix: str, *_: Any
) -> None:
    """Move a plain ``<prefix>weight`` entry to the parametrization's ``original``.

    Runs before the module and its children load, so the renamed entry then
    reaches the parametrization like any other key. A state with only the
    parametrization key (saved by an earlier version) loads as it is.

    Raises:
        RuntimeError: when the state holds both keys with different tensors
            (which to load is ambiguous). Both keys with the module's own
            stored weight under the parametrization key — what
            ``torch.distributed.checkpoint``'s ``set_model_state_dict`` adds
            from ``named_parameters()`` — load the plain key's value.
    """
    parametrizations: Any = module._modules.get("parametrizations")
    if parametrizations is None or "weight" not in parametrizations:
        return
    plain, original = prefix + "weight", prefix + ORIGINAL
    if plain not in state_dict:
        return
    if original in state_dict:
        if not _same_tensor(state_dict[original], parametrizations.weight.original):
            raise RuntimeError(
                f"the state holds both {plain!r} and {original!r}, the same weight under "
                "its plain name and its parametrize name: keep one of them (the plain name "
                "is what model.state_dict() gives while a Pruner is attached)"
            )
        del state_dict[original]
    state_dict[original] = state_dict.pop(plain)


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


def install(modules: Sequence[tuple[nn.Module, Sequence[str]]]) -> list[RemovableHandle]:
    """Give each parametrized module plain ``weight`` keys in ``state_dict`` and loading.

    Args:
        modules: each module with the names of its parameters *before* its
            weight was parametrized (``list(module._parameters)`` then), which
            fixes where ``weight`` goes among its entries. A module listed
            twice gets its hooks once.

    Returns:
        The hooks' handles; removing them all restores the parametrization keys.
    """
    handles: list[RemovableHandle] = []
    seen: set[int] = set()
    for module, names in modules:
        if id(module) in seen:
            continue
        seen.add(id(module))
        names = list(names)
        preceding = frozenset(names[: names.index("weight")] if "weight" in names else ())
        handles.append(
            module.register_state_dict_post_hook(functools.partial(_save_hook, preceding))
        )
        handles.append(module.register_load_state_dict_pre_hook(_load_hook))
    return handles
