"""The command line's one error path: every command turns a failure into one line and exit 1."""

from __future__ import annotations

import argparse
import errno
import re
import subprocess
import sys
from pathlib import Path

import pytest
from torch import nn

from _guards import guard
from _helpers import needs_safetensors
from feather_sparse import cli, save_sparse
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


@guard(
    "`feather-sparse inspect FILE` piped into `head`: the reader of stdout closes the pipe early",
    "quiet exit 141 (128 + SIGPIPE) as Unix tools end, for every command; no error line",
)
@needs_safetensors
def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path) -> None:
    """A real pipe: read the first line of ``inspect``'s table, then close it, as ``head
    -1`` does; the table is longer than a pipe holds, so the command is still writing."""
    path = tmp_path / "many.fsp"
    save_sparse(nn.Sequential(*(nn.Linear(2, 2) for _ in range(1500))), path)  # 3000 rows
    proc = subprocess.Popen(
        [sys.executable, "-m", "feather_sparse", "inspect", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert first.split()[:2] == [b"name", b"shape"]
    assert (proc.wait(timeout=120), err) == (141, "")  # what `yes | head -1` gives


@pytest.mark.parametrize("command", sorted(ARGV))
def test_every_command_ends_quietly_when_its_reader_is_gone(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def write_to_a_closed_pipe(name: str, args: argparse.Namespace) -> int:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr(cli.COMMANDS[command][0], "run", write_to_a_closed_pipe)
    for argv in (ARGV[command], ["-vv", *ARGV[command]]):
        assert (cli.main(argv), capsys.readouterr().err) == (141, "")


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
