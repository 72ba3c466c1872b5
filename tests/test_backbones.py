"""Backbones: uniform (GMP), FLOPs-biased global (ST-3σ), ASL+; allocation, scaled selection."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs
from _hypothesis import given, settings, st
from feather_sparse.backbones import allocate, flops_scale
from feather_sparse.selection import count_at_most

pytestmark = pytest.mark.usefixtures("one_thread")


class SmallCNN(nn.Module):
    """Layers of very different sizes, so that allocations differ between backbones."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.conv3 = nn.Conv2d(16, 32, 3, padding=1, groups=2)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        return self.fc(x.mean((2, 3)))


def macs(model: nn.Module, pruner: fs.Pruner, size: int = 32) -> tuple[int, float]:
    """Dense and sparse multiply-accumulates of one 3×size×size image.

    Per conv: ``out_h·out_w·C_out·C_in/groups·k_h·k_w``, times the fraction of
    its weights kept; per linear ``in·out`` likewise.
    """
    density = {row.name: 1.0 - row.sparsity for row in pruner.report().layers}
    dense: dict[str, int] = {}

    def hook(name: str) -> Callable[[nn.Module, object, torch.Tensor], None]:
        def record(module: nn.Module, inputs: object, out: torch.Tensor) -> None:
            if isinstance(module, nn.Conv2d):
                kh, kw = module.kernel_size
                per_out = module.in_channels // module.groups * kh * kw
                dense[name] = out[0].numel() * per_out
            else:
                dense[name] = module.in_features * module.out_features

        return record

    handles = [
        m.register_forward_hook(hook(n))
        for n, m in model.named_modules()
        if isinstance(m, (nn.Conv2d, nn.Linear))
    ]
    with torch.no_grad():
        model.eval()(torch.zeros(1, 3, size, size))
    for h in handles:
        h.remove()
    return sum(dense.values()), sum(v * density.get(n, 1.0) for n, v in dense.items())


def layer_zeros(pruner: fs.Pruner) -> list[int]:
    return [round(r.sparsity * r.params) for r in pruner.report().layers]


def train(
    model: nn.Module,
    pruner: fs.Pruner,
    steps: range,
    opt: torch.optim.Optimizer,
    task: float = 1.0,
) -> None:
    for i in steps:
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)
        loss = task * F.cross_entropy(model(x), y) + pruner.regularizer()
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()


def optimizer(model: nn.Module, pruner: fs.Pruner, lr: float = 0.05) -> torch.optim.Optimizer:
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if pruner.parameters():
        opt.add_param_group({"params": pruner.parameters(), "lr": lr, "weight_decay": 0.0})
    return opt


# ---------------------------------------------------------------- allocation
def test_allocate_golden() -> None:
    assert allocate([1.0, 1.0, 1.0], [10, 10, 10], 15) == [5, 5, 5]
    # 0.5 each: the largest remainders go to the earlier tensors on ties
    assert allocate([1.0, 1.0, 1.0, 1.0], [2, 2, 2, 2], 2) == [1, 1, 0, 0]
    # a capped tensor's excess is shared by the others in proportion
    assert allocate([3.0, 1.0, 1.0], [4, 100, 100], 24) == [4, 10, 10]
    # zero shares get nothing until the others are full
    assert allocate([0.0, 1.0], [10, 5], 5) == [0, 5]
    assert allocate([0.0, 1.0], [10, 5], 8) == [3, 5]
    assert allocate([0.0, 0.0], [3, 1], 2) == [2, 0]
    assert allocate([1.0], [7], 9) == [7]
    with pytest.raises(ValueError, match="shares"):
        allocate([-1.0], [3], 1)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 10, allow_nan=False), st.integers(1, 50)), min_size=1, max_size=8
    ),
    st.floats(0, 1),
)
def test_allocate_exact_total_and_within_one(layers: list[tuple[float, int]], frac: float) -> None:
    shares = [s for s, _ in layers]
    sizes = [n for _, n in layers]
    total = round(frac * sum(sizes))
    counts = allocate(shares, sizes, total)
    assert sum(counts) == total
    assert all(0 <= k <= n for k, n in zip(counts, sizes))
    top = max(shares)
    if top > 0:
        # tensors below their cap get counts in proportion to their shares, up to rounding
        w = [x / top for x in shares]
        below = [i for i in range(len(sizes)) if counts[i] < sizes[i]]
        for i in below:
            for j in below:
                if w[j] > 0:
                    assert counts[i] <= (counts[j] + 1) * w[i] / w[j] + 1


# ---------------------------------------------------------------- scaled selection
def test_scaled_selection_matches_sorted_scaled_copies() -> None:
    ws = [torch.randn(300), torch.randn(20, 7), torch.randn(5, 3, 2, 2)]
    scales = [math.sqrt(sum(w.shape)) for w in ws]
    scores = torch.sort(torch.cat([w.abs().reshape(-1) * c for w, c in zip(ws, scales)])).values
    for k in (0, 1, 137, 200, scores.numel()):
        got = fs.kth_magnitude(ws, k, scales=scales)
        want = torch.tensor(0.0) if k == 0 else scores[k - 1]
        assert torch.equal(got, want), k
        assert count_at_most(ws, got, scales=scales) == k
    t = fs.select_threshold(ws, 0.5, scales=scales, hint=float(scores[300]))
    assert torch.equal(t, scores[round(0.5 * scores.numel()) - 1])
    with pytest.raises(ValueError, match="positive"):
        fs.kth_magnitude(ws, 3, scales=[1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="scales"):
        fs.kth_magnitude(ws, 3, scales=[1.0])


# ---------------------------------------------------------------- uniform
@pytest.mark.parametrize("s", [0.0, 0.3, 0.77, 0.95])
def test_uniform_equal_per_layer_and_exact_total(s: float) -> None:
    model = SmallCNN()
    pruner = fs.Pruner(model, 0.95, 10, backbone="uniform")
    pruner.update(s)
    zeros = layer_zeros(pruner)
    for z, t in zip(zeros, pruner.targets):
        assert abs(z - s * t.numel) <= 1.0  # within one weight of ratio s
    assert sum(zeros) == round(s * pruner.num_params)


def test_uniform_keep_first_dense() -> None:
    model = SmallCNN()
    pruner = fs.Pruner(model, 0.9, 10, backbone={"name": "uniform", "keep_first_dense": True})
    pruner.update(0.9)
    zeros = layer_zeros(pruner)
    n_first = pruner.targets[0].numel
    assert pruner.targets[0].name == "conv1" and zeros[0] == 0
    rest = 0.9 * pruner.num_params / (pruner.num_params - n_first)
    for z, t in zip(zeros[1:], pruner.targets[1:]):
        assert abs(z - rest * t.numel) <= 1.0
    assert sum(zeros) == round(0.9 * pruner.num_params)
    assert pruner.backbone.config() == {"name": "uniform", "keep_first_dense": True}
    # the first conv is the first prunable *conv*, even after a prunable linear
    lin_first = nn.Sequential(nn.Linear(4, 4), nn.Unflatten(1, (1, 2, 2)), nn.Conv2d(1, 2, 2))
    p2 = fs.Pruner(lin_first, 0.5, 10, backbone=fs.UniformBackbone(keep_first_dense=True))
    assert p2.backbone.dense_index == 1
    with pytest.raises(ValueError, match="keep_first_dense"):
        fs.UniformBackbone(keep_first_dense="yes")  # type: ignore[arg-type]


# ---------------------------------------------------------------- global-flops
def test_flops_scale_is_one_over_sqrt_of_dimension_sum() -> None:
    conv = nn.Conv2d(16, 32, (3, 5), groups=4)  # weight (32, 4, 3, 5)
    assert flops_scale(conv.weight.shape) == 1 / math.sqrt(32 + 16 / 4 + 3 + 5)
    assert flops_scale(nn.Linear(7, 3).weight.shape) == 1 / math.sqrt(10)


@pytest.mark.parametrize("s", [0.0, 0.5, 0.9, 0.99])
def test_global_flops_prunes_exactly_the_lowest_scores(s: float) -> None:
    model = SmallCNN()
    pruner = fs.Pruner(model, 0.99, 10, backbone="global-flops")
    pruner.update(s)
    weights = [w.detach() for w in pruner.weights()]
    inverse = [1.0 / flops_scale(w.shape) for w in weights]
    scores = [w.abs() * c for w, c in zip(weights, inverse)]  # the same float32 rounding
    k = round(s * pruner.num_params)
    cut = torch.sort(torch.cat([x.reshape(-1) for x in scores])).values
    t_star = torch.tensor(0.0) if k == 0 else cut[k - 1]
    for w, x, th in zip(weights, scores, pruner.thresholds()):
        assert torch.equal(w.abs() <= th, x <= t_star)  # T_l separates exactly like T*
        assert float(th) <= float(t_star) * flops_scale(w.shape) * (1 + 1e-6)
    assert sum(layer_zeros(pruner)) == k


def test_global_flops_lowers_flops_on_resnet20() -> None:
    torch.manual_seed(0)
    results = {}
    for backbone in ("global", "global-flops"):
        model = fs.create_model("resnet20", num_classes=100)
        pruner = fs.Pruner(model, 0.9, 10, backbone=backbone)
        pruner.update(0.9)
        # a million float32 magnitudes hold a few ties: within one weight per tensor
        assert abs(sum(layer_zeros(pruner)) - round(0.9 * pruner.num_params)) <= len(pruner.targets)
        results[backbone] = macs(model, pruner)
        pruner.remove()
    dense, sparse_global = results["global"]
    assert results["global-flops"][0] == dense
    assert results["global-flops"][1] < 0.9 * sparse_global  # markedly fewer FLOPs


# ---------------------------------------------------------------- ASL+
def test_asl_init_and_regularizer_golden() -> None:
    model = SmallCNN()
    pruner = fs.Pruner(model, 0.9, 100, backbone="asl+")
    bb = pruner.backbone
    assert isinstance(bb, fs.ASLPlusBackbone)
    r0 = math.sqrt(2) * float(torch.special.erfinv(torch.tensor(0.54, dtype=torch.float64)))
    assert all(abs(float(r.detach()) - r0) < 1e-6 for r in pruner.parameters())
    assert len(pruner.parameters()) == len(pruner.targets)
    # set distinct r and check λ·(D − (1 − s))² by hand
    values = [0.2, 1.0, 1.5, 2.5]
    with torch.no_grad():
        for p, v in zip(pruner.parameters(), values):
            p.fill_(v)
    pruner.update(0.6)
    sizes = [t.numel for t in pruner.targets]
    density = sum(n * (1 - math.erf(v / math.sqrt(2))) for n, v in zip(sizes, values)) / sum(sizes)
    expected = 10.0 * (density - (1 - 0.6)) ** 2
    assert float(pruner.regularizer().detach()) == pytest.approx(expected, rel=1e-5)
    # the correction keeps the learned ratios and makes the total exact: implied
    # sparsities prune 78.5 % here, so at 60 % the sparsities are scaled down ...
    implied = [math.erf(v / math.sqrt(2)) for v in values]
    assert sum(s * n for s, n in zip(implied, sizes)) / sum(sizes) == pytest.approx(0.785, abs=1e-3)
    zeros = layer_zeros(pruner)
    assert sum(zeros) == round(0.6 * pruner.num_params)
    a = round(0.6 * sum(sizes)) / sum(s * n for s, n in zip(implied, sizes))
    for z, s, n in zip(zeros, implied, sizes):
        assert abs(z - a * s * n) <= 1.0
    # ... and at 95 % the densities are
    pruner.update(0.95)
    zeros = layer_zeros(pruner)
    assert sum(zeros) == round(0.95 * pruner.num_params)
    b = (sum(sizes) - round(0.95 * sum(sizes))) / sum((1 - s) * n for s, n in zip(implied, sizes))
    for z, s, n in zip(zeros, implied, sizes):
        assert abs((n - z) - b * (1 - s) * n) <= 1.0


def test_asl_correction_never_collapses_a_layer_its_r_does_not_prune() -> None:
    pruner = fs.Pruner(SmallCNN(), 0.9, 100, backbone="asl+")
    with torch.no_grad():  # the largest layer's r at 0: the others must not be emptied
        for p, v in zip(pruner.parameters(), [1.0, 1.0, 0.0, 1.0]):
            p.fill_(v)
    pruner.update(0.6)
    rows = pruner.report().layers
    assert sum(layer_zeros(pruner)) == round(0.6 * pruner.num_params)
    assert max(r.sparsity for r in rows) < 0.9 and rows[2].sparsity > 0.3


def test_asl_task_gradient_reaches_thresholds() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(20, 5)
    pruner = fs.Pruner(nn.Sequential(layer), 0.5, 10, backbone="asl+", theta=1.0)
    pruner.update(0.5)
    x = torch.randn(4, 20)
    c = torch.randn(4, 5)
    (layer(x) * c).sum().backward()
    r = pruner.parameters()[0]
    # dL/dŵ = c^T x; ASL's surrogate: σ·(−Σ_{|w|<=T} g·w / T)
    w = pruner.weights()[0].detach()
    g = c.t() @ x
    t = pruner.thresholds()[0]
    sigma = w.std(correction=0)
    expected = sigma * (-(g * w)[w.abs() <= t].sum() / t)
    assert r.grad is not None
    assert float(r.grad) == pytest.approx(float(expected), rel=1e-4)
    # the weights' gradient is the operator's straight-through one, untouched
    assert torch.allclose(pruner.weights()[0].grad, g)


def test_asl_sparsities_are_learned_and_non_uniform() -> None:
    def run(task: float) -> tuple[list[float], list[float]]:
        torch.manual_seed(0)
        model = SmallCNN()
        pruner = fs.Pruner(model, 0.9, 40, backbone="asl+")
        opt = optimizer(model, pruner, lr=0.05)
        train(model, pruner, range(40), opt, task=task)
        return [r.sparsity for r in pruner.report().layers], [
            float(r.detach()) for r in pruner.parameters()
        ]

    sparsities, r_task = run(1.0)
    _, r_reg_only = run(0.0)
    assert sum(s * t for s, t in zip(sparsities, [216, 1152, 2304, 320])) == pytest.approx(
        0.9 * 3992, abs=1
    )
    assert max(sparsities) - min(sparsities) > 0.1  # non-uniform
    r0 = math.sqrt(2) * float(torch.special.erfinv(torch.tensor(0.54)))
    assert max(abs(r - r0) for r in r_task) > 0.05  # the thresholds moved
    assert max(abs(a - b) for a, b in zip(r_task, r_reg_only)) > 1e-3  # ... with the task


def test_asl_state_dict_resume_is_exact() -> None:
    def fresh() -> tuple[nn.Module, fs.Pruner, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = SmallCNN()
        pruner = fs.Pruner(model, 0.9, 20, backbone={"name": "asl+", "lam": 5.0})
        return model, pruner, optimizer(model, pruner)

    model, pruner, opt = fresh()
    train(model, pruner, range(8), opt)
    saved = copy.deepcopy((pruner.dense_state_dict(), pruner.state_dict(), opt.state_dict()))
    train(model, pruner, range(8, 14), opt)

    torch.manual_seed(0)
    model2 = SmallCNN()
    model2.load_state_dict(saved[0])
    pruner2 = fs.Pruner.from_state_dict(model2, saved[1])
    assert isinstance(pruner2.backbone, fs.ASLPlusBackbone) and pruner2.backbone.lam == 5.0
    assert [float(r.detach()) for r in pruner2.parameters()] == saved[1]["backbone"]["r"].tolist()
    opt2 = optimizer(model2, pruner2)
    opt2.load_state_dict(saved[2])
    train(model2, pruner2, range(8, 14), opt2)
    for a, b in zip(pruner.parameters(), pruner2.parameters()):
        assert torch.equal(a, b)
    for (k, a), b in zip(pruner.dense_state_dict().items(), pruner2.dense_state_dict().values()):
        assert torch.equal(a, b), k


def test_default_backbones_keep_the_plain_forward_path() -> None:
    for backbone in ("global", "uniform", "global-flops"):
        pruner = fs.Pruner(SmallCNN(), 0.5, 10, backbone=backbone)
        assert all(t.module.parametrizations["weight"][0].backbone is None for t in pruner.targets)
    pruner = fs.Pruner(SmallCNN(), 0.5, 10, backbone="asl+")
    assert pruner.targets[0].module.parametrizations["weight"][0].backbone is pruner.backbone
