"""`check_model_takes` leaves every random state it could move as it was.

Its one forward runs in evaluation mode, where dropout draws nothing; a model
that draws random numbers in evaluation mode anyway (noise injection, a
sampling layer) would still move the random state of the device it draws on,
and a seeded run would then draw different numbers from its first batch on.
The check forks the CPU's random state and that of every accelerator the model
is on (``train.fit._rng_devices``).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from _guards import guard
from feather_sparse.train.fit import _rng_devices, check_model_takes


class _Noisy(nn.Module):
    """Adds uniform noise on its own device in every mode."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(40, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return self.fc(x + torch.rand_like(x))


def _check(model: nn.Module) -> None:
    check_model_takes(model, model_name="noisy", dataset="mnist1d", shape=(1, 40), num_classes=3)


@guard(
    "a model that draws random numbers in evaluation mode, checked by `check_model_takes`",
    "the check runs in a forked random state: what a seeded run draws next is unchanged",
)
def test_the_cpu_random_state_is_unchanged() -> None:
    model = _Noisy()
    torch.manual_seed(3)
    expected = torch.rand(5)
    torch.manual_seed(3)
    _check(model)
    assert torch.equal(torch.rand(5), expected)


class _Placed(nn.Module):
    """A module whose parameters and buffers report the given devices (no storage)."""

    def __init__(self, params: list[str], buffers: list[str]) -> None:
        super().__init__()
        self._p = [SimpleNamespace(device=torch.device(d)) for d in params]
        self._b = [SimpleNamespace(device=torch.device(d)) for d in buffers]

    def parameters(self, recurse: bool = True) -> Iterator[Any]:
        return iter(self._p)

    def buffers(self, recurse: bool = True) -> Iterator[Any]:
        return iter(self._b)


def test_every_accelerator_the_model_is_on_is_forked() -> None:
    model = _Placed(["cuda:1", "cpu", "cuda:0"], ["cuda:1", "meta", "cuda"])
    # "cuda" without an index is the current device, forked as device 0
    assert _rng_devices(model) == {"cuda": [0, 1]}


def test_a_model_on_the_cpu_forks_no_device() -> None:
    assert _rng_devices(nn.Linear(4, 2)) == {}
    assert _rng_devices(_Placed(["cpu"], ["meta"])) == {}
    assert _rng_devices(nn.Module()) == {}


def test_a_device_type_without_a_restorable_state_is_left_out() -> None:
    # torch has no module for "xla" without torch_xla: forking it would raise, and the
    # check would then report that the model does not take the data
    assert _rng_devices(_Placed(["xla:0", "cuda:2"], [])) == {"cuda": [2]}


@guard(
    "a model on a GPU that draws random numbers in evaluation mode, checked by `check_model_takes`",
    "the GPU's random state is forked too: what a seeded run draws there next is unchanged",
)
@pytest.mark.gpu
def test_the_cuda_random_state_is_unchanged() -> None:
    model = _Noisy().cuda()
    torch.cuda.manual_seed(5)
    expected = torch.rand(5, device="cuda")
    torch.cuda.manual_seed(5)
    _check(model)
    assert torch.equal(torch.rand(5, device="cuda"), expected)
