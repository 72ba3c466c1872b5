"""Tests that kill the surviving mutants of the model architectures (docs/mutation-audit.md).

Each architecture is checked against a forward pass written here from the
papers and the module docstrings (functional ops on the model's own
parameters, eval mode, with random batch-norm statistics so that every
normalisation counts), against layer shapes and strides written from the
papers' tables, and against parameter counts worked out from the layer
arithmetic. None of the expected values is taken from the code.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from feather_sparse.models import create_model
from feather_sparse.models.densenet import DenseNet
from feather_sparse.models.mixer import MNIST1DMixer
from feather_sparse.models.mobilenet import MobileNetV1
from feather_sparse.models.resnet50 import Bottleneck, ResNet
from feather_sparse.models.resnet_cifar import CifarResNet
from feather_sparse.models.small import MNIST1DCNN, MNIST1DMLP

pytestmark = pytest.mark.usefixtures("one_thread")


def _randomise_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Eval mode, every batch norm with random statistics and affine parameters."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                c = m.num_features
                m.running_mean.copy_(torch.randn(c, generator=gen) * 0.3)
                m.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(c, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(c, generator=gen) * 0.3)
    return model.eval()


def _bn(x: torch.Tensor, m: nn.Module, dim: int = 1) -> torch.Tensor:
    """Inference batch norm written out, along ``dim``."""
    shape = [1] * x.dim()
    shape[dim] = -1

    def v(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(shape)

    return (x - v(m.running_mean)) / torch.sqrt(v(m.running_var) + m.eps) * v(m.weight) + v(m.bias)


def _fc(x: torch.Tensor, m: nn.Linear) -> torch.Tensor:
    return x @ m.weight.T + (m.bias if m.bias is not None else 0)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# --- ResNet for CIFAR (He et al. §4.2; option B shortcuts, post-activation blocks)


def _ref_cifar_resnet(model: CifarResNet, x: torch.Tensor) -> torch.Tensor:
    h = F.relu(_bn(F.conv2d(x, model.conv1.weight, padding=1), model.bn1))
    for s, stage in enumerate((model.layer1, model.layer2, model.layer3)):
        for b, blk in enumerate(stage):
            stride = 2 if s > 0 and b == 0 else 1  # stages at strides 1, 2, 2
            out = F.relu(_bn(F.conv2d(h, blk.conv1.weight, stride=stride, padding=1), blk.bn1))
            out = _bn(F.conv2d(out, blk.conv2.weight, padding=1), blk.bn2)
            if stride == 1 and h.shape[1] == out.shape[1]:
                short = h
            else:
                proj = blk.shortcut
                short = _bn(F.conv2d(h, proj[0].weight, stride=stride), proj[1])
            h = F.relu(out + short)
    return _fc(h.mean(dim=(2, 3)), model.fc)


def test_cifar_resnet_forward_is_he_et_al_option_b() -> None:
    torch.manual_seed(0)
    model = _randomise_norms(CifarResNet(depth=20, num_classes=5, width=1))
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        _close(model(x), _ref_cifar_resnet(model, x))


def test_cifar_resnet_downsamples_at_the_first_conv_of_stages_two_and_three() -> None:
    model = create_model("resnet20")
    feats = {}
    for name in ("layer1", "layer2", "layer3"):
        getattr(model, name).register_forward_hook(
            lambda _m, _i, out, name=name: feats.__setitem__(name, out.shape)
        )
    with torch.no_grad():
        model.eval()(torch.randn(1, 3, 32, 32))
    assert feats == {
        "layer1": (1, 32, 32, 32),
        "layer2": (1, 64, 16, 16),
        "layer3": (1, 128, 8, 8),
    }
    for stage in (model.layer2, model.layer3):
        assert stage[0].conv1.stride == (2, 2) and stage[0].conv2.stride == (1, 1)


# --- ResNet-50 (v1.5: the stride on the 3x3 conv)


def _ref_bottleneck(blk: Bottleneck, h: torch.Tensor, stride: int) -> torch.Tensor:
    out = F.relu(_bn(F.conv2d(h, blk.conv1.weight), blk.bn1))
    out = F.relu(_bn(F.conv2d(out, blk.conv2.weight, stride=stride, padding=1), blk.bn2))
    out = _bn(F.conv2d(out, blk.conv3.weight), blk.bn3)
    if stride == 1 and h.shape[1] == out.shape[1]:
        short = h
    else:
        short = _bn(F.conv2d(h, blk.downsample[0].weight, stride=stride), blk.downsample[1])
    return F.relu(out + short)


def test_bottleneck_resnet_forward_is_resnet_v1_5() -> None:
    torch.manual_seed(0)
    model = _randomise_norms(ResNet((1, 1, 2, 1), num_classes=5))
    x = torch.randn(1, 3, 64, 64)
    h = F.relu(_bn(F.conv2d(x, model.conv1.weight, stride=2, padding=3), model.bn1))
    h = F.max_pool2d(h, 3, stride=2, padding=1)  # 64 -> 32 -> 16
    with torch.no_grad():
        for stage, stride in zip(
            (model.layer1, model.layer2, model.layer3, model.layer4), (1, 2, 2, 2), strict=True
        ):
            for b, blk in enumerate(stage):
                h = _ref_bottleneck(blk, h, stride if b == 0 else 1)
        assert h.shape == (1, 2048, 2, 2)  # 16 / 8
        _close(model(x), _fc(h.mean(dim=(2, 3)), model.fc))


def test_resnet50_count_and_where_it_downsamples() -> None:
    model = create_model("resnet50")
    # torchvision's resnet50: 25,557,032 parameters at 1000 classes
    assert sum(p.numel() for p in model.parameters()) == 25_557_032
    for stage in (model.layer2, model.layer3, model.layer4):
        first = stage[0]
        assert first.conv1.stride == (1, 1) and first.conv2.stride == (2, 2)
        assert first.downsample[0].stride == (2, 2)


def test_resnet50_zero_init_residual_zeroes_every_last_bn_only() -> None:
    model = create_model("resnet50", num_classes=3, zero_init_residual=True)
    blocks = [m for m in model.modules() if isinstance(m, Bottleneck)]
    assert len(blocks) == 3 + 4 + 6 + 3
    for blk in blocks:
        assert torch.all(blk.bn3.weight == 0)
        assert torch.all(blk.bn1.weight == 1) and torch.all(blk.bn2.weight == 1)
    default = create_model("resnet50", num_classes=3)
    assert all(torch.all(m.bn3.weight == 1) for m in default.modules() if isinstance(m, Bottleneck))


# --- MobileNetV1 (Howard et al., Table 1)

#: (output channels, stride) of the 13 depthwise-separable blocks, Howard et al. Table 1.
TABLE_1 = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1)] + [(512, 2)] + [(512, 1)] * 5
TABLE_1 += [(1024, 2), (1024, 1)]


def test_mobilenet_forward_follows_table_1() -> None:
    torch.manual_seed(0)
    alpha = 0.25
    model = _randomise_norms(MobileNetV1(num_classes=5, width_mult=alpha, pointwise_bias=True))
    x = torch.randn(1, 3, 64, 64)
    stem = model.stem
    assert stem[0].out_channels == int(32 * alpha)
    with torch.no_grad():
        h = F.relu(_bn(F.conv2d(x, stem[0].weight, stride=2, padding=1), stem[1]))
        for blk, (out, stride) in zip(model.blocks, TABLE_1, strict=True):
            c = h.shape[1]
            dw, pw = blk.depthwise, blk.pointwise
            assert dw[0].weight.shape == (c, 1, 3, 3)
            assert pw[0].weight.shape == (int(out * alpha), c, 1, 1)
            # the depthwise conv carries the stride: a strided 1x1 after it would give
            # the same values at four times the depthwise cost (FLOPs counts see it)
            assert dw[0].stride == (stride, stride) and pw[0].stride == (1, 1)
            h = F.relu(_bn(F.conv2d(h, dw[0].weight, stride=stride, padding=1, groups=c), dw[1]))
            h = F.relu(_bn(F.conv2d(h, pw[0].weight, pw[0].bias), pw[1]))
        assert h.shape == (1, 256, 2, 2)  # 64 / 32
        _close(model(x), _fc(h.mean(dim=(2, 3)), model.fc))


def test_mobilenet_imagenet_takes_the_pointwise_bias_option() -> None:
    model = create_model("mobilenet_v1_imagenet", pointwise_bias=True)
    # 4,231,976 without the biases, plus one per pointwise output channel
    assert sum(p.numel() for p in model.parameters()) == 4_231_976 + sum(c for c, _ in TABLE_1)


# --- DenseNet-BC (Huang et al. §3)


def test_densenet_forward_is_densenet_bc() -> None:
    torch.manual_seed(0)
    k = 3
    model = _randomise_norms(DenseNet(depth=16, growth_rate=k, num_classes=5))
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        h = F.conv2d(x, model.conv1.weight, padding=1)
        for part in model.features:
            if isinstance(part, nn.Sequential):  # a dense block of bottleneck layers
                for layer in part:
                    out = F.conv2d(F.relu(_bn(h, layer.bn1)), layer.conv1.weight)
                    out = F.conv2d(F.relu(_bn(out, layer.bn2)), layer.conv2.weight, padding=1)
                    assert out.shape[1] == k
                    h = torch.cat([h, out], dim=1)
            else:  # a transition
                h = F.avg_pool2d(F.conv2d(F.relu(_bn(h, part.bn)), part.conv.weight), 2)
        feats = F.relu(_bn(h, model.bn)).mean(dim=(2, 3))
        _close(model(x), _fc(feats, model.fc))


def test_densenet_transitions_take_the_floor_of_theta_c() -> None:
    # depth 10: one bottleneck per block; k = 3:
    # 6 -> 9 -> floor(4.5) = 4 -> 7 -> floor(3.5) = 3 -> 6
    model = DenseNet(depth=10, growth_rate=3, num_classes=2)
    transitions = [m for m in model.features if not isinstance(m, nn.Sequential)]
    assert [t.conv.out_channels for t in transitions] == [4, 3]
    assert model.num_features == 6 and model.fc.in_features == 6


# --- the MNIST-1D models (module docstrings)


def test_mixer_forward_follows_the_docstring() -> None:
    torch.manual_seed(0)
    model = _randomise_norms(MNIST1DMixer(num_classes=10, depth=2))
    x = torch.randn(3, 1, 40)
    with torch.no_grad():
        padded = torch.cat([torch.zeros(3, 1), x[:, 0], torch.zeros(3, 2)], dim=1)  # 43 points
        patches = torch.stack([padded[:, 5 * t : 5 * t + 8] for t in range(8)], dim=1)
        h = _fc(patches, model.embed)  # (N, 8 tokens, 64)
        for blk in model.blocks:
            y = _bn(h, blk.norm1, dim=2).transpose(1, 2)  # (N, C, T)
            h = h + _fc(F.relu(_fc(y, blk.token1)), blk.token2).transpose(1, 2)
            y = _bn(h, blk.norm2, dim=2)
            h = h + _fc(F.relu(_fc(y, blk.channel1)), blk.channel2)
        feats = _bn(h.mean(dim=1), model.norm)
        _close(model(x), _fc(feats, model.fc))


def test_mnist1d_cnn_forward_follows_the_docstring() -> None:
    torch.manual_seed(0)
    model = _randomise_norms(MNIST1DCNN(num_classes=10, width=0.25))
    x = torch.randn(2, 1, 40)
    convs = [m for m in model.features if isinstance(m, nn.Conv1d)]
    norms = [m for m in model.features if isinstance(m, nn.BatchNorm1d)]
    # 64, 128, 128, 256 channels at width 1; kernel 5 then 3; stride 2 at the 2nd and 4th
    layers = [(16, 5, 1), (32, 3, 2), (32, 3, 1), (64, 3, 2)]
    h = x
    with torch.no_grad():
        for conv, norm, (c, kernel, stride) in zip(convs, norms, layers, strict=True):
            assert conv.weight.shape == (c, h.shape[1], kernel)
            h = F.relu(_bn(F.conv1d(h, conv.weight, stride=stride, padding=kernel // 2), norm))
        assert h.shape == (2, 64, 10)  # 40 -> 20 -> 10 points
        _close(model(x), _fc(h.mean(dim=2), model.fc))


def test_mnist1d_mlp_forward_follows_the_docstring() -> None:
    torch.manual_seed(0)
    model = _randomise_norms(MNIST1DMLP(num_classes=10, hidden=(16, 8)))
    x = torch.randn(4, 1, 40)
    linears = [m for m in model.features if isinstance(m, nn.Linear)]
    norms = [m for m in model.features if isinstance(m, nn.BatchNorm1d)]
    h = x.reshape(4, 40)
    with torch.no_grad():
        for lin, norm in zip(linears, norms, strict=True):
            h = F.relu(_bn(_fc(h, lin), norm))
        _close(model(x), _fc(h, model.fc))


# --- the initialisation (_layers.py)


def test_every_conv_is_kaiming_fan_out_and_hidden_linears_kaiming_fan_in() -> None:
    torch.manual_seed(0)
    for conv in (m for m in create_model("mnist1d_cnn").modules() if isinstance(m, nn.Conv1d)):
        fan_out = conv.out_channels * conv.kernel_size[0]
        assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / fan_out), rel=0.15)
    mlp = create_model("mnist1d_mlp")
    for lin in (m for m in mlp.features if isinstance(m, nn.Linear)):
        assert lin.weight.std().item() == pytest.approx(math.sqrt(2 / lin.in_features), rel=0.1)
