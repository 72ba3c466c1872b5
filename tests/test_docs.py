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
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from torch import nn

from _helpers import one_thread, script_module

ROOT = Path(__file__).resolve().parents[1]

DOCS_EXTRA = (
    "mkdocs",
    "material",
    "mkdocstrings",
    "mkdocstrings_handlers.python",
    "griffe_inherited_docstrings",
)


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


@pytest.mark.parametrize("page", ["index.md", "guide/concepts.md", "guide/nm.md"])
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


# ------------------------------------------------- the commands and snippets of the pages
# What a newcomer copies from the pages: the `feather-sparse` command lines, the
# benchmark scripts' flags, the Python examples. Each is checked as cheaply as it
# can be (parsed, `--print-config`, or run at a tiny size), so that a renamed flag
# or a changed call shows up here instead of on a user's terminal.

COMMAND_PAGES = [
    "README.md",
    "docs/index.md",
    "docs/guide/cli.md",
    "docs/guide/concepts.md",
    "docs/guide/nm.md",
    "docs/guide/settings.md",
    "docs/training.md",
    "docs/results/README.md",
    "docs/benchmarks.md",
    "docs/benchmarks-nm.md",
]

# Stand-ins for the shell variables and placeholders the pages' loops use.
_SHELL_VALUES = {"$model": "resnet20", "$s": "0.9", "$c": "True", "$src": "src"}


def _code_blocks(text: str, languages: tuple[str, ...] = ("bash", "")) -> list[str]:
    blocks = re.findall(r"^ *```(\w*)\n(.*?)^ *```", text, flags=re.S | re.M)
    return [body for lang, body in blocks if lang in languages]


def _shell_lines(block: str) -> list[str]:
    """The block's commands: continuations joined, comments, redirections and the
    shell's own words (`for ...; do`, `&&`) dropped, one simple command each."""
    joined = re.sub(r"\\\n\s*", " ", block)
    commands = []
    for line in joined.splitlines():
        line = re.sub(r"(^|\s)#\s.*$", "", line).strip()
        line = re.sub(r"\$\([^)]*\)", "X", line)
        for name, value in _SHELL_VALUES.items():
            line = line.replace(name, value)
        for part in re.split(r"\s*(?:;|&&|\|\|)\s*", line):
            part = re.sub(r"^(?:do|then)\s+", "", part)
            part = re.split(r"\s+\d?>\s*", part)[0].strip()
            if part and not part.startswith(("for ", "done", "cd ")):
                commands.append(part)
    return commands


def _words(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError:  # a quoted program cut at a `;` (python -c "...; ...")
        return []


def _cli_argv(line: str) -> list[str] | None:
    """The argument list of a `feather-sparse` (or `-m feather_sparse`) command, else None."""
    words = _words(line)
    for i, word in enumerate(words):
        if word == "feather-sparse" or (word == "feather_sparse" and words[i - 1] == "-m"):
            return words[i + 1 :]
    return None


def _page_cli_commands() -> list[tuple[str, list[str]]]:
    found = []
    for page in COMMAND_PAGES:
        for block in _code_blocks((ROOT / page).read_text(encoding="utf-8")):
            for line in _shell_lines(block):
                argv = _cli_argv(line)
                if argv is not None:
                    found.append((page, argv))
    return found


def test_pages_show_commands_to_check() -> None:
    commands = _page_cli_commands()
    assert len(commands) > 30
    assert {argv[0] for _, argv in commands} >= {"train", "bench", "export", "inspect"}


@pytest.mark.parametrize(
    ("page", "argv"),
    _page_cli_commands(),
    ids=[f"{p}:{' '.join(a)[:60]}" for p, a in _page_cli_commands()],
)
def test_page_command_is_accepted(
    page: str,
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every `feather-sparse` command in a code block of the pages parses, and what
    can be checked without training is: a `train` command's config resolves
    (`--print-config`), a `bench` command's options are accepted."""
    from feather_sparse import cli
    from feather_sparse.cli.bench import options_from_args

    monkeypatch.chdir(tmp_path)
    args = cli.build_parser().parse_args(argv)  # an unknown flag exits 2 here
    if argv[0] == "bench":
        options_from_args(args)
    elif argv[0] == "train" and args.resume is None:
        recipe = args.recipe or ""
        if recipe.endswith(".toml"):  # the page's own file: the full config of a bundled one
            assert cli.main(["train", "--recipe", "cifar100", "--print-config"]) == 0
            Path(recipe).write_text(capsys.readouterr().out)
        assert cli.main([*argv, "--print-config"]) == 0, capsys.readouterr().err


def _benchmark_commands() -> list[tuple[str, str, list[str]]]:
    """``(page, script, flags)`` for every benchmark script a page runs with flags."""
    found = []
    for page in COMMAND_PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        lines = [line for block in _code_blocks(text) for line in _shell_lines(block)]
        # Commands in tables and prose too: `benchmarks/bench_x.py --flag ...`.
        lines += re.findall(r"`(?:\"\$PY\" )?(benchmarks/bench_\w+\.py[^`]*)`", text)
        for line in lines:
            words = _words(line)
            for i, word in enumerate(words):
                if re.fullmatch(r"(?:\S*/)?bench_\w+\.py", word):
                    flags = [w for w in words[i + 1 :] if w not in ("done",)]
                    found.append((page, Path(word).name, flags))
    return found


def test_pages_name_only_benchmark_scripts_that_exist() -> None:
    found = _benchmark_commands()
    assert len({script for _, script, _ in found}) >= 12
    for page, script, _ in found:
        assert (ROOT / "benchmarks" / script).is_file(), f"{page} runs a missing {script}"


class _Parsed(Exception):
    pass


@pytest.mark.parametrize(
    ("page", "script", "flags"),
    [c for c in _benchmark_commands() if c[2]],
    ids=[f"{p}:{s} {' '.join(f)}" for p, s, f in _benchmark_commands() if f],
)
def test_benchmark_flags_on_the_pages_exist(
    page: str, script: str, flags: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script's own parser accepts the flags the page gives it (the benchmark
    itself does not run: parsing stops it)."""
    import argparse
    import runpy

    path = ROOT / "benchmarks" / script
    assert "argparse" in path.read_text(encoding="utf-8"), f"{script} takes no flags"
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        parse(self, *args, **kwargs)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.setattr(sys, "argv", [str(path), *flags])
    with pytest.raises(_Parsed):
        runpy.run_path(str(path), run_name="__main__")


def test_settings_snippet_runs_in_its_context() -> None:
    """docs/guide/settings.md shows a Pruner for a model and step counts of the reader's."""
    import feather_sparse as fs

    (block,) = re.findall(
        r"```python\n(.*?)```", (ROOT / "docs/guide/settings.md").read_text(), flags=re.S
    )
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    scope: dict[str, Any] = {"fs": fs, "model": model, "epochs": 3, "steps_per_epoch": 10}
    exec(compile(block, "settings.md[python block 0]", "exec"), scope)
    assert scope["pruner"].config()["sparsity"] == 0.95
    assert scope["pruner"].config()["total_steps"] == 30


def test_training_page_python_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/training.md's "From Python" example, as written, with the CIFAR-100 config
    it loads (checked to resolve) swapped for one epoch of the bundled data."""
    import json

    from feather_sparse import recipes

    (block,) = re.findall(
        r"```python\n(.*?)```", (ROOT / "docs/training.md").read_text(), flags=re.S
    )
    real = recipes.load_config

    def one_epoch_of_mnist1d(name: str, **overrides: Any) -> recipes.TrainConfig:
        real(name, **overrides)  # the page's call resolves (no data is read)
        return real("mnist1d", sparsity=overrides.get("sparsity", 0.9), epochs=1)

    monkeypatch.setattr(recipes, "load_config", one_epoch_of_mnist1d)
    monkeypatch.chdir(tmp_path)
    with one_thread():
        exec(compile(block, "training.md[python block 0]", "exec"), {"__name__": "__docs__"})
    out = capsys.readouterr().out
    assert "| **total** |" in out  # print(result.table)
    lines = (tmp_path / "runs/r20-s95/metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["my_value"] == pytest.approx(0.95, abs=1e-3)


def test_results_page_run_count_command_prints_what_the_page_says(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/results/README.md plans the paper-regime sweep without training and
    states the count it prints."""
    text = (ROOT / "docs/results/README.md").read_text(encoding="utf-8")
    (code,) = re.findall(r'python -c "(import pathlib, tempfile.*?)"\n', text, flags=re.S)
    stated = re.search(r"prints `(\d+) distinct runs`", text)
    assert stated is not None
    exec(compile(code, "results/README.md[run count]", "exec"), {"__name__": "__docs__"})
    assert capsys.readouterr().out.strip() == f"{stated.group(1)} distinct runs"


def test_nm_size_table_is_what_its_command_prints(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/benchmarks-nm.md's table of N:M sizes is the output of the command above
    it (counts of bytes from seeded weights: the same on every machine)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    with one_thread(), script_module(ROOT / "benchmarks/bench_nm_size.py", "bench_nm_size") as m:
        m.main()
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| mnist")]
    text = (ROOT / "docs/benchmarks-nm.md").read_text(encoding="utf-8")
    section = text[text.index("python benchmarks/bench_nm_size.py") :]
    shown = [
        line for line in section.split("\n\n## ", 1)[0].splitlines() if line.startswith("| mnist")
    ]
    assert len(printed) == 6 and shown == printed
