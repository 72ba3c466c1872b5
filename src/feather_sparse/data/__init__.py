"""Data sets for training and benchmarking: one call gives both loaders.

Example:
    >>> from feather_sparse.data import load_dataset
    >>> bundle = load_dataset("synthetic-cifar", batch_size=128, seed=0)
    >>> for epoch in range(2):
    ...     bundle.train.set_epoch(epoch)
    ...     for x, y in bundle.train:  # already on the device
    ...         pass

Registered data sets (``list_datasets()``): ``mnist1d`` (the bundled default,
generated locally and cached), ``cifar10`` / ``cifar100`` (python-format
archive), ``imagenet`` (class folders), and ``synthetic`` with its presets
``synthetic-cifar``, ``synthetic-imagenet``, ``synthetic-mnist1d``. Register a
new one with ``@DATASETS.register("name")`` on a builder
``(data_dir, config, **options) -> DataBundle``.

Every loader follows ``Loader``: batches on the device, ``len()`` batches per
epoch, and ``set_epoch(epoch)``; shuffling and augmentation are a pure function
of ``(seed, epoch)``, and with ``world_size > 1`` ranks get disjoint shards and
the same number of training batches (see ``DataBundle`` and ``loaders``).
"""

# Importing the modules registers their data sets.
from feather_sparse.data import cifar, imagenet, mnist1d, synthetic
from feather_sparse.data.base import (
    DATASETS,
    DataBundle,
    DatasetBuilder,
    LoaderConfig,
    check_dataset_options,
    list_datasets,
    load_dataset,
    tensor_bundle,
)
from feather_sparse.data.cache import cache_dir
from feather_sparse.data.loaders import Loader, TensorLoader, derive_seed, epoch_indices

__all__ = [
    "DATASETS",
    "DataBundle",
    "DatasetBuilder",
    "Loader",
    "LoaderConfig",
    "TensorLoader",
    "cache_dir",
    "check_dataset_options",
    "cifar",
    "derive_seed",
    "epoch_indices",
    "imagenet",
    "list_datasets",
    "load_dataset",
    "mnist1d",
    "synthetic",
    "tensor_bundle",
]
