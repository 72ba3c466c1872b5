"""How the size of a ``.fsp`` is told against the dense bytes: smaller, or larger."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn

import feather_sparse as fs
from _guards import guard
from _helpers import needs_safetensors
from feather_sparse.cli import main
from feather_sparse.export.header import smaller_or_larger


def test_smaller_or_larger_names_the_direction() -> None:
    assert smaller_or_larger(900, 100) == "9.00x smaller"
    assert smaller_or_larger(100, 192, digits=1) == "1.9x larger"
    assert smaller_or_larger(100, 100) == "1.00x smaller"


@guard(
    "a `.fsp` larger than its dense bytes (a small dense model: the header and records "
    "outweigh the weights)",
    "`inspect`, `export` and the save log say `N.NNx larger`; they said `0.52x smaller`",
)
@needs_safetensors
def test_a_file_larger_than_dense_is_called_larger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    with caplog.at_level(logging.INFO, logger="feather_sparse.export.fsp"):
        info = fs.save_sparse(model, tmp_path / "small.fsp")
    assert info.file_bytes > info.dense_bytes
    assert "x larger than dense" in caplog.text and "smaller" not in caplog.text
    assert main(["inspect", str(tmp_path / "small.fsp")]) == 0
    out = capsys.readouterr().out
    factor = info.file_bytes / info.dense_bytes
    assert f"({factor:.2f}x larger)" in out and "smaller" not in out
