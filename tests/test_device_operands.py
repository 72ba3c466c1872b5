"""Every operand of the operators' kernels lives on the weight's device.

No GPU has run these paths yet, so the device rules are checked here on the
``meta`` device, which refuses any CPU tensor among a kernel's operands
(torch on a GPU refuses them in ternary kernels such as ``addcmul``, and
accepts a 0-d one only in binary kernels). Shapes and dtypes flow, no value
is computed: these tests check where the tensors live, not what they hold
(``tests/test_nm_devices.py`` checks the values, on a GPU when one is present).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

import feather_sparse as fs
from _guards import guard
from feather_sparse.nm import nm_threshold
from feather_sparse.ops import ThresholdOperator

META = torch.device("meta")


@pytest.mark.parametrize("p", [1.0, 2.5, 3.0, 5.0, math.inf])
@pytest.mark.parametrize("theta", [1.0, 0.5])
def test_the_operator_runs_on_the_weights_device(p: float, theta: float) -> None:
    w = torch.empty(64, 9, device=META, requires_grad=True)
    out = ThresholdOperator(p=p)(w, torch.empty((), device=META), theta)
    assert out.device == META and out.shape == w.shape
    out.backward(torch.empty_like(out))
    assert w.grad is not None and w.grad.device == META


@pytest.mark.parametrize("p", [1.0, 3.0, math.inf])
@pytest.mark.parametrize(("theta", "decay"), [(1.0, 0.0), (0.5, 0.0), (0.5, 2e-4)])
@pytest.mark.parametrize("ramp", [None, 0.5])
def test_the_nm_operator_runs_on_the_weights_device(
    p: float, theta: float, decay: float, ramp: float | None
) -> None:
    w = torch.empty(8, 16, device=META, requires_grad=True)
    r = 1.0 if ramp is None else torch.full((), ramp, device=META)
    out = nm_threshold(w, "2:4", r, p=p, theta=theta, decay=decay)
    assert out.device == META
    out.backward(torch.empty_like(out))
    assert w.grad is not None and w.grad.device == META


def test_a_fixed_mask_and_scale_run_on_the_weights_device() -> None:
    w = torch.empty(8, 16, device=META, requires_grad=True)
    mask = torch.empty(8, 16, dtype=torch.bool, device=META)
    out = nm_threshold(w, "2:4", mask=mask, theta=0.5, scale=torch.empty((), device=META))
    out.backward(torch.empty_like(out))
    assert w.grad is not None and w.grad.device == META


@guard(
    "a pruned model on a GPU, any operator, unstructured or N:M (checked on the `meta` "
    "device, the model moved there after the Pruner attached)",
    "forward and backward keep every operand on the weight's device: no CPU constant "
    "among a kernel's operands (`addcmul` on a GPU refuses one)",
)
@pytest.mark.parametrize(
    "settings",
    [
        {"sparsity": 0.9, "total_steps": 10},
        {"sparsity": 0.9, "total_steps": 10, "operator": "hard", "theta": 0.5},
        {"sparsity": 0.9, "total_steps": 10, "operator": "soft", "theta": 0.0},
        {"sparsity": 0.9, "total_steps": 10, "backbone": "asl+"},
        {"pattern": "2:4"},
        {"pattern": "2:4", "theta": 0.5},
        {"pattern": "2:4", "p": math.inf},
    ],
    ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()),
)
def test_a_pruned_model_moved_after_attaching_trains_there(settings: dict[str, object]) -> None:
    model = nn.Sequential(nn.Conv1d(4, 8, 4), nn.ReLU(), nn.Flatten(), nn.Linear(40, 8))
    pruner = fs.Pruner(model, **settings)  # type: ignore[arg-type]
    model(torch.randn(2, 4, 8)).sum().backward()
    pruner.step()
    model.to(META)
    assert {b.device for b in model.buffers()} <= {META}
    model(torch.empty(2, 4, 8, device=META)).sum().backward()
    assert all(p.grad is not None and p.grad.device == META for p in model.parameters())


@pytest.mark.parametrize("method", fs.METHODS.names())
def test_every_method_trains_on_the_device_the_model_moved_to(method: str) -> None:
    model = nn.Sequential(nn.Conv1d(4, 8, 4), nn.ReLU(), nn.Flatten(), nn.Linear(40, 8))
    nm = "pattern" in fs.METHODS.get(method).defaults
    settings = {"pattern": "2:4"} if nm else {"sparsity": 0.5}
    pruner = fs.make_pruner(model, method, total_steps=10, **settings)  # type: ignore[arg-type]
    for _ in range(2):
        model(torch.randn(2, 4, 8)).sum().backward()
        pruner.step()
    model.to(META)
    loss = model(torch.empty(2, 4, 8, device=META)).sum() + pruner.regularizer()
    loss.backward()
    assert all(p.grad is not None and p.grad.device == META for p in model.parameters())


def test_the_asl_regularizer_copies_nothing_from_the_host_at_each_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ASL+'s loss term runs in every training step: a tensor made there from Python
    data (``torch.tensor(sizes, device=...)``) would, on a GPU, wait for the device."""
    model = nn.Sequential(nn.Conv1d(4, 8, 4), nn.ReLU(), nn.Flatten(), nn.Linear(40, 8))
    pruner = fs.Pruner(model, sparsity=0.9, total_steps=10, backbone="asl+")
    first = pruner.regularizer()  # the first call may build what later ones reuse
    made: list[object] = []
    real = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: made.append(a) or real(*a, **k))
    for _ in range(3):
        again = pruner.regularizer()
    assert made == []
    assert torch.equal(again, first)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "settings",
    [
        {"sparsity": 0.9, "total_steps": 10},
        {"sparsity": 0.9, "total_steps": 10, "theta": 0.5},
        {"sparsity": 0.9, "total_steps": 10, "operator": "hard", "theta": 0.0},
        {"pattern": "2:4"},
        {"pattern": "2:4", "theta": 0.5},
        {"pattern": "2:4", "p": math.inf},
    ],
    ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()),
)
def test_forward_and_backward_on_cuda_never_wait_for_the_device(
    settings: dict[str, object],
) -> None:
    """The design's promise: thresholds stay on the device, the hot path reads none back."""
    model = nn.Sequential(nn.Conv1d(4, 8, 4), nn.ReLU(), nn.Flatten(), nn.Linear(40, 8)).cuda()
    pruner = fs.Pruner(model, **settings)  # type: ignore[arg-type]
    x = torch.randn(2, 4, 8, device="cuda")
    model(x).sum().backward()  # the first step initialises the libraries lazily
    pruner.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
    try:
        model(x).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@guard(
    "Spartan: `model.to(device)` after the Pruner attached and updated (its soft masks were "
    "made on the old device, tied to the weights there)",
    "the forward moves the masks and ties them again to the moved weights (same values, a "
    "backward on the new device), where it failed on a mask left on the old device",
)
def test_spartan_masks_follow_a_model_moved_after_an_update() -> None:
    model = nn.Sequential(nn.Conv1d(4, 8, 4), nn.ReLU(), nn.Flatten(), nn.Linear(40, 8))
    pruner = fs.make_pruner(model, "spartan", total_steps=10, sparsity=0.5)
    for _ in range(2):
        model(torch.randn(2, 4, 8)).sum().backward()
        pruner.step()
    backbone: Any = pruner.backbone
    before = [m.detach().clone() for m in backbone._masks]
    assert all(m.grad_fn is not None for m in backbone._masks)  # tied to the weights
    model.to(META)
    out = model(torch.empty(2, 4, 8, device=META))
    assert out.device == META
    assert all(m.device == META and m.grad_fn is not None for m in backbone._masks)
    assert [m.shape for m in backbone._masks] == [m.shape for m in before]
