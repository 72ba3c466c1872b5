"""Shared pytest configuration: fixed seeds, one thread on request, `gpu` skips without CUDA."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from _helpers import one_thread as _one_thread_block


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The test runs on one intra-op thread (``pytest.mark.usefixtures("one_thread")``)."""
    with _one_thread_block():
        yield
