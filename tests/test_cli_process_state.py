"""What ``cli.main`` changes in the process is given back when it returns: a notebook or a
script that runs several commands gets the verbosity each one asks for."""

from __future__ import annotations

import argparse
import logging

import pytest

from feather_sparse import cli


def test_each_call_logs_at_its_own_verbosity(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # a plain process's (pytest adds its own)
    level = root.level

    def run(command: str, args: argparse.Namespace) -> int:
        logging.getLogger("feather_sparse.cli.probe").info("a progress line")
        return 0

    monkeypatch.setattr(cli._train, "run", run)
    assert cli.main(["train"]) == 0
    assert "a progress line" not in capsys.readouterr().err
    assert cli.main(["-v", "train"]) == 0  # the first call's level held here
    assert "INFO feather_sparse.cli.probe: a progress line" in capsys.readouterr().err
    assert (root.handlers, root.level) == ([], level)
