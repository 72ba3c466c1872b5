"""Tests that close the gaps a mutation audit of the unstructured baselines found.

Each test here fails on one or more hand-made mutants of ``baselines.py`` (ST-3's
operator and rescale, Spartan's Sinkhorn soft top-k and its budget polish, the
implicit-gradient backward, the Spartan backbone's checks, β ramp, freeze, budget,
solver settings, state and config) that the rest of the suite let through
(``docs/mutation-audit.md``, "The unstructured baselines"; the mutants' ids are in
each test's docstring). The expected values are worked out here: by hand, from
references of ALGORITHMS.md's formulas written here in float64 (the published
Sinkhorn iteration, the fixed point ``Σ m = k`` by bisection, the implicit
gradient), never read back from the code under test. Nothing trains for more
than ten steps of a small CNN.
"""

from __future__ import annotations

import copy
import logging
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs
from feather_sparse import baselines
from feather_sparse.baselines import SpartanBackbone, st3_rescale
from test_baselines import SmallCNN, batch, optimizer, train
from test_mutation_gaps_train import forward_weight, soft_topk_reference, st3_reference

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------- ST-3
def test_st3_rescales_a_1d_weight_over_the_whole_tensor() -> None:
    """A 1-d weight is one channel: ``ρ`` is taken over the whole tensor.

    ``st3_rescale``'s docstring: "over each output channel (dim 0; the whole
    tensor for a 1-d weight)". Worked out by hand at ``T = 0.8``. It pins the
    1-d case, which no test reached: bas02 (the reduction over ``()``) is
    equivalent under torch 2.13, where ``mean(())`` reduces every dimension;
    the test fails on bas01, bas04 and bas05.
    """
    w = torch.tensor([2.0, -0.5, 1.0, -3.0])
    rho = (6.0 / 4 + 1e-6) / (6.5 / 4 + 1e-6)  # kept 2, 1, 3 of 2, .5, 1, 3
    s = 1.01 / (rho + 0.01)
    got = st3_rescale(w, 0.8)
    assert got.shape == (1,)
    assert got.item() == pytest.approx(s, rel=1e-6)
    out = fs.ST3Operator()(w, torch.tensor(0.8), theta=1.0)
    want = torch.tensor([1.2 * s, 0.0, 0.2 * s, -2.2 * s])
    assert torch.allclose(out, want, rtol=1e-6)


def test_st3_keeps_a_half_precision_weight_in_its_dtype() -> None:
    """bas06: the forward is computed in float32 and rounded once to the weight's dtype.

    A bfloat16 layer fed a float32 weight would fail in ``F.linear``; the values
    are the float64 reference rounded to bfloat16.
    """
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 6, generator=g).to(torch.bfloat16)
    out = fs.ST3Operator()(w, torch.tensor(0.5), theta=1.0)
    assert out.dtype == torch.bfloat16
    want = st3_reference(w.double(), 0.5)
    assert torch.allclose(out.double(), want, rtol=2**-7, atol=0)
    layer = nn.Linear(6, 4).to(torch.bfloat16)
    fs.Pruner(layer, 0.5, 10, operator="st3", schedule="constant")
    assert layer(torch.ones(2, 6, dtype=torch.bfloat16)).dtype == torch.bfloat16


# ------------------------------------------------------------- Sinkhorn top-k
def sinkhorn_reference(
    values: list[torch.Tensor], k: float, beta: float, tau: float, max_iters: int, tol: float
) -> tuple[torch.Tensor, float, int]:
    """The published iteration (ALGORITHMS.md, Spartan), unit costs, in float64, on
    the concatenated values: ``z = β(u − τ)``, ``μ = 0``, ``ν = −softplus(z)``;
    repeat ``μ = log k − logsumexp(z + ν)``, ``ν = −softplus(z + μ)``,
    ``m = exp(z + μ + ν)`` until the relative change of ``Σ m·v`` is below ``tol``
    (the change from the previous iteration; the first from ``m = sigmoid(z)``).
    Returns the masks (concatenated), ``μ`` and the iterations run."""
    v = torch.cat([x.double().reshape(-1) for x in values])
    z = beta * (v - tau)
    mu, nu = 0.0, -F.softplus(z)
    m = torch.sigmoid(z)
    prev = float((m * v).sum())
    done = 0
    for it in range(1, max_iters + 1):
        done = it
        mu = math.log(k) - float(torch.logsumexp(z + nu, 0))
        nu = -F.softplus(z + mu)
        m = torch.exp(z + mu + nu)
        obj = float((m * v).sum())
        if abs(obj - prev) <= tol * abs(prev):
            break
        prev = obj
    return m, mu, done


def values_of(scale: float) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [
        scale * torch.rand(30, generator=g, dtype=torch.float64),
        scale * torch.rand(4, 5, generator=g, dtype=torch.float64),
    ]


@pytest.mark.parametrize(
    ("scale", "beta", "max_iters", "tol"),
    [(1.0, 6.0, 1, 0.01), (1.0, 6.0, 3, 1e-9), (1.0, 6.0, 100, 1e-3), (1e-3, 6000.0, 100, 1e-3)],
)
def test_sinkhorn_without_the_polish_is_the_published_iteration(
    scale: float, beta: float, max_iters: int, tol: float
) -> None:
    """bas09, bas10, bas11, bas14, bas16: with ``max_newton=0`` the result is the
    published iteration's: its masks and ``μ`` after as many iterations as the
    relative stopping rule runs (the iteration count reported as ``iterations``,
    none as ``newton_steps``), and ``budget_error = |Σ m − k| / k``.

    The last case has small values (``Σ m·v`` about 0.01): only a relative rule
    keeps iterating there.
    """
    values, k, tau = values_of(scale), 12.0, 0.4 * scale
    got = fs.sinkhorn_topk(values, k, beta, tau=tau, max_iters=max_iters, tol=tol, max_newton=0)
    m, mu, iterations = sinkhorn_reference(values, k, beta, tau, max_iters, tol)
    if max_iters == 100:
        assert 2 < iterations < 100  # the stopping rule, not max_iters, ended it
    assert (got.iterations, got.newton_steps) == (iterations, 0)
    assert got.mu == pytest.approx(mu, abs=1e-9)
    assert got.tau == tau
    assert torch.allclose(torch.cat([x.reshape(-1) for x in got.masks]), m, atol=1e-12)
    error = abs(float(m.sum()) - k) / k
    assert error > 1e-4  # the budget is not met without the polish...
    assert got.budget_error == pytest.approx(error, rel=1e-9)  # ...and says by how much


def test_budget_polish_stops_at_the_relative_tolerance() -> None:
    """bas13: the polish runs until ``|Σ m − k| <= budget_tol·k`` (relative to ``k``).

    Sinkhorn (``tol = 1e-3``) misses the budget by a relative ``e`` (about 1e-3, so
    ``|Σ m − k|`` is about 0.01): asked for ``2e``, nothing is polished; asked for
    ``e / 2``, it is, down to ``e / 2``.
    """
    values, k, tau = values_of(1.0), 12.0, 0.4
    m, _, _ = sinkhorn_reference(values, k, 6.0, tau, 100, 1e-3)
    e = abs(float(m.sum()) - k) / k
    assert 1e-4 < e < 0.01
    loose = fs.sinkhorn_topk(values, k, 6.0, tau=tau, tol=1e-3, budget_tol=2 * e)
    assert loose.newton_steps == 0
    assert torch.allclose(torch.cat([x.reshape(-1) for x in loose.masks]), m, atol=1e-12)
    tight = fs.sinkhorn_topk(values, k, 6.0, tau=tau, tol=1e-3, budget_tol=e / 2)
    assert tight.newton_steps >= 1
    total = sum(float(x.sum()) for x in tight.masks)
    assert abs(total - k) <= e / 2 * k


def test_a_budget_missed_after_the_polish_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """bas15: ``Σ m`` still off ``k`` when the polishing steps run out is logged as a warning."""
    values, k = values_of(1.0), 12.0
    with caplog.at_level(logging.WARNING, logger="feather_sparse.baselines"):
        fs.sinkhorn_topk(values, k, 6.0, max_iters=1, max_newton=0)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "budget error" in caplog.records[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="feather_sparse.baselines"):
        fs.sinkhorn_topk(values, k, 6.0)  # polished: met
    assert caplog.records == []


@pytest.mark.parametrize(
    ("k", "beta", "message"),
    [
        (0.0, 1.0, r"the budget k must be in \(0, 50\), got 0\.0"),
        (50.0, 1.0, r"the budget k must be in \(0, 50\), got 50\.0"),
        (51.0, 1.0, r"the budget k must be in \(0, 50\), got 51\.0"),
        (-1.0, 1.0, r"the budget k must be in \(0, 50\), got -1\.0"),
        (5.0, 0.0, r"beta must be > 0, got 0\.0"),
        (5.0, -1.0, r"beta must be > 0, got -1\.0"),
    ],
)
def test_sinkhorn_refuses_a_budget_outside_0_n_and_a_beta_not_positive(
    k: float, beta: float, message: str
) -> None:
    """bas07, bas08: ``0 < k < N`` and ``β > 0`` (the docstring's Raises); N = 50 here."""
    with pytest.raises(ValueError, match=message):
        fs.sinkhorn_topk(values_of(1.0), k, beta)


def test_soft_topk_mask_passes_its_budget_tolerance_on() -> None:
    """bas19: ``soft_topk_mask(..., budget_tol=)`` is the solver's: a loose one is not polished.

    Sinkhorn (``tol = 1e-3``) misses the budget by a relative ``e`` < 1 %; asked
    for 1 %, the masks are the published iteration's, unpolished.
    """
    g = torch.Generator().manual_seed(5)
    weights = [
        torch.randn(30, generator=g, dtype=torch.float64),
        torch.randn(4, 5, generator=g, dtype=torch.float64),
    ]
    values = [w.abs() for w in weights]
    m, _, _ = sinkhorn_reference(values, 12.0, 6.0, 0.4, 100, 1e-3)
    assert 1e-4 < abs(float(m.sum()) - 12.0) / 12.0 < 0.01
    got = fs.soft_topk_mask(weights, 12.0, 6.0, tau=0.4, tol=1e-3, budget_tol=0.01)
    assert torch.allclose(torch.cat([x.detach().reshape(-1) for x in got]), m, atol=1e-12)


def test_a_binary_mask_has_a_zero_not_a_nan_gradient() -> None:
    """bas17: where every ``m(1 − m)`` is 0 (a saturated, binary mask) the budget term
    ``Σ g·m(1 − m) / Σ m(1 − m)`` is 0/0: the gradient through the mask is 0.

    ``τ = 2.5`` and ``β = 1000`` put every ``β(|w| − τ)`` 500 or more from 0: in
    float32 the masks are exactly 0, 0, 1, 1 and already meet ``k = 2``.
    """
    w = torch.tensor([1.0, -2.0, 3.0, -4.0], requires_grad=True)
    (m,) = fs.soft_topk_mask([w], 2.0, beta=1000.0, tau=2.5)
    assert torch.equal(m.detach(), torch.tensor([0.0, 0.0, 1.0, 1.0]))
    (m * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    assert w.grad is not None and torch.equal(w.grad, torch.zeros(4))


# ------------------------------------------------------------ SpartanBackbone
@pytest.mark.parametrize(
    "kwargs",
    [
        {"beta_init": 0.0},
        {"beta_init": 2.0, "beta_target": 1.0},
        {"freeze_at": -0.1},
        {"freeze_at": 1.1},
        {"max_iters": 0},
        {"tol": 0.0},
        {"budget_tol": 0.0},
        {"budget_tol": -1e-6},
    ],
)
def test_spartan_refuses_bad_settings(kwargs: dict[str, Any]) -> None:
    """bas22: ``0 < beta_init <= beta_target``, ``freeze_at`` in [0, 1], ``max_iters >= 1``,
    ``tol > 0`` and ``budget_tol > 0`` (a budget_tol of 0 would polish every update
    to ``max_newton`` steps and warn)."""
    with pytest.raises(ValueError):
        SpartanBackbone(**kwargs)


def test_spartan_takes_a_constant_beta_and_a_freeze_at_the_first_update() -> None:
    """bas20, bas21, bas24: the bounds are inclusive: ``beta_init == beta_target`` (a
    constant β) and ``freeze_at = 0`` (the mask solved once, at the first update,
    with β at its target) are valid settings."""
    constant = SpartanBackbone(beta_init=5.0, beta_target=5.0)
    assert [constant.beta_at(s, 10) for s in (0, 4, 8, 9)] == [5.0] * 4
    at_once = SpartanBackbone(freeze_at=0.0)
    assert at_once.freeze_step(10) == 0
    assert at_once.beta_at(0, 10) == 20.0
    torch.manual_seed(0)
    model = SmallCNN()
    pruner = fs.Pruner(model, 0.5, 10, backbone=at_once, schedule="constant")
    assert at_once.frozen and at_once.beta == 20.0
    n = pruner.num_params
    assert sum(int((forward_weight(t.module) == 0).sum()) for t in pruner.targets) == n // 2


def test_spartan_freezes_at_the_floor_of_freeze_at_times_total() -> None:
    """bas23: the freeze step is ``floor(freeze_at·total)`` (0.8·7 = 5.6: step 5), and
    β reaches its target there."""
    bb = SpartanBackbone()
    assert bb.freeze_step(7) == 5
    assert bb.beta_at(4, 7) == pytest.approx(1.0 + 19.0 * 4 / 5)
    assert bb.beta_at(5, 7) == 20.0
    torch.manual_seed(0)
    model = SmallCNN()
    pruner = fs.make_pruner(model, "spartan", sparsity=0.5, total_steps=7, backbone=bb)
    opt = optimizer(model, pruner)
    train(model, pruner, opt, range(4))
    assert not bb.frozen
    train(model, pruner, opt, range(4, 5))  # step 5
    assert bb.frozen


def test_spartans_soft_budget_is_the_hard_top_k_count() -> None:
    """bas25, bas33: the soft masks sum to ``k = N − round(s·N)``, the number of weights
    the hard part keeps; the Pruner counts every other weight, the one at ``|w| = T``
    included, as pruned.

    SmallCNN has N = 1528; 0.7·N = 1069.6 rounds to 1070 (floor: 1069).
    """
    torch.manual_seed(0)
    model = SmallCNN()
    pruner = fs.make_pruner(model, "spartan", sparsity=0.7, total_steps=100)
    pruner.update(0.7)
    bb = pruner.backbone
    assert isinstance(bb, SpartanBackbone) and bb._masks is not None
    n = pruner.num_params
    assert n == 1528
    kept = sum(int((forward_weight(t.module) != 0).sum()) for t in pruner.targets)
    assert kept == n - 1070 == 458
    assert sum(float(m.detach().double().sum()) for m in bb._masks) == pytest.approx(458, abs=1e-3)
    assert pruner.sparsity_achieved() == 1070 / n


def test_spartan_solves_with_its_own_settings() -> None:
    """bas26: ``max_iters``, ``tol`` and ``budget_tol`` given to the backbone are the
    solver's at every update: one iteration at most, and no polish for a 50 % budget."""
    torch.manual_seed(0)
    model = SmallCNN()
    bb = SpartanBackbone(max_iters=1, tol=1e-12, budget_tol=0.5)
    pruner = fs.make_pruner(model, "spartan", sparsity=0.5, total_steps=100, backbone=bb)
    pruner.update(0.5)
    assert bb.last is not None
    assert (bb.last.iterations, bb.last.newton_steps) == (1, 0)


def spartan_gradient_reference(
    w: list[torch.Tensor], c: list[torch.Tensor], sparsity: float, beta: float
) -> list[torch.Tensor]:
    """``∂/∂w`` of ``Σ c·ŵ``, ``ŵ = w·m·1[|w| > T]`` with the hard part straight-through:
    ``c·m`` directly, plus through ``m`` (ALGORITHMS.md, unit costs) with
    ``G = ∂L/∂m = c·w``: ``sign(w)·β·m(1 − m)·(G − Σ G·m(1 − m) / Σ m(1 − m))``. ``m``
    is the fixed point ``Σ m = k`` at ``β``, solved by bisection, in float64."""
    n = sum(x.numel() for x in w)
    k = n - round(sparsity * n)
    m = soft_topk_reference([x.abs() for x in w], k, beta)
    s = [x * (1 - x) for x in m]
    g = [ci.double() * wi.double() for ci, wi in zip(c, w)]
    coef = sum(float((gi * si).sum()) for gi, si in zip(g, s)) / sum(float(si.sum()) for si in s)
    return [
        ci.double() * mi + torch.sign(wi.double()) * beta * si * (gi - coef)
        for ci, wi, mi, si, gi in zip(c, w, m, s, g)
    ]


def test_spartans_weight_gradient_uses_the_current_beta() -> None:
    """bas27: before the freeze the implicit gradient through the soft masks has the
    β they were solved at (here 1, at step 0), not β's target (20)."""
    torch.manual_seed(0)
    model = SmallCNN()
    pruner = fs.make_pruner(model, "spartan", sparsity=0.5, total_steps=100)
    pruner.update(0.5)
    assert isinstance(pruner.backbone, SpartanBackbone) and pruner.backbone.beta == 1.0
    weights = pruner.weights()
    g = torch.Generator().manual_seed(7)
    c = [torch.randn(w.shape, generator=g) for w in weights]
    loss = torch.zeros(())
    for t, ci in zip(pruner.targets, c):
        weight = t.module.weight  # the forward weight, with its graph
        assert isinstance(weight, torch.Tensor)
        loss = loss + (weight * ci).sum()
    loss.backward()
    want = spartan_gradient_reference([w.detach() for w in weights], c, 0.5, 1.0)
    for w, ref in zip(weights, want):
        assert w.grad is not None
        assert torch.allclose(w.grad.double(), ref, rtol=1e-4, atol=1e-6)


def test_an_update_at_sparsity_0_drops_the_soft_masks() -> None:
    """bas28: back at sparsity 0 nothing is pruned and no soft mask scales the weights:
    the forward weight is the weight."""
    torch.manual_seed(0)
    model = SmallCNN()
    pruner = fs.make_pruner(model, "spartan", sparsity=0.5, total_steps=100)
    pruner.update(0.5)
    pruner.update(0.0)
    for t, w in zip(pruner.targets, pruner.weights()):
        assert torch.equal(forward_weight(t.module), w.detach()), t.name


def test_spartan_resumes_before_the_freeze_with_the_same_soft_masks() -> None:
    """bas29, bas30, bas31: a Pruner restored before the freeze (step 6 of 20, β mid-ramp)
    forwards ``w·m·1[|w| > T]`` with ``m`` at the saved β and sparsity, as the saved
    one does, and both train on identically."""
    torch.manual_seed(0)
    model = SmallCNN()
    pruner = fs.make_pruner(model, "spartan", sparsity=0.8, total_steps=20)
    opt = optimizer(model, pruner)
    train(model, pruner, opt, range(6))
    beta = 1.0 + 19.0 * 6 / 16
    bb = pruner.backbone
    assert isinstance(bb, SpartanBackbone)
    assert not bb.frozen and bb.beta == pytest.approx(beta)
    saved = copy.deepcopy((pruner.dense_state_dict(), pruner.state_dict(), opt.state_dict()))

    model2 = SmallCNN()
    model2.load_state_dict(saved[0])
    pruner2 = fs.Pruner.from_state_dict(model2, saved[1])
    assert isinstance(pruner2.backbone, SpartanBackbone)
    assert pruner2.backbone.beta == pytest.approx(beta)
    weights = [w.detach() for w in pruner2.weights()]
    n = sum(w.numel() for w in weights)
    k = n - round(0.8 * n)
    masks = soft_topk_reference([w.abs() for w in weights], k, beta)
    t = torch.sort(torch.cat([w.abs().reshape(-1) for w in weights])).values[n - k - 1]
    for target, w, m in zip(pruner2.targets, weights, masks):
        want = w.double() * m * (w.abs() > t).double()
        got = forward_weight(target.module).double()
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-7), target.name

    opt2 = optimizer(model2, pruner2)
    opt2.load_state_dict(saved[2])
    train(model, pruner, opt, range(6, 10))
    train(model2, pruner2, opt2, range(6, 10))
    for a, b in zip(pruner.targets, pruner2.targets):
        assert torch.allclose(forward_weight(a.module), forward_weight(b.module), atol=1e-6)


def test_a_restored_spartan_pruner_keeps_its_budget_tolerance() -> None:
    """bas35: the backbone's config holds every setting, so ``Pruner.from_state_dict``
    rebuilds it with the same ``budget_tol``."""
    torch.manual_seed(0)
    model = SmallCNN()
    bb = SpartanBackbone(beta_target=10.0, max_iters=7, tol=0.05, budget_tol=1e-3)
    pruner = fs.Pruner(model, 0.5, 10, backbone=bb)
    state = pruner.state_dict()
    pruner.remove()
    again = fs.Pruner.from_state_dict(model, state).backbone
    assert isinstance(again, SpartanBackbone)
    assert (again.beta_target, again.max_iters, again.tol, again.budget_tol) == (
        10.0,
        7,
        0.05,
        1e-3,
    )


def test_a_frozen_spartan_backbone_serves_a_new_pruner_from_scratch() -> None:
    """bas36: a backbone object reused by a new Pruner (after ``finalize()`` of the
    first) starts unfrozen: it solves soft masks on the new model's weights."""
    bb = SpartanBackbone(freeze_at=0.5)
    torch.manual_seed(0)
    first = SmallCNN()
    pruner = fs.Pruner(first, 0.5, 4, backbone=bb, schedule="constant")
    train(first, pruner, optimizer(first, pruner), range(2))
    assert bb.frozen
    pruner.finalize()
    second = SmallCNN()
    pruner2 = fs.Pruner(second, 0.5, 100, backbone=bb, schedule="constant")
    assert not bb.frozen and bb._masks is not None
    x, y = batch(0)
    F.cross_entropy(second(x), y).backward()  # a forward and backward on the new masks
    assert all(w.grad is not None for w in pruner2.weights())


def test_the_module_refuses_an_unknown_name() -> None:
    """bas37: only the three names moved to ``feather_sparse.methods`` are looked up
    lazily; any other is an AttributeError (``hasattr`` is False)."""
    assert baselines.make_pruner is fs.make_pruner
    assert not hasattr(baselines, "no_such_name")
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        baselines.no_such_name  # noqa: B018
