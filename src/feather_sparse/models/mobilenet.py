"""MobileNetV1 (Howard et al., "MobileNets: Efficient Convolutional Neural Networks for
Mobile Vision Applications", 2017, Table 1).

A 3x3 stem conv followed by 13 depthwise-separable blocks (a 3x3 depthwise
conv and a 1x1 pointwise conv, each followed by batch norm and ReLU), global
average pooling and a linear classifier. Channels go 32 → 64 → 128 → 256 →
512 (x6) → 1024, halving the resolution at the stem and at the first block of
each new width.

Two registered variants:

- ``mobilenet_v1`` (CIFAR, 32x32): the stem has stride 1, so a 32x32 image
  ends at 2x2. Following the Feather authors' released CIFAR code, the
  pointwise convs carry a bias (redundant before batch norm, but part of the
  architecture the paper counts): 3,315,428 parameters at 100 classes, the
  paper's 3.315M (3,309,476 without the pointwise biases).
- ``mobilenet_v1_imagenet`` (224x224): the standard network, stem stride 2,
  no conv biases; 4,231,976 parameters at 1000 classes, of which 4,210,088 are
  conv and linear weights and biases. The 4.21M the paper quotes (Appendix,
  MobileNetV1 on ImageNet, the figure used across the pruning literature)
  is this count without the 21,888 batch-norm parameters.
"""

from __future__ import annotations

import torch
from torch import nn

from feather_sparse.models._layers import init_weights, positive_multiplier
from feather_sparse.models._registry import register_model

__all__ = ["DepthwiseSeparable", "MobileNetV1", "mobilenet_v1", "mobilenet_v1_imagenet"]

STEM_CHANNELS = 32
#: (output channels, stride) of the 13 depthwise-separable blocks (Howard et al., Table 1).
BLOCKS: tuple[tuple[int, int], ...] = (
    (64, 1),
    (128, 2),
    (128, 1),
    (256, 2),
    (256, 1),
    (512, 2),
    (512, 1),
    (512, 1),
    (512, 1),
    (512, 1),
    (512, 1),
    (1024, 2),
    (1024, 1),
)


def _conv_bn_relu(
    in_channels: int,
    out_channels: int,
    kernel_size: int,
    stride: int = 1,
    groups: int = 1,
    bias: bool = False,
) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            padding=kernel_size // 2,
            groups=groups,
            bias=bias,
        ),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class DepthwiseSeparable(nn.Module):
    """A 3x3 depthwise conv-BN-ReLU followed by a 1x1 pointwise conv-BN-ReLU.

    Args:
        in_channels: channels of the input.
        out_channels: channels of the output.
        stride: stride of the depthwise conv.
        pointwise_bias: give the 1x1 conv a bias.
    """

    def __init__(
        self, in_channels: int, out_channels: int, stride: int = 1, pointwise_bias: bool = False
    ) -> None:
        super().__init__()
        self.depthwise = _conv_bn_relu(in_channels, in_channels, 3, stride, groups=in_channels)
        self.pointwise = _conv_bn_relu(in_channels, out_channels, 1, bias=pointwise_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output, ``(N, out_channels, H / stride, W / stride)``.

        Args:
            x: a batch of feature maps, ``(N, in_channels, H, W)``.
        """
        return self.pointwise(self.depthwise(x))


class MobileNetV1(nn.Module):
    """MobileNetV1.

    Args:
        num_classes: number of outputs.
        width_mult: the width multiplier α of Howard et al. (§3.3), scaling every layer's channels.
        stem_stride: stride of the first conv (2 for ImageNet, 1 for 32x32 CIFAR images).
        pointwise_bias: give the 1x1 convs a bias (the Feather authors' CIFAR variant).
        in_channels: channels of the input images.

    Raises:
        ValueError: if ``width_mult`` is not a positive finite number or
            ``stem_stride`` is not positive.
    """

    def __init__(
        self,
        num_classes: int = 1000,
        width_mult: float = 1.0,
        stem_stride: int = 2,
        pointwise_bias: bool = False,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        width_mult = positive_multiplier("width_mult", width_mult)
        if stem_stride <= 0:
            raise ValueError(f"stem_stride must be a positive integer, got {stem_stride}")

        def scaled(channels: int) -> int:
            return max(1, int(channels * width_mult))

        prev = scaled(STEM_CHANNELS)
        self.stem = _conv_bn_relu(in_channels, prev, 3, stem_stride)
        blocks = []
        for out, stride in BLOCKS:
            blocks.append(DepthwiseSeparable(prev, scaled(out), stride, pointwise_bias))
            prev = scaled(out)
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(prev, num_classes)
        self.num_features = prev
        init_weights(self, classifier=self.fc)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features before the classifier, ``(N, num_features)``.

        Args:
            x: a batch of images, ``(N, in_channels, H, W)``.
        """
        x = self.blocks(self.stem(x))  # (N, 1024·α, H/32·stem_stride/2, ...)
        return torch.flatten(self.pool(x), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits ``(N, num_classes)`` of a batch.

        Args:
            x: a batch of images, ``(N, in_channels, H, W)``.
        """
        return self.fc(self.forward_features(x))


@register_model("mobilenet_v1", input_shape=(3, 32, 32), num_classes=100)
def mobilenet_v1(
    num_classes: int = 100, width_mult: float = 1.0, pointwise_bias: bool = True
) -> MobileNetV1:
    """MobileNetV1 for CIFAR (stem stride 1), 3.315M parameters at 100 classes.

    Args:
        num_classes: number of outputs.
        width_mult: width multiplier α.
        pointwise_bias: biases on the 1x1 convs, as in the paper's count.
    """
    return MobileNetV1(num_classes, width_mult, stem_stride=1, pointwise_bias=pointwise_bias)


@register_model("mobilenet_v1_imagenet", input_shape=(3, 224, 224), num_classes=1000)
def mobilenet_v1_imagenet(
    num_classes: int = 1000, width_mult: float = 1.0, pointwise_bias: bool = False
) -> MobileNetV1:
    """MobileNetV1 for ImageNet, 4.232M parameters at 1000 classes (4.21M without batch norm).

    Args:
        num_classes: number of outputs.
        width_mult: width multiplier α.
        pointwise_bias: biases on the 1x1 convs (not in the standard network).
    """
    return MobileNetV1(num_classes, width_mult, stem_stride=2, pointwise_bias=pointwise_bias)
