"""Build-time assembly of the documentation site: a MkDocs hook (``hooks:`` in mkdocs.yml).

Three jobs, so that the site follows the code and the pages other people add
without anyone editing ``mkdocs.yml``:

- API reference: one page per public module of ``feather_sparse`` (names
  without a leading underscore), generated as ``reference/<module>.md`` with a
  mkdocstrings ``::: module`` block; a hand-written page of that name wins.
- Navigation: home, the user guide in reading order, the project pages that
  exist at build time (``benchmarks.md``, ``training.md``,
  ``distributed.md``, ``results/``), any other page found, then the reference.
- Live content: ``<!-- cli-help -->`` is replaced by the ``--help`` of the
  ``feather-sparse`` command and of each subcommand available now,
  ``<!-- public-api -->`` by a table of the names ``feather_sparse`` exports
  (from its ``__all__``, so it cannot fall behind), and a block
  ``<!-- if-page PATH -->...<!-- end-if -->`` is kept only when the page
  ``PATH`` (relative to ``docs/``) exists, so the guide can link to optional
  pages without breaking a strict build. Links from a page to repository
  files outside ``docs/`` (a script, the README) point to ``repo_url`` when
  mkdocs.yml sets one, else become plain text naming the file.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

PACKAGE = "feather_sparse"

# The user guide in reading order (docs/guide/...); missing ones are skipped.
GUIDE = [
    ("Concepts", "guide/concepts.md"),
    ("Choosing settings", "guide/settings.md"),
    ("Training frameworks", "guide/integrations.md"),
    ("Transformers", "guide/transformers.md"),
    ("Command line", "guide/cli.md"),
    ("Distributed training", "guide/distributed.md"),
    ("Checkpoints and export", "guide/export.md"),
    ("Architecture", "guide/architecture.md"),
]
# Pages written elsewhere in the project, included when present.
PROJECT = [
    ("Training runs", "training.md"),
    ("Benchmarks", "benchmarks.md"),
    ("Distributed (details)", "distributed.md"),
]
# Reference order: the core first, the rest alphabetically after it.
CORE = ["pruner", "ops", "selection", "backbones", "schedules", "registry"]

IF_PAGE = re.compile(r"<!-- if-page (\S+) -->\n?(.*?)<!-- end-if -->\n?", re.S)


def _source_root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).resolve().parent / "src"


def public_modules(src: Path) -> list[str]:
    """Dotted names of the package's public modules, found on disk (nothing imported)."""
    names = []
    root = src / PACKAGE
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts[1:]) or len(parts) == 1:
            continue  # private, __main__, and the top package (it only re-exports)
        names.append(".".join(parts))

    def key(name: str) -> tuple[int, str]:
        top = name.split(".")[1]
        return (CORE.index(top) if top in CORE else len(CORE), name)

    return sorted(names, key=key)


def _reference_page(module: str) -> str:
    return f"::: {module}\n"


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Import ``feather_sparse`` (for the CLI help) from this checkout's ``src``."""
    src = str(_source_root(config))
    if src not in sys.path:
        sys.path.insert(0, src)
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated reference pages, then lay out the navigation."""
    modules = public_modules(_source_root(config))
    for module in modules:
        uri = f"reference/{module}.md"
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, content=_reference_page(module)))

    present = {f.src_uri for f in files.documentation_pages()}
    nav: list[Any] = []
    used: set[str] = set()

    def take(title: str, uri: str) -> dict[str, str] | None:
        if uri not in present:
            return None
        used.add(uri)
        return {title: uri}

    if "index.md" in present:
        used.add("index.md")
        nav.append({"Home": "index.md"})
    guide = [e for e in (take(t, u) for t, u in GUIDE) if e]
    if guide:
        nav.append({"User guide": guide})
    project: list[Any] = [e for e in (take(t, u) for t, u in PROJECT) if e]
    results = sorted(
        (u for u in present if u.startswith("results/")),
        key=lambda u: (not u.endswith("index.md"), u),
    )
    if results:
        used.update(results)
        project.append({"Results": results})  # titles: each page's first heading
    if project:
        nav.append({"Project": project})
    reference: list[Any] = [e for e in [take("Overview", "reference/index.md")] if e]
    for module in modules:
        entry = take(module.removeprefix(PACKAGE + "."), f"reference/{module}.md")
        if entry:
            reference.append(entry)
    others = sorted(present - used - {u for u in present if u.startswith("reference/")})
    if others:
        nav.append({"More": others})
    leftover = sorted(u for u in present - used if u.startswith("reference/"))
    reference.extend(leftover)
    nav.append({"API reference": reference})
    config.nav = nav
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Fill in the live content; drop or rewrite links to pages the site does not have."""
    docs = Path(config.docs_dir).resolve()

    def keep(match: re.Match[str]) -> str:
        target = (docs / Path(page.file.src_uri).parent / match.group(1)).resolve()
        if not target.is_relative_to(docs):
            return ""
        exists = files.get_file_from_path(target.relative_to(docs).as_posix()) is not None
        return match.group(2) if exists else ""

    markdown = IF_PAGE.sub(keep, markdown)
    markdown = _outside_links(markdown, page, config)
    if "<!-- cli-help -->" in markdown:
        markdown = markdown.replace("<!-- cli-help -->", cli_help())
    if "<!-- public-api -->" in markdown:
        markdown = markdown.replace("<!-- public-api -->", public_api_table())
    return markdown


MD_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)


def _outside_links(markdown: str, page: Page, config: MkDocsConfig) -> str:
    """Links to repository files outside ``docs/`` (scripts, the README): to ``repo_url`` or text.

    Pages written to be read on a code host link to ``../benchmarks/x.py``;
    the site has no such page, so a strict build would fail on them.
    """
    docs = Path(config.docs_dir).resolve()
    repo = docs.parent
    page_dir = (docs / page.file.src_uri).parent

    def fix(match: re.Match[str]) -> str:
        bang, text, url = match.groups()
        if bang or re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", url):
            return match.group(0)
        path, _, anchor = url.partition("#")
        target = (page_dir / path).resolve()
        if target.is_relative_to(docs) or not target.is_relative_to(repo) or not target.exists():
            return match.group(0)  # a site page, or a broken link the build should report
        rel = target.relative_to(repo).as_posix()
        if config.repo_url:
            base = config.repo_url.rstrip("/")
            return f"[{text}]({base}/blob/HEAD/{rel}{'#' + anchor if anchor else ''})"
        return text if f"`{rel}`" in text or rel in text else f"{text} (`{rel}`)"

    out, last = [], 0
    for fence in FENCE.finditer(markdown):  # leave code blocks alone
        out.append(MD_LINK.sub(fix, markdown[last : fence.start()]))
        out.append(fence.group(0))
        last = fence.end()
    out.append(MD_LINK.sub(fix, markdown[last:]))
    return "".join(out)


def _home_module(name: str, obj: Any) -> str:
    """The module that defines ``obj`` (re-exported by the package as ``name``)."""
    if inspect.isclass(obj) or inspect.isfunction(obj):
        return str(obj.__module__)
    for module_name, module in sorted(sys.modules.items()):
        if not module_name.startswith(PACKAGE + ".") or module is None:
            continue
        if name in getattr(module, "__all__", ()) and getattr(module, name, None) is obj:
            return module_name
    return PACKAGE


SPHINX_ROLE = re.compile(r":\w+:`(~?)(?:([^`<]*?)\s*<)?([\w.]+)>?`")


def _plain_role(match: re.Match[str]) -> str:
    tilde, title, name = match.groups()
    return f"`{title or (name.rsplit('.', 1)[-1] if tilde else name)}`"


def public_api_table() -> str:
    """A Markdown table of ``feather_sparse.__all__``: name, summary, where it is documented."""
    import feather_sparse

    rows = ["| `fs.` name | what it is | documented in |", "|---|---|---|"]
    for name in feather_sparse.__all__:
        if name.startswith("_"):
            continue
        obj = getattr(feather_sparse, name)
        module = _home_module(name, obj)
        short = module.removeprefix(PACKAGE + ".")
        documented = (
            inspect.getdoc(obj) if inspect.isclass(obj) or inspect.isfunction(obj) else None
        )
        if documented:
            summary = SPHINX_ROLE.sub(_plain_role, documented.split("\n\n")[0].replace("\n", " "))
            where = f"[`{short}.{obj.__qualname__}`][{module}.{obj.__qualname__}]"
        else:
            summary = f"a `{type(obj).__name__}`"
            where = f"[`{short}`][{module}]" if module != PACKAGE else "the package"
        rows.append(f"| `{name}` | {summary} | {where} |")
    return "\n".join(rows) + "\n"


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def cli_help() -> str:
    """Markdown with the ``--help`` text of ``feather-sparse`` and each subcommand."""
    from feather_sparse import cli  # the checkout's own (on_config put src first on the path)

    with _columns(90):
        parser = cli.build_parser()
        blocks = [("feather-sparse --help", parser.format_help())]
        for action in parser._subparsers._group_actions if parser._subparsers else []:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    blocks.append((f"feather-sparse {name} --help", sub.format_help()))
    out = []
    for title, text in blocks:
        out.append(f"### `{title}`\n\n```text\n{text.rstrip()}\n```\n")
    return "\n".join(out)
