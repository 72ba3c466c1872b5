"""The API reference says what the code takes, returns and raises.

The reference pages (``docs/reference/``) are rendered by mkdocstrings from the
docstrings of every public module (the ones ``docs/reference/_build.py``
finds: no leading underscore in the dotted name) and of ``feather_sparse``'s
``__all__``. For every public function, class and method there, this module
checks with :mod:`inspect` and :mod:`ast`:

- a docstring with a one-line summary (a method without one of its own that
  overrides a documented method of a package base class is read with that
  docstring, as :func:`inspect.getdoc` reads it);
- the ``Args:`` section describes every parameter of the signature (a class:
  of its ``__init__``; a dataclass may describe its fields under
  ``Attributes:`` instead, the house style, or, where its docstring says so
  in the words of :data:`FIELD_HELP`, by each field's non-empty
  ``metadata["help"]``, the text the command line shows) and names none the
  signature lacks; ``*args`` / ``**kwargs`` are described as ``*args`` /
  ``**kwargs``;
- a class's ``Attributes:`` section names only attributes the class has;
- each exception a ``Raises:`` section names is raised (or built) by the code:
  the function's own body or the package functions it calls, followed a few
  calls deep (an exception class raised there that is the named one or a
  subclass of it counts). Where that search cannot decide (the exception may
  come from PyTorch or the standard library), the name is skipped, and the
  test asserts that the names it did decide stay above a measured floor;
- the ``>>>`` examples in the docstrings run (doctest).

Entries in :data:`ALLOWED` are known failures in files being edited elsewhere;
each says why it is allowed. An entry that no longer fails must be removed.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import doctest
import enum
import functools
import importlib
import importlib.util
import inspect
import re
import sys
import textwrap
import types
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import feather_sparse
from feather_sparse.rules import check_p

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "feather_sparse"

# Optional dependencies some public modules import at the top; a module whose
# dependency is missing is skipped (the docs build needs it anyway).
OPTIONAL = ("transformers", "lightning", "pytorch_lightning", "onnx", "matplotlib", "torchao")

# Known failures in files other changes are editing right now, by (qualified name, check);
# the check is one of CHECKS. Fix the docstring, then remove the entry (a test insists).
PARALLEL = "being edited in parallel; fix after"
ALLOWED: dict[tuple[str, str], str] = {}

# Fewer Raises: names decided than this means the search stopped working
# (measured: see test_raises_sections_name_exceptions_the_code_raises).
RAISES_FLOOR = 150


# ------------------------------------------------------------------ what is public
def public_modules() -> list[str]:
    """The modules the reference documents: the rule of ``docs/reference/_build.py``."""
    names = []
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts[1:]) or len(parts) == 1:
            continue
        names.append(".".join(parts))
    return names


def _import(name: str) -> types.ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError as error:  # an optional dependency is missing
        if error.name and error.name.split(".")[0] in OPTIONAL:
            return None
        raise


def _defined_in(obj: Any, module: str) -> bool:
    return getattr(obj, "__module__", None) == module


def _public_names(module: types.ModuleType) -> list[str]:
    """``__all__``, else the public classes and functions the module itself defines."""
    if hasattr(module, "__all__"):
        return [n for n in module.__all__ if not n.startswith("_")]
    return [
        n
        for n, obj in vars(module).items()
        if not n.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and _defined_in(obj, module.__name__)
    ]


@dataclasses.dataclass
class Item:
    """One documented object: where it lives and how to read its code."""

    qualname: str  # the name the reference shows, e.g. feather_sparse.pruner.Pruner.step
    obj: Any  # a function, class or property
    module: types.ModuleType
    owner: type | None = None  # the class of a method


def _own_function(obj: Any) -> Callable[..., Any] | None:
    """The plain function behind a method, static/class method or property (None: other)."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        obj = obj.fget
    if isinstance(obj, functools.cached_property):
        obj = obj.func
    return obj if inspect.isfunction(obj) else None


def _items() -> list[Item]:
    seen: set[int] = set()
    out: list[Item] = []

    def add(qualname: str, obj: Any, module: types.ModuleType, owner: type | None = None) -> None:
        key = id(obj)
        if key in seen:
            return
        seen.add(key)
        out.append(Item(qualname, obj, module, owner))

    modules = [feather_sparse] + [m for m in map(_import, public_modules()) if m is not None]
    for module in modules:
        for name in _public_names(module):
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if not obj.__module__.startswith(PACKAGE):
                continue  # re-exported from elsewhere
            home = sys.modules[obj.__module__]
            add(f"{obj.__module__}.{obj.__qualname__}", obj, home)
            if not inspect.isclass(obj):
                continue
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if _own_function(member) is None:
                    continue
                add(f"{obj.__module__}.{obj.__qualname__}.{attr}", member, home, obj)
    return out


ITEMS = _items()


# --------------------------------------------------------------- reading docstrings
SECTION = re.compile(r"^([A-Z][A-Za-z ]*):\s*$")
KNOWN_SECTIONS = {
    "Args",
    "Arguments",
    "Parameters",
    "Keyword Args",
    "Keyword Arguments",
    "Other Parameters",
    "Attributes",
    "Returns",
    "Return",
    "Yields",
    "Raises",
    "Example",
    "Examples",
    "Note",
    "Notes",
    "Warning",
    "Warnings",
    "Warns",
    "See Also",
    "References",
    "Todo",
}
ARGS_SECTIONS = {"Args", "Arguments", "Parameters", "Keyword Args", "Keyword Arguments"}
ENTRY = re.compile(r"^(\*{0,2}[A-Za-z_][\w.]*)\s*(\([^)]*\))?\s*:(\s|$)")


def sections(doc: str) -> dict[str, list[str]]:
    """Google-style sections of a cleaned docstring: title -> the names of its entries."""
    out: dict[str, list[str]] = {}
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        match = SECTION.match(lines[i])
        if not match or match.group(1) not in KNOWN_SECTIONS:
            i += 1
            continue
        title = match.group(1)
        entries = out.setdefault(title, [])
        i += 1
        indent: int | None = None
        while i < len(lines):
            line = lines[i]
            if line.strip() and not line.startswith(" "):
                break  # dedented back to the body: the section ended
            if line.strip():
                depth = len(line) - len(line.lstrip())
                if indent is None:
                    indent = depth
                if depth == indent:
                    entry = ENTRY.match(line.strip())
                    if entry:
                        entries.append(entry.group(1))
            i += 1
    return out


def _doc(obj: Any) -> str | None:
    """The object's own docstring (not one inherited from a base class)."""
    raw = obj.__doc__ if not isinstance(obj, (staticmethod, classmethod)) else obj.__func__.__doc__
    if isinstance(obj, property):
        raw = obj.__doc__ or (obj.fget.__doc__ if obj.fget else None)
    return inspect.cleandoc(raw) if raw else None


def _item_doc(item: Item) -> str | None:
    """The docstring the checks read: a method's own, else that of the package method it
    overrides (an override keeps its base's contract, as :func:`inspect.getdoc` reads it)."""
    doc = _doc(item.obj)
    if doc or item.owner is None:
        return doc
    name = item.qualname.rsplit(".", 1)[-1]
    for base in item.owner.__mro__[1:]:
        if name in vars(base) and base.__module__.startswith(PACKAGE):
            inherited = _doc(vars(base)[name])
            if inherited:
                return inherited
    return None


# ----------------------------------------------------------------- the checks
def _summary_problems(item: Item) -> Iterator[str]:
    doc = _item_doc(item)
    if inspect.isclass(item.obj) and doc is not None:
        # a class's docstring must be its own, not one inherited by assignment
        if item.obj.__doc__ is None or "__doc__" not in vars(item.obj):
            doc = None
        elif dataclasses.is_dataclass(item.obj) and doc.startswith(item.obj.__name__ + "("):
            doc = None  # the signature dataclasses write when there is no docstring
    if not doc:
        yield "no docstring"
        return
    first = doc.splitlines()[0].strip()
    if not first or SECTION.match(first):
        yield "no one-line summary"
    elif len(doc.splitlines()) > 1 and doc.splitlines()[1].strip():
        yield "the summary runs over more than one line (no blank line after it)"


def _signature_params(item: Item) -> list[inspect.Parameter] | None:
    """The parameters the Args: section describes (None: nothing to check)."""
    obj = item.obj
    if inspect.isclass(obj):
        if issubclass(obj, (enum.Enum, BaseException)) or getattr(obj, "_is_protocol", False):
            return None  # no constructor of its own to describe
        init = vars(obj).get("__init__")
        if init is None and not dataclasses.is_dataclass(obj):
            return None  # inherited: documented where it is defined
        if dataclasses.is_dataclass(obj) and init is None:
            return None
        try:
            signature = inspect.signature(obj)
        except (TypeError, ValueError):
            return None
        return list(signature.parameters.values())
    function = _own_function(obj)
    if function is None or isinstance(obj, (property, functools.cached_property)):
        return None
    params = list(inspect.signature(function).parameters.values())
    if item.owner is not None and not isinstance(obj, staticmethod) and params:
        params = params[1:]  # self / cls
    return params


def _param_name(p: inspect.Parameter) -> str:
    if p.kind is p.VAR_POSITIONAL:
        return "*" + p.name
    if p.kind is p.VAR_KEYWORD:
        return "**" + p.name
    return p.name


def _described(item: Item) -> tuple[list[str], list[str]]:
    """Names described under Args: (and, for a class, under Attributes:)."""
    docs = [_item_doc(item) or ""]
    if inspect.isclass(item.obj) and "__init__" in vars(item.obj):
        docs.append(_doc(vars(item.obj)["__init__"]) or "")
    args: list[str] = []
    attributes: list[str] = []
    for doc in docs:
        found = sections(doc)
        for title in ARGS_SECTIONS:
            args += found.get(title, [])
        attributes += found.get("Attributes", [])
    return args, attributes


#: What a dataclass's docstring says when its fields are described by their
#: ``metadata["help"]`` (``TrainConfig``: the text ``train --help`` shows).
FIELD_HELP = "described once, by its ``help`` metadata"


def _helped_fields(cls: type) -> set[str]:
    """The fields of a dataclass that carry a non-empty ``metadata["help"]``."""
    return {
        f.name
        for f in dataclasses.fields(cls)
        if isinstance(f.metadata.get("help"), str) and f.metadata["help"].strip()
    }


def _args_problems(item: Item) -> Iterator[str]:
    params = _signature_params(item)
    if params is None:
        return
    args, attributes = _described(item)
    names = [_param_name(p) for p in params]
    is_dataclass = inspect.isclass(item.obj) and dataclasses.is_dataclass(item.obj)
    described = set(args) | (set(attributes) if is_dataclass else set())
    if is_dataclass and FIELD_HELP in " ".join((_item_doc(item) or "").split()):
        described |= _helped_fields(item.obj)
    missing = [n for n in names if n not in described]
    if missing:
        yield f"Args: does not describe {', '.join(missing)}"
    extra = [a for a in args if a not in names]
    if extra:
        yield f"Args: names {', '.join(extra)}, not in the signature {names}"


def _self_attributes(cls: type) -> set[str]:
    """Names the class's code assigns as ``self.<name> = ...`` (tuples included)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return set()
    names = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            names.add(node.attr)
    return names


def _attributes_problems(item: Item) -> Iterator[str]:
    """A class's ``Attributes:`` names only attributes it has."""
    if not inspect.isclass(item.obj):
        return
    _, attributes = _described(item)
    if not attributes:
        return
    cls = item.obj
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    assigned = _self_attributes(cls)
    unknown = [
        a for a in attributes if a not in fields and a not in assigned and not hasattr(cls, a)
    ]
    if unknown:
        yield f"Attributes: names {', '.join(unknown)}, which the class does not have"


CHECKS = ("summary", "args", "attributes", "raises", "doctest")


# ---------------------------------------------------------------- raised exceptions
MAX_DEPTH = 4


def _tree(function: Callable[..., Any]) -> ast.AST | None:
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return None
    return ast.parse(source)


def _resolve_expr(node: ast.AST, scope: dict[str, Any], owner: type | None) -> Any:
    """The object an expression names (``Name``, ``a.b.c``, ``self.m``), or None."""
    if isinstance(node, ast.Name):
        if node.id in scope:
            return scope[node.id]
        return getattr(builtins, node.id, None)
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            return inspect.getattr_static(owner, node.attr, None) if owner else None
        base = _resolve_expr(node.value, scope, owner)
        if base is None:
            return None
        try:
            return inspect.getattr_static(base, node.attr, None)
        except Exception:
            return None
    return None


def _is_exception(obj: Any) -> bool:
    return inspect.isclass(obj) and issubclass(obj, BaseException)


def _in_package(function: Any) -> bool:
    return getattr(function, "__module__", "").startswith(PACKAGE)


def raised_types(function: Callable[..., Any], owner: type | None) -> set[type]:
    """Exception classes the function raises or builds, following package calls."""
    found: set[type] = set()
    seen: set[int] = set()
    todo: list[tuple[Any, type | None, int]] = [(function, owner, 0)]
    while todo:
        current, cls, depth = todo.pop()
        current = _own_function(current) or current
        if not inspect.isfunction(current) or id(current) in seen:
            continue
        seen.add(id(current))
        current = inspect.unwrap(current)
        tree = _tree(current)
        if tree is None:
            continue
        scope = {**vars(sys.modules[current.__module__]), **_closure(current)}
        for node in ast.walk(tree):
            target: ast.AST | None = None
            if isinstance(node, ast.Raise) and node.exc is not None:
                target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            elif isinstance(node, ast.Call):
                target = node.func
            if target is None:
                continue
            obj = _resolve_super(target, current) or _resolve_expr(target, scope, cls)
            if obj is None and isinstance(target, ast.Attribute) and cls is not None:
                # ``other.method()`` on an object the AST cannot type: the method of
                # that name of the class at hand, if it has one (e.g. ``new._attach``)
                obj = inspect.getattr_static(cls, target.attr, None)
            if _is_exception(obj):
                found.add(obj)
            elif inspect.isclass(obj) and obj.__module__.startswith(PACKAGE):
                if depth < MAX_DEPTH:
                    for hook in ("__init__", "__post_init__", "__new__"):
                        if hook in vars(obj):
                            todo.append((vars(obj)[hook], obj, depth + 1))
            elif (
                _own_function(obj) is not None
                and _in_package(_own_function(obj))
                and depth < MAX_DEPTH
            ):
                todo.append((obj, _owner_of(_own_function(obj), cls), depth + 1))
    return found


def _resolve_super(node: ast.AST, function: Any) -> Any:
    """``super().name`` inside a method: the base class's ``name`` (None: not that form)."""
    if not (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "super"
    ):
        return None
    defining = _owner_of(function, None)
    for base in defining.__mro__[1:] if defining else ():
        if node.attr in vars(base):
            return vars(base)[node.attr]
    return None


def _closure(function: Any) -> dict[str, Any]:
    if not function.__closure__:
        return {}
    out = {}
    for name, cell in zip(function.__code__.co_freevars, function.__closure__):
        with contextlib.suppress(ValueError):  # an empty cell
            out[name] = cell.cell_contents
    return out


def _owner_of(function: Any, fallback: type | None) -> type | None:
    """The package class a function is a method of (by its qualified name)."""
    parts = function.__qualname__.split(".")
    if len(parts) < 2 or "<locals>" in parts:
        return fallback
    obj: Any = sys.modules[function.__module__]
    for part in parts[:-1]:
        obj = getattr(obj, part, None)
    return obj if inspect.isclass(obj) else fallback


def _resolve_name(name: str, module: types.ModuleType) -> Any:
    obj: Any = vars(module).get(name.split(".")[0], getattr(builtins, name.split(".")[0], None))
    for part in name.split(".")[1:]:
        obj = getattr(obj, part, None)
    if obj is None:  # an exception of another package module, named bare
        for other in list(sys.modules.values()):
            if getattr(other, "__name__", "").startswith(PACKAGE):
                candidate = vars(other).get(name.split(".")[-1])
                if _is_exception(candidate):
                    return candidate
    return obj


# Raised by PyTorch, the standard library or the OS under us more often than
# by our own code: when the search finds no raise of these, it cannot decide.
OUTSIDE = (OSError, ImportError, RuntimeError, KeyboardInterrupt)


def _raises_roots(item: Item) -> list[tuple[Any, type | None]]:
    """Where a documented exception may come from: a class's constructor hooks
    (its own or those it inherits from package classes), else the function."""
    if not inspect.isclass(item.obj):
        return [(item.obj, item.owner)]
    roots: list[tuple[Any, type | None]] = []
    for hook in ("__init__", "__post_init__", "__new__", "__call__"):
        for cls in item.obj.__mro__:
            if hook in vars(cls):
                if cls.__module__.startswith(PACKAGE):
                    roots.append((vars(cls)[hook], item.obj))
                break
    return roots


def raises_problems(item: Item, counts: dict[str, int]) -> Iterator[str]:
    doc = _doc(item.obj) or ""
    documented = list(sections(doc).get("Raises", []))
    if inspect.isclass(item.obj) and "__init__" in vars(item.obj):
        documented += sections(_doc(vars(item.obj)["__init__"]) or "").get("Raises", [])
    if not documented:
        return
    found: set[type] = set()
    for root, owner in _raises_roots(item):
        found |= raised_types(root, owner)
    for name in documented:
        wanted = _resolve_name(name, item.module)
        if not _is_exception(wanted):
            yield f"Raises: names {name}, which is not an exception class"
            continue
        if any(issubclass(t, wanted) for t in found):
            counts["decided"] += 1
        elif issubclass(wanted, OUTSIDE):
            counts["undecided"] += 1
        else:
            counts["decided"] += 1
            yield f"Raises: names {name}, which the code does not raise"


# ------------------------------------------------------------------------- tests
def _doctest_problems() -> Iterator[tuple[str, str]]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    modules = [m for m in map(_import, public_modules()) if m is not None]
    for module in [feather_sparse, *modules]:
        for test in finder.find(module, module.__name__, globs=dict(vars(module))):
            if not test.examples:
                continue
            out: list[str] = []
            runner = doctest.DocTestRunner(optionflags=flags, verbose=False)
            runner.run(test, out=out.append)
            if runner.failures:
                detail = " | ".join("".join(out).strip().splitlines()[-6:])
                yield test.name, f"its example fails: {detail}"


def _found(check: str, counts: dict[str, int] | None = None) -> list[tuple[str, str]]:
    """``(qualified name, problem)`` of every public object for one check."""
    if check == "doctest":
        return list(_doctest_problems())
    checks: dict[str, Callable[[Item], Iterator[str]]] = {
        "summary": _summary_problems,
        "args": _args_problems,
        "attributes": _attributes_problems,
        "raises": lambda item: raises_problems(item, counts if counts is not None else Counter()),
    }
    return [(item.qualname, problem) for item in ITEMS for problem in checks[check](item)]


def _assert_none(check: str, found: list[tuple[str, str]]) -> None:
    left = [f"{name}: {problem}" for name, problem in found if (name, check) not in ALLOWED]
    assert not left, f"{len(left)} docstring problems:\n" + "\n".join(left)


def test_the_checks_see_the_public_api() -> None:
    names = {i.qualname.rsplit(".", 1)[-1] for i in ITEMS}
    assert {"Pruner", "threshold", "select_threshold", "save_sparse", "step"} <= names
    assert len(ITEMS) > 400, len(ITEMS)


def test_public_callables_have_a_one_line_summary() -> None:
    _assert_none("summary", _found("summary"))


def test_args_sections_match_the_signatures() -> None:
    _assert_none("args", _found("args"))


def test_attributes_sections_name_attributes_the_classes_have() -> None:
    _assert_none("attributes", _found("attributes"))


def test_raises_sections_name_exceptions_the_code_raises() -> None:
    counts = {"decided": 0, "undecided": 0}
    found = _found("raises", counts)
    print(f"Raises: names checked {counts['decided']}, undecided {counts['undecided']}")
    _assert_none("raises", found)
    assert counts["decided"] >= RAISES_FLOOR, counts


def test_docstring_examples_run() -> None:
    _assert_none("doctest", _found("doctest"))


def test_every_allowed_failure_still_fails() -> None:
    """An entry of ALLOWED whose docstring was fixed must leave the list."""
    failing = {(name, check) for check in CHECKS for name, _ in _found(check)}
    stale = sorted(f"{name} ({check})" for name, check in ALLOWED if (name, check) not in failing)
    assert not stale, "fixed, remove from ALLOWED: " + ", ".join(stale)


def test_the_reference_documents_the_modules_checked_here() -> None:
    """The module list above is the docs build's own (when the docs extra is installed)."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    spec = importlib.util.spec_from_file_location("docs_hook", ROOT / "docs/reference/_build.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    assert sorted(hook.public_modules(SRC)) == sorted(public_modules())


# ------------------------------------------------ the checks catch what they claim to
def _sample(x: int, *rest: int, scale: float = 1.0, **options: Any) -> int:
    """Add things.

    Args:
        x: the first.
        *rest: the others.
        scale: a factor.
        **options: ignored.

    Raises:
        ValueError: for a negative ``x``.
    """
    if x < 0:
        raise ValueError(x)
    return x


def _sample_wrong(x: int, y: int) -> int:
    """Add things
    over two lines.

    Args:
        x: the first.
        z: not a parameter.

    Raises:
        KeyError: never raised.
        ValueError: raised by a helper it calls.
    """
    return int(check_p(x)) + y  # check_p raises ValueError


def _item(function: Callable[..., Any]) -> Item:
    return Item(function.__qualname__, function, sys.modules[__name__])


def test_the_checks_accept_a_good_docstring() -> None:
    item = _item(_sample)
    counts = {"decided": 0, "undecided": 0}
    assert list(_summary_problems(item)) == []
    assert list(_args_problems(item)) == []
    assert list(raises_problems(item, counts)) == []
    assert counts == {"decided": 1, "undecided": 0}


def test_the_checks_reject_a_wrong_docstring() -> None:
    item = _item(_sample_wrong)
    counts = {"decided": 0, "undecided": 0}
    assert list(_summary_problems(item)) == [
        "the summary runs over more than one line (no blank line after it)"
    ]
    assert list(_args_problems(item)) == [
        "Args: does not describe y",
        "Args: names z, not in the signature ['x', 'y']",
    ]
    assert list(raises_problems(item, counts)) == [
        "Raises: names KeyError, which the code does not raise"
    ]
    assert counts == {"decided": 2, "undecided": 0}  # ValueError: found in check_p


def test_a_class_is_checked_against_its_constructor() -> None:
    problems = list(_args_problems(_item(Item)))
    assert problems == ["Args: does not describe qualname, obj, module, owner"]


@dataclasses.dataclass
class _SampleRecord:
    """A record.

    Attributes:
        size: its size.
        colour: not one of its fields.
    """

    size: int


def test_a_dataclass_may_describe_its_fields_as_attributes() -> None:
    item = _item(_SampleRecord)
    assert list(_args_problems(item)) == []
    assert list(_attributes_problems(item)) == [
        "Attributes: names colour, which the class does not have"
    ]


@dataclasses.dataclass
class _SampleHelpRecord:
    """A record.

    Each field is described once, by its ``help`` metadata.
    """

    size: int = dataclasses.field(default=0, metadata={"help": "its size"})
    colour: str = dataclasses.field(default="", metadata={"help": " "})
    weight: float = 0.0


@dataclasses.dataclass
class _SampleUnpointedRecord:
    """A record whose docstring does not point at its fields' help."""

    size: int = dataclasses.field(default=0, metadata={"help": "its size"})


def test_a_dataclass_may_point_at_its_fields_help() -> None:
    """The ``help`` metadata describes a field only where the docstring says so,
    and only a field that has one: a field without help (or with a blank one)
    is still an omission."""
    assert list(_args_problems(_item(_SampleHelpRecord))) == [
        "Args: does not describe colour, weight"
    ]
    assert list(_args_problems(_item(_SampleUnpointedRecord))) == ["Args: does not describe size"]
