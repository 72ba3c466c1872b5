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

from _helpers import needs_safetensors, one_thread, script_module

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


@pytest.mark.parametrize(
    "page",
    ["index.md", "guide/concepts.md", pytest.param("guide/nm.md", marks=needs_safetensors)],
)
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
    "docs/guide/export.md",
    "docs/guide/integrations.md",
    "docs/guide/transformers.md",
    "docs/distributed.md",
    "docs/guide/distributed.md",
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
    line = re.sub(r"\[(--[^\]]*)\]", r"\1", line)  # an optional flag shown `[--opset 18]`
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
        lines += re.findall(r"`(?:\"\$PY\" )?(benchmarks/(?:bench|profile)_\w+\.py[^`]*)`", text)
        for line in lines:
            words = _words(line)
            for i, word in enumerate(words):
                if re.fullmatch(r"(?:\S*/)?(?:bench|profile)_\w+\.py", word):
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


def _parse_only(path: Path, flags: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the script ``path`` with ``flags`` until its argparse parser has accepted them."""
    import argparse
    import runpy

    assert "argparse" in path.read_text(encoding="utf-8"), f"{path.name} takes no flags"
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        parse(self, *args, **kwargs)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.syspath_prepend(str(path.parent))
    monkeypatch.setattr(sys, "argv", [str(path), *flags])
    with pytest.raises(_Parsed):
        runpy.run_path(str(path), run_name="__main__")


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
    _parse_only(ROOT / "benchmarks" / script, flags, monkeypatch)


def _example_commands() -> list[tuple[str, str, list[str]]]:
    """``(page, script, flags)`` for every `python examples/x.py ...` in a page's code blocks."""
    found = []
    for page in COMMAND_PAGES:
        for block in _code_blocks((ROOT / page).read_text(encoding="utf-8")):
            for line in _shell_lines(block):
                words = _words(line)
                for i, word in enumerate(words):
                    if re.fullmatch(r"examples/\w+\.py", word):
                        found.append((page, word, words[i + 1 :]))
    return found


def test_pages_name_only_example_scripts_that_exist() -> None:
    found = _example_commands()
    assert {script for _, script, _ in found} >= {"examples/prune_transformer.py"}
    for page, script, _ in found:
        assert (ROOT / script).is_file(), f"{page} runs a missing {script}"


@pytest.mark.parametrize(
    ("page", "script", "flags"),
    _example_commands(),
    ids=[f"{p}:{s} {' '.join(f)}" for p, s, f in _example_commands()],
)
def test_example_flags_on_the_pages_exist(
    page: str, script: str, flags: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An example script's parser accepts the flags a page gives it (nothing trains)."""
    _parse_only(ROOT / script, flags, monkeypatch)


def _torchrun_commands() -> list[tuple[str, list[str]]]:
    found = []
    for page in COMMAND_PAGES:
        for block in _code_blocks((ROOT / page).read_text(encoding="utf-8")):
            for line in _shell_lines(block):
                words = _words(line)
                if words[:1] == ["torchrun"]:
                    found.append((page, words[1:]))
    return found


@pytest.mark.parametrize(
    ("page", "argv"),
    _torchrun_commands(),
    ids=[f"{p}:torchrun {' '.join(a)[:60]}" for p, a in _torchrun_commands()],
)
def test_torchrun_flags_on_the_pages_exist(page: str, argv: list[str]) -> None:
    """torchrun's own parser accepts the launcher flags a page shows (the program's
    flags, after it, are checked as `feather-sparse` commands above)."""
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(argv)  # an unknown launcher flag exits 2 here
    assert args.training_script in ("feather_sparse", "feather-sparse"), argv
    assert args.module == (args.training_script == "feather_sparse"), argv


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


#: A run of the training page's commands at a tiny size: one epoch of 128 synthetic signals.
_TINY_RUN = [
    "--epochs",
    "1",
    "--dataset",
    "synthetic-mnist1d",
    "--set",
    "data_options={train_size = 128, test_size = 32}",
    "--no-tensorboard",
]


def _section(page: str, heading: str) -> str:
    """The text of ``page`` under ``heading`` (a `## ` heading), up to the next one."""
    text = (ROOT / page).read_text(encoding="utf-8")
    return text[text.index(f"\n## {heading}\n") :].split("\n## ", 2)[1]


@needs_safetensors
def test_training_page_init_from_commands_run_as_the_page_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/training.md, "Starting from trained weights": its two commands, run (one
    epoch of synthetic data), start the second run from the first one's `model.fsp`
    and record it as the page says; the refusals the section describes name what it
    says they name, and the export command an unfinished run's refusal gives works."""
    import hashlib
    import json

    from feather_sparse import cli

    section = _section("docs/training.md", "Starting from trained weights")
    commands = [_cli_argv(line) for block in _code_blocks(section) for line in _shell_lines(block)]
    dense, pruned = [argv for argv in commands if argv is not None]
    assert "--dense" in dense and "--init-from" in pruned
    monkeypatch.chdir(tmp_path)
    with one_thread():
        assert cli.main([*dense, *_TINY_RUN]) == 0
        assert cli.main([*pruned, *_TINY_RUN]) == 0
    capsys.readouterr()
    source = (tmp_path / pruned[pruned.index("--init-from") + 1] / "model.fsp").resolve()
    run = tmp_path / pruned[pruned.index("--run-dir") + 1]
    # "config.json records the file's absolute path and SHA-256 (`"init"`)"
    recorded = json.loads((run / "config.json").read_text())["init"]
    assert recorded == {
        "path": str(source),
        "sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
    }
    # "the run's log says `starting from the weights of PATH`"
    logged = re.search(r"the run's log says `([^`]*) PATH`", section)
    assert logged is not None
    phrase = " ".join(logged.group(1).split())  # the code span may wrap
    assert f"{phrase} {source}" in (run / "train.log").read_text()

    # "a missing file ... stops the command before the run folder is made"
    assert "before the run folder is made" in section
    assert cli.main(["train", "--init-from", "nothing-here", "--run-dir", "never", *_TINY_RUN]) == 1
    assert "nothing-here" in capsys.readouterr().err and not (tmp_path / "never").exists()
    # "--resume refuses the changed settings and its message gives the --init-from command"
    assert cli.main(["train", "--resume", str(run), "--epochs", "2"]) == 1
    assert f"--init-from {run} --run-dir" in capsys.readouterr().err
    # "A training checkpoint or an unfinished run has no model.fsp: export one first
    # (`feather-sparse export RUN -o start.fsp` ...) ...; the error names the command."
    assert "the error names the command" in section
    with one_thread():
        stopped = ["--epochs", "2", "--stop-after-epoch", "1"]
        assert cli.main(["train", "--dense", "--run-dir", "unfinished", *_TINY_RUN, *stopped]) == 0
    capsys.readouterr()
    assert cli.main(["train", "--init-from", "unfinished", "--run-dir", "next", *_TINY_RUN]) == 1
    export = re.search(r"\((feather-sparse export [^)]*)\)", capsys.readouterr().err)
    assert export is not None
    argv = _cli_argv(export.group(1))
    assert argv is not None
    assert cli.main(argv) == 0
    start = argv[argv.index("-o") + 1]
    with one_thread():
        assert cli.main(["train", "--init-from", start, "--run-dir", "next", *_TINY_RUN]) == 0


def test_training_page_model_kwargs_tables_are_what_the_page_says(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/training.md's `--model-kwargs` tables: the misspelt one stops
    `--print-config` with the names the page lists, the TOML and the JSON spelling
    give the same config, and none builds a model far larger than the default (a
    table the page shows is one a newcomer copies)."""
    import torch

    from feather_sparse import cli, models

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    text = (ROOT / "docs/training.md").read_text(encoding="utf-8")
    typo = re.search(
        r"`--model-kwargs '(\{[^']*\})'` stops with the names the model takes:\s+`([^`]*)`", text
    )
    assert typo is not None
    assert cli.main(["train", "--model-kwargs", typo.group(1), "--print-config"]) == 1
    assert capsys.readouterr().err.strip().endswith(f"it accepts: {typo.group(2)}")

    tables = {t for t in re.findall(r"'(\{[^']*\})'", text) if t != typo.group(1)}
    assert any('"' in t for t in tables) and any("=" in t for t in tables)  # JSON and TOML
    printed = set()
    default = sum(p.numel() for p in models.create_model("mnist1d_cnn").parameters())
    for table in tables:
        assert cli.main(["train", "--model-kwargs", table, "--print-config"]) == 0, table
        (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("model_kw")]
        printed.add(line)
        kwargs = tomllib.loads(line)["model_kwargs"]
        with torch.device("meta"):
            model = models.create_model("mnist1d_cnn", **kwargs)
        assert sum(p.numel() for p in model.parameters()) < 10 * default, table
    assert len(printed) == 1, printed


@needs_safetensors
def test_export_and_nm_pages_tied_weight_statements_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/guide/export.md's "Tied weights" and docs/guide/nm.md's format versions:
    a tied head is an alias record (version 3) that `inspect` shows as `= <first
    key>` with 0 bytes, `export x.fsp -o y.fsp` keeps it, loading keeps the tie;
    a file without a tie is version 1, with N:M records 2, with both 3; a reader of
    versions 1 to 2 refuses a version-3 file with the message the page quotes."""
    import torch

    import feather_sparse as fs
    from feather_sparse import cli
    from feather_sparse.export import header

    export_page = (ROOT / "docs/guide/export.md").read_text(encoding="utf-8")
    nm_page = (ROOT / "docs/guide/nm.md").read_text(encoding="utf-8")
    monkeypatch.chdir(tmp_path)

    def lm(tied: bool, pattern: str | None = None) -> nn.Sequential:
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Embedding(64, 16), nn.Linear(16, 16), nn.Linear(16, 64, bias=False)
        )
        if tied:
            model[2].weight = model[0].weight
        fs.Pruner(
            model, sparsity=0.5, pattern=pattern, total_steps=1, schedule="constant"
        ).finalize()
        return model

    with one_thread():
        tied = fs.save_sparse(lm(tied=True), "x.fsp")
        assert tied.format_version == 3 and "format\n  version 3" in export_page
        assert [(r.name, r.alias_of) for r in tied.tensors if r.alias_of] == [
            ("2.weight", "0.weight")
        ]
        assert cli.main(["inspect", "x.fsp"]) == 0
        (row,) = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.startswith("2.w")]
        assert row[-4:-2] == ["=", "0.weight"] and row[-1] == "0"  # `= <first key>`, 0 bytes
        # "`feather-sparse export x.fsp -o y.fsp` keeps the alias"
        assert "`feather-sparse export x.fsp -o y.fsp` keeps the alias" in export_page
        assert cli.main(["export", "x.fsp", "-o", "y.fsp"]) == 0
        again = fs.inspect_sparse("y.fsp")
        assert again.format_version == 3 and again.tensors[-1].alias_of == "0.weight"
        into = lm(tied=True)
        fs.load_sparse("y.fsp", into)
        assert into[2].weight is into[0].weight

        versions = {
            "plain": fs.save_sparse(lm(tied=False), "plain.fsp").format_version,
            "nm": fs.save_sparse(lm(tied=False, pattern="2:4"), "nm.fsp").format_version,
            "nm+tie": fs.save_sparse(lm(tied=True, pattern="2:4"), "both.fsp").format_version,
        }
    assert versions == {"plain": 1, "nm": 2, "nm+tie": 3}
    assert "is format version 2; one without is written as version 1" in nm_page
    assert re.search(r"tied weight as an alias record is version 3", nm_page)

    # What an earlier reader (formats 1 to 2) says to a version-3 file, as the page quotes it.
    quote = re.search(r"message naming the version \(`([^`]*)`\)", export_page)
    assert quote is not None
    monkeypatch.setattr(header, "FORMAT_VERSION", 2)
    with pytest.raises(ValueError) as refused:
        fs.load_sparse("x.fsp")
    message = str(refused.value).replace(fs.__version__, "0.1.0")
    before, after = " ".join(quote.group(1).split()).split(" ...")  # the code span may wrap
    assert message.startswith(before) and message.endswith(after), (quote.group(1), message)


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


def _python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(encoding="utf-8"), flags=re.S)


@needs_safetensors
def test_export_page_snippets_run_in_their_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/guide/export.md, in order: save a training checkpoint, resume from it in
    a fresh model (the optimizer built before the Pruner, as in the run that saved
    it), finalize, and round-trip the `.fsp` file; the names the prose supplies
    (a model `create_model` built, its optimizer and Pruner) are defined here."""
    import torch

    import feather_sparse as fs

    saving, resuming, finalizing, fsp = _python_blocks("docs/guide/export.md")
    monkeypatch.chdir(tmp_path)

    def train(scope: dict[str, Any], steps: int) -> None:
        model, optimizer, pruner = scope["model"], scope["optimizer"], scope["pruner"]
        for _ in range(steps):
            loss = model(torch.randn(4, 1, 40)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            pruner.step()

    with one_thread():
        torch.manual_seed(0)
        model = fs.create_model("mnist1d_mlp")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        pruner = fs.Pruner(model, sparsity=0.9, total_steps=6)
        first = {"torch": torch, "model": model, "optimizer": optimizer, "pruner": pruner}
        train(first, 3)
        exec(compile(saving, "export.md[python block 0]", "exec"), first)

        checkpoint = torch.load("checkpoint.pt")
        second: dict[str, Any] = {
            "torch": torch,
            "fs": fs,
            "model": fs.create_model("mnist1d_mlp"),
            "checkpoint": checkpoint,
        }
        exec(compile(resuming, "export.md[python block 1]", "exec"), second)
        assert second["pruner"].current_step == 3
        train(second, 3)  # "continues exactly where the saved run would have"
        exec(compile(finalizing, "export.md[python block 2]", "exec"), second)
        assert second["sparsity"] == pytest.approx(0.9, abs=1e-3)
        assert set(torch.load("model.pt")) == set(fs.create_model("mnist1d_mlp").state_dict())

        baked = {k: v.clone() for k, v in second["model"].state_dict().items()}
        exec(compile(fsp, "export.md[python block 3]", "exec"), second)
        loaded = second["model"].state_dict()
        assert second["info"].path.endswith("model.fsp")
        assert all(torch.equal(loaded[k], v) for k, v in baked.items())


class _TinyTransformer(nn.Module):
    """Linear blocks and a `head`, as the transformer page's snippet expects."""

    def __init__(self) -> None:
        super().__init__()
        self.token = nn.Embedding(16, 8)
        self.blocks = nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 8))
        self.head = nn.Linear(8, 16)

    def forward(self, x: Any) -> Any:
        return self.head(self.blocks(self.token(x)))


def test_transformers_page_pruner_snippet_runs_in_its_context() -> None:
    """docs/guide/transformers.md's "part that matters" (its `...` stands for the
    forward and backward): the blocks are pruned, the head and embedding stay dense."""
    import torch

    import feather_sparse as fs

    block = _python_blocks("docs/guide/transformers.md")[0]
    model = _TinyTransformer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scope: dict[str, Any] = {"fs": fs, "nn": nn, "model": model, "steps": 5, "optimizer": optimizer}
    with one_thread():
        exec(compile(block, "transformers.md[python block 0]", "exec"), scope)
    assert [row.name for row in scope["report"].layers] == ["blocks.0", "blocks.2"]
    blocks = [layer.weight for layer in model.blocks if isinstance(layer, nn.Linear)]
    zeros = sum(int((w == 0).sum()) for w in blocks)
    assert zeros == round(0.8 * sum(w.numel() for w in blocks))
    assert int((model.head.weight == 0).sum()) == int((model.token.weight == 0).sum()) == 0


def _tiny_bert_config(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``transformers.BertConfig`` at a tiny size (the pages build the full-size one)."""
    transformers = pytest.importorskip("transformers")
    full = transformers.BertConfig
    tiny = {
        "vocab_size": 64,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 32,
    }
    monkeypatch.setattr(transformers, "BertConfig", lambda **kw: full(**{**tiny, **kw}))
    return transformers


@needs_safetensors  # transformers (which requires safetensors) imports its models only with it
def test_transformers_page_bert_snippet_names_real_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The BERT example (at a tiny size) builds, and the names the page excludes are
    modules of the models: `classifier`, and `cls.predictions.decoder` of a masked LM."""
    transformers = _tiny_bert_config(monkeypatch)
    block = _python_blocks("docs/guide/transformers.md")[1]
    scope: dict[str, Any] = {}
    exec(compile(block, "transformers.md[python block 1]", "exec"), scope)
    assert "classifier" in dict(scope["model"].named_modules())
    mlm = transformers.BertForMaskedLM(transformers.BertConfig())
    assert "cls.predictions.decoder" in dict(mlm.named_modules())


def test_integrations_page_trainer_snippet_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/guide/integrations.md's Trainer example as written, on a tiny BERT and
    32 samples (the page's `model` and `train_data`): the Pruner steps once per
    optimizer step, and the saved final model has the target sparsity."""
    import torch

    transformers = _tiny_bert_config(monkeypatch)
    pytest.importorskip("accelerate")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    block = _python_blocks("docs/guide/integrations.md")[0]
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(num_labels=2))
    g = torch.Generator().manual_seed(1)
    ids, labels = (
        torch.randint(0, 64, (32, 16), generator=g),
        torch.randint(0, 2, (32,), generator=g),
    )
    train_data = [{"input_ids": ids[i], "labels": labels[i]} for i in range(32)]
    scope: dict[str, Any] = {"model": model, "train_data": train_data}
    with one_thread():
        exec(compile(block, "integrations.md[python block 0]", "exec"), scope)
    callback, trainer = scope["callback"], scope["trainer"]
    assert callback.pruner.current_step == trainer.state.global_step > 0
    final = transformers.BertForSequenceClassification.from_pretrained("out/final")
    assert callback.final_sparsity == pytest.approx(0.9, abs=1e-3)
    assert int((final.classifier.weight == 0).sum()) == 0  # excluded
    assert int((final.bert.encoder.layer[0].output.dense.weight == 0).sum()) > 0


class _LitNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, x: Any) -> Any:
        return self.head(self.body(x).relu())


def test_integrations_page_lightning_snippet_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Lightning example as written, for a small module whose head is `net.head`
    (the page's `module` and `train_loader`)."""
    import torch

    L = pytest.importorskip("lightning.pytorch")
    monkeypatch.chdir(tmp_path)
    base: Any = L.LightningModule

    class Module(base):
        def __init__(self) -> None:
            super().__init__()
            self.net = _LitNet()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    block = _python_blocks("docs/guide/integrations.md")[1]
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
    module = Module()
    scope: dict[str, Any] = {
        "module": module,
        "train_loader": torch.utils.data.DataLoader(data, batch_size=8),
    }
    with one_thread():
        exec(compile(block, "integrations.md[python block 1]", "exec"), scope)
    callback = scope["callback"]
    assert callback.pruner.current_step == 10 * 4 // 2  # epochs x batches / accumulation
    assert callback.final_sparsity == pytest.approx(0.9, abs=1 / 128)
    assert int((module.net.head.weight == 0).sum()) == 0  # excluded


def test_integrations_page_ao_snippet_runs() -> None:
    """The `torch.ao.pruning`-style example, on a model with `fc1` and `fc2`."""
    from torch.nn.utils import parametrize

    block = _python_blocks("docs/guide/integrations.md")[3]
    fc1, fc2, out = nn.Linear(8, 16), nn.Linear(16, 4), nn.Linear(4, 2)
    model = nn.Sequential()
    for name, layer in (("fc1", fc1), ("fc2", fc2), ("out", out)):
        model.add_module(name, layer)
    scope: dict[str, Any] = {"model": model}
    exec(compile(block, "integrations.md[python block 3]", "exec"), scope)
    assert parametrize.is_parametrized(fc1) and parametrize.is_parametrized(fc2)
    assert not parametrize.is_parametrized(out)


def test_distributed_page_compile_snippet_runs_in_its_context() -> None:
    """docs/distributed.md's torch.compile block (the page's only one-process block
    that needs no GPU): it wraps the model the Pruner is attached to. The compiled
    training itself is tests/test_compile.py's."""
    import torch

    import feather_sparse as fs

    (block,) = [b for b in _python_blocks("docs/distributed.md") if "torch.compile" in b]
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    scope: dict[str, Any] = {"fs": fs, "torch": torch, "model": model, "total_steps": 10}
    exec(compile(block, "distributed.md[torch.compile block]", "exec"), scope)
    assert scope["compiled"]._orig_mod is model
    assert scope["pruner"].config()["sparsity"] == 0.9


def test_integrations_page_manual_optimization_snippet_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GAN sketch (its `...` left as they are) defines the module and a Trainer
    that carries the callback; training it needs the parts the page leaves out."""
    L = pytest.importorskip("lightning.pytorch")
    from feather_sparse.integrations.lightning import FeatherCallback

    monkeypatch.chdir(tmp_path)
    block = _python_blocks("docs/guide/integrations.md")[2]
    scope: dict[str, Any] = {"L": L, "FeatherCallback": FeatherCallback}
    exec(compile(block, "integrations.md[python block 2]", "exec"), scope)
    assert scope["GAN"]().automatic_optimization is False
    assert any(isinstance(c, FeatherCallback) for c in scope["trainer"].callbacks)
