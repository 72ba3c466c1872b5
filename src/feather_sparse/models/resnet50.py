"""ResNet-50 for ImageNet (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016).

A 7x7 stride-2 stem conv and 3x3 max pool, four stages of 3/4/6/3
bottleneck blocks (1x1 reduce, 3x3, 1x1 expand by 4) with 64/128/256/512
inner channels, global average pooling and a linear classifier; projection
shortcuts (1x1 conv + BN) where the shape changes.

The stride of a downsampling block sits on its 3x3 conv ("ResNet v1.5", as
in torchvision and most pruning work on ImageNet, Feather's included); the
parameter count is the same either way: 25,557,032 at 1000 classes, the
paper's 25.6M.
"""

from __future__ import annotations

import torch
from torch import nn

from feather_sparse.models._layers import init_weights, residual_shortcut
from feather_sparse.models._registry import register_model

__all__ = ["Bottleneck", "ResNet", "resnet50"]

STEM_CHANNELS = 64
STAGE_WIDTHS = (64, 128, 256, 512)
STAGE_STRIDES = (1, 2, 2, 2)
EXPANSION = 4


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride), 1x1 expand by 4, residual connection.

    Args:
        in_channels: channels of the input.
        width: channels of the 3x3 conv; the output has ``4 · width``.
        stride: stride of the 3x3 conv.
    """

    def __init__(self, in_channels: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = width * EXPANSION
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = residual_shortcut(in_channels, out_channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output, ``(N, 4 · width, H / stride, W / stride)``.

        Args:
            x: a batch of feature maps, ``(N, in_channels, H, W)``.
        """
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.downsample(x))


class ResNet(nn.Module):
    """Bottleneck ResNet for ImageNet-sized images.

    Args:
        layers: number of bottleneck blocks in each of the four stages.
        num_classes: number of outputs.
        zero_init_residual: start each block's last BN at weight 0, so every
            block begins as the identity (Goyal et al. 2017); off by default.
        in_channels: channels of the input images.

    Raises:
        ValueError: unless ``layers`` has four positive entries.
    """

    def __init__(
        self,
        layers: tuple[int, int, int, int] = (3, 4, 6, 3),
        num_classes: int = 1000,
        zero_init_residual: bool = False,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        if len(layers) != len(STAGE_WIDTHS) or min(layers) <= 0:
            raise ValueError(f"layers must be four positive block counts, got {layers}")
        self.conv1 = nn.Conv2d(in_channels, STEM_CHANNELS, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(STEM_CHANNELS)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages: list[nn.Module] = []
        prev = STEM_CHANNELS
        for blocks, width, stride in zip(layers, STAGE_WIDTHS, STAGE_STRIDES, strict=True):
            stage = [Bottleneck(prev, width, stride)]
            prev = width * EXPANSION
            stage += [Bottleneck(prev, width) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(prev, num_classes)
        self.num_features = prev
        init_weights(self, classifier=self.fc)
        if zero_init_residual:
            for module in self.modules():
                if isinstance(module, Bottleneck):
                    nn.init.zeros_(module.bn3.weight)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features before the classifier, ``(N, num_features)``.

        Args:
            x: a batch of images, ``(N, in_channels, H, W)``.
        """
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))  # (N, 64, H/4, W/4)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))  # (N, 2048, H/32, W/32)
        return torch.flatten(self.pool(x), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits ``(N, num_classes)`` of a batch.

        Args:
            x: a batch of images, ``(N, in_channels, H, W)``.
        """
        return self.fc(self.forward_features(x))


@register_model("resnet50", input_shape=(3, 224, 224), num_classes=1000)
def resnet50(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    """ResNet-50 for ImageNet, 25.6M parameters at 1000 classes.

    Args:
        num_classes: number of outputs.
        zero_init_residual: zero-initialise the last BN of every block.
    """
    return ResNet((3, 4, 6, 3), num_classes=num_classes, zero_init_residual=zero_init_residual)
