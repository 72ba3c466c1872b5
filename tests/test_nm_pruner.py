"""N:M in the Pruner: arguments, training steps, report, resume, finalize, schedules."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs
from _guards import guard
from feather_sparse.nm import NMBackbone, NMPattern, group_view


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv1d(4, 8, 3, padding=1),  # reduction 4·3 = 12
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 6, 16),  # reduction 48
        nn.ReLU(),
        nn.Linear(16, 5),
    )


def batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(8, 4, 6, generator=gen), torch.randint(0, 5, (8,), generator=gen))
        for _ in range(n)
    ]


def train(model: nn.Module, pruner: fs.Pruner, data: list, opt: torch.optim.Optimizer) -> None:
    for x, y in data:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()


def groups_nonzero(model: nn.Module, pattern: NMPattern, names: list[str]) -> torch.Tensor:
    mods = dict(model.named_modules())
    return torch.cat([(group_view(mods[n].weight, pattern) != 0).sum(1) for n in names])


# ------------------------------------------------------------------- arguments
def test_pattern_implies_sparsity_and_backbone() -> None:
    pruner = fs.Pruner(small_model(), pattern="1:4")
    assert pruner.sparsity == 0.75
    assert isinstance(pruner.backbone, NMBackbone)
    assert pruner.backbone.pattern == NMPattern(1, 4)
    assert pruner.theta == 1.0  # auto: S = 0.75 < 0.95


@guard(
    "`Pruner(pattern=...)` with another sparsity, backbone or `max_layer_sparsity`, or `4:4`",
    "`ValueError` naming both settings (the pattern implies the sparsity)",
)
def test_conflicting_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"prunes 0\.5 .* sparsity=0\.9"):
        fs.Pruner(small_model(), pattern="2:4", sparsity=0.9)
    fs.Pruner(small_model(), pattern="2:4", sparsity=0.5).remove()  # agreeing is fine
    with pytest.raises(ValueError, match="backbone='uniform' cannot be combined"):
        fs.Pruner(small_model(), pattern="2:4", backbone="uniform")
    with pytest.raises(ValueError, match="max_layer_sparsity"):
        fs.Pruner(small_model(), pattern="2:4", max_layer_sparsity=0.9)
    with pytest.raises(ValueError, match="total_steps is needed"):
        fs.Pruner(small_model(), pattern="2:4", schedule="cubic")
    with pytest.raises(ValueError, match="sparsity is required"):
        fs.Pruner(small_model())
    with pytest.raises(ValueError, match="N:M"):
        fs.Pruner(small_model(), pattern="4:4")


@guard(
    '`Pruner(pattern="2:4")` with a layer whose reduction dimension is not a multiple of M',
    "`ValueError` naming the layer: leave it dense with `exclude`/`min_params`; nothing attached",
)
def test_bad_layer_named_and_exclude_or_min_params_skip_it() -> None:
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 16))
    with pytest.raises(ValueError, match=r"layer '0' .* reduction dimension of 6"):
        fs.Pruner(model, pattern="2:4")
    assert not hasattr(model[0], "parametrizations")  # nothing attached
    fs.Pruner(model, pattern="2:4", exclude=["0"]).remove()
    fs.Pruner(model, pattern="2:4", min_params=100).remove()


def test_non_threshold_operator_rejected() -> None:
    model = small_model()
    with pytest.raises(ValueError, match="thresholding operators"):
        fs.Pruner(model, pattern="2:4", operator="st3")
    assert not any(hasattr(m, "parametrizations") for m in model.modules())


# ------------------------------------------------------------------- training
@pytest.mark.parametrize("spec", ["2:4", "1:4", "4:8"])
@pytest.mark.parametrize("p", [1.0, 3.0, math.inf])
def test_train_and_finalize_exact_pattern(spec: str, p: float) -> None:
    model = small_model()
    pattern = NMPattern.parse(spec)
    names = ["0", "3", "5"] if spec != "4:8" else ["3", "5"]
    exclude = [] if spec != "4:8" else ["0"]  # 12 is not a multiple of 8
    pruner = fs.Pruner(model, pattern=spec, p=p, theta=0.5, exclude=exclude)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, pruner, batches(4), opt)
    rep = pruner.report()
    assert rep.pattern == spec
    assert rep.sparsity == pytest.approx(pattern.sparsity)
    assert "N:M pattern " + spec in rep.table()
    # the forward uses at most n nonzeros per group
    mods = dict(model.named_modules())
    for n in names:
        used = group_view(mods[n].weight, pattern)
        assert ((used != 0).sum(1) <= pattern.n).all()
    achieved = pruner.finalize()
    assert achieved >= pattern.sparsity
    counts = groups_nonzero(model, pattern, names)
    assert (counts <= pattern.n).all()
    if math.isinf(p):  # random weights: no ties, so exactly n
        assert (counts == pattern.n).all()


def test_finalize_counts_and_structure_golden() -> None:
    model = nn.Sequential(nn.Linear(8, 2, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(
            torch.tensor([[1.0, -4, 3, 2, 0.5, 0.25, -0.125, 8], [1, 1, 1, 1, 0, 0, 0, 0]])
        )
    pruner = fs.Pruner(model, pattern="2:4", operator="hard")
    pruner.finalize()
    assert model[0].weight.tolist() == [[0.0, -4, 3, 0, 0.5, 0, 0, 8], [1, 1, 0, 0, 0, 0, 0, 0]]


@guard(
    "`finalize(sparsity=...)` of an N:M Pruner below its pattern",
    "`ValueError` before anything is baked; the Pruner stays attached",
)
def test_finalize_below_the_pattern_is_refused_and_undoable() -> None:
    model = small_model()
    pruner = fs.Pruner(model, pattern="2:4")
    with pytest.raises(ValueError, match=r"layer '0' would keep .* finalize\(\) without sparsity"):
        pruner.finalize(sparsity=0.25)
    assert hasattr(model[0], "parametrizations")  # nothing baked
    assert pruner.finalize() == pytest.approx(0.5)


def test_state_dict_resume_is_bit_exact() -> None:
    data = batches(8)
    # reference: 8 uninterrupted steps, dense warm-up then pattern
    ref = small_model()
    sched = {"name": "cubic", "start": 0.0, "end": 0.5}
    pr = fs.Pruner(ref, pattern="2:4", schedule=sched, total_steps=8, theta=0.5)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    train(ref, pr, data, opt)
    # interrupted after 3 steps, resumed from state dicts into a fresh model
    a = small_model()
    pa = fs.Pruner(a, pattern="2:4", schedule=sched, total_steps=8, theta=0.5)
    oa = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    train(a, pa, data[:3], oa)
    model_state = copy.deepcopy(pa.dense_state_dict())
    pruner_state = copy.deepcopy(pa.state_dict())
    opt_state = copy.deepcopy(oa.state_dict())
    b = small_model(seed=5)
    b.load_state_dict(model_state)
    pb = fs.Pruner.from_state_dict(b, pruner_state)
    assert pb.backbone.pattern == NMPattern(2, 4)
    ob = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
    ob.load_state_dict(opt_state)
    train(b, pb, data[3:], ob)
    for (k, v), (k2, v2) in zip(pr.dense_state_dict().items(), pb.dense_state_dict().items()):
        assert k == k2
        assert torch.equal(v, v2), k
    assert pr.state_dict()["thresholds"] == pb.state_dict()["thresholds"]


# ------------------------------------------------------------------- how the pattern is reached
def test_from_first_step_warmup_and_ramp() -> None:
    x = torch.randn(2, 4, 6)
    # from the first step: the full pattern at once
    first = fs.Pruner(small_model(), pattern="2:4")
    assert first.sparsity_achieved() == pytest.approx(0.5)
    first.remove()
    # dense warm-up for 50 % of 4 steps, then the full pattern
    model = small_model()
    warm = fs.Pruner(
        model, pattern="2:4", schedule={"name": "constant", "start": 0.5}, total_steps=4
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = [warm.sparsity_achieved()]
    for xb, yb in batches(4):
        train(model, warm, [(xb, yb)], opt)
        seen.append(warm.sparsity_achieved())
    assert seen[0] == 0.0 and seen[1] == 0.0
    assert seen[2:] == [pytest.approx(0.5)] * 3
    model(x)
    # ramped: sparsity rises monotonically to the pattern's
    model = small_model()
    ramp = fs.Pruner(model, pattern="2:4", schedule="cubic", total_steps=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    seen = [ramp.sparsity_achieved()]
    for xb, yb in batches(8):
        train(model, ramp, [(xb, yb)], opt)
        seen.append(ramp.sparsity_achieved())
    assert seen[0] == 0.0
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(seen))
    assert 0.0 < seen[2] < 0.5
    assert seen[-1] == pytest.approx(0.5)


def test_exact_pattern_whatever_update_every() -> None:
    model = small_model()
    pruner = fs.Pruner(model, pattern="2:4", update_every=5)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    train(model, pruner, batches(3), opt)  # weights moved, thresholds not recomputed
    assert (groups_nonzero(model, NMPattern(2, 4), ["0", "3", "5"]) <= 2).all()


@pytest.mark.parametrize("method", ["feather-nm", "hard-nm", "oneshot-nm"])
def test_achieved_sparsity_counts_what_the_forward_zeroes(method: str) -> None:
    """Exact zeros and weights tied at a group's threshold are zeroed by the forward
    beyond the pattern's M − N; the report counts them, and flags a layer it zeroes whole."""
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    with torch.no_grad():
        w = torch.randn(8, 16, generator=torch.Generator().manual_seed(3))
        w[:, ::4] = 0.0  # one exact zero in every group of the first layer
        w[:2] = 0.5  # two rows of equal weights: T_g equals every |w| of their groups
        w[2, :3] = 0.0  # a group of three zeros: a kept position holds a zero
        model[0].weight.copy_(w)
        model[2].weight.fill_(0.25)  # every group tied: P_T is 0 for finite p
    pruner = fs.make_pruner(model, method, pattern="2:4", total_steps=4, schedule="constant")
    forward_zeros = sum(int((layer.weight == 0).sum()) for layer in (model[0], model[2]))
    assert pruner.sparsity_achieved() == forward_zeros / pruner.num_params
    assert pruner.sparsity_achieved() > 0.5
    report = pruner.report()
    assert report.sparsity == pruner.sparsity_achieved()
    assert [layer.collapsed for layer in report.layers] == [False, method == "feather-nm"]


def test_total_steps_need_not_match_when_the_pattern_starts_at_once() -> None:
    """From the first step the length of training is unused, so a resume that passes
    total_steps on one side only is accepted; with a ramp it must still match."""
    state = fs.Pruner(small_model(), pattern="2:4").state_dict()
    fs.Pruner(small_model(), pattern="2:4", total_steps=1000).load_state_dict(state)
    state = fs.Pruner(small_model(), pattern="2:4", total_steps=1000).state_dict()
    fs.Pruner(small_model(), pattern="2:4").load_state_dict(state)
    ramp = fs.Pruner(small_model(), pattern="2:4", total_steps=8, schedule="cubic").state_dict()
    with pytest.raises(ValueError, match="saved with total_steps=8"):
        fs.Pruner(small_model(), pattern="2:4", total_steps=9, schedule="cubic").load_state_dict(
            ramp
        )
