"""Random tensors shaped like a real data set, for smoke tests and speed benchmarks.

Samples are standard normal float32 (already "normalised"), labels uniform;
both are drawn from a generator seeded by the run's seed, so the same seed
gives the same data set. There is nothing to learn beyond memorising the
training set. Presets match the shapes of the real data sets:

=====================  ==============  =======  ======  =====
name                   input_shape     classes  train   test
=====================  ==============  =======  ======  =====
``synthetic``          (3, 32, 32)     10       1024    256
``synthetic-cifar``    (3, 32, 32)     100      2048    512
``synthetic-imagenet`` (3, 224, 224)   1000     256     64
``synthetic-mnist1d``  (1, 40)         10       4000    1000
=====================  ==============  =======  ======  =====

Every size is an option (``input_shape``, ``num_classes``, ``train_size``,
``test_size``); the ImageNet preset is kept small because its samples are
600 KB each and live on the training device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from feather_sparse.data.base import (
    DATASETS,
    DataBundle,
    DatasetBuilder,
    LoaderConfig,
    tensor_bundle,
)
from feather_sparse.data.loaders import derive_seed

__all__ = ["PRESETS", "SyntheticPreset", "make_synthetic"]

_SYNTHETIC_STREAM = 3


def make_synthetic(
    name: str,
    config: LoaderConfig,
    *,
    input_shape: Sequence[int],
    num_classes: int,
    train_size: int,
    test_size: int,
) -> DataBundle:
    """Build a synthetic ``DataBundle`` (see the module docstring).

    Args:
        name: the data set's name.
        config: how to load it (device, batch size, seed, ...).
        input_shape: one sample's shape.
        num_classes: the number of classes, at least 2.
        train_size: the number of training samples.
        test_size: the number of test samples.

    Raises:
        ValueError: for non-positive sizes or fewer than two classes.
    """
    shape = tuple(int(d) for d in input_shape)
    if not shape or min(shape) < 1:
        raise ValueError(f"input_shape must be positive dimensions, got {tuple(input_shape)}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if train_size < 1 or test_size < 1:
        raise ValueError(f"sizes must be >= 1, got train_size={train_size}, test_size={test_size}")
    generator = torch.Generator().manual_seed(derive_seed(config.seed, _SYNTHETIC_STREAM))

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn((n, *shape), generator=generator)
        y = torch.randint(0, num_classes, (n,), generator=generator)
        return x, y

    train = draw(train_size)
    test = draw(test_size)
    return tensor_bundle(
        name, config, train=train, test=test, num_classes=num_classes, input_shape=shape
    )


@dataclass(frozen=True)
class SyntheticPreset:
    """Default sizes of one synthetic data set.

    Attributes:
        input_shape: one sample's shape.
        num_classes: the number of classes.
        train_size: the number of training samples.
        test_size: the number of test samples.
    """

    input_shape: tuple[int, ...]
    num_classes: int
    train_size: int
    test_size: int


PRESETS: dict[str, SyntheticPreset] = {
    "synthetic": SyntheticPreset((3, 32, 32), 10, 1024, 256),
    "synthetic-cifar": SyntheticPreset((3, 32, 32), 100, 2048, 512),
    "synthetic-imagenet": SyntheticPreset((3, 224, 224), 1000, 256, 64),
    "synthetic-mnist1d": SyntheticPreset((1, 40), 10, 4000, 1000),
}


def _preset_builder(name: str, preset: SyntheticPreset) -> DatasetBuilder:
    """A registry entry for ``name`` whose option defaults are ``preset``."""

    def build(
        data_dir: Path | None,
        config: LoaderConfig,
        *,
        input_shape: Sequence[int] = preset.input_shape,
        num_classes: int = preset.num_classes,
        train_size: int = preset.train_size,
        test_size: int = preset.test_size,
    ) -> DataBundle:
        # data_dir is ignored: nothing is read from disk.
        return make_synthetic(
            name,
            config,
            input_shape=input_shape,
            num_classes=num_classes,
            train_size=train_size,
            test_size=test_size,
        )

    build.__name__ = build.__qualname__ = f"build_{name.replace('-', '_')}"
    build.__doc__ = f"Random data set {name!r}, defaults {preset}."
    return build


for _name, _preset in PRESETS.items():
    DATASETS.register(_name, _preset_builder(_name, _preset))
