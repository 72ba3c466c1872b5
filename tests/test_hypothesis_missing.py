"""The suite where hypothesis (a dev dependency) is not installed: the property tests skip.

A test module that imported hypothesis directly failed its collection there,
and pytest stopped the whole suite at the collection errors (11 modules, with
those that import from them); the property tests now import it through
``tests/_hypothesis.py``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def test_no_test_module_imports_hypothesis_itself() -> None:
    direct = []
    for path in sorted(TESTS.glob("*.py")):
        if path.name == "_hypothesis.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            if any(name.split(".")[0] == "hypothesis" for name in names):
                direct.append(f"{path.name}:{node.lineno}")
    assert direct == [], "import hypothesis through tests/_hypothesis.py"


def test_without_hypothesis_only_the_property_tests_skip(tmp_path: Path) -> None:
    code = """
import sys
import pytest

class NotInstalled:  # `import hypothesis` fails as if it were not installed
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "hypothesis":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NotInstalled())
sys.exit(pytest.main(sys.argv[1:]))
"""
    argv = [sys.executable, "-c", code, str(TESTS / "test_schedules.py"), "-q", "-rs"]
    argv += ["-p", "no:cacheprovider", "--rootdir", str(ROOT)]
    # No plugins from entry points: hypothesis's own would load it (pytest reads a plugin's
    # package past sys.meta_path's first finder, to rewrite its asserts).
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "5 passed, 1 skipped" in out, out
    assert "hypothesis is not installed" in out and "pip install -e '.[dev]'" in out
