"""DenseNet-BC for CIFAR (Huang et al., "Densely Connected Convolutional Networks", CVPR 2017).

Each layer of a dense block sees the concatenation of all earlier feature maps
of the block and adds ``growth_rate`` (k) new channels. DenseNet-BC uses
bottleneck layers (pre-activation BN-ReLU-Conv1x1 to ``4k`` channels, then
BN-ReLU-Conv3x3 to ``k``) and transitions (BN-ReLU-Conv1x1-AvgPool2) that
compress the channels by a factor θ = 0.5 (§3, "Compression").

The paper's DenseNet40-24 (0.714M parameters at 100 classes) is DenseNet-BC
with these settings, the configuration of the Feather authors' released code:

- depth 40: ``(40 - 4) / 3 = 12`` conv layers per block, i.e. 6 bottleneck
  layers (two convs each) in each of the 3 dense blocks;
- growth rate k = 24, bottleneck width ``4k = 96``;
- a 3x3 stem conv to ``2k = 48`` channels;
- compression 0.5 at the two transitions: channels go
  48 → 192 → 96 → 240 → 120 → 264, and the classifier sees 264 features;
- no dropout, no conv biases.

This gives 714,196 parameters. The alternatives are far off: without
bottlenecks (12 plain 3x3 layers per block) 2.41M, without compression 1.02M,
with a 16-channel stem 0.670M.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from feather_sparse.models._layers import init_weights
from feather_sparse.models._registry import register_model

__all__ = ["Bottleneck", "DenseNet", "Transition", "densenet40_24"]

#: Bottleneck width as a multiple of the growth rate (Huang et al., §3).
BOTTLENECK_FACTOR = 4
NUM_BLOCKS = 3


class Bottleneck(nn.Module):
    """BN-ReLU-Conv1x1(4k)-BN-ReLU-Conv3x3(k); the output is the input with k channels appended.

    Args:
        in_channels: channels of the input.
        growth_rate: channels the layer adds (k).
    """

    def __init__(self, in_channels: int, growth_rate: int) -> None:
        super().__init__()
        inner = BOTTLENECK_FACTOR * growth_rate
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = nn.Conv2d(in_channels, inner, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(inner)
        self.conv2 = nn.Conv2d(inner, growth_rate, 3, padding=1, bias=False)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The input with the layer's ``growth_rate`` new channels appended.

        Args:
            x: a batch of feature maps, ``(N, in_channels, H, W)``.
        """
        # the in-place ReLUs act on BN outputs, never on x, which is concatenated below
        out = self.conv1(self.relu(self.bn1(x)))
        out = self.conv2(self.relu(self.bn2(out)))
        return torch.cat([x, out], dim=1)  # (N, C + k, H, W)


class Transition(nn.Module):
    """BN-ReLU-Conv1x1 to ``out_channels``, then 2x2 average pooling.

    Args:
        in_channels: channels of the input.
        out_channels: channels of the output.
    """

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(in_channels)
        self.conv = nn.Conv2d(in_channels, out_channels, 1, bias=False)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.AvgPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The compressed, pooled feature maps.

        Args:
            x: a batch of feature maps, ``(N, in_channels, H, W)``.
        """
        return self.pool(self.conv(self.relu(self.bn(x))))


class DenseNet(nn.Module):
    """DenseNet-BC with three dense blocks, for small images.

    Args:
        depth: total depth, ``6n + 4`` with ``n`` bottleneck layers per block.
        growth_rate: channels each layer adds (k).
        num_classes: number of outputs.
        compression: channel reduction θ at the transitions (0.5 for "-BC").
        in_channels: channels of the input images.

    Raises:
        ValueError: if ``depth`` is not ``6n + 4`` or ``compression`` is not in (0, 1].
    """

    def __init__(
        self,
        depth: int = 40,
        growth_rate: int = 24,
        num_classes: int = 100,
        compression: float = 0.5,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        if depth < 10 or (depth - 4) % 6 != 0:
            raise ValueError(f"depth must be 6n + 4 for DenseNet-BC (40, 100, ...), got {depth}")
        if not 0.0 < compression <= 1.0:
            raise ValueError(f"compression must be in (0, 1], got {compression}")
        layers_per_block = (depth - 4) // 6  # each bottleneck layer holds two convs

        channels = 2 * growth_rate
        self.conv1 = nn.Conv2d(in_channels, channels, 3, padding=1, bias=False)
        stages: list[nn.Module] = []
        for b in range(NUM_BLOCKS):
            layers = []
            for _ in range(layers_per_block):
                layers.append(Bottleneck(channels, growth_rate))
                channels += growth_rate
            stages.append(nn.Sequential(*layers))
            if b < NUM_BLOCKS - 1:
                reduced = math.floor(channels * compression)
                stages.append(Transition(channels, reduced))
                channels = reduced
        self.features = nn.Sequential(*stages)
        self.bn = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)
        self.num_features = channels
        init_weights(self, classifier=self.fc)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features before the classifier, ``(N, num_features)``.

        Args:
            x: a batch of images, ``(N, in_channels, H, W)``.
        """
        x = self.features(self.conv1(x))  # (N, 264, H/4, W/4) for DenseNet40-24
        x = self.relu(self.bn(x))
        return torch.flatten(self.pool(x), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits ``(N, num_classes)`` of a batch.

        Args:
            x: a batch of images, ``(N, in_channels, H, W)``.
        """
        return self.fc(self.forward_features(x))


@register_model("densenet40_24", input_shape=(3, 32, 32), num_classes=100)
def densenet40_24(num_classes: int = 100) -> DenseNet:
    """DenseNet-BC, depth 40, growth rate 24, for CIFAR; 0.714M parameters at 100 classes.

    Args:
        num_classes: number of outputs.
    """
    return DenseNet(depth=40, growth_rate=24, num_classes=num_classes, compression=0.5)
