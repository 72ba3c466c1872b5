"""Helpers several test files share: one CPU thread, and the tiny 1-D convnet."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block on one intra-op thread, then restore the previous count.

    The tests' models are tiny: one thread is fastest, and several threads on a
    busy CPU spin against each other (5-100x slower). No result depends on it.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def conv1d_net(seed: int = 0, hidden: int = 32) -> nn.Module:
    """A seeded conv + two linear layers on ``(batch, 2, 16)`` inputs, 4 classes."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv1d(2, 8, 5, padding=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 16, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 4),
    )
