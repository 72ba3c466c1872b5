"""Messages a first-hour user meets: each says plainly what it means.

Found by following the README as a new user would (quick start, pruning an
own model, 2:4 with export, an interrupted run resumed, a bench smoke run).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn

import feather_sparse as fs
from _helpers import needs_safetensors
from feather_sparse.train.run_dir import _run_logging


def test_collapse_warning_quotes_layer_names(caplog: pytest.LogCaptureFixture) -> None:
    # A layer named "2" read "layer collapse: 2 pruned to 100 %", as if two layers were.
    first, last = nn.Linear(8, 16), nn.Linear(16, 4)
    model = nn.Sequential(first, nn.ReLU(), last)
    with torch.no_grad():
        first.weight.fill_(1.0)
        last.weight.fill_(1e-3)  # 64 weights, all below every weight of layer "0"
    caplog.set_level(logging.WARNING, logger="feather_sparse")
    pruner = fs.Pruner(model, sparsity=0.3, total_steps=1)
    pruner.finalize()
    assert "layer collapse: '2' pruned to 100 %" in caplog.text


def test_attention_warning_reads_for_one_module(caplog: pytest.LogCaptureFixture) -> None:
    # "1 nn.MultiheadAttention module ('attn') keep their ..." did not agree in number.
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    caplog.set_level(logging.WARNING, logger="feather_sparse")
    fs.Pruner(Block(), sparsity=0.5, total_steps=10)
    assert (
        "1 nn.MultiheadAttention module ('attn'): the Q/K/V projections stay dense (768 weights)"
        in caplog.text
    )


class _Tagger(nn.Module):
    """An LSTM tagger: its recurrent weights are 8 of every 9 weights."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 5)


def test_recurrent_weights_left_dense_are_named(caplog: pytest.LogCaptureFixture) -> None:
    # An LSTM's weight_ih_l*/weight_hh_l* are no layer's `weight`: sparsity=0.9 pruned
    # the 160 weights of the head alone and said nothing of the 14,336 left dense
    # (4 gates × 32 × (16 + 32) + 4 × 32 × (32 + 32)).
    caplog.set_level(logging.WARNING, logger="feather_sparse")
    fs.Pruner(_Tagger(), sparsity=0.9, total_steps=10)
    assert (
        "1 recurrent module (nn.LSTM 'lstm') keeps 14,336 weights dense: they are "
        "weight_ih_l*/weight_hh_l* parameters" in caplog.text
    )
    assert "exclude=['lstm'] silences this" in caplog.text
    caplog.clear()
    fs.Pruner(_Tagger(), sparsity=0.9, total_steps=10, exclude=["lstm"])
    assert "recurrent" not in caplog.text


def test_recurrent_model_alone_says_why_nothing_is_prunable() -> None:
    # "widen `include`" alone sent the user looking for a type to add: none selects them.
    # GRU(8, 8): 3 gates × 8 × (8 + 8) = 384 weights.
    with pytest.raises(
        ValueError,
        match=r"no prunable layer found in GRU.*1 recurrent module "
        r"\(nn\.GRU '\(the model\)'\) keeps 384 weights dense",
    ):
        fs.Pruner(nn.GRU(8, 8), sparsity=0.5, total_steps=10)


@needs_safetensors
def test_save_sparse_names_the_bound_it_compares_to(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # "0.885x the entropy bound" read as a file below what no coder can beat; the
    # bound is the pattern's entropy plus the raw values, as `inspect` says.
    model = nn.Linear(64, 64)
    with torch.no_grad():
        model.weight[:, 8:] = 0.0
    caplog.set_level(logging.INFO, logger="feather_sparse")
    fs.save_sparse(model, tmp_path / "m.fsp")
    assert "the bound H(d)*N + raw values)" in caplog.text
    assert "entropy bound" not in caplog.text


def test_interrupted_run_is_logged_as_stopped(tmp_path: Path) -> None:
    # Ctrl-C left "ERROR ... run failed: TrainingInterrupted(...)" in train.log.
    with pytest.raises(KeyboardInterrupt), _run_logging(tmp_path):
        raise KeyboardInterrupt
    log = (tmp_path / "train.log").read_text(encoding="utf-8")
    assert "run stopped: KeyboardInterrupt()" in log
    assert "run failed" not in log


@needs_safetensors
def test_inspect_of_an_own_model_says_how_to_load_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # "model: unknown model" left open whether the file was usable at all.
    from feather_sparse import cli

    fs.save_sparse(nn.Linear(8, 8), tmp_path / "m.fsp")
    assert cli.main(["inspect", str(tmp_path / "m.fsp")]) == 0
    out = capsys.readouterr().out
    assert "model: no model spec (load it into your model: fs.load_sparse(path, model))" in out
