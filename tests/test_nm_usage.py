"""N:M Pruners under unusual but legitimate PyTorch usage.

The N:M counterpart of tests/test_pruner_usage.py: every N:M pattern (2:4,
4:8, 1:4) and method (feather-nm, hard-nm, sr-ste, s-ste, oneshot-nm) on
small models, in one situation each — a deep copy (an EMA model) outliving
the Pruner, a dtype conversion after attaching, ``torch.inference_mode``,
edits of the weights the fused forward's cache must notice, gradient
accumulation and the other ways of calling autograd, unusual layouts,
resumes, ties and zeros, non-finite weights, ``torch.compile``.

Where a result is "the layer-by-layer bits", the run is repeated with the
fused pass and the cache of layers computed alone turned off
(``FUSE_MAX_NUMEL = 0``, ``CACHE_ALONE = False``) and the two must agree bit
for bit; where it is "fresh", each layer's forward is compared with
:func:`~feather_sparse.nm.nm_threshold` computed from the stored weight now.
"""

from __future__ import annotations

import copy
import io
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs
from _guards import guard
from feather_sparse.nm import fused, nm_threshold

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest

PATTERNS = ["2:4", "4:8", "1:4"]
NM_METHODS = ["feather-nm", "hard-nm", "sr-ste", "s-ste", "oneshot-nm"]
METHODS = PATTERNS + NM_METHODS
DEFAULT_MAX = fused.FUSE_MAX_NUMEL  # as shipped, read before any test patches it


def make(model: nn.Module, method: str, total_steps: int = 8, **kwargs: Any) -> fs.Pruner:
    """A Pruner of ``method``: a bare pattern (Feather's operator), or an N:M method at 2:4.

    One-shot N:M prunes half-way through ``total_steps`` (dense before).
    """
    if method in PATTERNS:
        return fs.Pruner(model, pattern=method, **kwargs)
    return fs.make_pruner(model, method, pattern="2:4", total_steps=total_steps, **kwargs)


def pattern_of(method: str) -> tuple[int, int]:
    n, m = (method if method in PATTERNS else "2:4").split(":")
    return int(n), int(m)


def mlp(dtype: torch.dtype = torch.float32, width: int = 16) -> nn.Sequential:
    """Two small Linear layers: the fused pass computes them together."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, 32), nn.ReLU(), nn.Linear(32, 8, bias=False)).to(dtype)


def train(
    model: nn.Module,
    pruner: fs.Pruner,
    steps: int,
    dtype: torch.dtype = torch.float32,
    optimizer: torch.optim.Optimizer | None = None,
    seed: int = 0,
    width: int = 16,
) -> torch.optim.Optimizer:
    opt = optimizer or torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(4, width, generator=gen).to(dtype)
        loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        pruner.step()
    return opt


def layer_by_layer(monkeypatch: pytest.MonkeyPatch, off: bool = True) -> None:
    """Turn the fused pass and the cache of layers computed alone off (or leave them on)."""
    monkeypatch.setattr(fused, "FUSE_MAX_NUMEL", 0 if off else DEFAULT_MAX)
    monkeypatch.setattr(fused, "CACHE_ALONE", not off)


def parametrized(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    for name, module in model.named_modules():
        if hasattr(module, "parametrizations"):
            yield name, module


def fresh(module: nn.Module) -> torch.Tensor:
    """The layer's N:M forward computed now from its stored weight, alone, nothing cached."""
    param = module.parametrizations.weight[0]
    backbone, i = param.backbone, param.index
    weight = module.parametrizations.weight.original.detach()
    mask = None if backbone._masks is None else backbone._masks[i]
    scale = None if backbone._beta is None else backbone._beta[i]
    return nm_threshold(
        weight, backbone.pattern, param.threshold, param.operator.p, mask=mask, scale=scale
    )


def assert_fresh(model: nn.Module, where: str) -> None:
    """Every parametrized layer's forward, with and without grad, is the fresh one."""
    for name, module in parametrized(model):
        expected = fresh(module)
        assert torch.equal(module.weight, expected), f"{where}: layer {name} is stale"
        with torch.no_grad():
            assert torch.equal(module.weight, expected), f"{where}: layer {name} is stale"


def assert_pattern(weights: list[torch.Tensor], method: str) -> None:
    """At most ``n`` nonzeros in every group of ``m`` along the reduction dimension."""
    n, m = pattern_of(method)
    for w in weights:
        counts = (w.detach().reshape(w.shape[0], -1, m) != 0).sum(-1)
        assert int(counts.max()) <= n


# ------------------------------------------------------------------ copies
@pytest.mark.parametrize("end", ["finalize", "remove"])
@pytest.mark.parametrize("method", METHODS)
def test_a_deep_copy_trains_on_after_the_original_pruner_ends(method: str, end: str) -> None:
    model = mlp()
    pruner = make(model, method)
    train(model, pruner, steps=5)  # past one-shot's pruning step (4 of 8)
    x = torch.randn(4, 16)
    with torch.no_grad():
        before = model(x)
    ema = copy.deepcopy(model)  # an EMA model, a best-so-far snapshot
    getattr(pruner, end)()
    with torch.no_grad():
        assert torch.equal(ema(x), before)
    opt = torch.optim.SGD(ema.parameters(), lr=0.05)
    for _ in range(3):
        loss = ema(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    ema.eval()
    assert_fresh(ema, "the copy after training")
    assert_pattern([m.weight for _, m in parametrized(ema)], method)
    if end == "finalize":
        assert_pattern(pruner.weights(), method)


# ------------------------------------------------------------------ precision
def _converted_run(
    method: str, dtype: torch.dtype, convert_first: bool, evaluate: bool
) -> tuple[Any, ...]:
    """Train a 64-wide model converted to ``dtype`` before or after attaching (and
    evaluated in inference mode before training); save a resume point half-way.
    One-shot prunes at attaching here, as S-STE takes β."""
    model = mlp(width=64)
    if convert_first:
        model.to(dtype)
    kwargs: dict[str, Any] = {}
    if method == "oneshot-nm":
        kwargs["schedule"] = {"name": "constant", "start": 0.0}
    pruner = make(model, method, total_steps=8, **kwargs)
    model.to(dtype)
    if evaluate:  # the first forward after the conversion
        with torch.inference_mode():
            model(torch.randn(4, 64).to(dtype))
    opt = train(model, pruner, steps=4, dtype=dtype, width=64)
    saved = copy.deepcopy((pruner.dense_state_dict(), pruner.state_dict(), opt.state_dict()))
    train(model, pruner, steps=4, dtype=dtype, optimizer=opt, seed=1, width=64)
    return pruner, saved


@guard(
    "`model.half()` / `model.to(torch.bfloat16)` after attaching S-STE (its β) or a one-shot "
    "N:M Pruner that prunes at once (its mask)",
    "β and the mask, taken from the float32 weights at attaching, are taken again from the "
    "converted weights at each layer's first forward: training and resume are bit for bit "
    "those of a model converted before attaching",
)
@pytest.mark.parametrize("evaluate", [False, True], ids=["train", "evaluate-first"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("method", ["s-ste", "oneshot-nm", "sr-ste", "4:8"])
def test_a_half_conversion_after_attaching_trains_and_resumes_as_a_half_model(
    method: str, dtype: torch.dtype, evaluate: bool
) -> None:
    after, saved = _converted_run(method, dtype, convert_first=False, evaluate=evaluate)
    first, _ = _converted_run(method, dtype, convert_first=True, evaluate=evaluate)
    state_after, state_first = after.state_dict(), first.state_dict()
    for key in ("beta", "masks"):
        a, b = state_after["backbone"][key], state_first["backbone"][key]
        assert (a is None) == (b is None)
        for x, y in zip(a or [], b or []):
            assert torch.equal(x, y), key
    kept = after.backbone._beta or after.backbone._masks or []
    assert not any(t.is_inference() for t in kept)  # made outside an evaluation block
    for a, b in zip(after.weights(), first.weights()):
        assert a.dtype == dtype
        assert torch.equal(a, b)

    dense, state, opt_state = saved  # resume half-way into a model made in the half type
    model = mlp(width=64).to(dtype)
    model.load_state_dict(dense)
    resumed = fs.Pruner.from_state_dict(model, state)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opt.load_state_dict(opt_state)
    train(model, resumed, steps=4, dtype=dtype, optimizer=opt, seed=1, width=64)
    for a, b in zip(after.weights(), resumed.weights()):
        assert torch.equal(a, b)
    after.finalize()
    assert_pattern(after.weights(), method)


@pytest.mark.parametrize("method", ["s-ste", "oneshot-nm"])
def test_beta_and_mask_stay_as_taken_for_other_tensors_and_after_a_step(method: str) -> None:
    model = mlp()
    pruner = make(model, method, schedule={"name": "constant", "start": 0.0})
    taken = copy.deepcopy(pruner.backbone.state_dict())
    halves = {k: v.detach().half() for k, v in model.named_parameters()}
    torch.func.functional_call(model, halves, (torch.randn(4, 16).half(),))  # not the weights
    train(model, pruner, steps=1)
    for key in ("beta", "masks"):
        for a, b in zip(pruner.backbone.state_dict()[key] or [], taken[key] or []):
            assert torch.equal(a, b)
    model.double()  # converted after a training step: what was taken is kept
    train(model, pruner, steps=1, dtype=torch.float64)
    for key in ("beta", "masks"):
        for a, b in zip(pruner.backbone.state_dict()[key] or [], taken[key] or []):
            assert torch.equal(a, b)


# ------------------------------------------------------------------ inference mode
@pytest.mark.parametrize("context", ["inference_mode", "no_grad"])
@pytest.mark.parametrize("method", METHODS)
def test_attach_step_load_and_forward_inside_inference_mode_or_no_grad(
    method: str, context: str
) -> None:
    block = torch.inference_mode if context == "inference_mode" else torch.no_grad
    model = mlp()
    with block():
        pruner = make(model, method, total_steps=10)
    opt = train(model, pruner, steps=2)
    with block():
        pruner.step()
        model(torch.randn(4, 16))
        model.eval()
        model(torch.randn(4, 16))
        model.train()
    train(model, pruner, steps=2, optimizer=opt)
    buffer = io.BytesIO()
    torch.save((pruner.dense_state_dict(), pruner.state_dict()), buffer)
    buffer.seek(0)
    with block():
        dense, state = torch.load(buffer)
        pruner.load_state_dict(state)
    train(model, pruner, steps=2, optimizer=opt)  # past one-shot's pruning step (5 of 10)
    other = mlp()
    with block():
        other.load_state_dict(dense)
        resumed = fs.Pruner.from_state_dict(other, state)
    train(other, resumed, steps=2)
    assert_fresh(model, "after the blocks")
    with block():
        pruner.finalize()
    assert_pattern(pruner.weights(), method)
    assert not any(p.is_inference() for p in model.parameters())


# ------------------------------------------------------------------ the cache
@pytest.mark.parametrize("alone", [False, True], ids=["fused", "alone"])
@pytest.mark.parametrize("method", METHODS)
def test_the_cached_forward_follows_every_change_of_the_weights(
    method: str, alone: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if alone:  # every layer computed alone: cached while its forwards repeat
        monkeypatch.setattr(fused, "FUSE_MAX_NUMEL", 0)
    model = mlp()
    pruner = make(model, method)
    opt = train(model, pruner, steps=5)
    x = torch.randn(4, 16)
    first = pruner.targets[0].weight

    def repeat() -> None:  # forwards that fill the cache
        model(x)
        model.eval()
        with torch.no_grad():
            model(x)
        model.train()
        model(x)

    repeat()
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()  # no pruner.step(): the ramp stays, the weights move
    assert_fresh(model, "after optimizer.step()")
    repeat()
    with torch.no_grad():
        first.mul_(1.5)
    assert_fresh(model, "after an in-place edit under no_grad")
    repeat()
    with torch.no_grad():
        first[0, :4] = torch.tensor([1.0, -1.0, 1.0, 0.0])
    assert_fresh(model, "after an indexed write")
    saved = copy.deepcopy(model.state_dict())
    train(model, pruner, steps=2, optimizer=opt)
    repeat()
    model.load_state_dict(saved)
    assert_fresh(model, "after model.load_state_dict")
    repeat()
    opt.zero_grad(set_to_none=True)
    assert_fresh(model, "after zero_grad(set_to_none=True)")
    repeat()
    first.data = torch.randn_like(first)
    assert_fresh(model, "after assigning .data")
    repeat()
    first.data.copy_(torch.randn_like(first))
    assert_fresh(model, "after writing through .data")


def _autograd_run(model: nn.Module, pruner: fs.Pruner, kind: str) -> list[torch.Tensor]:
    """Six steps of SGD with momentum, the gradient taken in the way ``kind`` names."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    params = list(model.parameters())
    gen = torch.Generator().manual_seed(1)
    for _ in range(6):
        xs = [torch.randn(4, 16, generator=gen) for _ in range(3)]
        opt.zero_grad(set_to_none=True)
        if kind == "accumulation":
            for x in xs:
                model(x).pow(2).mean().backward()
        elif kind == "retain_graph":
            loss = model(xs[0]).pow(2).mean()
            loss.backward(retain_graph=True)
            loss.backward()
        elif kind == "double-forward":
            (model(xs[0]).pow(2).mean() + model(xs[1]).abs().mean()).backward()
        elif kind == "autograd.grad":
            grads = torch.autograd.grad(sum(model(x).pow(2).mean() for x in xs), params)
            for p, g in zip(params, grads):
                p.grad = g
        elif kind == "create_graph":  # a gradient penalty
            loss = model(xs[0]).pow(2).mean()
            grads = torch.autograd.grad(loss, params, create_graph=True)
            (loss + 0.1 * sum(g.pow(2).sum() for g in grads)).backward()
        elif kind == "functional_call":
            named = dict(model.named_parameters())
            for x in xs:
                torch.func.functional_call(model, named, (x,)).pow(2).mean().backward()
        elif kind == "func.grad":
            detached = {k: v.detach() for k, v in model.named_parameters()}

            def loss_of(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
                return torch.func.functional_call(model, p, (x,)).pow(2).mean()

            grads = torch.func.grad(loss_of)(detached, xs[0])
            for k, p in model.named_parameters():
                p.grad = grads[k]
        elif kind == "evaluation-between":
            model(xs[0]).pow(2).mean().backward()
            model.eval()
            with torch.no_grad():
                model(xs[1])
                model(xs[2])
            model.train()
            model(xs[2]).pow(2).mean().backward()
        opt.step()
        pruner.step()
    return [w.detach().clone() for w in pruner.weights()]


AUTOGRAD = [
    "accumulation",
    "retain_graph",
    "double-forward",
    "autograd.grad",
    "create_graph",
    "functional_call",
    "func.grad",
    "evaluation-between",
]


@pytest.mark.parametrize("method", METHODS)
def test_every_way_of_taking_gradients_gives_the_layer_by_layer_bits(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for kind in AUTOGRAD:
        runs = []
        for off in (False, True):
            layer_by_layer(monkeypatch, off)
            model = mlp()
            runs.append(_autograd_run(model, make(model, method, total_steps=6), kind))
        for a, b in zip(*runs):
            assert torch.equal(a, b), kind


# ------------------------------------------------------------------ layers
class Net(nn.Module):
    """Conv2d, Conv1d and Linear layers, optionally channels-last, transposed, tied or large."""

    def __init__(self, layout: str) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(8, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, padding=1)
        self.c3 = nn.Conv1d(16, 8, 4, bias=False)
        self.fc = nn.Linear(40, 16)
        self.fc2 = nn.Linear(16, 16, bias=False)
        self.fc3 = nn.Linear(16, 16, bias=False)
        if layout == "transposed":  # a weight whose storage is (in, out)
            self.fc.weight = nn.Parameter(torch.randn(40, 16).t())
        if layout == "tied":
            self.fc3.weight = self.fc2.weight
        if layout == "large":  # over FUSE_MAX_NUMEL: computed alone, cached while it repeats
            self.fc3 = nn.Linear(16, 2 * DEFAULT_MAX // 16, bias=False)
        if layout == "channels_last":
            self.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.c2(F.relu(self.c1(x)))).mean(2)  # (b, 16, 8)
        h = F.relu(self.fc(self.c3(h).flatten(1)))  # (b, 40) -> (b, 16)
        return self.fc3(F.relu(self.fc2(h)))


def _net_run(method: str, layout: str) -> tuple[list[torch.Tensor], Net, fs.Pruner]:
    torch.manual_seed(0)
    model = Net(layout)
    pruner = make(model, method, total_steps=6)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    for _ in range(6):
        opt.zero_grad()
        for _ in range(2):  # accumulation: forwards repeat before the update
            x = torch.randn(2, 8, 8, 8, generator=gen)
            if layout == "channels_last":
                x = x.to(memory_format=torch.channels_last)
            model(x).pow(2).mean().backward()
        opt.step()
        pruner.step()
    return [w.detach().clone() for w in pruner.weights()], model, pruner


@pytest.mark.parametrize("layout", ["channels_last", "transposed", "tied", "large"])
@pytest.mark.parametrize("method", METHODS)
def test_unusual_layouts_give_the_layer_by_layer_bits_and_bake_the_pattern(
    method: str, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    layer_by_layer(monkeypatch)
    expected, _, _ = _net_run(method, layout)
    layer_by_layer(monkeypatch, off=False)
    weights, model, pruner = _net_run(method, layout)
    for a, b in zip(weights, expected):
        assert torch.equal(a, b)
    assert_fresh(model, layout)
    if layout == "large":  # the path this layout is for: fc3 (the last target) outside the pass
        fused_forward = pruner.backbone._fused
        assert fused_forward is None or fused_forward.eligible[-1] is False
    x = torch.randn(2, 8, 8, 8)
    with torch.no_grad():
        live = model(x)
    pruner.finalize()
    with torch.no_grad():
        torch.testing.assert_close(model(x), live)
    assert_pattern(pruner.weights(), method)
    if layout == "channels_last":
        assert model.c1.weight.is_contiguous(memory_format=torch.channels_last)
    if layout == "tied":
        assert model.fc3.weight is model.fc2.weight


# ------------------------------------------------------------------ state
@pytest.mark.parametrize("method", METHODS)
def test_resume_at_any_step_is_bit_exact(method: str) -> None:
    for at in (2, 4, 5):  # before, at and after one-shot's pruning step (4 of 8)
        model = mlp()
        pruner = make(model, method)
        opt = train(model, pruner, steps=at)
        dense, state, opt_state = copy.deepcopy(
            (pruner.dense_state_dict(), pruner.state_dict(), opt.state_dict())
        )
        train(model, pruner, steps=8 - at, optimizer=opt, seed=3)
        other = mlp()
        other.load_state_dict(dense)
        resumed = fs.Pruner.from_state_dict(other, state)
        opt2 = torch.optim.SGD(other.parameters(), lr=0.05)
        opt2.load_state_dict(opt_state)
        train(other, resumed, steps=8 - at, optimizer=opt2, seed=3)
        for a, b in zip(pruner.weights(), resumed.weights()):
            assert torch.equal(a, b), at
        x = torch.randn(4, 16)
        assert torch.equal(model(x), other(x))


@guard(
    "a damaged N:M backbone state: S-STE's β NaN, inf, zero or negative, or a one-shot mask "
    "that is not bool",
    "`ValueError` 'not a valid Pruner state' naming the entry and the layer; nothing of the "
    "state is applied (a bad β would scale the layer's forward unseen)",
)
@pytest.mark.parametrize(
    "method, key, value",
    [
        ("s-ste", "beta", torch.tensor(math.nan)),
        ("s-ste", "beta", torch.tensor(math.inf)),
        ("s-ste", "beta", torch.tensor(0.0)),
        ("s-ste", "beta", torch.tensor(-2.0)),
        ("s-ste", "beta", torch.tensor(2)),
        ("oneshot-nm", "masks", None),  # the saved mask as float 0/1
    ],
    ids=["beta-nan", "beta-inf", "beta-zero", "beta-negative", "beta-int", "mask-float"],
)
def test_a_damaged_backbone_state_is_refused_before_anything_is_applied(
    method: str, key: str, value: torch.Tensor | None
) -> None:
    model = mlp()
    pruner = make(model, method, schedule="constant")
    train(model, pruner, steps=2)
    state = copy.deepcopy(pruner.state_dict())
    own = copy.deepcopy(pruner.state_dict())
    entries = state["backbone"][key]
    entries[1] = entries[1].float() if value is None else value
    with pytest.raises(ValueError, match=rf"not a valid Pruner state: .*{key}.* layer '2'"):
        pruner.load_state_dict(state)
    for a, b in zip(pruner.backbone.state_dict()[key], own["backbone"][key]):
        assert torch.equal(a, b)
    assert pruner.current_step == own["step"]
    train(model, pruner, steps=1)  # goes on as it was
    pruner.finalize()
    assert_pattern(pruner.weights(), method)


@guard(
    "a saved N:M Pruner state whose ramp (its `thresholds`, in [0, 1]) is out of range or NaN",
    "`ValueError` naming the entry and the layer, before anything is applied",
)
@pytest.mark.parametrize("ramp", [5.0, -0.5, math.nan])  # (r < 0 and NaN: any Pruner state)
def test_an_nm_ramp_out_of_range_is_refused(ramp: float) -> None:
    model = mlp()
    pruner = make(model, "feather-nm", schedule="constant")
    train(model, pruner, steps=2)
    own = copy.deepcopy(pruner.state_dict())
    state = copy.deepcopy(own)
    state["thresholds"][1] = torch.tensor(ramp)
    with pytest.raises(ValueError, match=r"not a valid Pruner state: thresholds\[1\]"):
        pruner.load_state_dict(state)
    for a, b in zip(pruner.thresholds(), own["thresholds"]):
        assert torch.equal(a, b)


# ------------------------------------------------------------------ ties and zeros
@pytest.mark.parametrize(
    "operator, rows",
    [
        # hard: exactly N kept per group where N are nonzero, ties to the lower position
        ("hard", [[1, 1, 0, 0, 0, 0, 0, 0], [0, 0, 0, 3, -2, 2, 0, 0]]),
        # p = 3: a kept weight tied with T_g maps to 0, so a group of ties empties
        ("feather", [[0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 3, 0, 0, 0, 0]]),
    ],
)
def test_finalize_golden_groups_of_ties_and_zeros(operator: str, rows: list[list[float]]) -> None:
    layer = nn.Linear(8, 2, bias=False)
    with torch.no_grad():  # groups: four ties, all zeros, one nonzero, ties of both signs
        layer.weight.copy_(torch.tensor([[1, 1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 3, -2, 2, -2, 2.0]]))
    pruner = fs.Pruner(nn.Sequential(layer), pattern="2:4", operator=operator)
    pruner.finalize()
    assert torch.equal(layer.weight.detach(), torch.tensor(rows, dtype=torch.float32))
    assert not torch.signbit(layer.weight.detach()[layer.weight.detach() == 0]).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("method", METHODS)
def test_finalize_with_many_ties_and_zero_groups_keeps_the_forward_and_the_count(
    method: str, dtype: torch.dtype
) -> None:
    model = mlp()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((p * 4).round() / 4)  # magnitudes in steps of 0.25: ties everywhere
        model[0].weight[:3] = 0.0
        model[0].weight[3] = -0.0
    model.to(dtype)
    kwargs = {} if method in PATTERNS else {"schedule": "constant"}
    pruner = make(model, method, **kwargs)
    x = torch.randn(4, 16, dtype=dtype)
    with torch.no_grad():
        live = model(x)
    reported = pruner.sparsity_achieved()
    before = [w.detach().clone() for w in pruner.weights()]
    pruner.finalize()
    assert pruner.sparsity_achieved() == reported  # the report counted what is baked
    with torch.no_grad():
        torch.testing.assert_close(model(x), live)
    assert_pattern(pruner.weights(), method)
    n, m = pattern_of(method)
    if method in ("hard-nm", "sr-ste", "oneshot-nm"):  # the hard mask: exactly N nonzeros,
        for w, dense in zip(pruner.weights(), before):  # or all of a group's if fewer
            kept = (w.detach().reshape(-1, m) != 0).sum(1)
            had = (dense.reshape(-1, m) != 0).sum(1)
            assert torch.equal(kept, had.clamp(max=n))


# ------------------------------------------------------------------ non-finite weights
@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("method", METHODS)
def test_non_finite_weights_are_refused_at_attach_step_and_finalize(
    method: str, bad: float
) -> None:
    model = mlp()
    with torch.no_grad():
        model[2].weight[0, 3] = bad
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(RuntimeError, match=r"non-finite weights.* 2 at step 0"):
        make(model, method)
    assert not any(hasattr(m, "parametrizations") for m in model)  # left as it was
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0, equal_nan=True)

    model = mlp()
    pruner = make(model, method)
    train(model, pruner, steps=3)
    dense = copy.deepcopy(pruner.dense_state_dict())
    with torch.no_grad():
        pruner.weights()[1][0, 3] = bad
    with pytest.raises(RuntimeError, match=r"non-finite weights.* 2 at step 4"):
        pruner.step()
    with pytest.raises(RuntimeError, match="non-finite weights"):
        pruner.finalize()
    assert all(hasattr(model[i], "parametrizations") for i in (0, 2))  # nothing baked
    with torch.no_grad():
        pruner.weights()[1][0, 3] = dense["2.weight"][0, 3]
    pruner.finalize()
    assert_pattern(pruner.weights(), method)


@guard(
    "`finalize()` of an N:M Pruner made with `check_finite=False` whose weights hold a NaN",
    "`RuntimeError` naming the layer and the non-finite weights (not the advice to finalize "
    "without `sparsity=`); nothing is baked and the Pruner goes on as it was",
)
@pytest.mark.parametrize("method", METHODS)
def test_finalize_with_a_nan_let_through_names_the_nan(method: str) -> None:
    model = mlp()
    pruner = make(model, method, check_finite=False)
    train(model, pruner, steps=5)
    good = pruner.weights()[1][0, 3].item()
    with torch.no_grad():
        pruner.weights()[1][0, 3] = math.nan
    masks = pruner.backbone._masks
    if method in ("hard-nm", "sr-ste") or (method == "oneshot-nm" and bool(masks[1][0, 3])):
        # the hard mask keeps the NaN (ranked first, or in the frozen mask): the group keeps
        # it and N − 1 others, as the unstructured Pruner bakes a NaN it let through
        pruner.finalize()
        assert int(model[2].weight.isnan().sum()) == 1
        assert_pattern(pruner.weights(), method)
        return
    with pytest.raises(RuntimeError, match=r"non-finite weights \(NaN or inf\) in layer '2'"):
        pruner.finalize()
    assert all(hasattr(model[i], "parametrizations") for i in (0, 2))
    with torch.no_grad():
        pruner.weights()[1][0, 3] = good
    train(model, pruner, steps=1)  # the Pruner goes on
    pruner.finalize()
    assert_pattern(pruner.weights(), method)


# ------------------------------------------------------------------ torch.compile
@pytest.mark.parametrize("method", ["s-ste", "oneshot-nm"])
def test_compiled_training_matches_eager(method: str) -> None:
    def run(backend: str | None) -> tuple[list[torch.Tensor], int]:
        torch._dynamo.reset()
        model = mlp()
        pruner = make(model, method, total_steps=6)
        counter = torch._dynamo.testing.CompileCounterWithBackend(backend) if backend else None
        forward: Callable[[torch.Tensor], torch.Tensor] = (
            torch.compile(model, backend=counter) if counter else model
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(0)
        for _ in range(6):
            loss = forward(torch.randn(4, 16, generator=gen)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            pruner.step()
        return [w.detach().clone() for w in pruner.weights()], counter.frame_count if counter else 0

    eager, _ = run(None)
    compiled, frames = run("aot_eager")
    # S-STE: one graph; one-shot: a second once the mask is frozen (half-way)
    assert frames == (1 if method == "s-ste" else 2)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
