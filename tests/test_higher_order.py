"""Gradients of gradients through a pruned model: ``create_graph=True`` and ``torch.func``.

A backward that is itself recorded (``torch.autograd.grad(..., create_graph=True)``
for a gradient penalty or a second-order method, and every ``torch.func.grad``)
runs the operators' backward with gradient mode on, where their in-place
``out=`` kernels cannot run. There the backward multiplies the incoming
gradient by a factor computed apart (1 on kept weights, θ on pruned ones), so
it stays differentiable and gives the first-order values bit for bit.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs
from _guards import guard
from feather_sparse.methods import METHODS
from feather_sparse.nm.fused import same_bits

NM_METHODS = {"feather-nm", "hard-nm", "sr-ste", "s-ste", "oneshot-nm"}


def pruned_mlp(method: str) -> tuple[nn.Module, fs.Pruner]:
    """A small MLP under ``method``, trained to its final sparsity (95 % when unstructured)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    kwargs = {} if method in NM_METHODS else {"sparsity": 0.95}
    pruner = fs.make_pruner(model, method, total_steps=10, **kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    for _ in range(10):
        x, y = torch.randn(8, 16, generator=gen), torch.randint(0, 8, (8,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        pruner.step()
    return model, pruner


@pytest.fixture(autouse=True)
def _quiet_collapse_warnings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)  # 95 % on a tiny MLP may collapse a layer: not the point


@pytest.mark.parametrize("method", METHODS.names())
def test_create_graph_gives_the_first_order_gradient_and_a_second_order_one(method: str) -> None:
    model, _ = pruned_mlp(method)
    x = torch.randn(4, 16)
    params = list(model.parameters())
    plain = torch.autograd.grad(model(x).pow(2).sum(), params)
    recorded = torch.autograd.grad(model(x).pow(2).sum(), params, create_graph=True)
    for a, b in zip(plain, recorded):
        assert same_bits(a, b.detach())
    penalty = sum(g.pow(2).sum() for g in recorded)
    second = torch.autograd.grad(penalty, params, allow_unused=True)
    assert any(g is not None and bool(g.abs().sum() > 0) for g in second)


@pytest.mark.parametrize("method", METHODS.names())
def test_torch_func_grad_equals_autograd(method: str) -> None:
    model, _ = pruned_mlp(method)
    x = torch.randn(4, 16)
    params = dict(model.named_parameters())

    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.func.functional_call(model, p, (x,)).pow(2).sum()

    grads = torch.func.grad(loss)(params)
    model.zero_grad()
    loss(params).backward()
    for name, param in params.items():
        assert same_bits(grads[name], param.grad), name


@pytest.mark.parametrize("pattern", [None, "2:4"], ids=["unstructured", "2:4"])
def test_second_order_gradient_matches_the_straight_through_derivation(
    pattern: str | None,
) -> None:
    """One bias-free Linear, ``L = ½‖x Wᵀ‖²`` with ``W = P_T(w)``: the STE's gradient is
    ``c ⊙ G`` with ``G = W xᵀx`` and ``c`` 1 on kept, θ on pruned weights, so the
    gradient of ``R = ‖c ⊙ G‖²`` is ``c ⊙ (2 (c² ⊙ G) xᵀx)``."""
    torch.manual_seed(3)
    layer = nn.Linear(16, 8, bias=False).double()
    theta = 0.5
    if pattern is None:
        pruner = fs.Pruner(layer, 0.6, total_steps=1, theta=theta, schedule="constant")
    else:
        pruner = fs.Pruner(layer, pattern=pattern, theta=theta)
    pruner.update(pruner.sparsity)
    w = pruner.weights()[0]
    x = torch.randn(5, 16, dtype=torch.float64)
    y = layer(x)
    (g,) = torch.autograd.grad(0.5 * y.pow(2).sum(), [w], create_graph=True)
    (second,) = torch.autograd.grad(g.pow(2).sum(), [w])
    with torch.no_grad():
        weight = layer.weight  # P_T(w)
        kept = ~pruner.backbone.pruned_mask(0, w, pruner.thresholds()[0])
        c = torch.where(kept, 1.0, theta).to(torch.float64)
        gram = x.T @ x
        big_g = weight @ gram
        expected_first = c * big_g
        expected = c * (2 * (c * c * big_g) @ gram)
    assert math.isclose(float(kept.float().mean()), 1 - pruner.sparsity, abs_tol=0.13)
    torch.testing.assert_close(g.detach(), expected_first)
    torch.testing.assert_close(second, expected)


@pytest.mark.parametrize("method", METHODS.names())
def test_per_sample_gradients_with_vmap(method: str) -> None:
    """``vmap(grad(...))`` over the data, the weights unbatched (as for DP-SGD): each
    sample's gradient is the one computed for that sample alone (up to the rounding
    of batched matrix products)."""
    model, _ = pruned_mlp(method)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(5, 16), torch.randint(0, 8, (5,))

    def loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = torch.func.functional_call(model, p, (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0))

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    for i in range(len(x)):
        alone = torch.func.grad(loss)(params, x[i], y[i])
        for name in params:
            torch.testing.assert_close(per_sample[name][i], alone[name], rtol=1e-5, atol=1e-7)


@guard(
    "`torch.func.vmap` over the pruned weights (a stacked ensemble of models)",
    "`NotImplementedError` saying that vmap over the data (per-sample gradients) works",
)
@pytest.mark.parametrize("kwargs", [{"sparsity": 0.9, "total_steps": 10}, {"pattern": "2:4"}])
def test_vmap_over_the_weights_is_refused_clearly(kwargs: dict) -> None:
    """A stacked ensemble (weights batched by vmap) gets a one-line NotImplementedError
    that says what works instead, not an error from inside an ``out=`` kernel."""
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
        fs.Pruner(model, **kwargs)
        models.append(model)
    params, buffers = torch.func.stack_module_state(models)
    x = torch.randn(4, 16)

    def run(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.func.functional_call(models[0], (p, b), (x,))

    with pytest.raises(NotImplementedError, match="per-sample gradients"):
        torch.func.vmap(run)(params, buffers)
