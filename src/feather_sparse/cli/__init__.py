"""The ``feather-sparse`` command-line tool: the only layer that parses arguments.

One module per command family (``train``, ``export``/``inspect``, ``bench``),
each with two functions::

    def add_arguments(command: str, parser: argparse.ArgumentParser) -> None
    def run(command: str, args: argparse.Namespace) -> int

Library modules never import :mod:`argparse`; this package turns arguments into
their typed configs and calls them.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType

from feather_sparse._version import __version__
from feather_sparse.cli import bench as _bench
from feather_sparse.cli import export as _export
from feather_sparse.cli import train as _train

# command -> (module implementing it, one-line help)
COMMANDS: dict[str, tuple[ModuleType, str]] = {
    "train": (_train, "train a model with Feather sparsity (or dense)"),
    "export": (_export, "write a compressed sparse checkpoint (and ONNX) of a run"),
    "inspect": (_export, "per-tensor table of a sparse checkpoint"),
    "bench": (_bench, "reproduce the paper's tables and figures"),
}


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="feather-sparse",
        description="Feather sparse training for PyTorch (BMVC 2023).",
    )
    parser.add_argument("--version", action="version", version=f"feather-sparse {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # also after the command (`feather-sparse train -v`); main adds the two counts
        p.add_argument(
            "-v",
            "--verbose",
            action="count",
            default=0,
            dest="command_verbose",
            help="more log output (-vv for debug; also accepted before the command)",
        )
        module.add_arguments(name, p)
    return parser


#: The shell's code for a process ended by SIGPIPE (128 + 13), as ``yes | head`` gives.
BROKEN_PIPE_EXIT_CODE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code.

    Output piped into a reader that stops early (``feather-sparse inspect FILE |
    head``) ends the command quietly with :data:`BROKEN_PIPE_EXIT_CODE`, as
    other Unix tools end, instead of an error message.

    Args:
        argv: the command-line arguments after the program name (``None``:
            ``sys.argv[1:]``).
    """
    try:
        try:
            return _main(argv)
        finally:
            # Write what is buffered now, so that a reader gone away shows up
            # here and not as a traceback at the interpreter's exit.
            sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()
        return BROKEN_PIPE_EXIT_CODE


def _stdout_to_devnull() -> None:
    """Point the process's stdout at the null device (Python's "Note on SIGPIPE").

    The interpreter flushes ``sys.stdout`` once more at exit; into the closed
    pipe that would fail again and print a warning.
    """
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced or closed (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.verbose += getattr(args, "command_verbose", 0)
    if args.command is None:
        parser.print_help()
        return 2
    run: Callable[[str, argparse.Namespace], int] = COMMANDS[args.command][0].run
    try:
        with _root_logging(logging.WARNING - 10 * min(args.verbose, 2)):
            return int(run(args.command, args))
    except BrokenPipeError:
        raise  # the reader of stdout went away: no error of the command (see main)
    except (ValueError, OSError, RuntimeError, ImportError) as err:
        # Bad input, a damaged file (IntegrityError), a full disk or read-only folder
        # (DiskFullError, NotWritableError), a missing path, a missing optional
        # dependency (its message names the extra to install): one line, not a
        # traceback, for every command; -vv shows the trace.
        if args.verbose >= 2:
            raise
        print(f"feather-sparse {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 1


@contextlib.contextmanager
def _root_logging(level: int) -> Iterator[None]:
    """Log records of ``level`` and above to stderr for the block, as ``logging.basicConfig``
    would, where the root logger has no handler yet; then take the handler and level back.

    ``main()`` called again in the same process (a notebook, a script running several
    commands) gets the verbosity it asks for each time: ``basicConfig`` acts only once
    per process, so the first call's level held for every later one (a later ``-v``
    showed nothing), and the root logger went on printing other libraries' records.
    A root logger configured by the caller is left as it is.
    """
    root = logging.getLogger()
    if root.handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    previous = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)


def _one_line(err: BaseException) -> str:
    """What ``err`` says, without the ``[Errno N]`` prefix of an ``OSError``."""
    if isinstance(err, OSError) and err.strerror:
        text = err.strerror
        return f"{text}: {err.filename}" if err.filename is not None else text
    return str(err)


if __name__ == "__main__":
    raise SystemExit(main())
