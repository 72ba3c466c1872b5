"""The model registry: ``register_model``, ``create_model``, ``list_models``, ``model_info``.

Modelled on timm's factory: every model family file registers its factories
with :func:`register_model`; :func:`create_model` looks a name up, drops
``None`` keyword arguments (so a command-line default of ``None`` never
overrides a model's own default), builds the model and records how it was
built in ``model.feather_model_spec``, so that other code (checkpoint export)
can rebuild the same architecture with
``create_model(spec["name"], **spec["kwargs"])``.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import nn

from feather_sparse.registry import Registry

__all__ = [
    "MODEL_SPEC_ATTR",
    "ModelInfo",
    "check_model_kwargs",
    "create_model",
    "list_models",
    "model_info",
    "register_model",
]

#: Name of the attribute ``create_model`` sets on every model it builds.
MODEL_SPEC_ATTR = "feather_model_spec"

FactoryT = TypeVar("FactoryT", bound=Callable[..., nn.Module])


@dataclass(frozen=True)
class ModelInfo:
    """What a registered model expects and produces.

    Attributes:
        name: the registered name.
        input_shape: shape of one sample, channels first, e.g. ``(3, 32, 32)``
            or ``(1, 40)``.
        num_classes: the default number of outputs (the data set it was made for).
        description: one line for listings.
    """

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    description: str = ""


@dataclass(frozen=True)
class _Entry:
    factory: Callable[..., nn.Module]
    info: ModelInfo


_MODELS: Registry[_Entry] = Registry("model")


def register_model(
    name: str,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    description: str = "",
) -> Callable[[FactoryT], FactoryT]:
    """Decorator registering ``factory(num_classes=..., **kwargs) -> nn.Module`` under ``name``.

    Args:
        name: the name ``create_model`` looks up (case and ``-``/``_`` insensitive).
        input_shape: shape of one input sample, channels first.
        num_classes: default number of classes.
        description: one line for listings; defaults to the first line of the
            factory's docstring.

    Returns:
        A decorator that registers the factory and returns it unchanged.

    Raises:
        ValueError: if ``name`` is already registered or the metadata is invalid.
    """
    if not input_shape or any(int(d) <= 0 for d in input_shape):
        raise ValueError(f"model {name!r}: input_shape must be positive sizes, got {input_shape}")
    if num_classes <= 0:
        raise ValueError(f"model {name!r}: num_classes must be positive, got {num_classes}")

    def decorator(factory: FactoryT) -> FactoryT:
        if "num_classes" not in inspect.signature(factory).parameters:
            raise ValueError(f"model factory {factory.__qualname__} must accept num_classes")
        doc_line = (inspect.getdoc(factory) or "").split("\n", 1)[0].strip()
        info = ModelInfo(
            name=name,
            input_shape=tuple(int(d) for d in input_shape),
            num_classes=int(num_classes),
            description=description or doc_line,
        )
        _MODELS.register(name, _Entry(factory=factory, info=info))
        return factory

    return decorator


def _entry(name: str) -> _Entry:
    if not isinstance(name, str):
        raise TypeError(f"model name must be a string, got {type(name).__name__}")
    entry: _Entry = _MODELS.get(name)
    return entry


def list_models() -> list[str]:
    """The registered model names, sorted."""
    return _MODELS.names()


def model_info(name: str) -> ModelInfo:
    """Metadata of a registered model.

    Args:
        name: a registered model name.

    Raises:
        ValueError: for an unknown name, listing the registered names.
    """
    return _entry(name).info


def _bind(
    entry: _Entry,
    signature: inspect.Signature,
    args: dict[str, Any],
    unlisted: frozenset[str] = frozenset(),
) -> inspect.BoundArguments:
    """``args`` bound to the factory's parameters, or a ``ValueError`` listing the accepted ones.

    ``unlisted`` names parameters the caller sets apart (``num_classes``), left
    out of the list so that it holds only what the user can give there.
    """
    try:
        return signature.bind(**args)
    except TypeError as err:
        accepted = [
            p.name
            for p in signature.parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in unlisted
        ]
        takes = f"it accepts: {', '.join(accepted)}" if accepted else "it takes no options"
        raise ValueError(
            f"model {entry.info.name!r} does not accept these arguments ({err}); {takes}"
        ) from None


def check_model_kwargs(name: str, **kwargs: Any) -> None:
    """Raise unless ``create_model(name, **kwargs)`` takes these argument names.

    Reads the factory's signature only: nothing is built, and the values are
    not checked (the factory does that when it builds).

    Args:
        name: a registered name (see :func:`list_models`).
        **kwargs: the model-specific options, as for :func:`create_model`.

    Raises:
        ValueError: for an unknown name, or an argument the factory does not
            take (listing the model-specific options it does take, without
            ``num_classes``, which ``create_model`` sets apart and a training
            config takes from the data set).

    Example:
        >>> check_model_kwargs("resnet20", width=16)
    """
    entry = _entry(name)
    args = {k: v for k, v in kwargs.items() if v is not None}
    args.setdefault("num_classes", entry.info.num_classes)
    _bind(entry, inspect.signature(entry.factory), args, unlisted=frozenset({"num_classes"}))


def _plain(value: Any) -> Any:
    """``value`` as the spec records it, and the factory gets it: plain Python, read once.

    A NumPy scalar or array becomes a Python number or list (a ``.fsp`` stores
    the spec as JSON); an iterator, a generator or a ``range`` becomes a list,
    so that the factory and the spec see the same values (an iterator the
    factory consumed would be recorded empty); the items of a list, a tuple or
    a dict are made plain too, the containers kept. Anything else is kept as is.
    """
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return _plain(value.tolist())
    if isinstance(value, list | Iterator | range):
        return [_plain(v) for v in value]
    if isinstance(value, tuple) and type(value) is tuple:  # a NamedTuple is kept as is
        return tuple(_plain(v) for v in value)
    if type(value) is dict:
        return {k: _plain(v) for k, v in value.items()}
    return value


def create_model(name: str, num_classes: int | None = None, **kwargs: Any) -> nn.Module:
    """Build a registered model.

    ``None`` values (for ``num_classes`` too) are dropped, so the model's own
    defaults apply. The returned model carries
    ``model.feather_model_spec = {"name": ..., "kwargs": {...}}`` with every
    argument of the factory resolved (defaults included), so
    ``create_model(spec["name"], **spec["kwargs"])`` rebuilds the same
    architecture. NumPy scalars and arrays are recorded (and passed to the
    factory) as Python numbers and lists, and an iterator or ``range`` as a
    list, so that the spec can be saved as JSON.

    Args:
        name: a registered name (see :func:`list_models`).
        num_classes: number of outputs; ``None`` keeps the model's default.
        **kwargs: model-specific options (see the factory's docstring).

    Returns:
        The freshly initialised model.

    Raises:
        ValueError: for an unknown name (listing the valid ones), an argument
            the factory does not take, or a non-positive ``num_classes``.

    Example:
        >>> model = create_model("resnet20", num_classes=10, width=None)
        >>> model.feather_model_spec["kwargs"].get("num_classes")
        10
    """
    entry = _entry(name)
    args = {k: v for k, v in kwargs.items() if v is not None}
    classes = entry.info.num_classes if num_classes is None else num_classes
    if not isinstance(classes, numbers.Integral) or isinstance(classes, bool) or classes <= 0:
        raise ValueError(f"num_classes must be a positive integer, got {classes!r}")
    args["num_classes"] = int(classes)

    signature = inspect.signature(entry.factory)
    bound = _bind(entry, signature, args)
    bound.apply_defaults()
    resolved: dict[str, Any] = {}
    for pname, value in bound.arguments.items():
        if signature.parameters[pname].kind is inspect.Parameter.VAR_KEYWORD:
            resolved.update({k: _plain(v) for k, v in value.items()})
        else:
            resolved[pname] = _plain(value)

    model = entry.factory(**resolved)
    setattr(model, MODEL_SPEC_ATTR, {"name": entry.info.name, "kwargs": resolved})
    return model
