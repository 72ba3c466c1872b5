"""Functions that run a model in eval mode for a moment give every module its own mode back.

The usual fine-tuning setup trains a model whose BatchNorm is frozen in eval
mode; ``model.train(was_training)`` after an export or a FLOP count would
switch that BatchNorm back to training (its running statistics then drift),
and an MC-dropout model (root in eval, dropout training) would lose its
dropout. Each public function that runs the model must leave every module's
``training`` flag as it found it, also when it raises.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from _guards import guard
from feather_sparse._modes import evaluating
from feather_sparse.analysis import count_flops, reference_flops
from feather_sparse.export.inference import to_sparse_inference
from feather_sparse.export.onnx import check_example_input, export_onnx, verify_onnx
from feather_sparse.train.fit import check_model_takes


class _Net(nn.Module):
    """Linear, BatchNorm, dropout, Linear; ``fail`` makes its forward raise."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(8, 3)
        self.fail = False
        self.seen: list[list[bool]] = []  # every module's mode at each forward

    def forward(self, x: Tensor) -> Tensor:
        self.seen.append([m.training for m in self.modules()])
        if self.fail:
            raise RuntimeError("the forward fails")
        return self.fc2(self.drop(torch.relu(self.bn(self.fc1(x)))))


def _frozen_batchnorm() -> _Net:
    """The fine-tuning setup: the model trains, its BatchNorm is frozen in eval mode."""
    net = _Net().train()
    net.bn.eval()
    return net


def _mc_dropout() -> _Net:
    """The other mix: the model in eval mode, its dropout kept sampling (MC dropout)."""
    net = _Net().eval()
    net.drop.train()
    return net


MIXES = {"frozen-batchnorm": _frozen_batchnorm, "mc-dropout": _mc_dropout}


def _modes(net: nn.Module) -> dict[str, bool]:
    return {name or "<root>": m.training for name, m in net.named_modules()}


def _count_flops(net: nn.Module) -> object:
    return count_flops(net, (8,))


def _reference_flops(net: nn.Module) -> object:
    return reference_flops(net, (8,))


def _check_example_input(net: nn.Module) -> object:
    check_example_input(net, torch.randn(2, 8))
    return None


def _check_model_takes(net: nn.Module) -> object:
    check_model_takes(net, model_name="net", dataset="synthetic-mnist1d", shape=(8,), num_classes=3)
    return None


def _to_sparse_inference(net: nn.Module) -> object:
    return to_sparse_inference(
        net, min_sparsity=0.0, min_weights=0, example_input=torch.randn(4, 8), inplace=True
    )


RUNNERS: dict[str, Callable[[nn.Module], object]] = {
    "count_flops": _count_flops,
    "reference_flops": _reference_flops,
    "check_example_input": _check_example_input,
    "check_model_takes": _check_model_takes,
    "to_sparse_inference": _to_sparse_inference,
}


@guard(
    "`count_flops`, `reference_flops`, `check_example_input`, `check_model_takes` or "
    "`to_sparse_inference(example_input=...)` of a model whose submodules are in another "
    "mode than the root (a frozen BatchNorm, MC dropout)",
    "the forward runs in eval mode; every module's own train/eval mode is restored",
)
@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_each_module_keeps_its_mode(runner: str, mix: str) -> None:
    net = MIXES[mix]()
    before = _modes(net)
    RUNNERS[runner](net)
    assert _modes(net) == before
    assert net.seen and not any(any(seen) for seen in net.seen)  # all in eval inside


@guard(
    "a model whose forward raises inside `count_flops`, `reference_flops`, "
    "`check_example_input` or `check_model_takes` (submodules in another mode than the root)",
    "the error propagates (or is turned into a `ValueError`); every module's own mode is restored",
)
@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("runner", sorted(set(RUNNERS) - {"to_sparse_inference"}))
def test_each_module_keeps_its_mode_when_the_forward_raises(runner: str, mix: str) -> None:
    net = MIXES[mix]()
    net.fail = True
    before = _modes(net)
    with pytest.raises((RuntimeError, ValueError), match="the forward fails"):
        RUNNERS[runner](net)
    assert _modes(net) == before


@guard(
    "`export_onnx` / `verify_onnx` of a model whose submodules are in another mode than the "
    "root (a frozen BatchNorm while fine-tuning), also when the export fails",
    "exported in eval mode; every module's own train/eval mode is restored",
)
@pytest.mark.parametrize("mix", sorted(MIXES))
def test_onnx_export_keeps_each_module_mode(
    mix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnx")
    net = MIXES[mix]()
    before = _modes(net)
    path = tmp_path / "net.onnx"
    export_onnx(net, path, torch.randn(2, 8))
    assert _modes(net) == before
    assert not any(net.seen[0])  # check_example_input's forward: all in eval
    if mix == "frozen-batchnorm":  # (MC dropout's output is random: nothing to compare)
        pytest.importorskip("onnxruntime")
        assert verify_onnx(net, path, torch.randn(5, 8)) < 1e-4
        assert _modes(net) == before
    # ... and when it fails: in the model's forward, in the exporter, in verify_onnx
    with pytest.raises(ValueError, match="does not run on an input of shape"):
        export_onnx(net, tmp_path / "wrong.onnx", torch.randn(2, 5))
    assert _modes(net) == before

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the exporter fails")

    monkeypatch.setattr(torch.onnx, "export", fail)
    with pytest.raises(RuntimeError, match="the exporter fails"):
        export_onnx(net, tmp_path / "failed.onnx", torch.randn(2, 8))
    assert _modes(net) == before
    assert not (tmp_path / "failed.onnx").exists()
    pytest.importorskip("onnxruntime")
    net.fail = True
    with pytest.raises(RuntimeError, match="the forward fails"):
        verify_onnx(net, path, torch.randn(5, 8))
    assert _modes(net) == before


class _KeepsBatchNormFrozen(nn.Module):
    """A module whose ``train()`` keeps its BatchNorm in eval mode (a common pattern)."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(4)

    def train(self, mode: bool = True) -> _KeepsBatchNormFrozen:
        super().train(mode)
        self.bn.eval()
        return self


def test_evaluating_sets_every_flag_back_exactly_also_on_an_error() -> None:
    outer = nn.Sequential(nn.Linear(4, 4), _KeepsBatchNormFrozen(), nn.Dropout())
    outer.train()
    outer[1].bn.train()  # set by hand, against what its train() would do: kept as it is
    outer[2].eval()
    before = _modes(outer)
    with evaluating(outer) as model:
        assert model is outer and not any(_modes(outer).values())
    assert _modes(outer) == before
    with pytest.raises(KeyError), evaluating(outer):
        raise KeyError("inside")
    assert _modes(outer) == before
