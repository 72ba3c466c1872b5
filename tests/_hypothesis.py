"""Hypothesis for the property tests, or stand-ins that skip them where it is not installed.

hypothesis is a dev dependency (``pip install -e ".[dev]"``). A test module
imports it from here, never directly::

    from _hypothesis import example, given, settings, st

With hypothesis installed these are hypothesis's own. Without it only the
``@given`` tests skip, naming the install, and the module's other tests still
run: a direct ``from hypothesis import given`` would fail the module's
collection, and with it the whole suite (``tests/test_hypothesis_missing.py``
holds the modules to this).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

__all__ = ["HYPOTHESIS_MISSING", "example", "given", "settings", "st"]

try:
    from hypothesis import example, given, settings
    from hypothesis import strategies as st
except ImportError as err:
    #: Why the ``@given`` tests skip; ``None`` where hypothesis is installed.
    HYPOTHESIS_MISSING: str | None = (
        f"hypothesis is not installed ({err}); install it with: pip install -e '.[dev]'"
    )

    class _Strategy:
        """What any strategy expression builds (``st.lists(st.floats()).map(f)``): nothing."""

        def __call__(self, *args: object, **kwargs: object) -> _Strategy:
            return self

        def __getattr__(self, name: str) -> _Strategy:
            if name.startswith("_"):  # pytest and copy probe dunders and private markers
                raise AttributeError(name)
            return self

        def __getitem__(self, key: object) -> _Strategy:
            return self

    st = _Strategy()  # type: ignore[assignment]

    def given(*args: object, **kwargs: object) -> Any:  # type: ignore[no-redef]
        return pytest.mark.skip(reason=HYPOTHESIS_MISSING)

    def _unchanged(*args: object, **kwargs: object) -> Callable[[Any], Any]:
        return lambda test: test

    settings = _unchanged  # type: ignore[assignment]
    example = _unchanged  # type: ignore[assignment]
else:
    HYPOTHESIS_MISSING = None
