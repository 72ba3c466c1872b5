"""Baselines: method registry, ST-3, Spartan, GMP; exact sparsity and resume for every method."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs
from _helpers import tiny_run_args
from feather_sparse.baselines import SpartanBackbone, st3_rescale

pytestmark = pytest.mark.usefixtures("one_thread")

METHOD_NAMES = ["feather", "feather-gmp", "gmp", "hard", "nonste", "soft", "spartan", "st3"]
#: The N:M methods (registered in feather_sparse.methods; tested in test_nm_methods.py).
NM_METHOD_NAMES = ["feather-nm", "hard-nm", "oneshot-nm", "s-ste", "sr-ste"]

# Every method, and Feather on every backbone.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("feather", {}),
    ("feather", {"backbone": "uniform"}),
    ("feather", {"backbone": "global-flops"}),
    ("feather", {"backbone": "asl+"}),
    ("hard", {}),
    ("soft", {}),
    ("nonste", {}),
    ("gmp", {}),
    ("feather-gmp", {}),
    ("st3", {}),
    ("st3", {"backbone": "global-flops"}),
    ("spartan", {}),
]
IDS = [m + ("-" + kw["backbone"] if kw else "") for m, kw in CASES]


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.fc(x.mean((2, 3)))


def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)


def optimizer(model: nn.Module, pruner: fs.Pruner) -> torch.optim.Optimizer:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    if pruner.parameters():
        opt.add_param_group({"params": pruner.parameters(), "lr": 0.05, "weight_decay": 0.0})
    return opt


def train(model: nn.Module, pruner: fs.Pruner, opt: torch.optim.Optimizer, steps: range) -> None:
    for i in steps:
        x, y = batch(i)
        loss = F.cross_entropy(model(x), y) + pruner.regularizer()
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()


# ---------------------------------------------------------------- registry
def test_method_registry_and_errors() -> None:
    assert fs.METHODS.names() == sorted(METHOD_NAMES + NM_METHOD_NAMES)
    for name in METHOD_NAMES + NM_METHOD_NAMES:
        method = fs.METHODS.get(name)
        assert method.reference and method.summary
    with pytest.raises(
        ValueError, match="unknown method 'rigl'; choose one of: feather, feather-gmp, feather-nm"
    ):
        fs.make_pruner(SmallCNN(), "rigl", sparsity=0.5, total_steps=10)
    with pytest.raises(ValueError, match=r"method 'gmp' fixes operator='hard'"):
        fs.make_pruner(SmallCNN(), "gmp", sparsity=0.5, total_steps=10, operator="feather")
    with pytest.raises(ValueError, match=r"fixes theta=0\.0"):
        fs.make_pruner(SmallCNN(), "nonste", sparsity=0.5, total_steps=10, theta=0.5)
    with pytest.raises(ValueError, match="fixes backbone='spartan'"):
        fs.make_pruner(SmallCNN(), "spartan", sparsity=0.5, total_steps=10, backbone="global")
    with pytest.raises(ValueError, match=r"unknown argument \['beta'\].*'asl\+'"):
        fs.make_pruner(SmallCNN(), sparsity=0.5, total_steps=10, backbone="asl+", beta=2.0)
    with pytest.raises(ValueError, match="backbone object"):
        fs.make_pruner(
            SmallCNN(), sparsity=0.5, total_steps=10, backbone=fs.UniformBackbone(), lam=1.0
        )


def test_methods_configure_the_pruner_as_published() -> None:
    def make(name: str, **kw: Any) -> fs.Pruner:
        return fs.make_pruner(SmallCNN(), name, sparsity=0.96, total_steps=100, **kw)

    feather = make("feather")
    assert (feather.operator.p, feather.theta, feather.backbone.name) == (3.0, 0.5, "global")
    hard, soft, nonste = make("hard"), make("soft"), make("nonste")
    assert (hard.operator.p, hard.theta) == (math.inf, 1.0)
    assert (soft.operator.p, soft.theta) == (1.0, 1.0)
    assert (nonste.operator.p, nonste.theta) == (3.0, 0.0)
    gmp = make("gmp")
    assert (gmp.operator.p, gmp.theta) == (math.inf, 0.0)
    assert gmp.backbone.config() == {"name": "uniform", "keep_first_dense": True}
    assert make("gmp", keep_first_dense=False).backbone.config()["keep_first_dense"] is False
    assert make("gmp", backbone="uniform").backbone.config()["keep_first_dense"] is True
    st3 = make("st3")
    assert isinstance(st3.operator, fs.ST3Operator) and st3.backbone.name == "global"
    assert make("st3", backbone="global-flops").backbone.name == "global-flops"
    spartan = make("spartan", beta_target=10.0)
    assert isinstance(spartan.backbone, SpartanBackbone)
    assert spartan.backbone.beta_target == 10.0
    assert spartan.schedule == fs.LinearSchedule(start=0.0, end=0.2)
    asl = make("feather", backbone="asl+", lam=3.0)
    assert asl.backbone.config()["lam"] == 3.0
    assert make("feather", backbone="uniform", operator="hard").operator.p == math.inf


# ---------------------------------------------------------------- every method
@pytest.mark.parametrize(("method", "kw"), CASES, ids=IDS)
def test_final_sparsity_within_one_weight_per_tensor(method: str, kw: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = SmallCNN()
    pruner = fs.make_pruner(model, method, sparsity=0.9, total_steps=12, **kw)
    opt = optimizer(model, pruner)
    train(model, pruner, opt, range(12))
    assert abs(pruner.sparsity_achieved() - 0.9) <= len(pruner.targets) / pruner.num_params
    achieved = pruner.finalize()
    zeros = sum(int((t.module.weight == 0).sum()) for t in pruner.targets)
    assert zeros == round(achieved * pruner.num_params)
    assert abs(zeros - round(0.9 * pruner.num_params)) <= len(pruner.targets)
    model(batch(0)[0])  # a plain model again


@pytest.mark.parametrize(("method", "kw"), CASES, ids=IDS)
def test_state_dict_resume_continues_identically(method: str, kw: dict[str, Any]) -> None:
    total, cut, end = 20, 9, 20
    if method == "spartan":  # also resume inside the frozen-mask phase (from step 16)
        cut = 17

    torch.manual_seed(0)
    model = SmallCNN()
    pruner = fs.make_pruner(model, method, sparsity=0.9, total_steps=total, **kw)
    opt = optimizer(model, pruner)
    train(model, pruner, opt, range(cut))
    saved = copy.deepcopy((pruner.dense_state_dict(), pruner.state_dict(), opt.state_dict()))
    train(model, pruner, opt, range(cut, end))

    model2 = SmallCNN()
    model2.load_state_dict(saved[0])
    pruner2 = fs.Pruner.from_state_dict(model2, saved[1])
    assert pruner2.config() == saved[1]["config"]
    opt2 = optimizer(model2, pruner2)
    opt2.load_state_dict(saved[2])
    train(model2, pruner2, opt2, range(cut, end))

    for (key, a), b in zip(
        pruner.dense_state_dict(pruned=True).items(), pruner2.dense_state_dict(pruned=True).values()
    ):
        assert torch.allclose(a, b, rtol=0, atol=1e-6), key
    for a, b in zip(pruner.thresholds(), pruner2.thresholds()):
        assert torch.allclose(a, b, rtol=0, atol=1e-7)
    assert pruner.backbone.state_dict().keys() == pruner2.backbone.state_dict().keys()


# ---------------------------------------------------------------- GMP
def test_gmp_first_conv_dense_uniform_rest_and_no_gradient_to_pruned() -> None:
    torch.manual_seed(0)
    model = SmallCNN()
    pruner = fs.make_pruner(model, "gmp", sparsity=0.8, total_steps=10)
    pruner.update(0.8)
    rows = pruner.report().layers
    assert rows[0].name == "conv1" and rows[0].sparsity == 0.0
    assert abs(rows[1].sparsity - rows[2].sparsity) <= 1 / min(r.params for r in rows[1:])
    F.cross_entropy(model(batch(0)[0]), batch(0)[1]).backward()
    for w, t in zip(pruner.weights(), pruner.thresholds()):
        pruned = w.detach().abs() <= t
        assert torch.all(w.grad[pruned] == 0)
        assert torch.equal(  # hard mask: kept weights exactly as stored
            fs.threshold(w.detach(), t, p=math.inf)[~pruned], w.detach()[~pruned]
        )


# ---------------------------------------------------------------- ST-3
def test_st3_rescale_golden() -> None:
    # two output channels, T = 0.8, worked out by hand
    w = torch.tensor([[2.0, -0.5, 1.0, -3.0], [0.2, 0.4, -1.5, 0.1]], requires_grad=True)
    t = torch.tensor(0.8)
    rho0 = (6.0 / 4 + 1e-6) / (6.5 / 4 + 1e-6)  # channel 0 keeps 2, 1, 3 of 2, .5, 1, 3
    rho1 = (1.5 / 4 + 1e-6) / (2.2 / 4 + 1e-6)  # channel 1 keeps 1.5 of .2, .4, 1.5, .1
    s0, s1 = 1.01 / (rho0 + 0.01), 1.01 / (rho1 + 0.01)
    assert torch.allclose(st3_rescale(w, t).flatten(), torch.tensor([s0, s1]), rtol=1e-6)
    out = fs.ST3Operator()(w, t, theta=0.3)  # θ is ignored: identity backward
    expected = torch.tensor([[1.2 * s0, 0.0, 0.2 * s0, -2.2 * s0], [0.0, 0.0, -0.7 * s1, 0.0]])
    assert torch.allclose(out, expected, rtol=1e-6)
    assert torch.all(out[expected == 0] == 0) and not torch.signbit(out[expected == 0]).any()
    c = torch.randn(2, 4)
    (out * c).sum().backward()
    assert torch.equal(w.grad, c)
    # T = 0 keeps the weights exactly
    assert torch.equal(fs.ST3Operator()(w.detach(), torch.tensor(0.0), 1.0), w.detach())


# ---------------------------------------------------------------- Spartan
def test_sinkhorn_golden_tiny_vector() -> None:
    # v symmetric around 0.25 and k = 2: sigmoid(−x) + sigmoid(x) = 1 pairs up, so the
    # solution is m = sigmoid(β(v − 0.25)), i.e. μ = β(τ − 0.25) with τ = 0.2 (k-th smallest)
    v = torch.tensor([0.1, 0.2, 0.3, 0.4])
    res = fs.sinkhorn_topk([v], 2.0, beta=10.0)
    expected = torch.sigmoid(torch.tensor([-1.5, -0.5, 0.5, 1.5]))
    assert torch.allclose(res.masks[0], expected, atol=1e-6)
    assert res.tau == pytest.approx(0.2)
    assert res.mu == pytest.approx(-0.5, abs=1e-5)
    assert res.budget_error <= 1e-5


def test_sinkhorn_alone_reaches_the_same_fixed_point() -> None:
    # The published iteration, run long, without the Newton polish.
    g = torch.Generator().manual_seed(1)
    v = [torch.rand(40, generator=g, dtype=torch.float64), torch.rand(7, generator=g).double()]
    long = fs.sinkhorn_topk(v, 12.0, 4.0, max_iters=5000, tol=1e-15, max_newton=0)
    polished = fs.sinkhorn_topk(v, 12.0, 4.0)
    assert long.budget_error < 1e-9
    for a, b in zip(long.masks, polished.masks):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("beta", [1.0, 20.0, 500.0])
@pytest.mark.parametrize("density", [0.01, 0.3, 0.9])
def test_spartan_budget_holds(beta: float, density: float) -> None:
    g = torch.Generator().manual_seed(2)
    ws = [torch.randn(3000, generator=g) * 0.05, torch.randn(64, 9, generator=g)]
    n = sum(w.numel() for w in ws)
    k = density * n
    res = fs.sinkhorn_topk([w.abs() for w in ws], k, beta)
    total = sum(float(m.double().sum()) for m in res.masks)
    assert abs(total - k) <= 1e-5 * k
    assert all(bool(((m >= 0) & (m <= 1)).all()) for m in res.masks)


def test_spartan_implicit_gradient_matches_finite_differences() -> None:
    g = torch.Generator().manual_seed(3)
    ws = (
        torch.randn(6, generator=g, dtype=torch.float64).requires_grad_(),
        torch.randn(2, 3, generator=g, dtype=torch.float64).requires_grad_(),
    )

    def masks(*w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(fs.soft_topk_mask(list(w), 5.0, beta=3.0, budget_tol=1e-14))

    assert torch.autograd.gradcheck(masks, ws, eps=1e-6, atol=1e-6)
    # the published denominator k − Σ c·m² gives the same gradient at the fixed point
    m = [x.detach() for x in masks(*ws)]
    sum_m2 = sum(float((x * x).sum()) for x in m)
    slopes = sum(float((x * (1 - x)).sum()) for x in m)
    assert 5.0 - sum_m2 == pytest.approx(slopes, rel=1e-10)


def test_spartan_schedules_freeze_and_gradient_accumulation() -> None:
    torch.manual_seed(0)
    model = SmallCNN()
    pruner = fs.make_pruner(model, "spartan", sparsity=0.8, total_steps=20)
    bb = pruner.backbone
    assert isinstance(bb, SpartanBackbone)
    assert (bb.beta_at(0, 20), bb.beta_at(8, 20), bb.beta_at(16, 20)) == (1.0, 10.5, 20.0)
    assert bb.freeze_step(20) == 16
    assert pruner.scheduled_sparsity(2) == pytest.approx(0.4)  # density linear over 20 %
    opt = optimizer(model, pruner)
    # two micro-batches per optimizer step go through the same masks
    for i in range(15):
        opt.zero_grad()
        for j in range(2):
            x, y = batch(2 * i + j)
            F.cross_entropy(model(x), y).backward()
        opt.step()
        pruner.step()
        if i >= 3:
            assert bb.last is not None and bb.last.budget_error <= 1e-5
    assert not bb.frozen and bb.beta == pytest.approx(1 + 19 * 15 / 16)
    train(model, pruner, opt, range(15, 16))  # step 16: the last mask update, then frozen
    assert bb.frozen and bb.beta == 20.0
    frozen = [m.clone() for m in bb._frozen_masks]
    zeros_before = [int(z) for z in pruner._layer_zeros()]
    train(model, pruner, opt, range(16, 19))
    F.cross_entropy(model(batch(99)[0]), batch(99)[1]).backward()
    for m, w in zip(frozen, pruner.weights()):
        assert torch.all(w.grad[m == 0] == 0)  # pruned weights get no gradient any more
    assert all(torch.equal(a, b) for a, b in zip(frozen, bb._frozen_masks))
    assert [int(z) for z in pruner._layer_zeros()] == zeros_before
    pruner.finalize()
    for m, t in zip(frozen, pruner.targets):
        assert torch.equal(t.module.weight == 0, m == 0)


@pytest.mark.parametrize(("method", "kw"), CASES, ids=IDS)
def test_model_with_pruner_attached_can_be_deep_copied(method: str, kw: dict[str, Any]) -> None:
    model = SmallCNN()
    fs.make_pruner(model, method, sparsity=0.5, total_steps=10, schedule="constant", **kw)
    clone = copy.deepcopy(model)  # e.g. for an EMA or an evaluation copy
    x = batch(0)[0]
    assert torch.allclose(clone(x), model(x))


def test_spartan_forward_is_soft_masked_and_hard_projected() -> None:
    torch.manual_seed(0)
    model = SmallCNN()
    pruner = fs.make_pruner(model, "spartan", sparsity=0.5, total_steps=100)
    pruner.update(0.5)
    bb = pruner.backbone
    assert isinstance(bb, SpartanBackbone) and bb._masks is not None
    for i, (t, th) in enumerate(zip(pruner.targets, pruner.thresholds())):
        w = pruner.weights()[i].detach()
        keep = w.abs() > th
        assert torch.allclose(t.module.weight, w * bb._masks[i].detach() * keep)


# ---------------------------------------------------------------- training CLI
TINY_RUN = tiny_run_args(train_size=256, test_size=64, epochs=2, quarter_width=False)


def test_build_pruner_maps_methods_and_refuses_contradictions() -> None:
    from feather_sparse.methods import build_pruner
    from feather_sparse.recipes import load_config
    from feather_sparse.train import build_optimizer

    def build(**overrides: Any) -> fs.Pruner:
        pruner = build_pruner(load_config("mnist1d", overrides), SmallCNN(), 100)
        assert isinstance(pruner, fs.Pruner)
        return pruner

    assert build().config()["operator"] == {"name": "feather", "p": 3.0}
    gmp = build(method="gmp")
    assert (gmp.operator.p, gmp.theta, gmp.backbone.config()["keep_first_dense"]) == (
        math.inf,
        0.0,
        True,
    )
    spartan = build(method="spartan")
    assert spartan.schedule == fs.LinearSchedule(0.0, 0.2)  # the method's own schedule
    assert build(method="spartan", schedule_end=0.4).schedule == fs.CubicSchedule(0.0, 0.4)
    assert build(method="st3", backbone="global-flops").backbone.name == "global-flops"
    with pytest.raises(ValueError, match="fixes operator='hard'"):
        build(method="gmp", operator="soft")
    with pytest.raises(ValueError, match=r"fixes theta=1\.0"):
        build(method="hard", theta=0.5)
    # ASL+'s thresholds train at lr/100 without weight decay
    cfg = load_config("mnist1d", {"backbone": "asl+"})
    model = SmallCNN()
    pruner = build_pruner(cfg, model, 100)
    assert pruner is not None
    group = build_optimizer(cfg, model, pruner).param_groups[-1]
    assert group["params"] == pruner.parameters()
    assert (group["lr"], group["weight_decay"]) == (cfg.lr * fs.ASL_LR_SCALE, 0.0)


@pytest.mark.parametrize("method", ["gmp", "st3", "spartan"])
def test_cli_trains_with_each_method(
    method: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from feather_sparse import cli

    run = tmp_path / method
    assert cli.main(["train", *TINY_RUN, "--method", method, "--run-dir", str(run)]) == 0
    assert "final test accuracy" in capsys.readouterr().out
    final = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["sparsity"] == pytest.approx(0.9, abs=1e-3)
    assert json.loads((run / "config.json").read_text())["config"]["method"] == method
