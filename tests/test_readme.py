"""The README's Python snippets run as written (so the README cannot rot)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_python_snippets() -> None:
    assert BLOCKS, "README.md should show a Python quick start"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_snippet_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # snippets that write files write them here
    code = compile(BLOCKS[index], f"README.md[python block {index}]", "exec")
    exec(code, {"__name__": "__readme__"})
