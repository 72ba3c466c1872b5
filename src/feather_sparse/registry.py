"""One small generic registry for operators, backbones, schedules and models.

Strings are looked up, objects pass through, and an unknown name raises a
``ValueError`` that lists the valid choices. Every pluggable piece of the
library (``ops``, ``backbones``, ``schedules``, ``models``) owns one
``Registry`` instance.

Example:
    >>> colors = Registry[int]("color")
    >>> colors.register("red", 1)
    1
    >>> colors.get("red")
    1
    >>> colors.get(7)  # objects pass through unchanged
    7
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")

__all__ = ["Registry"]


class Registry(Generic[T]):
    """A name -> object mapping with helpful errors.

    Args:
        kind: what the registry holds, used in error messages ("operator",
            "backbone", "model", ...).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._display: dict[str, str] = {}

    @overload
    def register(self, name: str, obj: T) -> T: ...

    @overload
    def register(self, name: str, obj: None = None) -> Callable[[T], T]: ...

    def register(self, name: str, obj: T | None = None) -> T | Callable[[T], T]:
        """Register ``obj`` under ``name``; without ``obj``, return a decorator.

        Args:
            name: the name to look it up by (case-insensitive; ``-`` and ``_`` alike).
            obj: the object to register; None to get a decorator that registers
                what it decorates.

        Returns:
            ``obj``, or the decorator.

        Raises:
            ValueError: if ``name`` is already registered.
        """
        key = self._normalize(name)

        def add(item: T) -> T:
            if key in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[key] = item
            self._display[key] = name
            return item

        return add if obj is None else add(obj)

    def get(self, name_or_obj: str | Any) -> T | Any:
        """Look a string up; pass any other object through unchanged.

        Args:
            name_or_obj: a registered name, or an object to return as it is.

        Raises:
            ValueError: for an unknown name, listing the registered names.
        """
        if not isinstance(name_or_obj, str):
            return name_or_obj
        key = self._normalize(name_or_obj)
        try:
            return self._items[key]
        except KeyError:
            raise ValueError(
                f"unknown {self.kind} {name_or_obj!r}; choose one of: {', '.join(self.names())}"
            ) from None

    def canonical(self, name: str) -> str:
        """The registered spelling of ``name`` (``"Feather"`` -> ``"feather"``).

        Args:
            name: a registered name, in any case, with ``-`` or ``_``.

        Raises:
            ValueError: for an unknown name, as :meth:`get` does.
        """
        self.get(name)
        return self._display[self._normalize(name)]

    def names(self) -> list[str]:
        """The registered names as they were registered, sorted."""
        return sorted(self._display.values())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._normalize(name) in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    @staticmethod
    def _normalize(name: str) -> str:
        # Lookup ignores case and treats "_" and "-" alike, so "Global_Flops"
        # finds "global-flops"; error messages show the registered spelling.
        return name.strip().lower().replace("_", "-")

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"
