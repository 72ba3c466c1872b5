"""Tests that kill the surviving mutants of the ONNX export and of what `export` reads.

See docs/mutation-audit.md, "The ONNX export and what `export` reads": each test
asserts the documented contract (the docstrings of ``export/onnx.py`` and
``export/run.py``) or an independent computation, never the code's current output.
"""

from __future__ import annotations

import copy
import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from _helpers import needs_safetensors, training_checkpoint
from feather_sparse import Pruner, export
from feather_sparse.export import (
    export_onnx,
    load_export_source,
    save_sparse,
    verify_onnx,
)
from feather_sparse.export.onnx import check_example_input, onnx_opset
from feather_sparse.export.run import resolve_source
from feather_sparse.integrity import DiskFullError
from feather_sparse.models import create_model

pytestmark = pytest.mark.usefixtures("one_thread")


def small_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(40, 16), nn.ReLU(), nn.Linear(16, 4)).eval()


def legacy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exporter that runs where onnxscript is not installed."""
    monkeypatch.setattr(export.onnx, "_onnx_exporter", lambda: ("legacy", 20))


# ---------------------------------------------------------------------------
# the opset range
# ---------------------------------------------------------------------------


def test_the_oldest_opset_each_exporter_writes_is_accepted_and_one_older_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The docstring's range: the torch.export-based exporter from 18, the legacy one from 7."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    assert onnx_opset(18) == 18
    with pytest.raises(ValueError, match="opset 17 is older than this setup exports"):
        onnx_opset(17)
    legacy(monkeypatch)
    assert onnx_opset(7) == 7
    with pytest.raises(ValueError, match="opset 6 is older than this setup exports"):
        onnx_opset(6)


def test_the_default_opset_is_the_newest_both_onnx_and_torch_export_write() -> None:
    """With onnxscript, the cap is torch's ONNX_MAX_OPSET (23 in torch 2.13), not the legacy 20."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    from torch.onnx import _constants

    expected = min(onnx.defs.onnx_opset_version(), _constants.ONNX_MAX_OPSET)
    assert expected > _constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET  # else nothing is checked
    assert onnx_opset() == expected


# ---------------------------------------------------------------------------
# the example input and the size checks
# ---------------------------------------------------------------------------


def test_an_index_error_in_the_forward_is_the_one_line_error() -> None:
    """An embedding given an index out of range raises IndexError: still "does not run on"."""
    with pytest.raises(ValueError, match=r"does not run on an input of shape \(1, 2\)"):
        check_example_input(nn.Embedding(4, 2), torch.tensor([[7, 1]]))


def meta_linear(in_features: int, out_features: int) -> nn.Linear:
    return nn.Linear(in_features, out_features, bias=False, device="meta")


def test_the_legacy_exporter_refuses_exactly_2_gib_of_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2**29 float32 weights are 2**31 bytes: more than one protobuf message holds."""
    pytest.importorskip("onnx")
    legacy(monkeypatch)
    model = meta_linear(2**15, 2**14)  # on "meta": no memory
    with pytest.raises(ValueError, match=r"\(2\.0 GiB\) do not fit in one ONNX file"):
        export_onnx(model, tmp_path / "big.onnx", torch.randn(2, 2**15))
    assert list(tmp_path.iterdir()) == []


class TiedNoForward(nn.Module):
    """Two layers sharing one weight; its forward fails (the size check comes before it)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.first, self.second = meta_linear(features, features), meta_linear(features, features)
        self.second.weight = self.first.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("no forward here")


def test_a_tied_weight_counts_once_towards_the_2_gib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One 1 GiB weight used by two layers is 1 GiB to store: not refused for its size, so
    the example-input check that comes after it is the one that fails."""
    pytest.importorskip("onnx")
    legacy(monkeypatch)
    model = TiedNoForward(2**14)  # 2**28 float32 weights: 1 GiB, on "meta"
    with pytest.raises(ValueError, match="does not run on an input of shape"):
        export_onnx(model, tmp_path / "tied.onnx", torch.randn(2, 2**14))
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------
# the modes
# ---------------------------------------------------------------------------


def test_the_legacy_exporter_keeps_a_frozen_batchnorm_frozen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "every module's own mode is restored": the legacy exporter, left to itself, sets
    eval mode and then ``train(True)`` on the root, which unfreezes the BatchNorm."""
    pytest.importorskip("onnx")
    legacy(monkeypatch)
    net = nn.Sequential(nn.Linear(8, 6), nn.BatchNorm1d(6), nn.Dropout(0.5), nn.Linear(6, 3))
    net.train()
    net[1].eval()  # fine-tuning with frozen statistics
    before = [m.training for m in net.modules()]
    assert before == [True, True, False, True, True]
    export_onnx(net, tmp_path / "net.onnx", torch.randn(2, 8))
    assert [m.training for m in net.modules()] == before


# ---------------------------------------------------------------------------
# the large-model path
# ---------------------------------------------------------------------------


def test_a_failed_large_model_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnxscript")
    monkeypatch.setattr(export.onnx, "_large_model_bytes", lambda: 0)  # every model is large

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(DiskFullError, match=r"model\.onnx"):
        export_onnx(small_net(), tmp_path / "model.onnx", torch.randn(2, 1, 40))
    # the weights are written first (and may have landed); the graph did not, nor any temp file
    assert {p.name for p in tmp_path.iterdir()} <= {"model.onnx.data"}


def test_a_model_of_exactly_the_threshold_is_written_in_one_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two files only *above* the threshold (as torch's own exporter decides): a model whose
    weights are exactly that many bytes is one file."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    one = tmp_path / "one.onnx"
    export_onnx(small_net(), one, torch.randn(2, 1, 40))
    stored = sum(
        len(onnx.numpy_helper.to_array(i).tobytes()) for i in onnx.load(str(one)).graph.initializer
    )
    monkeypatch.setattr(export.onnx, "_large_model_bytes", lambda: stored)
    export_onnx(small_net(), tmp_path / "model.onnx", torch.randn(2, 1, 40))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "one.onnx"]


# ---------------------------------------------------------------------------
# verify_onnx
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("shift", [0.5, -0.5])
def test_verify_onnx_returns_the_largest_absolute_difference(shift: float, tmp_path: Path) -> None:
    """The file computes ``net``; a model whose output is ``net``'s plus ``shift`` differs
    from it by ``|shift|`` everywhere, whichever the sign."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    net = small_net()
    path = tmp_path / "net.onnx"
    export_onnx(net, path, torch.randn(2, 1, 40))
    shifted = copy.deepcopy(net)
    head = shifted[3]
    assert isinstance(head, nn.Linear)
    with torch.no_grad():
        head.bias.add_(shift)
    assert verify_onnx(shifted, path, torch.randn(3, 1, 40)) == pytest.approx(0.5, abs=1e-5)


def test_verify_onnx_refuses_outputs_of_another_shape(tmp_path: Path) -> None:
    """Same number of values, another shape: refused, not broadcast into a comparison."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    net = small_net()
    path = tmp_path / "net.onnx"
    export_onnx(net, path, torch.randn(2, 1, 40))
    reshaped = nn.Sequential(net, nn.Unflatten(1, (4, 1)))
    with pytest.raises(ValueError, match=r"ONNX output shape \(3, 4\) != \(3, 4, 1\)"):
        verify_onnx(reshaped, path, torch.randn(3, 1, 40))


# ---------------------------------------------------------------------------
# run.py: the run folder, finished or not, the checks
# ---------------------------------------------------------------------------


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return create_model("mnist1d_cnn", width=0.25)


def trained(model: nn.Module, steps: int, total: int, **kwargs: Any) -> Pruner:
    pruner = Pruner(model, total_steps=total, **kwargs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        loss = model(torch.randn(8, 1, 40)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        pruner.step()
    return pruner


def test_a_run_folder_with_only_its_previous_checkpoint_exports_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    model = cnn()
    prev = training_checkpoint(run / "checkpoints" / "prev.pt", model, None)
    assert resolve_source(run) == prev
    source = load_export_source(run)
    assert source.path == prev
    assert source.warning is not None and "last.pt is missing" in source.warning


def test_a_pruner_at_its_last_step_is_a_finished_run_without_epochs(tmp_path: Path) -> None:
    """No epoch count: step == total_steps is finished, baked at the target."""
    model = cnn()
    pruner = trained(model, 4, 4, sparsity=0.8)
    source = load_export_source(training_checkpoint(tmp_path / "last.pt", model, pruner))
    assert source.finished and source.progress == "step 4 of 4"
    assert source.baked == "target" and source.sparsity == pytest.approx(0.8, abs=1e-3)


def test_a_finished_run_exported_at_another_sparsity_warns(tmp_path: Path) -> None:
    model = cnn()
    pruner = trained(model, 4, 4, sparsity=0.8)
    path = training_checkpoint(tmp_path / "last.pt", model, pruner, epoch=5, config={"epochs": 5})
    source = load_export_source(path, sparsity=0.5)
    assert source.finished and source.baked == "requested"
    assert source.warning is not None and "not trained for it" in source.warning
    assert "target 0.8" in source.warning
    assert load_export_source(path, sparsity=0.8).warning is None  # its target: no warning


def test_a_checkpoint_missing_a_weight_is_refused(tmp_path: Path) -> None:
    model = cnn()
    path = training_checkpoint(tmp_path / "last.pt", model, None)
    ckpt = torch.load(path, weights_only=True)
    name = next(iter(ckpt["model"]))
    del ckpt["model"][name]
    torch.save(ckpt, path)
    with pytest.raises(ValueError, match="do not fit its model spec"):
        load_export_source(path)


@needs_safetensors
def test_a_config_that_is_not_json_is_left_out_of_the_metadata(tmp_path: Path) -> None:
    """metadata: "JSON-able facts to store in the .fsp header"."""
    model = cnn()
    path = training_checkpoint(tmp_path / "last.pt", model, None, config={"note": b"\x00bytes"})
    source = load_export_source(path)
    assert source.metadata["config"] is None
    json.dumps(source.metadata)
    save_sparse(source.model, tmp_path / "m.fsp", metadata=source.metadata)


def test_an_nm_run_accepts_its_pattern_sparsity_computed_as_1_minus_n_over_m(
    tmp_path: Path,
) -> None:
    """1 - 4/5 is 0.19999999999999996 in floats, (5 - 4)/5 is 0.2: both are the 4:5 pattern's."""
    torch.manual_seed(0)
    model = create_model("mnist1d_mlp")
    pruner = Pruner(model, pattern="4:5", exclude=["features.4", "fc"])
    path = training_checkpoint(tmp_path / "last.pt", model, pruner)
    assert 1 - 4 / 5 != 0.2
    source = load_export_source(path, sparsity=1 - 4 / 5)
    assert source.baked == "requested" and source.sparsity == pytest.approx(0.2, abs=1e-6)
