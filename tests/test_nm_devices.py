"""The N:M operator and Pruner on every device present: CPU always, CUDA when there is one.

Each test runs the same checks on the CPU and (marked ``gpu``) on a CUDA
device, against references computed here independently of the library: a
float64 per-group formula for the operator, exact pattern counts for the
Pruner, bit-equal resumes. The CPU run keeps the checks themselves honest on
machines without a GPU; the CUDA run is what a GPU session adds.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs
from feather_sparse.nm import NMPattern, group_view, nm_threshold

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
NM_METHODS = ["feather-nm", "hard-nm", "sr-ste", "s-ste", "oneshot-nm"]


def exact_weights(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Multiples of 1/64 in (-4, 4): their cubes and cube differences are exact in
    float32, and the narrow range gives many ties within groups."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-255, 256, (rows, cols), generator=g).float() / 64


def reference(w: torch.Tensor, pattern: NMPattern, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``P_T(w)`` in float64 by a sort, and the pruned positions (where the gradient is θ·g)."""
    x = w.double().reshape(-1, pattern.m)
    a = x.abs()
    t = a.sort(dim=1).values[:, pattern.m - pattern.n - 1 : pattern.m - pattern.n]
    if math.isinf(p):
        # the n largest, a lower position winning a tie (a stable descending sort)
        order = a.sort(dim=1, descending=True, stable=True).indices
        keep = torch.zeros_like(a, dtype=torch.bool).scatter_(1, order[:, : pattern.n], True)
        out = torch.where(keep, x, torch.zeros_like(x))
        pruned = ~keep
    else:
        out = x.sign() * (a.pow(p) - t.pow(p)).clamp(min=0).pow(1 / p)
        pruned = a <= t
    return out.reshape(w.shape), pruned.reshape(w.shape)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", ["2:4", "1:4", "4:8"])
@pytest.mark.parametrize("p", [1.0, 3.0, math.inf])
def test_operator_matches_a_float64_reference(device: str, spec: str, p: float) -> None:
    pattern = NMPattern.parse(spec)
    w = exact_weights(48, 64, seed=pattern.m + int(min(p, 9)))
    ref, pruned = reference(w, pattern, p)
    x = w.to(device).requires_grad_(True)
    out = nm_threshold(x, pattern, p=p, theta=0.25)
    assert out.device.type == device and out.dtype == torch.float32
    got = out.detach().cpu()
    assert torch.equal(got == 0, ref == 0)  # the same positions pruned, ties included
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=0.0)
    grad = torch.arange(1.0, w.numel() + 1).reshape(w.shape)
    out.backward(grad.to(device))
    assert x.grad is not None
    assert torch.equal(x.grad.cpu(), torch.where(pruned, 0.25 * grad, grad))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_weights_match_the_reference_in_their_dtype(device: str, dtype: torch.dtype) -> None:
    w = exact_weights(32, 32, seed=3).to(dtype)  # multiples of 1/64 below 4 are exact in both
    ref, _ = reference(w.float(), NMPattern(2, 4), 3.0)
    got = nm_threshold(w.to(device), "2:4").cpu()
    assert got.dtype == dtype
    assert torch.equal(got == 0, ref == 0)
    torch.testing.assert_close(got, ref.to(dtype))  # dtype's own tolerance (one rounding)


def mlp(device: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).to(device)


def train(model: nn.Module, pruner: fs.Pruner, opt: torch.optim.Optimizer, steps: range) -> None:
    device = next(model.parameters()).device
    for i in steps:
        g = torch.Generator().manual_seed(100 + i)
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 8, (8,), generator=g)
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", NM_METHODS)
def test_every_method_trains_and_finalizes_to_the_pattern(device: str, method: str) -> None:
    model = mlp(device)
    pruner = fs.make_pruner(model, method, pattern="2:4", total_steps=6)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, pruner, opt, range(6))
    pruner.finalize()
    for layer in (model[0], model[2]):
        assert layer.weight.device.type == device
        assert torch.isfinite(layer.weight).all()
        counts = (group_view(layer.weight, NMPattern(2, 4)) != 0).sum(1)
        if method == "s-ste":  # soft thresholding: a kept weight tied with T_g maps to 0
            assert (counts <= 2).all() and (counts == 2).float().mean() > 0.9
        else:
            assert (counts == 2).all()


@pytest.mark.parametrize("device", DEVICES)
def test_resume_from_state_dicts_is_bit_exact(device: str) -> None:
    def fresh() -> tuple[nn.Module, fs.Pruner, torch.optim.Optimizer]:
        m = mlp(device)
        pr = fs.Pruner(m, pattern="2:4", theta=0.5, total_steps=8, schedule="cubic")
        return m, pr, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    model, pruner, opt = fresh()
    train(model, pruner, opt, range(3))
    saved = copy.deepcopy(
        {"model": model.state_dict(), "pruner": pruner.state_dict(), "opt": opt.state_dict()}
    )
    train(model, pruner, opt, range(3, 8))

    resumed, rpruner, ropt = fresh()
    resumed.load_state_dict(saved["model"])
    rpruner.load_state_dict(saved["pruner"])
    ropt.load_state_dict(saved["opt"])
    train(resumed, rpruner, ropt, range(3, 8))
    for a, b in zip(model.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_a_model_pruned_on_the_device_loads_on_the_cpu(device: str) -> None:
    """A checkpoint written on the device restores a CPU model, Pruner included."""
    model = mlp(device)
    pruner = fs.Pruner(model, pattern="2:4", total_steps=4)
    train(model, pruner, torch.optim.SGD(model.parameters(), lr=0.1), range(4))
    state = {"model": model.state_dict(), "pruner": pruner.state_dict()}
    cpu = mlp("cpu", seed=1)
    cpu_pruner = fs.Pruner(cpu, pattern="2:4", total_steps=4)
    cpu.load_state_dict({k: v.cpu() for k, v in state["model"].items()})
    cpu_pruner.load_state_dict(state["pruner"])
    pruner.finalize()
    cpu_pruner.finalize()
    for a, b in zip(model.state_dict().values(), cpu.state_dict().values(), strict=True):
        # P_T's cube roots may round differently on another device's math library
        torch.testing.assert_close(a.cpu(), b, rtol=1e-6, atol=0.0)
        assert torch.equal(a.cpu() == 0, b == 0)


@pytest.mark.gpu
def test_compiled_training_step_on_cuda_matches_eager() -> None:
    """Inductor (Triton on a GPU) gives the eager forward and gradients, to rounding."""

    def step(compiled: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model = mlp("cuda")
        fs.Pruner(model, pattern="2:4", theta=0.5)
        run = torch.compile(model) if compiled else model
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(7)).cuda()
        out = run(x)
        out.square().sum().backward()
        return out.detach(), [p.grad for p in model.parameters()]

    eager, eager_grads = step(False)
    compiled, compiled_grads = step(True)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(compiled_grads, eager_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
