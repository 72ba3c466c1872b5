"""Tests that close the gaps a mutation audit of the sparse-training backbones found.

Each test here fails on one or more hand-made mutants of ``backbones.py`` (the
checks of ``allocate``, GMP's first conv kept dense, the FLOPs-biased per-layer
thresholds, ASL+'s options, initial value, clamps, θ, exact count, state,
config and learning-rate scale, the thresholds that follow a moved model) that
the rest of the suite let through (``docs/mutation-audit.md``, "The
sparse-training backbones"; the mutants' ids are in each test's docstring). The
expected values come from the formulas of ``ALGORITHMS.md`` and §3 of the paper
(GMP's ratio ``s·N / (N − N_first)``, ASL's ``b_l = clamp(r_l, 0, r_max)·σ_l``
and its surrogate gradient, the lr/100 of ASL's thresholds), a brute-force
ranking of the scores, or arithmetic done here. Two tests check a real bug
fixed with the audit: a prunable layer without weights under ``global-flops``
and ASL+. Nothing trains beyond one optimizer step.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs
from _guards import guard
from feather_sparse.backbones import BACKBONES, allocate, flops_scale
from feather_sparse.ops import Operator
from test_backbones import SmallCNN, layer_zeros

pytestmark = pytest.mark.usefixtures("one_thread")

SQRT2 = math.sqrt(2.0)


# ---------------------------------------------------------------- allocate
@guard(
    "`allocate(shares, sizes, total)` with shares and sizes of different lengths, or an "
    "infinite share",
    "`ValueError` naming the counts, or the shares",
)
def test_allocate_refuses_shares_that_do_not_fit_the_tensors() -> None:
    """bbn09, bbn10: one finite share per tensor, or a clear error (not a silent split)."""
    with pytest.raises(ValueError, match="got 3 shares for 2 tensors"):
        allocate([1.0, 1.0, 1.0], [4, 4], 2)
    with pytest.raises(ValueError, match="got 1 shares for 2 tensors"):
        allocate([1.0], [4, 4], 2)
    for bad in (math.inf, math.nan, -1.0):
        with pytest.raises(ValueError, match="shares must be finite and >= 0"):
            allocate([1.0, bad], [4, 4], 2)


# ---------------------------------------------------------------- uniform (GMP)
class LinearThenConv1d(nn.Module):
    """A linear layer registered before the first (1-d) convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.fc_in = nn.Linear(6, 24)  # 144 weights
        self.conv = nn.Conv1d(3, 4, 3)  # 36 weights: the first conv
        self.fc_out = nn.Linear(24, 5)  # 120 weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(self.fc_in(x).view(-1, 3, 8))
        return self.fc_out(F.relu(h).flatten(1))


def test_gmp_keeps_the_first_conv_of_any_dimension_dense() -> None:
    """bbn13, bbn16: the first *conv* (a Conv1d here, after a linear layer) stays dense,
    and the other tensors share the whole budget at ratio s·N / (N − N_first)."""
    model = LinearThenConv1d()
    pruner = fs.Pruner(model, 0.5, 10, backbone=fs.UniformBackbone(keep_first_dense=True))
    assert [t.name for t in pruner.targets] == ["fc_in", "conv", "fc_out"]
    pruner.update(0.5)
    zeros = layer_zeros(pruner)
    # N = 144 + 36 + 120 = 300, K = 150; the others at 150 / (300 − 36) = 150/264:
    # 144·150/264 = 81.8…, 120·150/264 = 68.1…, largest remainder → 82 and 68
    assert zeros == [82, 0, 68]


def test_gmp_without_a_conv_keeps_the_first_tensor_dense() -> None:
    """bbn14: with no conv at all, the first prunable tensor is the one left dense
    (the docstring of ``keep_first_dense``)."""
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 16), nn.Linear(16, 2))
    pruner = fs.Pruner(model, 0.5, 10, backbone={"name": "uniform", "keep_first_dense": True})
    pruner.update(0.5)
    # N = 32 + 128 + 32 = 192, K = 96, shared by 160 weights at 96/160 = 0.6: 76.8 and 19.2
    assert layer_zeros(pruner) == [0, 77, 19]


# ---------------------------------------------------------------- global-flops
def test_global_flops_thresholds_separate_exactly_what_the_ranking_prunes() -> None:
    """bbn18: ``T*·s_l`` rounded to float32 need not separate the weights whose score is
    at most ``T*``; every layer's threshold must prune exactly the ranking's weights.
    Brute force: sort the float32 scores ``|w|·(1/s_l)`` of both layers together."""
    for seed in range(16):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(5, 8), nn.Linear(7, 6))  # weights (8, 5) and (6, 7)
        pruner = fs.Pruner(model, 0.75, 10, backbone="global-flops", schedule="constant")
        for s in (0.25, 0.5, 0.75):
            pruner.update(s)
            weights = [w.detach() for w in pruner.weights()]
            scores = [w.abs() * (1.0 / flops_scale(w.shape)) for w in weights]  # float32
            k = round(s * 82)
            cut = torch.sort(torch.cat([x.reshape(-1) for x in scores])).values[k - 1]
            for w, x, t in zip(weights, scores, pruner.thresholds()):
                assert torch.equal(w.abs() <= t, x <= cut), (seed, s)
            assert sum(layer_zeros(pruner)) == k
        pruner.remove()


# ---------------------------------------------------------------- real bug: empty layers
def _with_an_empty_layer() -> nn.Sequential:
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="zero-element"):  # torch's own, at initialisation
        return nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 0), nn.Linear(8, 8))


@guard(
    "a prunable layer with no weights (`nn.Linear(8, 0)`) under the `global-flops` backbone",
    "threshold 0 for it; the other layers pruned by the global ranking of the scores",
)
def test_global_flops_with_a_layer_without_weights() -> None:
    """The bug fixed with the audit: the empty layer's ``amax`` failed at attach."""
    model = _with_an_empty_layer()
    pruner = fs.Pruner(model, 0.5, 4, backbone="global-flops", schedule="constant")
    pruner.step()
    assert float(pruner.thresholds()[1]) == 0.0
    # both non-empty layers have the same s_l (8 + 8): the ranking is by |w| over 128 weights
    weights = [w.detach() for w in pruner.weights()]
    cut = torch.sort(torch.cat([weights[0].reshape(-1), weights[2].reshape(-1)]).abs()).values[63]
    for i in (0, 2):
        assert torch.equal(weights[i].abs() <= pruner.thresholds()[i], weights[i].abs() <= cut)
    assert layer_zeros(pruner)[1] == 0 and sum(layer_zeros(pruner)) == 64
    assert pruner.finalize() == 0.5


@guard(
    "a prunable layer with no weights (`nn.Linear(8, 0)`) under the `asl+` backbone",
    "its learned threshold gets no gradient (0, not NaN) and training goes on",
)
def test_asl_with_a_layer_without_weights_trains() -> None:
    """The bug fixed with the audit: σ_l of no weights was NaN, so its r_l's gradient
    was NaN, r_l became NaN at the optimizer step and the next update raised."""
    model = _with_an_empty_layer()
    pruner = fs.Pruner(model, 0.5, 4, backbone="asl+", schedule="constant")
    r = pruner.parameters()
    optimizer = torch.optim.SGD([*model.parameters(), *r], lr=0.1)
    r0 = SQRT2 * float(torch.special.erfinv(torch.tensor(0.3, dtype=torch.float64)))
    x = torch.randn(4, 8)
    loss = model[2](model[0](x)).square().mean() + model[1](x).sum() + pruner.regularizer()
    loss.backward()
    grads = [float(p.grad) for p in r if p.grad is not None]
    assert len(grads) == 3 and all(math.isfinite(g) for g in grads)
    assert grads[1] == 0.0  # nothing to prune, no size in the loss
    optimizer.step()
    pruner.step()
    assert float(r[1].detach()) == pytest.approx(r0, abs=1e-6)
    assert layer_zeros(pruner)[1] == 0 and sum(layer_zeros(pruner)) == 64


# ---------------------------------------------------------------- ASL+ options
@guard(
    "ASL+ given `r_max <= 0`, a NaN or infinite `init`, or an infinite `lam`",
    "`ValueError` naming the option; `lam=0` (no sparsity loss) is accepted",
)
def test_asl_options_are_checked_and_lam_zero_is_allowed() -> None:
    """bbn20, bbn21, bbn22: λ >= 0 and finite, r_max > 0, init finite or None."""
    for r_max in (0.0, -1.0):
        with pytest.raises(ValueError, match="r_max must be > 0"):
            fs.ASLPlusBackbone(r_max=r_max)
    for init in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match="init must be a finite number"):
            fs.ASLPlusBackbone(init=init)
    for lam in (math.inf, -1.0):
        with pytest.raises(ValueError, match="lam must be a finite number"):
            fs.ASLPlusBackbone(lam=lam)
    pruner = fs.Pruner(SmallCNN(), 0.9, 10, backbone=fs.ASLPlusBackbone(lam=0.0))
    pruner.update(0.6)
    assert float(pruner.regularizer().detach()) == 0.0


def test_asl_init_zero_is_used() -> None:
    """bbn23: ``init=0.0`` starts every r_l at 0 (not ASL's √2·erfinv(0.6·S)); with
    nothing implied pruned, the correction prunes each layer at the same ratio."""
    pruner = fs.Pruner(SmallCNN(), 0.9, 10, backbone={"name": "asl+", "init": 0.0})
    assert [float(r.detach()) for r in pruner.parameters()] == [0.0] * 4
    pruner.update(0.5)
    # sizes 216, 1152, 2304, 320: half of each, 1996 in all
    assert layer_zeros(pruner) == [108, 576, 1152, 160]


def test_a_reused_asl_backbone_starts_again_from_its_initial_value() -> None:
    """bbn24: a backbone object attached again after ``remove()`` makes new thresholds
    and initialises them again (not left at 0)."""
    backbone = fs.ASLPlusBackbone(init=1.25)
    first = fs.Pruner(SmallCNN(), 0.9, 10, backbone=backbone)
    first.remove()
    second = fs.Pruner(SmallCNN(), 0.9, 10, backbone=backbone)
    assert [float(r.detach()) for r in second.parameters()] == [1.25] * 4


# ---------------------------------------------------------------- ASL+ clamps and θ
def test_asl_clamps_r_to_zero_and_r_max() -> None:
    """bbn26, bbn27: ASL's threshold is ``clamp(r_l, 0, r_max)·σ_l``: the implied
    sparsity of an r_l above r_max is erf(r_max/√2), and the task loss gives an r_l
    outside [0, r_max] no gradient (the clamp's), one inside a non-zero one."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 10), nn.Linear(10, 10), nn.Linear(10, 5))
    backbone = fs.ASLPlusBackbone(r_max=1.0)
    pruner = fs.Pruner(model, 0.5, 10, backbone=backbone, theta=1.0)
    with torch.no_grad():
        for p, v in zip(pruner.parameters(), [3.0, -0.5, 0.5]):
            p.fill_(v)
    assert backbone.implied_sparsities() == pytest.approx(
        [math.erf(1.0 / SQRT2), 0.0, math.erf(0.5 / SQRT2)], rel=1e-12
    )
    pruner.update(0.5)
    model(torch.randn(8, 20)).square().mean().backward()  # the task loss alone
    grads = [p.grad for p in pruner.parameters()]
    assert grads[0] is not None and float(grads[0]) == 0.0
    assert grads[1] is not None and float(grads[1]) == 0.0
    assert grads[2] is not None and float(grads[2]) != 0.0


def test_asl_applies_the_gradient_scale_theta() -> None:
    """bbn28: with ASL+ the forward is Feather's ``P_{T_l}`` with the pruned weights'
    gradient scaled by θ (ALGORITHMS.md): g·θ where |w| <= T_l, g elsewhere."""
    torch.manual_seed(0)
    layer = nn.Linear(20, 5)
    pruner = fs.Pruner(nn.Sequential(layer), 0.5, 10, backbone="asl+", theta=0.25)
    pruner.update(0.5)
    x, c = torch.randn(4, 20), torch.randn(4, 5)
    (layer(x) * c).sum().backward()
    w, t = pruner.weights()[0].detach(), pruner.thresholds()[0]
    g = c.t() @ x
    expected = torch.where(w.abs() <= t, 0.25 * g, g)
    assert int((w.abs() <= t).sum()) == 50
    grad = pruner.weights()[0].grad
    assert grad is not None
    assert torch.allclose(grad, expected, rtol=1e-6, atol=1e-7)


def test_asl_threshold_gradient_is_accumulated_in_float32_for_bfloat16_weights() -> None:
    """bbn19: the surrogate ``σ·(−Σ_{|w|<=T} g·w / T)`` of bfloat16 weights, summed in
    float32 (as for float32 weights), matches the float64 sum of the same values."""
    torch.manual_seed(0)
    layer = nn.Linear(256, 16).to(torch.bfloat16)
    pruner = fs.Pruner(nn.Sequential(layer), 0.5, 10, backbone="asl+", theta=1.0)
    pruner.update(0.5)
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    c = torch.randn(4, 16, dtype=torch.bfloat16)
    (layer(x).float() * c.float()).sum().backward()
    w = pruner.weights()[0].detach().double()
    grad = pruner.weights()[0].grad
    assert grad is not None
    g = grad.double()  # θ = 1: the gradient the surrogate received
    t = float(pruner.thresholds()[0])
    sigma = w.std(correction=0)
    expected = sigma * (-(g * w)[w.abs() <= t].sum() / t)
    got = pruner.parameters()[0].grad
    assert got is not None
    assert float(got) == pytest.approx(float(expected), rel=1e-5)


# ---------------------------------------------------------------- ASL+ exact count
def test_asl_prunes_round_s_times_n_weights() -> None:
    """bbn31: the correction's total is ``round(s·N)``, as every backbone's: SmallCNN
    holds N = 3992 weights, and 0.9·3992 = 3592.8 rounds to 3593."""
    torch.manual_seed(0)
    pruner = fs.Pruner(SmallCNN(), 0.9, 10, backbone="asl+")
    pruner.update(0.9)
    assert sum(layer_zeros(pruner)) == 3593
    pruner.update(0.3)  # 1197.6 → 1198 (the other branch of the correction)
    assert sum(layer_zeros(pruner)) == 1198


# ---------------------------------------------------------------- ASL+ on a moved model
class _Mask(Operator):
    """Plain masking ``w·1[|w| > T]``: runs on the meta device (the Feather kernels do not)."""

    name = "mask"

    def __call__(self, w: torch.Tensor, t: torch.Tensor, theta: float) -> torch.Tensor:
        return torch.where(w.abs() > t, w, 0.0)


def _asl_mlp() -> tuple[nn.Sequential, fs.Pruner]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    return model, fs.Pruner(model, 0.5, 10, backbone="asl+", operator=_Mask())


def test_a_moved_threshold_keeps_its_gradient_and_its_requires_grad() -> None:
    """bbn07, bbn08: moving r_l (as ``model.to`` moves the weights) takes its gradient
    along, and a threshold frozen by the user (``requires_grad_(False)``) stays frozen."""
    model, pruner = _asl_mlp()
    model(torch.randn(4, 16)).square().mean().backward()
    r = pruner.parameters()
    r[1].requires_grad_(False)
    model.to("meta")
    moved = pruner.parameters()  # moves them
    assert [id(p) for p in moved] == [id(p) for p in r]
    assert r[0].grad is not None and r[0].grad.device.type == "meta"  # not dropped
    assert r[0].requires_grad and not r[1].requires_grad


def test_the_regularizer_follows_a_model_moved_after_it_was_computed() -> None:
    """bbn34: the layers' sizes cached by the regularizer on one device are made again
    on the thresholds' new device."""
    model, pruner = _asl_mlp()
    before = pruner.regularizer()
    assert before.device.type == "cpu"
    model.to("meta")
    after = pruner.regularizer()
    assert after.device.type == "meta" and after.requires_grad


# ---------------------------------------------------------------- ASL+ state, config, lr
@guard(
    "`ASLPlusBackbone.load_state_dict` given the state of a model with another number of "
    "prunable layers",
    "`ValueError` naming both counts; nothing loaded",
)
def test_asl_state_of_another_number_of_layers_is_refused() -> None:
    """bbn35: the backbone's own ``load_state_dict`` refuses it (zip would load a prefix)."""
    three = fs.Pruner(
        nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)),
        0.5,
        10,
        backbone="asl+",
    )
    state = three.backbone.state_dict()
    four = fs.Pruner(SmallCNN(), 0.5, 10, backbone={"name": "asl+", "init": 0.0})
    with pytest.raises(ValueError, match="holds 3 thresholds, this model has 4"):
        four.backbone.load_state_dict(state)
    assert [float(r.detach()) for r in four.parameters()] == [0.0] * 4


def test_asl_config_rebuilds_every_option_and_a_resume_keeps_them() -> None:
    """bbn37: ``config()`` names λ, init and r_max, so that ``BACKBONES`` (and
    ``Pruner.from_state_dict``) rebuild the same backbone."""
    backbone = fs.ASLPlusBackbone(lam=3.0, init=0.5, r_max=2.0)
    config = backbone.config()
    assert config == {"name": "asl+", "lam": 3.0, "init": 0.5, "r_max": 2.0}
    rest = {k: v for k, v in config.items() if k != "name"}
    rebuilt = BACKBONES.get(config["name"])(**rest)
    assert isinstance(rebuilt, fs.ASLPlusBackbone)
    assert (rebuilt.lam, rebuilt.init, rebuilt.r_max) == (3.0, 0.5, 2.0)
    torch.manual_seed(0)
    model = SmallCNN()
    pruner = fs.Pruner(model, 0.9, 10, backbone=backbone)
    resumed = fs.Pruner.from_state_dict(SmallCNN(), pruner.state_dict())
    assert isinstance(resumed.backbone, fs.ASLPlusBackbone)
    assert (resumed.backbone.lam, resumed.backbone.init, resumed.backbone.r_max) == (
        3.0,
        0.5,
        2.0,
    )


def test_asl_thresholds_train_at_one_hundredth_of_the_learning_rate() -> None:
    """bbn38: ASL trains r_l at lr/100 (ALGORITHMS.md), without weight decay."""
    from feather_sparse.methods import build_pruner
    from feather_sparse.recipes import load_config
    from feather_sparse.train import build_optimizer

    assert fs.ASL_LR_SCALE == 0.01
    cfg = load_config("mnist1d", {"backbone": "asl+", "lr": 0.2})
    model = SmallCNN()
    pruner = build_pruner(cfg, model, 100)
    assert pruner is not None
    group = build_optimizer(cfg, model, pruner).param_groups[-1]
    assert group["params"] == pruner.parameters()
    assert group["lr"] == pytest.approx(0.002, rel=1e-12) and group["weight_decay"] == 0.0
