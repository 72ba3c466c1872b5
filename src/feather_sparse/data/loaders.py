"""Deterministic, rank-sharded batch loaders.

Every loader follows one small protocol (``Loader``): iterating yields
``(x, y)`` batches already on the training device, ``len()`` is the number of
batches per epoch on this rank, and ``set_epoch(epoch)`` selects the epoch. The
shard, order and batch count of each epoch live in one place, ``EpochShard``,
which the loaders (and ImageNet's batch sampler) build on.

Shuffling and augmentation never touch the global RNG. Each epoch draws from
its own ``torch.Generator`` seeded by ``derive_seed(seed, epoch, ...)``, so the
batches of epoch ``k`` are a pure function of ``(seed, k)``: a run resumed at
epoch ``k`` sees exactly what an uninterrupted run sees, and iterating the same
epoch twice gives the same batches. The random numbers are drawn on the CPU
(and moved to the device when needed), so a CPU and a GPU run see the same
permutation and the same crops and flips.

Sharding (``epoch_indices``) follows ``torch.utils.data.DistributedSampler``'s
strided split, with one difference: neither split pads with repeated samples.

* train (``drop_last=True``): the permutation is cut to a whole number of
  *global* batches (``batch_size * world_size``) and rank ``r`` takes
  positions ``r, r + world_size, ...``; every rank has the same number of full
  batches, and the few samples that do not fill one global batch are skipped
  (a different few each epoch).
* test (``drop_last=False``): rank ``r`` takes samples ``r, r + world_size, ...``
  of the whole set, so the shards cover it exactly once and may differ by one
  sample (and so by one batch).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = [
    "AUGMENT_STREAM",
    "SHUFFLE_STREAM",
    "BatchTransform",
    "EpochShard",
    "Loader",
    "TensorLoader",
    "derive_seed",
    "epoch_generator",
    "epoch_indices",
    "num_batches",
]

_MASK64 = (1 << 64) - 1

# Independent random streams of one epoch: the permutation and the
# augmentation, so switching augmentation off does not change the order.
SHUFFLE_STREAM = 1
AUGMENT_STREAM = 2


@runtime_checkable
class Loader(Protocol):
    """What the training loop iterates over.

    ``__iter__`` yields ``(x, y)`` on the training device (``x`` float32,
    ``y`` int64 class indices), ``__len__`` is batches per epoch on this rank,
    and ``set_epoch`` selects the epoch whose shuffle and augmentation to use.
    """

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]: ...

    def __len__(self) -> int: ...

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s shuffle and augmentation from now on.

        Args:
            epoch: the epoch whose shuffle and augmentation to use.
        """


# A batch transform gets the raw batch (on the device) and the epoch's
# augmentation generator (CPU) and returns the model's input.
BatchTransform = Callable[[Tensor, torch.Generator], Tensor]


def _splitmix64(x: int) -> int:
    # SplitMix64 finaliser (Steele, Lea & Flood 2014): a bijective 64-bit mix,
    # so nearby seeds and epochs give unrelated generator states.
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(*parts: int) -> int:
    """A 63-bit seed that is a pure function of ``parts`` (seed, epoch, stream, ...).

    Args:
        *parts: integers the seed depends on, in order.

    Example:
        >>> derive_seed(0, 3, SHUFFLE_STREAM) == derive_seed(0, 3, SHUFFLE_STREAM)
        True
    """
    h = 0
    for part in parts:
        h = _splitmix64(h ^ (part & _MASK64))
    return h >> 1  # torch.Generator.manual_seed takes a non-negative int64


def epoch_generator(*parts: int) -> torch.Generator:
    """A fresh CPU generator seeded with ``derive_seed(*parts)``.

    Args:
        *parts: integers the seed depends on, in order (see :func:`derive_seed`).
    """
    return torch.Generator().manual_seed(derive_seed(*parts))


def num_batches(n: int, batch_size: int, *, drop_last: bool, rank: int, world_size: int) -> int:
    """Batches per epoch on ``rank`` for ``n`` samples (see the module docstring).

    Args:
        n: the number of samples.
        batch_size: samples per batch.
        drop_last: whether an incomplete last batch is dropped.
        rank: this process's rank.
        world_size: the number of processes the samples are split over.
    """
    if drop_last:
        return n // (batch_size * world_size)
    shard = len(range(rank, n, world_size))
    return math.ceil(shard / batch_size)


def epoch_indices(
    n: int,
    *,
    batch_size: int,
    shuffle: bool,
    drop_last: bool,
    seed: int,
    epoch: int,
    rank: int = 0,
    world_size: int = 1,
) -> Tensor:
    """This rank's sample order for one epoch, as a CPU int64 tensor.

    Args:
        n: samples in the data set.
        batch_size: samples per batch on each rank.
        shuffle: permute with a generator seeded by ``(seed, epoch)``.
        drop_last: keep only whole global batches, so every rank gets the same
            number of full batches (train); otherwise keep every sample (test).
        seed: base seed of the run.
        epoch: the epoch whose permutation to use.
        rank: this rank.
        world_size: number of ranks.
    """
    if shuffle:
        order = torch.randperm(n, generator=epoch_generator(seed, epoch, SHUFFLE_STREAM))
    else:
        order = torch.arange(n)
    if drop_last:
        global_batch = batch_size * world_size
        order = order[: (n // global_batch) * global_batch]
    return order[rank::world_size]


class EpochShard:
    """This rank's share of every epoch of ``n`` samples: order, batch count, epoch.

    The state every loader keeps to shard and shuffle (see the module
    docstring); a loader subclasses it and adds what it delivers.

    Args:
        n: samples in the data set.
        batch_size: samples per batch on this rank.
        shuffle: reshuffle every epoch (train).
        drop_last: drop what does not fill a global batch (train).
        seed: base seed; shuffling and augmentation depend only on
            ``(seed, epoch)`` (and the rank, for augmentation).
        rank: this rank.
        world_size: number of ranks.
        what: what the samples are, for the error message.

    Raises:
        ValueError: if ``drop_last`` leaves no batch at all.
    """

    def __init__(
        self,
        n: int,
        *,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        what: str = "samples",
    ) -> None:
        self.n = n
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        if len(self) == 0 and drop_last:
            raise ValueError(
                f"{n} training {what} do not fill one global batch of "
                f"{batch_size} x {world_size} ranks; lower batch_size"
            )

    @property
    def num_samples(self) -> int:
        """Samples this rank sees per epoch."""
        return self.indices().numel()

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s permutation and augmentation from now on.

        Args:
            epoch: the epoch whose permutation and augmentation to use.
        """
        self.epoch = epoch

    def indices(self) -> Tensor:
        """This rank's sample order for the current epoch (CPU int64)."""
        return epoch_indices(
            self.n,
            batch_size=self.batch_size,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
            seed=self.seed,
            epoch=self.epoch,
            rank=self.rank,
            world_size=self.world_size,
        )

    def batch_slices(self) -> Iterator[slice]:
        """The positions in ``indices()`` of each of this epoch's batches, in order."""
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            yield slice(start, start + self.batch_size)

    def __len__(self) -> int:
        return num_batches(
            self.n,
            self.batch_size,
            drop_last=self.drop_last,
            rank=self.rank,
            world_size=self.world_size,
        )


class TensorLoader(EpochShard):
    """Batches of in-memory tensors that already live on the training device.

    Args:
        x: samples, ``(N, ...)``, on the training device (any dtype the
            transform understands; float32 when there is no transform).
        y: int64 labels, ``(N,)``, on the same device.
        batch_size: samples per batch on this rank.
        shuffle: reshuffle every epoch (train).
        drop_last: drop what does not fill a global batch (train).
        seed: base seed; shuffling and augmentation depend only on
            ``(seed, epoch)`` (and the rank, for augmentation).
        rank: this rank.
        world_size: number of ranks.
        transform: applied to every batch on the device, with the epoch's
            augmentation generator.

    Raises:
        ValueError: if ``drop_last`` leaves no batch at all.
    """

    def __init__(
        self,
        x: Tensor,
        y: Tensor,
        *,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        transform: BatchTransform | None = None,
    ) -> None:
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"x has {x.shape[0]} samples but y has {y.shape[0]} labels")
        super().__init__(
            x.shape[0],
            batch_size=batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            seed=seed,
            rank=rank,
            world_size=world_size,
        )
        self.x = x
        self.y = y
        self.transform = transform

    @property
    def device(self) -> torch.device:
        """Where the batches are delivered."""
        return self.x.device

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        order = self.indices()
        # The augmentation stream also depends on the rank: ranks see
        # different samples and should not share crop offsets batch for batch.
        generator = epoch_generator(self.seed, self.epoch, AUGMENT_STREAM, self.rank)
        identity = not self.shuffle and self.world_size == 1
        if not identity:
            order = order.to(self.device)
        for batch in self.batch_slices():
            if identity:  # plain slices are views: no gather, no copy
                x = self.x[batch]
                y = self.y[batch]
            else:
                idx = order[batch]
                x = self.x.index_select(0, idx)
                y = self.y.index_select(0, idx)
            if self.transform is not None:
                x = self.transform(x, generator)
            yield x, y

    def __repr__(self) -> str:
        return (
            f"TensorLoader(samples={self.x.shape[0]}, batch_size={self.batch_size}, "
            f"batches={len(self)}, shuffle={self.shuffle}, rank={self.rank}/{self.world_size}, "
            f"device={self.device})"
        )
