"""N:M groups of a convolution: flat (kernel innermost) or input channels per kernel position."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs
from _helpers import needs_safetensors
from feather_sparse import cli
from feather_sparse.export import load_sparse_state_dict, save_sparse
from feather_sparse.nm import NMBackbone, NMPattern, group_view

CHANNELS = {"name": "nm", "conv_order": "channels"}


def convnet(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(8, 16, 3, padding=1),  # kernel 3×3: the two orders differ
        nn.ReLU(),
        nn.Conv2d(16, 8, 1),  # 1×1: the same either way
        nn.ReLU(),
        nn.Identity(),
        nn.Flatten(),
        nn.Linear(8 * 5 * 5, 4),
    )


def channel_groups(w: torch.Tensor, m: int = 4) -> torch.Tensor:
    """Nonzeros per group of ``m`` consecutive input channels at each kernel position."""
    return (w.movedim(1, -1).reshape(-1, m) != 0).sum(1)


def train(model: nn.Module, pruner: fs.Pruner, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for i in range(steps):
        g = torch.Generator().manual_seed(100 + i)
        x, y = torch.randn(4, 8, 5, 5, generator=g), torch.randint(0, 4, (4,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        pruner.step()


@pytest.mark.parametrize("method", ["feather-nm", "sr-ste", "s-ste", "oneshot-nm"])
def test_channels_order_groups_input_channels_at_each_kernel_position(method: str) -> None:
    model = convnet()
    pruner = fs.make_pruner(
        model, method, pattern="2:4", conv_order="channels", total_steps=6, schedule="constant"
    )
    assert pruner.backbone.config()["conv_order"] == "channels"
    train(model, pruner, 6)
    pruner.finalize()
    counts = channel_groups(model[0].weight)
    assert (counts <= 2).all() and (counts == 2).float().mean() > 0.9
    flat = (group_view(model[0].weight, NMPattern(2, 4)) != 0).sum(1)
    assert (flat > 2).any()  # not N:M in the flattened order
    for layer in (model[2], model[6]):
        assert ((group_view(layer.weight, NMPattern(2, 4)) != 0).sum(1) <= 2).all()


def test_linear_and_pointwise_layers_are_the_same_in_both_orders() -> None:
    def trained(order: str) -> nn.Module:
        model = convnet()
        model[0] = nn.Identity()  # only 1×1 convs and Linear layers left
        model[2] = nn.Conv2d(8, 8, 1)
        pruner = fs.Pruner(model, pattern="2:4", backbone={"name": "nm", "conv_order": order})
        train(model, pruner, 3)
        pruner.finalize()
        return model

    flat, channels = trained("flat"), trained("channels")
    for a, b in zip(flat.state_dict().values(), channels.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_resume_is_bit_exact_and_the_setting_is_part_of_the_state() -> None:
    model = convnet()
    pruner = fs.Pruner(model, pattern="2:4", theta=0.5, backbone=CHANNELS)
    train(model, pruner, 2)
    saved = copy.deepcopy({"model": pruner.dense_state_dict(), "pruner": pruner.state_dict()})
    train(model, pruner, 2)  # a fresh optimizer each call: the resumed run below gets one too
    resumed = convnet(seed=1)
    resumed.load_state_dict(saved["model"])
    again = fs.Pruner.from_state_dict(resumed, saved["pruner"])
    assert again.backbone.conv_order == "channels"
    train(resumed, again, 2)
    for a, b in zip(model.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    flat = fs.Pruner(convnet(), pattern="2:4", theta=0.5)
    with pytest.raises(ValueError, match="saved with backbone"):
        flat.load_state_dict(saved["pruner"])


def test_a_conv_whose_channels_do_not_split_is_named() -> None:
    model = nn.Sequential(nn.Conv2d(6, 8, 3))  # 6·9 = 54 flat: not a multiple of 4 either
    with pytest.raises(ValueError, match=r"layer '0'.*6 input channels.*conv_order='flat'"):
        fs.Pruner(model, pattern="2:4", backbone=CHANNELS)
    model = nn.Sequential(nn.Conv2d(6, 8, (2, 2)))  # 24 flat entries split; 6 channels do not
    fs.Pruner(copy.deepcopy(model), pattern="2:4")
    with pytest.raises(ValueError, match="6 input channels"):
        fs.Pruner(model, pattern="2:4", backbone=CHANNELS)
    with pytest.raises(ValueError, match="conv_order must be one of flat, channels"):
        NMBackbone("2:4", conv_order="nhwc")


@needs_safetensors
def test_sparse_file_round_trip_is_bit_exact(tmp_path: Path) -> None:
    model = convnet()
    fs.Pruner(model, pattern="2:4", backbone=CHANNELS).finalize()
    save_sparse(model, tmp_path / "m.fsp")
    state, _ = load_sparse_state_dict(tmp_path / "m.fsp")
    for key, value in model.state_dict().items():
        assert torch.equal(state[key], value), key


@needs_safetensors
def test_training_config_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["train", "--dataset", "synthetic-mnist1d", "--model-kwargs", "{width = 0.25}"]
    args += ["--set", "data_options={train_size = 128, test_size = 64}", "--batch-size", "64"]
    args += ["--epochs", "1", "--no-tensorboard", "--no-progress", "--threads", "1"]
    assert cli.main([*args, "--conv-order", "channels", "--run-dir", str(tmp_path / "x")]) == 1
    assert "needs a pattern" in capsys.readouterr().err
    run = tmp_path / "run"
    assert (
        cli.main([*args, "--pattern", "2:4", "--conv-order", "channels", "--run-dir", str(run)])
        == 0
    )
    model = fs.load_sparse(run / "model.fsp")
    convs = [m for m in model.modules() if isinstance(m, nn.Conv1d) and m.weight.shape[1] % 4 == 0]
    assert convs and all((channel_groups(m.weight) <= 2).all() for m in convs)
