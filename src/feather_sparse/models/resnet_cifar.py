"""ResNet for CIFAR (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016, §4.2).

A ``6n + 2``-layer network for 32x32 images: a 3x3 stem conv, three stages of
``n`` basic blocks (two 3x3 convs each) at strides 1, 2, 2, global average
pooling and a linear classifier. The Feather paper (§4, footnote 1) doubles
the channels of ResNet-20 (``n = 3``), giving stages of 32/64/128 channels,
as Zhou et al. 2021 and Wang et al. 2020 do.

Where a block changes shape, its shortcut is a 1x1 strided conv followed by
batch norm (He et al.'s option B, as in the Feather authors' released code);
with it ResNet-20 at 2x width has 1,096,196 parameters for 100 classes, the
1.096M of the paper's Table 1 (identity/zero-padding shortcuts would give
1,085,572).
"""

from __future__ import annotations

import torch
from torch import nn

from feather_sparse.models._layers import init_weights, positive_int, residual_shortcut
from feather_sparse.models._registry import register_model

__all__ = ["BasicBlock", "CifarResNet", "resnet20"]

#: Channels of the three stages at width 1 (He et al.'s CIFAR ResNets).
BASE_CHANNELS = (16, 32, 64)
STAGE_STRIDES = (1, 2, 2)


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers and a residual connection (post-activation).

    Args:
        in_channels: channels of the input.
        out_channels: channels of the output.
        stride: stride of the first conv (and of the shortcut's projection).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        # option B: a learned projection where the shape changes
        self.shortcut = residual_shortcut(in_channels, out_channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output, ``(N, out_channels, H / stride, W / stride)``.

        Args:
            x: a batch of feature maps, ``(N, in_channels, H, W)``.
        """
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for small images.

    Args:
        depth: number of weighted layers, ``6n + 2`` (20, 32, 44, 56, 110).
        num_classes: number of outputs.
        width: channel multiplier of the stages (1 is He et al.'s 16/32/64;
            the Feather paper uses 2).
        in_channels: channels of the input images.

    Raises:
        ValueError: if ``depth`` is not ``6n + 2`` or ``width`` is not a positive
            integer (``0.5`` too: the stages' channels must be whole numbers).
    """

    def __init__(
        self, depth: int = 20, num_classes: int = 100, width: int = 2, in_channels: int = 3
    ) -> None:
        super().__init__()
        if depth < 8 or (depth - 2) % 6 != 0:
            raise ValueError(f"depth must be 6n + 2 (20, 32, 44, 56, 110), got {depth}")
        width = positive_int(
            "width",
            width,
            " (the channel multiplier: 1 gives 16/32/64 channels, 2 the paper's "
            "32/64/128; fractional widths are not supported)",
        )
        blocks_per_stage = (depth - 2) // 6
        channels = [c * width for c in BASE_CHANNELS]

        self.conv1 = nn.Conv2d(in_channels, channels[0], 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels[0])
        self.relu = nn.ReLU(inplace=True)
        stages: list[nn.Module] = []
        prev = channels[0]
        for out, stride in zip(channels, STAGE_STRIDES, strict=True):
            blocks = [BasicBlock(prev, out, stride)]
            blocks += [BasicBlock(out, out) for _ in range(blocks_per_stage - 1)]
            stages.append(nn.Sequential(*blocks))
            prev = out
        self.layer1, self.layer2, self.layer3 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(prev, num_classes)
        self.num_features = prev
        init_weights(self, classifier=self.fc)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features before the classifier, ``(N, num_features)``.

        Args:
            x: a batch of images, ``(N, in_channels, H, W)``.
        """
        x = self.relu(self.bn1(self.conv1(x)))  # (N, C0, H, W)
        x = self.layer3(self.layer2(self.layer1(x)))  # (N, C2, H/4, W/4)
        return torch.flatten(self.pool(x), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits ``(N, num_classes)`` of a batch.

        Args:
            x: a batch of images, ``(N, in_channels, H, W)``.
        """
        return self.fc(self.forward_features(x))


@register_model("resnet20", input_shape=(3, 32, 32), num_classes=100)
def resnet20(num_classes: int = 100, width: int = 2) -> CifarResNet:
    """ResNet-20 for CIFAR at 2x width (32/64/128 channels), 1.096M parameters at 100 classes.

    Args:
        num_classes: number of outputs.
        width: channel multiplier (2 in the paper).
    """
    return CifarResNet(depth=20, num_classes=num_classes, width=width)
