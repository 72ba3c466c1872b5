"""The ``bench`` command family of the CLI: arguments in, library call out."""

from __future__ import annotations

import argparse

from feather_sparse import experiments as _impl


def add_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` command's arguments to *parser*."""
    _impl.add_cli_arguments(command, parser)


def run(command: str, args: argparse.Namespace) -> int:
    """Run the command; returns the process exit code."""
    return _impl.run_cli(command, args)
