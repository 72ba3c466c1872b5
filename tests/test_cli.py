"""The command line's one error path: every command turns a failure into one line and exit 1."""

from __future__ import annotations

import argparse
import errno
import re

import pytest

from feather_sparse import cli
from feather_sparse.integrity import DiskFullError, IntegrityError
from feather_sparse.methods import METHODS
from feather_sparse.pruner_config import REGISTRIES

# The smallest command line each command parses.
ARGV = {
    "train": ["train"],
    "export": ["export", "run", "-o", "m.fsp"],
    "inspect": ["inspect", "m.fsp"],
    "bench": ["bench", "claims"],
}
FAILURES = [
    (IsADirectoryError(errno.EISDIR, "out is a directory"), "out is a directory"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "x.pt"), "directory: x.pt"),
    (DiskFullError("the disk is full while writing m.fsp"), "the disk is full"),
    (IntegrityError("last.pt: its SHA-256 does not match"), "SHA-256 does not match"),
    (ValueError("--sparsity must be in [0, 1)"), "--sparsity must be"),
]


def test_every_command_is_covered() -> None:
    assert set(ARGV) == set(cli.COMMANDS)


@pytest.mark.parametrize("command", sorted(ARGV))
@pytest.mark.parametrize(("error", "expected"), FAILURES)
def test_errors_are_one_line_and_exit_1(
    command: str,
    error: Exception,
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def fail(name: str, args: argparse.Namespace) -> int:
        raise error

    monkeypatch.setattr(cli.COMMANDS[command][0], "run", fail)
    assert cli.main(ARGV[command]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"feather-sparse {command}: error: ")
    assert expected in err[0] and "Errno" not in err[0]
    name, *rest = ARGV[command]
    for argv in (["-vv", name, *rest], [name, "-vv", *rest], ["-v", name, "-v", *rest]):
        with pytest.raises(type(error)):  # -vv, before or after the command: the traceback
            cli.main(argv)


def test_train_help_lists_every_registered_choice(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The choices in ``train --help`` come from the registries, so they cannot drift."""
    monkeypatch.setenv("COLUMNS", "10000")  # argparse would wrap inside hyphenated names
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for flag, registry in [("--method", METHODS), *((f"--{k}", r) for k, r in REGISTRIES.items())]:
        shown = re.search(rf"{flag} [A-Z]+ [a-z ]+: ([\w+.-]+(?:, [\w+.-]+)*)", text)
        assert shown is not None, flag
        assert shown.group(1).split(", ") == registry.names(), flag
