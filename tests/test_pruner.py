"""The Pruner: attaching, stepping, exactness against a sort reference, state, finalize, errors."""

from __future__ import annotations

import copy
import logging
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

import feather_sparse as fs
from feather_sparse import pruner as pruner_module


class SmallCNN(nn.Module):
    """A small BatchNorm CNN with a first conv, a grouped conv, a dilated conv and a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.block = nn.Sequential(
            nn.Conv2d(16, 32, 3, padding=2, dilation=2, groups=2),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.Conv2d(32, 32, 1),
        )
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.block(x)
        return self.fc(x.mean((2, 3)))


def batch(seed: int, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def train_steps(
    model: nn.Module, opt: torch.optim.Optimizer, pruner: fs.Pruner, steps: range
) -> None:
    for i in steps:
        x, y = batch(i)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()


def sort_threshold(weights: list[torch.Tensor], s: float) -> torch.Tensor:
    mags = torch.sort(torch.cat([w.detach().reshape(-1).abs() for w in weights])).values
    k = round(s * mags.numel())
    return torch.tensor(0.0) if k == 0 else mags[k - 1]


PRUNED = ["conv1", "block.0", "block.3", "fc"]


# ------------------------------------------------------------------- attaching
def test_defaults_prune_every_conv_and_linear_weight_only() -> None:
    model = SmallCNN()
    pruner = fs.Pruner(model, 0.9, total_steps=10)
    assert [t.name for t in pruner.targets] == PRUNED  # first conv and classifier included
    for name, module in model.named_modules():
        assert parametrize.is_parametrized(module, "weight") == (name in PRUNED)
        if name in PRUNED:
            assert not parametrize.is_parametrized(module, "bias")
    assert isinstance(model.conv1, nn.Conv2d)  # modules are not replaced
    assert pruner.num_params == sum(model.get_submodule(n).weight.numel() for n in PRUNED)


def test_optimizer_created_before_or_after_keeps_working() -> None:
    torch.manual_seed(0)
    a = SmallCNN()
    b = copy.deepcopy(a)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1)  # before
    weight_before = a.conv1.weight
    pa = fs.Pruner(a, 0.5, total_steps=4)
    assert a.conv1.parametrizations.weight.original is weight_before  # same Parameter
    pb = fs.Pruner(b, 0.5, total_steps=4)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1)  # after
    train_steps(a, opt_a, pa, range(4))
    train_steps(b, opt_b, pb, range(4))
    for wa, wb in zip(pa.weights(), pb.weights()):
        assert torch.equal(wa, wb)
    assert not torch.equal(pa.weights()[0], SmallCNN().conv1.weight)


def test_exclude_names_patterns_and_min_params() -> None:
    model = SmallCNN()
    p = fs.Pruner(model, 0.5, 10, exclude=["fc", "re:block\\.\\d"])
    assert [t.name for t in p.targets] == ["conv1"]
    p.remove()
    p = fs.Pruner(model, 0.5, 10, exclude=["block"])  # a name excludes its children
    assert [t.name for t in p.targets] == ["conv1", "fc"]
    p.remove()
    p = fs.Pruner(model, 0.5, 10, min_params=500)
    assert [t.name for t in p.targets] == ["block.0", "block.3"]
    p.remove()
    p = fs.Pruner(model, 0.5, 10, include=[nn.Linear, "conv1"])
    assert [t.name for t in p.targets] == ["conv1", "fc"]


def test_auto_theta_rule_and_boundary_option() -> None:
    assert fs.auto_theta(0.9) == 1.0
    assert fs.auto_theta(0.95) == 0.5  # the paper's text: S >= 0.95
    assert fs.auto_theta(0.95, rule="released") == 1.0  # the released code: S > 0.95
    assert fs.auto_theta(0.98, rule="released") == 0.5
    model = SmallCNN()
    assert fs.Pruner(model, 0.95, 10).theta == 0.5
    assert fs.Pruner(SmallCNN(), 0.95, 10, theta_rule="released").theta == 1.0
    assert fs.Pruner(SmallCNN(), 0.99, 10, theta=0.25).theta == 0.25


# ------------------------------------------------------------------- exactness during training
@pytest.mark.parametrize("theta", [1.0, 0.5])
def test_each_step_effective_weight_is_P_T_at_kth_magnitude(theta: float) -> None:
    torch.manual_seed(0)
    model = SmallCNN()
    total, target = 12, 0.9
    pruner = fs.Pruner(model, target, total_steps=total, theta=theta)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = fs.CubicSchedule()
    for step in range(total + 3):
        weights = pruner.weights()
        s = sched(step, total, target)
        assert pruner.scheduled_sparsity() == s
        t_ref = sort_threshold(weights, s)
        for name, w in zip(PRUNED, weights):
            effective = model.get_submodule(name).weight
            assert torch.equal(effective, fs.threshold(w, t_ref, p=3.0))
        n_pruned = sum(int((w.abs() <= t_ref).sum()) for w in weights)
        assert n_pruned == round(s * pruner.num_params)
        assert pruner.sparsity_achieved() == pytest.approx(n_pruned / pruner.num_params)
        train_steps(model, opt, pruner, range(step, step + 1))
    achieved = pruner.finalize()
    zeros = sum(int((model.get_submodule(n).weight == 0).sum()) for n in PRUNED)
    assert zeros == round(target * pruner.num_params)
    assert achieved == zeros / pruner.num_params
    # plain model, same Parameter objects, no parametrizations left
    assert not any(parametrize.is_parametrized(m) for m in model.modules())


def test_gradient_scaling_reaches_the_dense_weights() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 20))
    pruner = fs.Pruner(model, 0.5, total_steps=1, schedule=fs.ConstantSchedule(), theta=0.25)
    w = pruner.weights()[0]
    x = torch.randn(4, 20)
    model(x).sum().backward()
    dense_grad = torch.ones(4, 20).t() @ x  # d/dW of sum(W x + b) = 1 xᵀ
    keep = w.detach().abs() > pruner.thresholds()[0]
    assert torch.allclose(w.grad, torch.where(keep, dense_grad, 0.25 * dense_grad))


def test_finalize_bakes_shrunk_values_not_a_mask() -> None:
    model = nn.Sequential(nn.Linear(50, 50))
    pruner = fs.Pruner(model, 0.5, total_steps=1, schedule="constant")
    w = pruner.weights()[0].detach().clone()
    t = sort_threshold([w], 0.5)
    pruner.finalize()
    assert torch.equal(model[0].weight.detach(), fs.threshold(w, t, p=3.0))
    kept = w.abs() > t
    assert torch.all(model[0].weight.detach()[kept].abs() < w[kept].abs())


def test_update_every() -> None:
    model = SmallCNN()
    pruner = fs.Pruner(model, 0.8, total_steps=10, update_every=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for i in range(6):
        train_steps(model, opt, pruner, range(i, i + 1))
        seen.append(float(pruner.thresholds()[0]))
    assert seen[0] == seen[1] == 0.0  # steps 1, 2: not updated since step 0 (sparsity 0)
    assert seen[2] > 0  # step 3
    assert seen[3] == seen[2] and seen[4] == seen[2]
    assert seen[5] != seen[2]


def test_callable_schedule() -> None:
    pruner = fs.Pruner(SmallCNN(), 0.9, total_steps=10, schedule=lambda step: 0.1 * step)
    assert pruner.scheduled_sparsity(3) == pytest.approx(0.3)
    pruner.step()
    assert pruner.sparsity_achieved() == pytest.approx(0.1, abs=1 / pruner.num_params)
    bad = fs.Pruner(SmallCNN(), 0.9, total_steps=10, schedule=lambda step: 2.0 * step)
    with pytest.raises(ValueError, match="must be in \\[0, 1\\)"):
        bad.step()


# ------------------------------------------------------------------- state
def test_resume_mid_schedule_is_identical() -> None:
    torch.manual_seed(0)
    model = SmallCNN()
    ref_model = copy.deepcopy(model)
    total = 10
    # reference: 10 steps straight
    ref_pruner = fs.Pruner(ref_model, 0.9, total)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.05, momentum=0.9)
    train_steps(ref_model, ref_opt, ref_pruner, range(total))
    # 4 steps, checkpoint, fresh objects, resume for 6 more
    pruner = fs.Pruner(model, 0.9, total)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    train_steps(model, opt, pruner, range(4))
    ckpt = {
        "model": pruner.dense_state_dict(),
        "pruner": pruner.state_dict(),
        "opt": opt.state_dict(),
    }
    resumed = SmallCNN()
    resumed.load_state_dict(ckpt["model"])  # dense keys load into the plain model
    p2 = fs.Pruner.from_state_dict(resumed, ckpt["pruner"])
    opt2 = torch.optim.SGD(resumed.parameters(), lr=0.05, momentum=0.9)
    opt2.load_state_dict(ckpt["opt"])
    assert p2.current_step == 4
    for a, b in zip(p2.thresholds(), pruner.thresholds()):
        assert torch.equal(a, b)
    train_steps(resumed, opt2, p2, range(4, total))
    for a, b in zip(p2.weights(), ref_pruner.weights()):
        assert torch.equal(a, b)
    for a, b in zip(p2.thresholds(), ref_pruner.thresholds()):
        assert torch.equal(a, b)


def test_load_state_dict_refuses_other_config() -> None:
    state = fs.Pruner(SmallCNN(), 0.9, 10).state_dict()
    other = fs.Pruner(SmallCNN(), 0.8, 10)
    with pytest.raises(ValueError, match=r"sparsity=0\.9.*sparsity=0\.8"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="not a feather-sparse Pruner state"):
        other.load_state_dict({"step": 3})
    with pytest.raises(ValueError, match="targets"):
        fs.Pruner(SmallCNN(), 0.9, 10, exclude=["fc"]).load_state_dict(state)


def test_dense_state_dict_plain_and_pruned() -> None:
    model = SmallCNN()
    pruner = fs.Pruner(model, 0.7, 1, schedule="constant")
    dense = pruner.dense_state_dict()
    plain = SmallCNN()
    assert set(dense) == set(plain.state_dict())
    plain.load_state_dict(dense)
    assert torch.equal(plain.conv1.weight, pruner.weights()[0])
    pruned = pruner.dense_state_dict(pruned=True)
    assert torch.equal(pruned["conv1.weight"], model.conv1.weight)
    x = torch.randn(2, 3, 8, 8)
    model.eval()
    plain.load_state_dict(pruned)
    plain.eval()
    assert torch.equal(plain(x), model(x))


def test_remove_restores_dense_weights() -> None:
    model = SmallCNN()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pruner = fs.Pruner(model, 0.9, 1, schedule="constant")
    pruner.remove()
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(RuntimeError, match=r"step\(\) is refused: this Pruner was removed"):
        pruner.step()


# ------------------------------------------------------------------- layer collapse
def test_layer_collapse_flagged_and_guard() -> None:
    model = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10))
    with torch.no_grad():
        model[0].weight.mul_(1e-3)  # far smaller than the second layer: collapses first
    pruner = fs.Pruner(model, 0.5, 1, schedule="constant")
    report = pruner.report()
    assert report.collapsed == ["0"]
    assert "collapsed" in report.table()
    pruner.remove()
    guarded = fs.Pruner(model, 0.5, 1, schedule="constant", max_layer_sparsity=0.9)
    rows = guarded.report().layers
    assert rows[0].sparsity == pytest.approx(0.9)
    assert not rows[0].collapsed


def test_layer_collapse_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    model = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10))
    with torch.no_grad():
        model[0].weight.mul_(1e-3)
    with caplog.at_level(logging.WARNING, logger="feather_sparse.pruner"):
        pruner = fs.Pruner(model, 0.5, 5, schedule="constant")
        pruner.step()
        pruner.step()
        pruner.report()
    assert sum("layer collapse" in r.message for r in caplog.records) == 1


# ------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sparsity": 1.0}, r"sparsity must be in \[0, 1\)"),
        ({"sparsity": -0.1}, r"sparsity must be in \[0, 1\)"),
        ({"sparsity": "0.9"}, "sparsity must be a number"),
        ({"total_steps": 0}, "total_steps must be a positive int"),
        ({"total_steps": 2.5}, "total_steps must be a positive int"),
        ({"p": 0.0}, "p must be >= 1"),
        ({"p": 0.5}, "p must be >= 1"),
        ({"p": 2.0, "operator": "hard"}, "fixes p"),
        ({"theta": 1.5}, r"theta must be in \[0, 1\]"),
        ({"theta": "sometimes"}, "theta must be a number"),
        ({"theta_rule": "mine"}, "unknown theta rule"),
        ({"operator": "medium"}, "unknown operator 'medium'; choose one of: feather, hard, soft"),
        ({"backbone": "local"}, "unknown backbone 'local'; choose one of: .*global"),
        ({"schedule": "exp"}, "unknown schedule 'exp'; choose one of: constant, cubic, linear"),
        ({"update_every": 0}, "update_every must be an int >= 1"),
        ({"exclude": ["re:("]}, "invalid regular expression"),
        ({"include": [nn.LSTM]}, "no prunable layer found in SmallCNN"),
        ({"max_layer_sparsity": 1.0}, "max_layer_sparsity"),
        ({"max_layer_sparsity": 0.5}, "caps every layer below the target sparsity 0.9"),
    ],
)
def test_bad_arguments_leave_the_model_untouched(kwargs: dict, match: str) -> None:
    model = SmallCNN()
    before = copy.deepcopy(model.state_dict())
    args = {"sparsity": 0.9, "total_steps": 10, **kwargs}
    with pytest.raises(ValueError, match=match):
        fs.Pruner(model, **args)
    assert not any(parametrize.is_parametrized(m) for m in model.modules())
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_already_pruned_model_is_refused() -> None:
    model = SmallCNN()
    fs.Pruner(model, 0.5, 10)
    with pytest.raises(ValueError, match="already has a parametrization"):
        fs.Pruner(model, 0.5, 10)


def test_nan_weight_at_step_names_the_layer() -> None:
    model = SmallCNN()
    pruner = fs.Pruner(model, 0.5, 10)
    with torch.no_grad():
        pruner.weights()[2][0, 0] = math.nan
    with pytest.raises(RuntimeError, match=r"non-finite weights .* block\.3"):
        pruner.step()
    with torch.no_grad():
        pruner.weights()[2][0, 0] = math.inf
    with pytest.raises(RuntimeError, match=r"block\.3"):
        pruner.step()


def test_nan_at_construction_leaves_model_untouched() -> None:
    model = SmallCNN()
    with torch.no_grad():
        model.fc.weight[0, 0] = math.nan
    with pytest.raises(RuntimeError, match="fc"):
        fs.Pruner(model, 0.5, 10)
    assert not any(parametrize.is_parametrized(m) for m in model.modules())


# ------------------------------------------------------------------- compile and devices
def test_torch_compile_does_not_recompile_when_threshold_changes() -> None:
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    model = SmallCNN()
    pruner = fs.Pruner(model, 0.9, total_steps=6)
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    thresholds = set()
    for i in range(6):
        x, y = batch(i)
        loss = F.cross_entropy(compiled(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()
        thresholds.add(float(pruner.thresholds()[0]))
    assert len(thresholds) > 3  # the threshold did move
    assert counter.frame_count == 1
    x, _ = batch(0)
    model.eval()
    assert torch.allclose(compiled(x), model(x))


def test_repr_and_report_table() -> None:
    pruner = fs.Pruner(SmallCNN(), 0.9, 10)
    assert "sparsity=0.9" in repr(pruner)
    table = pruner.report().table()
    assert table.splitlines()[0].startswith("| layer |")
    assert "block.0" in table and "**total**" in table


@pytest.mark.gpu
def test_cuda_training_matches_reference_threshold() -> None:
    model = SmallCNN().cuda()
    pruner = fs.Pruner(model, 0.9, total_steps=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for i in range(4):
        x, y = batch(i)
        loss = F.cross_entropy(model(x.cuda()), y.cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()
    assert pruner.thresholds()[0].device.type == "cuda"
    ref = sort_threshold([w.cpu() for w in pruner.weights()], pruner.scheduled_sparsity())
    assert float(pruner.thresholds()[0]) == float(ref)


def test_global_backbone_checks_finiteness_without_an_extra_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:

    model = SmallCNN()
    pruner = fs.Pruner(model, 0.5, 10, schedule="constant")
    calls = []
    original = pruner_module._abs_max_each
    monkeypatch.setattr(pruner_module, "_abs_max_each", lambda ws: calls.append(1) or original(ws))
    pruner.step()
    assert calls == []  # the selection's own pass measured max |w|
    with torch.no_grad():
        pruner.weights()[1][0, 0] = math.nan
    with pytest.raises(RuntimeError, match=r"non-finite weights"):
        pruner.step()
    assert calls == []  # the search's own measurement named the layer


@pytest.mark.parametrize(
    "weights",
    [
        [torch.randn(4, 8), torch.randn(16), torch.randn(2, 3, 4)],
        [torch.randn(4, 8), torch.tensor([1.0, math.nan]), torch.tensor([-math.inf, 2.0])],
        [torch.randn(4, 8).half(), torch.tensor([-3.0, 2.0]).half()],
        [torch.randn(4, 8), torch.randn(8, dtype=torch.float64)],  # mixed dtypes
        [torch.randn(4, 8), torch.empty(0)],  # an empty shard
        [torch.tensor([-5.0, 1.0]), torch.tensor([0.5, -0.25])],
    ],
)
def test_abs_max_each_matches_one_tensor_at_a_time(weights: list[torch.Tensor]) -> None:
    from feather_sparse.pruner import _abs_max_each

    got = _abs_max_each(weights)
    # computed independently: |w| in float32, then its max (NaN-propagating); 0 when empty
    want = torch.stack([w.float().abs().amax() if w.numel() else torch.zeros(()) for w in weights])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)


def test_prune_target_reads_the_stored_weight_with_and_without_a_parametrization() -> None:
    from feather_sparse.backbones import PruneTarget

    layer = nn.Linear(8, 4)
    stored = layer.weight
    target = PruneTarget("layer", layer)
    assert target.weight is stored and target.parametrizations() is None
    fs.Pruner(layer, 0.5, 10, schedule="constant")
    assert target.weight is layer.parametrizations.weight.original
    assert target.parametrizations() is layer.parametrizations.weight
    # a plain-tensor weight is kept as a buffer named ``original``
    plain = nn.Linear(8, 4)
    data = plain.weight.detach().clone()
    del plain.weight
    plain.register_buffer("weight", data)
    parametrize.register_parametrization(plain, "weight", nn.Identity())
    assert PruneTarget("plain", plain).weight is plain.parametrizations.weight.original


def test_thresholds_written_with_and_without_foreach_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every layer's threshold buffer gets its value, whether one ``_foreach_copy_``
    call writes them all or (a torch without it) one ``copy_`` per layer."""
    written = []
    for foreach in (True, False):
        if not foreach:
            monkeypatch.setattr(pruner_module, "_FOREACH_COPY", None)
        torch.manual_seed(0)
        model = SmallCNN()
        pruner = fs.Pruner(model, 0.5, 10)
        buffers = pruner.thresholds()
        pruner.update(0.3)
        assert all(b is a for a, b in zip(buffers, pruner.thresholds()))  # written in place
        written.append([float(b) for b in buffers])
    assert written[0] == written[1]
    assert all(v > 0 for v in written[0])  # the buffers started at 0: each was written
