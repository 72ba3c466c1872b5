"""The documentation site builds offline with ``mkdocs build --strict`` (no warning).

The build runs on a copy of ``docs/`` with stand-ins for the pages other parts
of the project add (``benchmarks.md``, ``distributed.md``, ``results/``, an
unexpected page), so the test also shows that such pages get into the
navigation and that the guide's conditional links appear. Skipped when the
``docs`` extra is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from _helpers import one_thread

ROOT = Path(__file__).resolve().parents[1]

DOCS_EXTRA = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def needs_docs_extra() -> None:
    for needed in DOCS_EXTRA:
        pytest.importorskip(
            needed, reason="the docs extra is not installed (pip install '.[docs]')"
        )


def load_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "docs_build_hook", ROOT / "docs/reference/_build.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STAND_INS = {
    "benchmarks.md": "# Benchmarks (stand-in)\n",
    "distributed.md": "# Distributed (stand-in)\n",
    "results/zz-stand-in.md": "# Results stand-in\n",
    "zz-unlisted.md": "# An unlisted page\n\nRun [the script](../benchmarks/zz_script.py).\n",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    needs_docs_extra()
    work = tmp_path_factory.mktemp("docs")
    shutil.copy(ROOT / "mkdocs.yml", work / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", work / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    (work / "src").symlink_to(ROOT / "src")
    (work / "benchmarks").mkdir()
    (work / "benchmarks/zz_script.py").write_text("# a script outside docs/\n")
    for name, text in STAND_INS.items():
        path = work / "docs" / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "NO_MKDOCS_2_WARNING": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(work / "site")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert "WARNING" not in log, log
    return work / "site"


def page_text(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text(encoding="utf-8")


def test_every_public_module_has_a_reference_page(site: Path) -> None:
    modules = load_hook().public_modules(ROOT / "src")
    assert {"feather_sparse.pruner", "feather_sparse.integrations.hf"} <= set(modules)
    for module in modules:
        html = page_text(site, f"reference/{module}")
        assert f'id="{module}"' in html, module


def test_sphinx_roles_become_links(site: Path) -> None:
    for page in (site / "reference").rglob("index.html"):
        html = page.read_text(encoding="utf-8")
        assert not re.search(r":(class|meth|func|mod|attr):<code>", html), page
    pruner = page_text(site, "reference/feather_sparse.pruner")
    assert 'href="#feather_sparse.pruner.Pruner.step"' in pruner


def test_public_api_table_lists_every_export(site: Path) -> None:
    import feather_sparse

    html = page_text(site, "reference")
    for name in feather_sparse.__all__:
        if not name.startswith("_"):
            assert f"<code>{name}</code>" in html, name


def test_cli_page_shows_the_generated_help(site: Path) -> None:
    assert "usage: feather-sparse" in page_text(site, "guide/cli")


def test_project_pages_join_the_navigation(site: Path) -> None:
    home = page_text(site, "")
    for href in ("benchmarks/", "distributed/", "results/zz-stand-in/", "zz-unlisted/"):
        assert f'href="{href}"' in home, href
    # The guide's conditional link appears once the page exists.
    assert 'href="../../distributed/"' in page_text(site, "guide/distributed")
    # A link to a repository file outside docs/ becomes text naming the file.
    assert "<code>benchmarks/zz_script.py</code>" in page_text(site, "zz-unlisted")


def test_conditional_blocks_vanish_without_their_page() -> None:
    needs_docs_extra()
    hook = load_hook()
    page = SimpleNamespace(file=SimpleNamespace(src_uri="guide/distributed.md"))
    config = SimpleNamespace(docs_dir=str(ROOT / "docs"), repo_url=None)
    files = SimpleNamespace(get_file_from_path=lambda uri: None)
    text = "a\n<!-- if-page ../missing.md -->\nsee [it](../missing.md)\n<!-- end-if -->\nb\n"
    assert hook.on_page_markdown(text, page, config, files) == "a\nb\n"


@pytest.mark.parametrize("page", ["index.md", "guide/concepts.md"])
def test_self_contained_snippets_run(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    with one_thread():
        for i, block in enumerate(blocks):
            exec(compile(block, f"{page}[python block {i}]", "exec"), {"__name__": "__docs__"})


def test_training_page_lists_every_config_field_and_choice() -> None:
    """The table of config fields in docs/training.md names every ``TrainConfig``
    field, and its method and backbone lists are the registries' names."""
    import dataclasses

    from feather_sparse.methods import METHODS
    from feather_sparse.pruner_config import REGISTRIES
    from feather_sparse.recipes import TrainConfig

    text = (ROOT / "docs" / "training.md").read_text()
    table = text[text.index("| group | fields |") :].split("\n\n", 1)[0]
    listed = set(re.findall(r"`(\w+)`", table))
    assert {f.name for f in dataclasses.fields(TrainConfig)} <= listed
    for field, names in [
        ("method", METHODS.names()),
        *((k, r.names()) for k, r in REGISTRIES.items()),
    ]:
        shown = re.search(rf"`{field}` \(([^)]*)\)", table)
        assert shown is not None, field
        assert sorted(shown.group(1).split(", ")) == sorted(names), field


def test_install_page_lists_every_extra() -> None:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    text = (ROOT / "docs" / "index.md").read_text()
    table = text[text.index("| extra | for |") :].split("\n\n", 1)[0]
    assert re.findall(r"^\| `([\w-]+)` \|", table, flags=re.M) == list(extras)
