"""Small models for the bundled MNIST-1D data (Greydanus, "Scaling down Deep Learning", 2020).

An MNIST-1D sample is a 40-point signal (shape ``(1, 40)``, channels first)
made from one of 10 digit-like templates by random padding, translation,
scaling, shear and noise; 4000 training and 1000 test samples by default.
The task rewards translation invariance: Greydanus reports about 68 % test
accuracy for an MLP and about 94 % for a small 3-layer CNN.

``mnist1d_cnn`` is the project's default model, meant for a training run of
about a minute on two CPU cores with enough weights that 99 % sparsity still
leaves a working network. Design:

- four ``Conv1d`` layers (64, 128, 128, 256 channels; kernel 5 then 3;
  stride 2 at the second and fourth, so 40 → 20 → 10 points), each followed
  by batch norm and ReLU: the last layer's receptive field (15 points) spans
  about a whole template, and the stride-2 layers double the channels where
  they halve the length, keeping the cost per layer even;
- global average pooling before the classifier: it makes the prediction
  nearly invariant to the templates' random translation, which is what
  MNIST-1D tests (flattening the final map instead gave lower accuracy for
  more weights in our trials);
- no conv biases (batch norm follows); 176,074 parameters, of which 174,912
  are prunable conv/linear weights, so 1,749 survive at 99 % sparsity.

Why this width. Trials (SGD lr 0.1, momentum 0.9, weight decay 5e-4 off
batch norm and biases, cosine schedule, batch 128, gradient clipping at 3,
30 epochs on the default 4000/1000 split, Feather-Global with the library's
``Pruner``):

- half the channels (32/64/64/128, 45k weights): 98.6-99.1 % dense, but
  unstable at 99 % sparsity (9-92 % over eight runs), because the global
  threshold leaves its two middle convs only 1-20 weights each;
- 1.5x that (99k weights): 94.5-97.2 % at 99 % over three seeds;
- this model: 98.6 % dense, 97.7-98.3 % at 99 % over three seeds;
- three convs of 64/128/256 (126k weights): 97.9 % dense, 96.2-96.8 % at 99 %.

A training step (batch 128, one thread) costs about 2.8x that of the half
width model; 30 epochs with the pruner took 65-76 s on a heavily shared
two-core machine. ``width`` scales every layer's channels (``width=0.5`` is
the 45k-weight model).

``mnist1d_mlp`` flattens its input and uses two hidden layers of 256 units
with batch norm (79,370 parameters); it is the non-convolutional baseline
(about 70 % test accuracy, in line with Greydanus' MLP).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from feather_sparse.models._layers import init_weights, positive_int, positive_multiplier
from feather_sparse.models._registry import register_model

__all__ = ["MNIST1DCNN", "MNIST1DMLP", "mnist1d_cnn", "mnist1d_mlp"]

MNIST1D_SHAPE = (1, 40)
MNIST1D_CLASSES = 10
#: (channels at width 1, kernel size, stride) of the CNN's conv layers.
CNN_LAYERS: tuple[tuple[int, int, int], ...] = ((64, 5, 1), (128, 3, 2), (128, 3, 1), (256, 3, 2))
MLP_HIDDEN = (256, 256)


class MNIST1DCNN(nn.Module):
    """A 1-D CNN: four Conv1d-BN-ReLU layers, global average pooling, a linear classifier.

    Accepts signals of any length.

    Args:
        num_classes: number of outputs.
        width: multiplier of every layer's channels.
        in_channels: channels of the input signal.

    Raises:
        ValueError: if ``width`` is not a positive finite number.
    """

    def __init__(self, num_classes: int = 10, width: float = 1.0, in_channels: int = 1) -> None:
        super().__init__()
        width = positive_multiplier("width", width)
        layers: list[nn.Module] = []
        prev = in_channels
        for channels, kernel, stride in CNN_LAYERS:
            out = max(1, round(channels * width))
            layers += [
                nn.Conv1d(prev, out, kernel, stride=stride, padding=kernel // 2, bias=False),
                nn.BatchNorm1d(out),
                nn.ReLU(inplace=True),
            ]
            prev = out
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.fc = nn.Linear(prev, num_classes)
        self.num_features = prev
        init_weights(self, classifier=self.fc)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features before the classifier, ``(N, num_features)``.

        Args:
            x: a batch of signals, ``(N, in_channels, L)``.
        """
        x = self.features(x)  # (N, 1, 40) -> (N, 256, 10)
        return torch.flatten(self.pool(x), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits ``(N, num_classes)`` of a batch.

        Args:
            x: a batch of signals, ``(N, in_channels, L)``.
        """
        return self.fc(self.forward_features(x))


class MNIST1DMLP(nn.Module):
    """An MLP on the flattened signal: Linear-BN-ReLU hidden layers and a linear classifier.

    Args:
        num_classes: number of outputs.
        hidden: widths of the hidden layers.
        input_shape: shape of one sample; its product is the first layer's input size.

    Raises:
        ValueError: if a hidden width or ``input_shape`` entry is not a positive integer.
    """

    def __init__(
        self,
        num_classes: int = 10,
        hidden: Sequence[int] = MLP_HIDDEN,
        input_shape: Sequence[int] = MNIST1D_SHAPE,
    ) -> None:
        super().__init__()
        if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
            raise ValueError(
                f"hidden must be a list of layer widths (e.g. [256, 256]), got {hidden!r}"
            )
        if not input_shape:
            raise ValueError(f"input_shape must be positive sizes, got {input_shape!r}")
        input_shape = [positive_int("input_shape entry", d) for d in input_shape]
        hidden = [positive_int("hidden width", w, f" (hidden={list(hidden)!r})") for w in hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        prev = math.prod(input_shape)
        for width in hidden:
            layers += [nn.Linear(prev, width, bias=False), nn.BatchNorm1d(width), nn.ReLU()]
            prev = width
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(prev, num_classes)
        self.num_features = prev
        init_weights(self, classifier=self.fc)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden features before the classifier, ``(N, num_features)``.

        Args:
            x: a batch of samples, ``(N, *input_shape)``.
        """
        return self.features(x)  # (N, 1, 40) -> (N, 40) -> ... -> (N, hidden[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits ``(N, num_classes)`` of a batch.

        Args:
            x: a batch of samples, ``(N, *input_shape)``.
        """
        return self.fc(self.forward_features(x))


@register_model("mnist1d_cnn", input_shape=MNIST1D_SHAPE, num_classes=MNIST1D_CLASSES)
def mnist1d_cnn(num_classes: int = MNIST1D_CLASSES, width: float = 1.0) -> MNIST1DCNN:
    """Small 1-D CNN for MNIST-1D (the default model), 176k parameters.

    Args:
        num_classes: number of outputs.
        width: channel multiplier.
    """
    return MNIST1DCNN(num_classes=num_classes, width=width)


@register_model("mnist1d_mlp", input_shape=MNIST1D_SHAPE, num_classes=MNIST1D_CLASSES)
def mnist1d_mlp(
    num_classes: int = MNIST1D_CLASSES, hidden: Sequence[int] = MLP_HIDDEN
) -> MNIST1DMLP:
    """MLP on the flattened MNIST-1D signal, 79k parameters.

    Args:
        num_classes: number of outputs.
        hidden: widths of the hidden layers.
    """
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Iterable):
        raise ValueError(f"hidden must be a list of layer widths (e.g. [256, 256]), got {hidden!r}")
    return MNIST1DMLP(num_classes=num_classes, hidden=tuple(hidden))
