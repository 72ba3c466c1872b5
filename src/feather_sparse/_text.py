"""Counts in words for what people read (pages, messages, logs): ``1 run``, ``2 runs``.

One place for the rule, so that no message says ``1 runs`` or falls back to
``run(s)``.
"""

from __future__ import annotations

__all__ = ["count", "plural"]


def plural(n: object, noun: str, many: str | None = None) -> str:
    """``noun`` in the number ``n`` asks for: the singular for exactly 1, else the plural.

    Args:
        n: the count; anything that is not 1 (``0``, ``2``, ``"default"``) takes the plural.
        noun: the singular; in a phrase the last word takes the ending (``"parallel run"``).
        many: the plural when it is not ``noun`` + ``s`` (``es`` after s, x, sh), e.g.
            ``plural(n, "batch", "batches")`` (``"epochs"`` is regular),
            ``plural(n, "was", "were")``.
    """
    if n == 1:
        return noun
    if many is not None:
        return many
    return noun + ("es" if noun.endswith(("s", "x", "sh")) else "s")


def count(n: object, noun: str, many: str | None = None) -> str:
    """``n`` followed by ``noun`` in its number: ``count(1, "run") == "1 run"``,
    ``count(2, "process") == "2 processes"`` (arguments as :func:`plural`)."""
    return f"{n} {plural(n, noun, many)}"
