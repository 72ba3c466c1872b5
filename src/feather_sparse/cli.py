"""The ``feather-sparse`` command-line tool.

Each subcommand lives in the module that implements it. A module named in
``COMMANDS`` provides two functions::

    def add_cli_arguments(command: str, parser: argparse.ArgumentParser) -> None
    def run_cli(command: str, args: argparse.Namespace) -> int

so this file only dispatches. Modules are imported when the parser is built;
nothing runs at import time of this module.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from feather_sparse._version import __version__

# command -> (module implementing it, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("feather_sparse.train", "train a model with Feather sparsity (or dense)"),
    "export": ("feather_sparse.export", "write a compressed sparse checkpoint (and ONNX) of a run"),
    "inspect": ("feather_sparse.export", "per-tensor table of a sparse checkpoint"),
    "bench": ("feather_sparse.experiments", "reproduce the paper's tables and figures"),
}


def _available_commands() -> dict[str, tuple[str, str]]:
    """The commands whose modules import (optional modules may be absent)."""
    out = {}
    for name, (module, help_text) in COMMANDS.items():
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:  # a module not written yet / optional
            if err.name is not None and err.name.startswith("feather_sparse"):
                continue
            raise
        out[name] = (module, help_text)
    return out


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with one subparser per available command."""
    parser = argparse.ArgumentParser(
        prog="feather-sparse",
        description="Feather sparse training for PyTorch (BMVC 2023).",
    )
    parser.add_argument("--version", action="version", version=f"feather-sparse {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in _available_commands().items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_cli_arguments(name, p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.run_cli(args.command, args))
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        # Bad input gets one clear line, not a traceback; -vv shows the trace.
        if args.verbose >= 2:
            raise
        print(f"feather-sparse {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
