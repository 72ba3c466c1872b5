"""Batched image augmentation as tensor ops on the training device.

The standard CIFAR recipe (He et al. 2016, §4.2): pad 4 pixels with zeros,
take a random 32x32 crop, flip horizontally with probability 1/2, then
normalise each channel. Here all three run on a whole ``(B, C, H, W)`` batch at
once, on whatever device the batch is on (no torchvision, no per-sample Python
loop); the per-sample random numbers come from the CPU generator the loader
passes in, so CPU and GPU runs agree.

Images arrive as uint8 (0..255); cropping and flipping happen on uint8 (a
quarter of the memory traffic of float32) and normalisation produces float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR100_MEAN",
    "CIFAR100_STD",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CropFlipNormalize",
    "Normalize",
    "random_crop",
    "random_hflip",
]

# Per-channel statistics of the training sets on the 0..1 scale (the values
# commonly quoted for CIFAR-10, CIFAR-100 and ImageNet).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def random_crop(x: Tensor, padding: int, generator: torch.Generator) -> Tensor:
    """Zero-pad every image by ``padding`` pixels and crop back at a random offset.

    Args:
        x: images ``(B, C, H, W)``, any dtype, any device.
        padding: pixels of zeros added on each side; offsets are uniform in
            ``0 .. 2 * padding`` per sample and axis.
        generator: CPU generator the offsets are drawn from.

    Returns:
        ``(B, C, H, W)`` crops, same dtype and device as ``x``.
    """
    if padding == 0:
        return x
    b, c, h, w = x.shape
    offsets = torch.randint(0, 2 * padding + 1, (2, b), generator=generator).to(x.device)
    padded = F.pad(x, (padding, padding, padding, padding))  # (B, C, H + 2p, W + 2p)
    rows = offsets[0, :, None] + torch.arange(h, device=x.device)  # (B, H)
    cols = offsets[1, :, None] + torch.arange(w, device=x.device)  # (B, W)
    # Two gathers pick each sample's rows, then its columns.
    out = padded.gather(2, rows[:, None, :, None].expand(b, c, h, w + 2 * padding))
    return out.gather(3, cols[:, None, None, :].expand(b, c, h, w))


def random_hflip(x: Tensor, generator: torch.Generator, p: float = 0.5) -> Tensor:
    """Mirror each image left-right with probability ``p``.

    Args:
        x: images ``(B, C, H, W)``.
        generator: CPU generator the coin flips are drawn from.
        p: probability of flipping one image.
    """
    flip = (torch.rand(x.shape[0], generator=generator) < p).to(x.device)
    return torch.where(flip[:, None, None, None], x.flip(3), x)


class Normalize:
    """uint8 images to float32 ``(x / 255 - mean) / std`` per channel (the eval transform).

    Args:
        mean: per-channel mean on the 0..1 scale.
        std: per-channel standard deviation on the 0..1 scale.
        device: where the batches will be.
    """

    def __init__(
        self, mean: Sequence[float], std: Sequence[float], device: torch.device | str = "cpu"
    ) -> None:
        if len(mean) != len(std):
            raise ValueError(f"mean has {len(mean)} channels but std has {len(std)}")
        if min(std) <= 0:
            raise ValueError(f"std must be positive, got {tuple(std)}")
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        m = torch.tensor(self.mean, dtype=torch.float32, device=device)[:, None, None]
        s = torch.tensor(self.std, dtype=torch.float32, device=device)[:, None, None]
        # (x/255 - m)/s = x * scale - shift: one multiply-add per pixel.
        self._scale = 1.0 / (255.0 * s)
        self._shift = m / s

    def __call__(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Normalise ``(B, C, H, W)`` uint8 images; ``generator`` is unused."""
        return x.to(torch.float32).mul(self._scale).sub_(self._shift)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mean={self.mean}, std={self.std})"


class CropFlipNormalize(Normalize):
    """Random crop with zero padding, horizontal flip, then normalisation (CIFAR train).

    Args:
        mean: per-channel mean on the 0..1 scale.
        std: per-channel standard deviation on the 0..1 scale.
        device: where the batches will be.
        padding: zero padding of the random crop (4 for CIFAR); 0 disables it.
        flip: whether to flip horizontally with probability 1/2.
    """

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        device: torch.device | str = "cpu",
        *,
        padding: int = 4,
        flip: bool = True,
    ) -> None:
        super().__init__(mean, std, device)
        if padding < 0:
            raise ValueError(f"padding must be >= 0, got {padding}")
        self.padding = padding
        self.flip = flip

    def __call__(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Augment and normalise ``(B, C, H, W)`` uint8 images."""
        if generator is None:
            raise ValueError("augmentation needs the loader's generator (never the global RNG)")
        x = random_crop(x, self.padding, generator)
        if self.flip:
            x = random_hflip(x, generator)
        return super().__call__(x)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(padding={self.padding}, flip={self.flip}, "
            f"mean={self.mean}, std={self.std})"
        )
