"""The mutation harness's definitions still fit the code (docs/mutation-audit.md).

Each mutant of ``benchmarks/mutation/m_*.py`` is one exact text replacement: its
``old`` text must occur exactly once in its file as committed (``git show
HEAD:FILE``), or the harness stops at it (not found) or cannot tell where to
apply it (ambiguous). The committed text, not the working tree, because the
harness mutates a fresh clone.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
MUTATION = ROOT / "benchmarks" / "mutation"
MODULES = sorted(p.stem for p in MUTATION.glob("m_*.py"))


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"mutation_{name}", MUTATION / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _committed(path: str) -> str:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout (the harness mutates a clone of HEAD)")
    got = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"HEAD:{path}"], capture_output=True, text=True
    )
    if got.returncode != 0:
        pytest.skip(f"{path} is not committed yet")
    return got.stdout


def test_there_are_mutant_modules() -> None:
    expected = {
        "m_ops",
        "m_nm",
        "m_sel",
        "m_codec",
        "m_dist",
        "m_train",
        "m_nmb",
        "m_keys",
        "m_fsp",
        "m_pruner",
        "m_infer",
        "m_data",
        "m_integ",
        "m_stats",
        "m_onnx",
        "m_loop",
        "m_anl",
        "m_mdl",
        "m_cli",
        "m_cfg",
        "m_xf",
        "m_run",
        "m_win",
        "m_ddp",
        "m_plt",
        "m_exp",
        "m_pages",
        "m_enm",
        "m_meth",
        "m_bas",
        "m_bbn",
        "m_pr2",
        "m_swp",
    }
    assert expected <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_every_mutant_changes_exactly_one_place_of_its_file(name: str) -> None:
    module = _load(name)
    ids = [m["id"] for m in module.MUTATIONS]
    assert len(ids) == len(set(ids)), f"{name}: duplicate mutant ids"
    problems = []
    texts: dict[str, str] = {}
    for m in module.MUTATIONS:
        path = m.get("file", module.FILE)
        if path not in texts:
            texts[path] = _committed(path)
        count = texts[path].count(m["old"])
        if m.get("occ", 0) == 0 and count != 1:
            problems.append(f"{m['id']}: `old` occurs {count} times in {path}: {m['old']!r}")
        elif count < m.get("occ", 0):
            problems.append(f"{m['id']}: fewer than occ={m['occ']} occurrences in {path}")
        if m["old"] == m["new"]:
            problems.append(f"{m['id']}: `new` equals `old`")
        for test in m.get("tests", module.TESTS):
            if not (ROOT / test.split("::")[0]).is_file():
                problems.append(f"{m['id']}: no test file {test}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", MODULES)
def test_every_mutant_has_a_row_in_the_report(name: str) -> None:
    report: Any = _load("report")
    module = _load(name)
    missing = [m["id"] for m in module.MUTATIONS if m["id"] not in report.LOC]
    assert not missing, f"report.py's LOC lacks {missing}"


@pytest.mark.parametrize("name", MODULES)
def test_every_mutant_has_a_recorded_outcome_and_a_section_in_the_report(name: str) -> None:
    """``report.py`` reads each module's ``results/results_KEY.jsonl`` (a missing id
    would stop it with a KeyError) and prints the modules of its ``MODULES``."""
    report: Any = _load("report")
    key = name.removeprefix("m_")
    assert key in {k for k, _ in report.MODULES}, f"report.py's MODULES lacks {key!r}"
    results = MUTATION / "results" / f"results_{key}.jsonl"
    recorded = {json.loads(line)["id"] for line in results.read_text().splitlines() if line}
    missing = [m["id"] for m in _load(name).MUTATIONS if m["id"] not in recorded]
    assert not missing, f"{results.name} has no outcome for {missing}"
