"""``mnist1d_mlpmixer``: a Linear-heavy MLP-Mixer for the bundled MNIST-1D data.

MLP-Mixer (Tolstikhin et al., "MLP-Mixer: An all-MLP Architecture for
Vision", NeurIPS 2021) carried to MNIST-1D's 40-point signal, so that N:M
sparsity can be measured on a model whose weights are almost all
``nn.Linear`` (the bundled CNN is convolutional). Every reduction dimension
is a multiple of 8, so the 2:4, 1:4 and 4:8 patterns apply to every layer:

- patches: the signal is padded to 43 points and cut into 8 overlapping
  windows of 8 points, stride 5 → 8 tokens × 8 values;
- a patch embedding ``Linear(8, 64)``;
- ``depth`` mixer blocks, each a token-mixing MLP (``Linear(8, 32)``, ReLU,
  ``Linear(32, 8)`` across the tokens) and a channel-mixing MLP
  (``Linear(64, 256)``, ReLU, ``Linear(256, 64)``), each after a batch norm
  and with a residual connection;
- mean over the tokens and a classifier ``Linear(64, classes)``.

Batch norm stands in for the original's layer norm, and ReLU for GELU, so
that the model is built from the same plain layers, with the same
initialisation, as the project's other models. Three blocks give 103,042
parameters, 100,992 of them in prunable Linear weights. The input length is
fixed at 40 (the token-mixing layers' width is the number of tokens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from feather_sparse.models._layers import init_weights, positive_int
from feather_sparse.models._registry import register_model

__all__ = ["MNIST1DMixer", "mnist1d_mlpmixer"]

MNIST1D_SHAPE = (1, 40)
MNIST1D_CLASSES = 10
#: Patches: window length, stride and padding (left, right) giving 8 tokens from 40 points.
PATCH, STRIDE, PAD = 8, 5, (1, 2)
TOKENS = 8


class MixerBlock(nn.Module):
    """Token mixing across the tokens, then channel mixing, each with a residual.

    Args:
        tokens: number of tokens.
        dim: channels per token.
        token_hidden: hidden width of the token-mixing MLP.
        channel_hidden: hidden width of the channel-mixing MLP.
    """

    def __init__(self, tokens: int, dim: int, token_hidden: int, channel_hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm1d(dim)
        self.token1 = nn.Linear(tokens, token_hidden)
        self.token2 = nn.Linear(token_hidden, tokens)
        self.norm2 = nn.BatchNorm1d(dim)
        self.channel1 = nn.Linear(dim, channel_hidden)
        self.channel2 = nn.Linear(channel_hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The mixed tokens, the shape of the input.

        Args:
            x: a batch of token embeddings, ``(N, tokens, dim)``.
        """
        # x: (N, T, C)
        y = self.norm1(x.transpose(1, 2))  # (N, C, T): mix along T
        x = x + self.token2(F.relu(self.token1(y))).transpose(1, 2)
        y = self.norm2(x.transpose(1, 2)).transpose(1, 2)  # (N, T, C): mix along C
        return x + self.channel2(F.relu(self.channel1(y)))


class MNIST1DMixer(nn.Module):
    """MLP-Mixer over MNIST-1D patches (see the module docstring).

    Args:
        num_classes: number of outputs.
        dim: channels per token.
        depth: number of mixer blocks.
        token_hidden: hidden width of the token-mixing MLPs.
        channel_hidden: hidden width of the channel-mixing MLPs.

    Raises:
        ValueError: if a width or the depth is not a positive integer.
    """

    def __init__(
        self,
        num_classes: int = MNIST1D_CLASSES,
        dim: int = 64,
        depth: int = 3,
        token_hidden: int = 32,
        channel_hidden: int = 256,
    ) -> None:
        super().__init__()
        dim = positive_int("dim", dim, " (channels per token)")
        depth = positive_int("depth", depth, " (mixer blocks)")
        token_hidden = positive_int("token_hidden", token_hidden)
        channel_hidden = positive_int("channel_hidden", channel_hidden)
        self.embed = nn.Linear(PATCH, dim)
        self.blocks = nn.Sequential(
            *(MixerBlock(TOKENS, dim, token_hidden, channel_hidden) for _ in range(depth))
        )
        self.norm = nn.BatchNorm1d(dim)
        self.fc = nn.Linear(dim, num_classes)
        self.num_features = dim
        init_weights(self, classifier=self.fc)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Token-averaged features before the classifier, ``(N, dim)``.

        Args:
            x: a batch of signals, ``(N, 1, 40)``.

        Raises:
            ValueError: for inputs of another shape.
        """
        if x.shape[1:] != MNIST1D_SHAPE:
            raise ValueError(f"mnist1d_mlpmixer takes (N, 1, 40) signals, got {tuple(x.shape)}")
        patches = F.pad(x, PAD).unfold(-1, PATCH, STRIDE).squeeze(1)  # (N, 8 tokens, 8)
        h = self.blocks(self.embed(patches))  # (N, T, C)
        return self.norm(h.mean(dim=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits ``(N, num_classes)`` of a batch.

        Args:
            x: a batch of signals, ``(N, 1, 40)``.
        """
        return self.fc(self.forward_features(x))


@register_model("mnist1d_mlpmixer", input_shape=MNIST1D_SHAPE, num_classes=MNIST1D_CLASSES)
def mnist1d_mlpmixer(
    num_classes: int = MNIST1D_CLASSES, dim: int = 64, depth: int = 3
) -> MNIST1DMixer:
    """Linear-heavy MLP-Mixer for MNIST-1D, 103k parameters, for N:M patterns.

    Args:
        num_classes: number of outputs.
        dim: channels per token.
        depth: number of mixer blocks.
    """
    return MNIST1DMixer(num_classes=num_classes, dim=dim, depth=depth)
