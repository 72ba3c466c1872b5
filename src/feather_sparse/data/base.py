"""The data-set registry, ``load_dataset`` and the ``DataBundle`` it returns.

A data set is registered as a *builder*: a function
``builder(data_dir, config, **options) -> DataBundle`` where ``config`` is the
``LoaderConfig`` every data set shares (batch sizes, device, seed, rank) and
``options`` are the data set's own keyword arguments (``input_shape`` for
``synthetic``, ``mean``/``std`` for CIFAR, ...).

Example:
    >>> bundle = load_dataset("synthetic-mnist1d", batch_size=64)
    >>> bundle.input_shape, bundle.num_classes
    ((1, 40), 10)
    >>> x, y = next(iter(bundle.train))
    >>> tuple(x.shape), tuple(y.shape)
    ((64, 1, 40), (64,))
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from feather_sparse._text import plural
from feather_sparse.data.loaders import BatchTransform, Loader, TensorLoader
from feather_sparse.registry import Registry

__all__ = [
    "DATASETS",
    "DataBundle",
    "DatasetBuilder",
    "LoaderConfig",
    "check_dataset_options",
    "list_datasets",
    "load_dataset",
    "tensor_bundle",
]


@dataclass(frozen=True)
class LoaderConfig:
    """What every data set needs to build its loaders.

    Attributes:
        batch_size: samples per training batch *on each rank*.
        eval_batch_size: samples per test batch on each rank.
        device: where the loaders put their batches (and where in-memory data
            sets keep their tensors).
        seed: shuffling and augmentation are a pure function of
            ``(seed, epoch)``.
        rank: this process's index among ``world_size`` data-parallel ranks.
        world_size: number of data-parallel ranks.
        num_workers: worker processes for file-based data sets (ImageNet).
    """

    batch_size: int
    eval_batch_size: int
    device: torch.device
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    num_workers: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError(
                f"batch sizes must be >= 1, got batch_size={self.batch_size}, "
                f"eval_batch_size={self.eval_batch_size}"
            )
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"need 0 <= rank < world_size, got rank={self.rank}, world_size={self.world_size}"
            )
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")


@dataclass(frozen=True)
class DataBundle:
    """A data set ready for training: its two loaders and what a model needs to know.

    Attributes:
        name: the registered name of the data set.
        train: shuffled, augmented loader. With ``world_size > 1`` each rank sees
            a disjoint shard of every epoch's permutation, and every rank has the
            same number of batches: the remainder that does not fill one batch
            on every rank is dropped (a different remainder each epoch). With
            one rank the same rule drops only the last incomplete batch.
        test: unshuffled, unaugmented loader over *this rank's shard* of the
            test set: rank ``r`` gets samples ``r, r + world_size, ...``. The
            shards are disjoint and together hold every test sample exactly
            once (nothing dropped, nothing padded), so they may differ by one
            sample and one batch; sum correct counts and sample counts over
            ranks (``all_reduce``) after the loop, not per batch.
        num_classes: number of classes (labels are ``0 .. num_classes - 1``).
        input_shape: shape of one sample, channels first, e.g. ``(3, 32, 32)``.
        train_size: samples in the whole training set (all ranks).
        test_size: samples in the whole test set (all ranks).
    """

    name: str
    train: Loader
    test: Loader
    num_classes: int
    input_shape: tuple[int, ...]
    train_size: int
    test_size: int


# What the registry holds: ``builder(data_dir, config, **options) -> DataBundle``
# with ``data_dir: Path | None``, ``config: LoaderConfig`` and the data set's own
# options as keyword-only arguments.
DatasetBuilder = Callable[..., DataBundle]


def tensor_bundle(
    name: str,
    config: LoaderConfig,
    *,
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    num_classes: int,
    input_shape: tuple[int, ...],
    train_transform: BatchTransform | None = None,
    test_transform: BatchTransform | None = None,
) -> DataBundle:
    """A ``DataBundle`` of two ``TensorLoader``s over in-memory ``(x, y)`` pairs.

    The tensors are moved to ``config.device`` once, here, so batches are
    gathered and augmented there.

    Args:
        name: the data set's name.
        config: how to load it (device, batch size, seed, ...).
        train: the training ``(x, y)`` tensors.
        test: the test ``(x, y)`` tensors.
        num_classes: the number of classes.
        input_shape: one sample's shape.
        train_transform: applied to each training batch (augmentation), or None.
        test_transform: applied to each test batch, or None.
    """
    device = config.device
    x, y = (t.to(device) for t in train)
    x_test, y_test = (t.to(device) for t in test)
    common = {"seed": config.seed, "rank": config.rank, "world_size": config.world_size}
    train_loader = TensorLoader(
        x,
        y,
        batch_size=config.batch_size,
        shuffle=True,
        drop_last=True,
        transform=train_transform,
        **common,
    )
    test_loader = TensorLoader(
        x_test,
        y_test,
        batch_size=config.eval_batch_size,
        shuffle=False,
        drop_last=False,
        transform=test_transform,
        **common,
    )
    return DataBundle(
        name=name,
        train=train_loader,
        test=test_loader,
        num_classes=num_classes,
        input_shape=tuple(input_shape),
        train_size=int(x.shape[0]),
        test_size=int(x_test.shape[0]),
    )


DATASETS: Registry[DatasetBuilder] = Registry("dataset")


def list_datasets() -> list[str]:
    """The registered data-set names, sorted."""
    return DATASETS.names()


def check_dataset_options(name: str, **options: Any) -> None:
    """Raise unless the registered data set ``name`` takes these option names.

    Reads the builder's signature only: no data is loaded, and the values are
    not checked (the builder does that when it loads).

    Args:
        name: a registered name (see :func:`list_datasets`).
        **options: options of the data set, as for :func:`load_dataset`.

    Raises:
        ValueError: for an unknown name, or an option the data set does not
            take (listing those it does).

    Example:
        >>> check_dataset_options("mnist1d")
    """
    _check_options(name, DATASETS.get(name), options)


def _check_options(name: str, builder: DatasetBuilder, options: dict[str, Any]) -> None:
    """Reject options the builder does not take, listing the ones it does."""
    params = inspect.signature(builder).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [
        p.name
        for p in params.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in ("data_dir", "config")
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        choices = ", ".join(accepted) if accepted else "none"
        raise ValueError(
            f"dataset {name!r} does not take {plural(len(unknown), 'option')} "
            f"{', '.join(unknown)}; its options: {choices}"
        )


def load_dataset(
    name: str | DatasetBuilder,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    batch_size: int,
    eval_batch_size: int | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    num_workers: int = 0,
    **options: Any,
) -> DataBundle:
    """Load a registered data set and wrap it in train and test loaders.

    Args:
        name: a registered name (see ``list_datasets()``), or a builder
            function, which passes through.
        data_dir: where the data set lives on disk (CIFAR archive or folder,
            ImageNet root). ``mnist1d`` uses it as its cache folder; it defaults
            to the user cache (``$FEATHER_SPARSE_CACHE``, else
            ``$XDG_CACHE_HOME/feather-sparse``, else ``~/.cache/feather-sparse``).
        batch_size: training samples per batch on each rank.
        eval_batch_size: test samples per batch on each rank; defaults to
            ``batch_size``.
        device: where batches are delivered (in-memory data sets also keep
            their tensors there, so augmentation runs on that device).
        seed: shuffling and augmentation are a pure function of
            ``(seed, epoch)``: call ``loader.set_epoch(epoch)`` before each
            epoch, and a run resumed at epoch ``k`` sees the same batches as an
            uninterrupted one.
        rank: this process's data-parallel rank.
        world_size: number of data-parallel ranks.
        num_workers: worker processes for file-based data sets.
        **options: options of the data set itself.

    Returns:
        The loaders and the data set's shape facts; see ``DataBundle``.

    Raises:
        ValueError: for an unknown name or option, or bad sizes.
        FileNotFoundError: when the data set's files are not where expected.
        ImportError: when an optional dependency of the data set is missing.
    """
    builder = DATASETS.get(name)
    label = name if isinstance(name, str) else getattr(builder, "__name__", "dataset")
    _check_options(label, builder, options)
    config = LoaderConfig(
        batch_size=batch_size,
        eval_batch_size=batch_size if eval_batch_size is None else eval_batch_size,
        device=torch.device(device),
        seed=seed,
        rank=rank,
        world_size=world_size,
        num_workers=num_workers,
    )
    root = None if data_dir is None else Path(data_dir).expanduser()
    return builder(root, config, **options)
