"""The table of bad inputs the library guards against, collected from the tests themselves.

A test that feeds the library a bad input (a damaged file, a wrong flag, a
full disk) and checks the answer joins the table with one decorator::

    from _guards import guard

    @guard("`--run-dir` names an existing file", "CLI exit 1; `ValueError` naming the file")
    def test_run_dir_that_is_a_file(tmp_path): ...

The first argument is the bad input as a user would meet it, the second what
the library does about it. Any test module under ``tests/`` may use it, and
the decorator works on parametrized tests too (one row per test function).

The table in ``docs/reliability.md`` (between ``<!-- guards:begin -->`` and
``<!-- guards:end -->``) is generated, never typed::

    python tests/_guards.py --write docs/reliability.md   # rewrite the table
    python tests/_guards.py                               # print it

It runs ``pytest --collect-only`` (no test runs, slow tests included) with
this file as a plugin that reads the tags. ``tests/test_faults.py`` checks
that the page matches the tests, so after adding a tag, run the first command.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ATTRIBUTE = "__feather_guard__"
BEGIN, END = "<!-- guards:begin -->", "<!-- guards:end -->"
ROOT = Path(__file__).resolve().parent.parent

F = TypeVar("F", bound=Callable[..., Any])


def guard(bad_input: str, answer: str) -> Callable[[F], F]:
    """Tag a test as the check of one guard: the bad input, and the library's answer."""
    if not bad_input.strip() or not answer.strip() or "|" in bad_input + answer:
        raise ValueError("guard: give a non-empty bad input and answer, without '|'")

    def tag(test: F) -> F:
        setattr(test, ATTRIBUTE, (bad_input, answer))
        return test

    return tag


class _Collector:
    """A pytest plugin: the guard rows of every collected test, in collection order."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, str, str]] = {}

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        for item in items:
            function = getattr(item, "function", None)
            tag = getattr(function, ATTRIBUTE, None)
            if tag is None:
                continue
            where = f"{Path(item.path).name}::{function.__name__}"
            self.rows.setdefault(where, (tag[0], tag[1], where))


def collect(paths: list[str] | None = None) -> list[tuple[str, str, str]]:
    """``(bad input, answer, test)`` for every tagged test under ``tests/`` (or ``paths``)."""
    import pytest

    collector = _Collector()
    args = ["--collect-only", "-q", "-m", "", "-p", "no:cacheprovider"]
    if paths is None:  # only the modules that can tag (importing every test module is slow)
        modules = sorted((ROOT / "tests").glob("test_*.py"))
        paths = [str(p) for p in modules if "_guards" in p.read_text(encoding="utf-8")]
    with contextlib.redirect_stdout(io.StringIO()):  # the list of test ids
        code = pytest.main([*args, *paths], plugins=[collector])
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        raise RuntimeError(f"pytest could not collect the tests (exit code {code})")
    return list(collector.rows.values())


def table(rows: list[tuple[str, str, str]]) -> str:
    """The Markdown table of ``rows``."""
    lines = ["| bad input | what the library does | checked by |", "|---|---|---|"]
    lines += [f"| {bad} | {answer} | `{test}` |" for bad, answer, test in rows]
    return "\n".join(lines)


def replace_table(page: str, text: str) -> str:
    """``page`` with the text between the guard markers replaced by ``text``."""
    head, sep, rest = page.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"the page has no {BEGIN} ... {END} block")
    return f"{head}{BEGIN}\n{text}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="rewrite the table in this Markdown page")
    args = parser.parse_args(argv)
    text = table(collect())
    if args.write is None:
        print(text)
    else:
        args.write.write_text(replace_table(args.write.read_text(), text))
        print(f"wrote {text.count(chr(10)) - 1} guards to {args.write}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
