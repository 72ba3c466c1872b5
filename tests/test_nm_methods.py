"""The N:M baselines behind make_pruner: SR-STE, S-STE, hard-STE N:M, one-shot, Feather N:M."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

import feather_sparse as fs
from _guards import guard
from feather_sparse.nm import NMPattern, group_view, nm_threshold
from feather_sparse.nm.methods import SR_STE_DECAY

NM_METHODS = ["feather-nm", "hard-nm", "sr-ste", "s-ste", "oneshot-nm"]
#: The pattern from the first step (one-shot's mask and S-STE's β are then taken at once).
AT_ONCE = {"total_steps": 4, "schedule": "constant"}


def linear(rows: list[list[float]]) -> nn.Sequential:
    w = torch.tensor(rows)
    layer = nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        layer.weight.copy_(w)
    return nn.Sequential(layer)


def model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def step(m: nn.Module, pruner: fs.Pruner, opt: torch.optim.Optimizer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, 16, generator=gen), torch.randint(0, 8, (8,), generator=gen)
    loss = F.cross_entropy(m(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    pruner.step()


@pytest.mark.parametrize("method", NM_METHODS)
@pytest.mark.parametrize("spec", ["2:4", "1:4", "4:8"])
def test_every_method_trains_to_the_pattern(method: str, spec: str) -> None:
    m = model()
    pruner = fs.make_pruner(m, method, pattern=spec, total_steps=4)
    assert pruner.report().pattern == spec
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for i in range(4):
        step(m, pruner, opt, i)
    pruner.finalize()
    pattern = NMPattern.parse(spec)
    for layer in (m[0], m[2]):
        counts = (group_view(layer.weight, pattern) != 0).sum(1)
        assert (counts <= pattern.n).all()
        if method != "s-ste":  # soft thresholding: exact n with distinct magnitudes too
            assert (counts == pattern.n).all()


def test_method_settings_and_conflicts() -> None:
    p = fs.make_pruner(model(), "sr-ste")
    assert p.backbone.config() == {"name": "nm", "pattern": "2:4", "decay": SR_STE_DECAY}
    assert (p.operator.name, p.theta) == ("hard", 1.0)
    p.remove()
    p = fs.make_pruner(model(), "sr-ste", decay=1e-3, pattern="4:8")  # a backbone option
    assert p.backbone.config() == {"name": "nm", "pattern": "4:8", "decay": 1e-3}
    p.remove()
    with pytest.raises(ValueError, match="fixes operator='hard'"):
        fs.make_pruner(model(), "sr-ste", operator="feather")
    with pytest.raises(ValueError, match=r"prunes 0\.5"):
        fs.make_pruner(model(), "s-ste", sparsity=0.9)
    with pytest.raises(ValueError, match="decay must be >= 0"):
        fs.make_pruner(model(), "sr-ste", decay=-1.0)


def test_sr_ste_adds_the_sparse_refined_decay() -> None:
    m = linear([[2.0, -1.0, 0.5, -3.0]])
    pruner = fs.make_pruner(m, "sr-ste")
    w = pruner.weights()[0]
    m(torch.ones(1, 4)).sum().backward()  # dL/dW̃ = 1 everywhere
    lam = SR_STE_DECAY
    expected = [[1.0, 1.0 + lam * -1.0, 1.0 + lam * 0.5, 1.0]]
    assert w.grad is not None
    assert w.grad.tolist()[0] == pytest.approx(expected[0], rel=1e-6)
    assert m[0].weight.tolist() == [[2.0, 0.0, 0.0, -3.0]]


def test_s_ste_soft_threshold_with_fixed_beta() -> None:
    rows = [[2.0, -1.0, 0.5, -3.0], [0.4, 0.3, -0.2, 0.1]]
    m = linear(rows)
    pruner = fs.make_pruner(m, "s-ste", total_steps=3)
    w = torch.tensor(rows)
    s = torch.tensor([[1.0, 0.0, 0.0, -2.0], [0.2, 0.1, 0.0, 0.0]])  # sign(w)(|w| − t)
    beta = float((w * s).sum() / (s * s).sum())
    torch.testing.assert_close(m[0].weight, beta * s)
    # β is fixed: after the weights move, it is not recomputed
    with torch.no_grad():
        pruner.weights()[0].mul_(2.0)
    pruner.step()
    torch.testing.assert_close(m[0].weight, beta * 2 * s)
    # the backward is the plain STE (β does not scale it)
    m(torch.ones(1, 4)).sum().backward()
    assert torch.equal(pruner.weights()[0].grad, torch.ones(2, 4))
    state = pruner.state_dict()
    assert state["backbone"]["beta"][0].item() == pytest.approx(beta, rel=1e-6)


def test_oneshot_dense_then_fixed_mask_and_resume() -> None:
    m = model()
    pruner = fs.make_pruner(m, "oneshot-nm", total_steps=6)  # prunes at step 3
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    for i in range(3):
        assert pruner.sparsity_achieved() == 0.0
        step(m, pruner, opt, i)
    assert pruner.sparsity_achieved() == 0.5
    mask = [mk.clone() for mk in pruner.backbone._masks]
    state = copy.deepcopy(pruner.state_dict())
    dense = copy.deepcopy(pruner.dense_state_dict())
    for i in range(3, 6):
        step(m, pruner, opt, i)
    # the mask never moved although the weights did; pruned weights got no gradient
    assert all(torch.equal(a, b) for a, b in zip(mask, pruner.backbone._masks))
    for w, mk, saved in zip(pruner.weights(), mask, [dense["0.weight"], dense["2.weight"]]):
        assert torch.equal(w.detach()[~mk], saved[~mk])
    # resume: the mask comes back from the state
    m2 = model(seed=9)
    m2.load_state_dict(dense)
    p2 = fs.Pruner.from_state_dict(m2, state)
    assert all(torch.equal(a, b) for a, b in zip(mask, p2.backbone._masks))


def test_hard_nm_equals_the_hard_operator() -> None:
    m = model()
    pruner = fs.make_pruner(m, "hard-nm")
    w = pruner.weights()[0].detach()
    assert torch.equal(m[0].weight, nm_threshold(w, "2:4", p=float("inf")))


def test_a_state_from_a_model_of_other_widths_is_refused_naming_the_layer() -> None:
    """A one-shot mask (or S-STE β) that does not fit this model's layers is refused when
    the state is loaded, and the Pruner goes on as it was."""
    wide = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 8))
    source = fs.make_pruner(model(), "oneshot-nm", pattern="2:4", **AT_ONCE)
    target = fs.make_pruner(wide, "oneshot-nm", pattern="2:4", **AT_ONCE)
    before = copy.deepcopy(target.state_dict())
    with pytest.raises(
        ValueError, match=r"'masks' entry of layer '0' has shape \(32, 16\).*another model"
    ):
        target.load_state_dict(source.state_dict())
    after = target.state_dict()["backbone"]["masks"]
    assert all(torch.equal(a, b) for a, b in zip(after, before["backbone"]["masks"], strict=True))
    beta = fs.make_pruner(model(), "s-ste", pattern="2:4", **AT_ONCE).state_dict()
    beta["backbone"]["beta"] = beta["backbone"]["beta"][:1]
    with pytest.raises(ValueError, match=r"'beta' holds 1 entries for 2 layers"):
        fs.make_pruner(model(), "s-ste", pattern="2:4", **AT_ONCE).load_state_dict(beta)


@guard(
    "`make_pruner(model, 'gmp', pattern='2:4')` (`--method gmp --pattern 2:4`): a method "
    "with no N:M form",
    "`ValueError` naming the method, what it fixes (its backbone or operator) and the "
    "methods that train a pattern; the model is left unwrapped",
)
@pytest.mark.parametrize(
    ("method", "fixed"),
    [
        ("gmp", "backbone='uniform'"),
        ("feather-gmp", "backbone='uniform'"),
        ("spartan", "backbone='spartan'"),
        ("st3", "operator='st3'"),
    ],
)
def test_a_method_without_an_nm_form_refuses_a_pattern(method: str, fixed: str) -> None:
    m = model()
    before = copy.deepcopy(m.state_dict())
    with pytest.raises(ValueError, match=f"method '{method}' has no N:M form") as caught:
        fs.make_pruner(m, method, pattern="2:4", total_steps=4)
    message = str(caught.value)
    assert f"it fixes {fixed}" in message
    for name in [*NM_METHODS, "feather", "hard", "soft", "nonste"]:
        assert name in message.split("trains one: ")[1].split(", ")
    for name in ("gmp", "st3", "spartan", "feather-gmp"):
        assert name not in message.split("trains one: ")[1].split(", ")
    assert not any(parametrize.is_parametrized(layer) for layer in m.modules())
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    # the training config gives the same message, before any run starts
    from feather_sparse.methods import pruner_config
    from feather_sparse.recipes import TrainConfig

    with pytest.raises(ValueError, match=f"method '{method}' has no N:M form"):
        pruner_config(TrainConfig(method=method, pattern="2:4"))


@pytest.mark.parametrize("method", ["feather", "hard", "soft", "nonste"])
def test_the_thresholding_methods_take_a_pattern(method: str) -> None:
    pruner = fs.make_pruner(model(), method, pattern="2:4", total_steps=4)
    assert pruner.report().pattern == "2:4"
