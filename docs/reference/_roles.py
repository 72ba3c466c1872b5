"""A Griffe extension: Sphinx roles in docstrings become links in the API reference.

The library's docstrings follow PyTorch's reference-manual style and name
other objects with Sphinx roles (``:class:`~feather_sparse.Pruner```,
``:meth:`step```). mkdocstrings would print those verbatim; this extension
rewrites each into a Markdown cross-reference (``[`Pruner`][feather_sparse.pruner.Pruner]``)
that mkdocs-autorefs turns into a link, resolving relative names the way a
reader would: a member of the class at hand, then of its module, then a name
in the package. A name that does not lead to a documented public object stays
plain code, so the strict build never meets a dangling reference.

Loaded by mkdocs.yml (``extensions:`` of the mkdocstrings Python handler).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

# :role:`name`, :role:`~name` (show the last part only), :role:`title <name>`
ROLE = re.compile(r":(class|meth|func|attr|mod|data|exc|obj):`(~?)(?:([^`<]*?)\s*<)?([\w.]+)>?`")
CALLABLE_ROLES = ("meth", "func")


def _members(obj: Any) -> dict[str, Any]:
    try:
        return dict(obj.members)
    except Exception:  # an alias whose target is outside the package
        return {}


def _walk(start: Any, dotted: str) -> Any | None:
    obj = start
    for part in dotted.split("."):
        obj = _members(obj).get(part)
        if obj is None:
            return None
    return obj


def _canonical(obj: Any) -> Any | None:
    """The object an alias points to (None when it leaves the package)."""
    try:
        return obj.final_target if obj.is_alias else obj
    except Exception:
        return None


def _documented(obj: Any) -> bool:
    """Whether the reference renders ``obj`` (public path, has a docstring)."""
    if obj is None or not obj.docstring:
        return False
    parts = obj.path.split(".")
    return not any(p.startswith("_") and not p.startswith("__") for p in parts)


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles into autorefs cross-references once the package is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._visit(pkg, pkg, set())

    # The same event's name before Griffe 2; rewriting twice changes nothing.
    on_package_loaded = on_package

    def _visit(self, pkg: griffe.Module, obj: Any, seen: set[str]) -> None:
        if obj.is_alias or obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(lambda m: self._link(pkg, obj, m), obj.docstring.value)
        for member in _members(obj).values():
            self._visit(pkg, member, seen)

    def _resolve(self, pkg: griffe.Module, obj: Any, name: str) -> Any | None:
        if name == pkg.name or name.startswith(pkg.name + "."):
            return _canonical(_walk(pkg, name.removeprefix(pkg.name).lstrip(".")) or pkg)
        scopes = []
        cls = obj if obj.is_class else (obj.parent if obj.parent and obj.parent.is_class else None)
        if cls is not None:
            scopes.append(cls)
        module = obj.module
        scopes += [module, pkg]
        for scope in scopes:
            found = _canonical(_walk(scope, name)) if name else None
            if found is not None:
                return found
        return None

    def _link(self, pkg: griffe.Module, obj: Any, match: re.Match[str]) -> str:
        role, short, title, name = match.groups()
        shown = title or (name.rsplit(".", 1)[-1] if short else name)
        if role in CALLABLE_ROLES and not title and not shown.endswith("()"):
            shown += "()"
        target = self._resolve(pkg, obj, name)
        if target is not None and _documented(target):
            return f"[`{shown}`][{target.path}]"
        return f"`{shown}`"
