"""The Pruner under unusual but common PyTorch usage.

Each test trains a small model a few steps with one of three pruners — Feather
at 90 % unstructured sparsity, Feather 2:4 and SR-STE 2:4 — in one situation
(autocast, half-precision weights, activation checkpointing, a dtype move after
attaching, fused optimizers, ``torch.func``, frozen layers, grouped and dilated
convolutions, ``torch.inference_mode``), then checks that ``finalize`` leaves
exact zeros at the target and, where it applies, that a resume is bit-exact.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import feather_sparse as fs
from _guards import guard
from _helpers import frozen_spartan

METHODS = ["unstructured", "2:4", "sr-ste"]


def make(model: nn.Module, method: str, total_steps: int = 8, **kwargs: Any) -> fs.Pruner:
    """A pruner of ``method`` (see :data:`METHODS`) on ``model``."""
    if method == "unstructured":
        return fs.Pruner(model, sparsity=0.9, total_steps=total_steps, **kwargs)
    if method == "2:4":
        return fs.Pruner(model, pattern="2:4", **kwargs)
    return fs.make_pruner(model, method, pattern="2:4", total_steps=total_steps, **kwargs)


def mlp(dtype: torch.dtype = torch.float32) -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8, bias=False)).to(dtype)


def train(
    model: nn.Module,
    pruner: fs.Pruner,
    steps: int,
    dtype: torch.dtype = torch.float32,
    optimizer: torch.optim.Optimizer | None = None,
    seed: int = 0,
) -> torch.optim.Optimizer:
    opt = optimizer or torch.optim.SGD([*model.parameters(), *pruner.parameters()], lr=0.05)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(4, 16, generator=gen).to(dtype)
        loss = model(x).float().pow(2).mean() + pruner.regularizer()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        pruner.step()
    return opt


def assert_finalized(pruner: fs.Pruner, method: str) -> None:
    """``finalize`` leaves exact zeros: 90 % of the weights, or at most 2 of every 4."""
    pruner.finalize()
    weights = [t.weight.detach() for t in pruner.targets]
    if method == "unstructured":
        zeros = sum(int((w == 0).sum()) for w in weights)
        assert zeros >= round(0.9 * sum(w.numel() for w in weights))
    else:
        for w in weights:  # groups of 4 along the reduction dimension
            assert int((w.reshape(w.shape[0], -1, 4) != 0).sum(-1).max()) <= 2


# ------------------------------------------------------------------ inference mode
@guard(
    "a Pruner attached inside `torch.inference_mode()`",
    "works: its thresholds and backbone state are made outside inference mode, so training goes on",
)
@pytest.mark.parametrize("method", [*METHODS, "asl+"])
def test_a_pruner_attached_in_inference_mode_trains(method: str) -> None:
    model = mlp()
    with torch.inference_mode():
        if method == "asl+":
            pruner = fs.Pruner(model, sparsity=0.9, total_steps=6, backbone="asl+")
        else:
            pruner = make(model, method, total_steps=6)
    train(model, pruner, steps=6)
    assert_finalized(pruner, "unstructured" if method == "asl+" else method)


@guard(
    "`pruner.step()` (or `update()`) called inside `torch.inference_mode()`",
    "works: the backbone's state (ASL+'s σ) is made outside it; the next training step runs",
)
@pytest.mark.parametrize("backbone", ["global", "asl+"])
def test_a_step_in_inference_mode_leaves_training_working(backbone: str) -> None:
    model = mlp()
    pruner = fs.Pruner(model, sparsity=0.9, total_steps=6, backbone=backbone)
    opt = train(model, pruner, steps=1)
    with torch.inference_mode():
        pruner.step()
    train(model, pruner, steps=4, optimizer=opt)
    assert_finalized(pruner, "unstructured")


@guard(
    "a Pruner state read with `torch.load` inside `torch.inference_mode()`, then loaded",
    "works: the backbone keeps copies of its own, not the inference tensors",
)
def test_a_state_loaded_in_inference_mode_trains() -> None:
    model = mlp()
    pruner = fs.Pruner(model, sparsity=0.9, total_steps=8, backbone="asl+")
    opt = train(model, pruner, steps=4)
    buffer = io.BytesIO()
    torch.save(pruner.state_dict(), buffer)
    buffer.seek(0)
    with torch.inference_mode():
        pruner.load_state_dict(torch.load(buffer))
    train(model, pruner, steps=4, optimizer=opt)
    assert_finalized(pruner, "unstructured")


# ------------------------------------------------------------------ precision
@pytest.mark.parametrize("method", METHODS)
def test_training_under_bf16_autocast(method: str) -> None:
    model = mlp()
    pruner = make(model, method)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(8):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 16)).float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()
    assert model[0].parametrizations.weight.original.grad.dtype == torch.float32
    assert_finalized(pruner, method)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("method", METHODS)
def test_half_weights_train_finalize_and_resume_bit_exactly(
    method: str, dtype: torch.dtype
) -> None:
    model = mlp(dtype)
    pruner = make(model, method, total_steps=12)
    opt = train(model, pruner, steps=6, dtype=dtype)
    dense, state, opt_state = (
        copy.deepcopy(pruner.dense_state_dict()),
        copy.deepcopy(pruner.state_dict()),
        copy.deepcopy(opt.state_dict()),
    )
    train(model, pruner, steps=6, dtype=dtype, optimizer=opt, seed=1)

    resumed = mlp(dtype)
    resumed.load_state_dict(dense)
    again = fs.Pruner.from_state_dict(resumed, state)
    opt2 = torch.optim.SGD(resumed.parameters(), lr=0.05)
    opt2.load_state_dict(opt_state)
    train(resumed, again, steps=6, dtype=dtype, optimizer=opt2, seed=1)
    for a, b in zip(pruner.weights(), again.weights()):
        assert torch.equal(a, b)
    for a, b in zip(pruner.thresholds(), again.thresholds()):
        assert torch.equal(a, b)
    assert_finalized(pruner, method)
    assert model[0].weight.dtype == dtype


@pytest.mark.parametrize("method", METHODS)
def test_a_dtype_move_after_attaching_is_followed(method: str) -> None:
    model = mlp()
    pruner = make(model, method)
    train(model, pruner, steps=3)
    weight = pruner.weights()[0]
    model.double()
    assert pruner.weights()[0] is weight  # the optimizer's Parameter, converted in place
    assert all(t.dtype == torch.float64 for t in pruner.thresholds())
    train(model, pruner, steps=5, dtype=torch.float64)
    assert_finalized(pruner, method)
    assert model[0].weight.dtype == torch.float64


@guard(
    "`model.half()` / `model.to(torch.bfloat16)` after the Pruner is attached",
    "thresholds stay float32 (as when attached to a half model): training is the same, no value "
    "rounded to the half type",
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pattern", [None, "2:4"])
def test_a_half_conversion_after_attaching_trains_as_a_half_model(
    pattern: str | None, dtype: torch.dtype
) -> None:
    def run(convert_first: bool) -> fs.Pruner:
        torch.manual_seed(0)
        model = mlp()
        if convert_first:
            model.to(dtype)
        # a ramp up to 2:4 over the steps: the ramp buffer takes values between 0 and 1
        schedule = fs.CubicSchedule(start=0.0, end=0.9)
        if pattern is None:
            pruner = fs.Pruner(model, sparsity=0.9, total_steps=12, schedule=schedule)
        else:
            pruner = fs.Pruner(model, pattern=pattern, total_steps=12, schedule=schedule)
        model.to(dtype)
        assert all(t.dtype == torch.float32 for t in pruner.thresholds())
        train(model, pruner, steps=8, dtype=dtype)
        return pruner

    converted_after, converted_first = run(False), run(True)
    for a, b in zip(converted_after.thresholds(), converted_first.thresholds()):
        assert a.dtype == torch.float32
        assert torch.equal(a, b)
    for a, b in zip(converted_after.weights(), converted_first.weights()):
        assert torch.equal(a, b)


# ------------------------------------------------------------------ autograd usage
class Checkpointed(nn.Module):
    """Two pruned layers inside activation checkpoints, one of them reused (two names)."""

    def __init__(self, reentrant: bool | None) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 32)
        self.again = self.b
        self.reentrant = reentrant  # None: no checkpointing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def block(t: torch.Tensor) -> torch.Tensor:
            return F.relu(self.b(F.relu(self.a(t))))

        if self.reentrant is None:
            return self.again(block(x))
        h = checkpoint(block, x, use_reentrant=self.reentrant)
        return checkpoint(self.again, h, use_reentrant=self.reentrant)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("method", METHODS)
def test_activation_checkpointing_gives_the_plain_gradients(method: str, reentrant: bool) -> None:
    model = Checkpointed(reentrant)
    pruner = make(model, method)
    x = torch.randn(4, 16, requires_grad=True)  # reentrant checkpoints need an input with grad
    for _ in range(3):
        model.zero_grad()
        model(x).pow(2).mean().backward()
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(0.05 * p.grad)
        pruner.step()
    model.zero_grad()
    model(x).pow(2).mean().backward()
    checkpointed = [p.grad.clone() for p in model.parameters()]
    model.reentrant = None
    model.zero_grad()
    model(x).pow(2).mean().backward()
    for a, p in zip(checkpointed, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=0, atol=0)
    assert sorted(pruner.dense_state_dict()) == sorted(
        k.replace("parametrizations.weight.original", "weight") for k in model.state_dict()
    )
    assert_finalized(pruner, method)


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=True),
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, fused=True),
    ],
    ids=["adam-foreach", "adamw-fused", "sgd-fused"],
)
@pytest.mark.parametrize("method", METHODS)
def test_foreach_and_fused_optimizers_with_clipping(
    method: str, make_optimizer: Callable[[Any], torch.optim.Optimizer]
) -> None:
    model = mlp()
    pruner = make(model, method)
    opt = make_optimizer(model.parameters())
    for _ in range(8):
        loss = model(torch.randn(4, 16)).pow(2).mean()
        model.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        pruner.step()
    assert_finalized(pruner, method)


@pytest.mark.parametrize("method", METHODS)
def test_functional_call_no_grad_and_eval_see_the_pruned_weights(method: str) -> None:
    model = mlp()
    pruner = make(model, method)
    train(model, pruner, steps=3)
    x = torch.randn(4, 16)
    out = model(x)
    params = dict(model.named_parameters())
    assert torch.equal(torch.func.functional_call(model, params, (x,)), out)
    halved = {k: v.detach() / 2 for k, v in params.items()}
    expected = copy.deepcopy(model)
    with torch.no_grad():
        for p in expected.parameters():
            p.div_(2)
    assert torch.equal(torch.func.functional_call(model, halved, (x,)), expected(x))
    with torch.no_grad():
        assert torch.equal(model(x), out)
    model.eval()
    assert torch.equal(model(x), out)
    model.train()
    assert_finalized(pruner, method)


@pytest.mark.parametrize("method", METHODS)
def test_a_frozen_layer_is_pruned_and_stays_frozen(method: str) -> None:
    model = mlp()
    model[0].requires_grad_(False)
    stored = model[0].weight.detach().clone()
    pruner = make(model, method)
    train(model, pruner, steps=8)
    assert torch.equal(pruner.weights()[0], stored)  # no update reached it
    assert_finalized(pruner, method)
    assert not model[0].weight.requires_grad


# ------------------------------------------------------------------ layers
@pytest.mark.parametrize(
    "layer, shape",
    [
        (lambda: nn.Conv2d(8, 16, 3, groups=2, dilation=2, padding=2), (2, 8, 8, 8)),
        (lambda: nn.Conv1d(8, 8, 4, groups=8, bias=False), (2, 8, 10)),
        (lambda: nn.Conv2d(8, 8, 1, groups=2, padding_mode="circular"), (2, 8, 5, 5)),
        (lambda: nn.Linear(16, 8, bias=False), (2, 16)),
    ],
    ids=["grouped-dilated", "depthwise-1d", "grouped-1x1", "linear-no-bias"],
)
@pytest.mark.parametrize("method", METHODS)
def test_grouped_dilated_and_biasless_layers_keep_their_own_forward(
    method: str, layer: Callable[[], nn.Module], shape: tuple[int, ...]
) -> None:
    model = nn.Sequential(layer())
    x = torch.randn(*shape)
    pruner = make(model, method)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(8):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()
    with torch.no_grad():
        live = model(x)
    assert_finalized(pruner, method)
    with torch.no_grad():
        torch.testing.assert_close(model(x), live)  # the baked layer computes what it did


@pytest.mark.parametrize("method", ["2:4", "sr-ste"])
@pytest.mark.parametrize(
    "layer, reduction",
    [
        (lambda: nn.Conv2d(8, 8, 3, groups=8), 9),  # depthwise 3x3: 1 channel x 9
        (lambda: nn.Conv1d(8, 8, 3, groups=8, dilation=2), 3),
        (lambda: nn.Linear(6, 8, bias=False), 6),
    ],
    ids=["depthwise-3x3", "depthwise-1d-dilated", "linear-6"],
)
def test_nm_refuses_a_reduction_dimension_not_a_multiple_of_m(
    method: str, layer: Callable[[], nn.Module], reduction: int
) -> None:
    model = nn.Sequential(layer())
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=rf"reduction dimension of {reduction}, not a multiple"):
        make(model, method)
    assert not hasattr(model[0], "parametrizations")  # the model is left as it was
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key])


@guard(
    "a model moved to another device after its backbone froze a mask (Spartan's last 20 %, "
    "one-shot N:M's fine-tuning)",
    "the frozen masks follow each layer's weight to its device on the next forward (they are "
    "the backbone's, not buffers of the model, and stayed behind)",
)
def test_frozen_masks_follow_the_model_to_another_device() -> None:
    # The meta device stands in for a GPU here: a full-size mask left on the CPU
    # cannot meet a weight on another device.
    model, pruner = frozen_spartan()
    model.to("meta")
    out = model(torch.randn(4, 16, device="meta"))
    out.sum().backward()
    assert out.device.type == "meta"
    assert all(m.device.type == "meta" for m in pruner.backbone._frozen_masks)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    pruner = fs.make_pruner(model, "oneshot-nm", pattern="2:4", total_steps=4, schedule="constant")
    assert pruner.backbone._masks is not None
    model.to("meta")
    weight = pruner.targets[0].weight
    keep = pruner.backbone.keep_mask(weight, pruner.thresholds()[0], 0)
    assert keep.device.type == "meta" and pruner.backbone._masks[0].device.type == "meta"
    assert pruner.backbone._masks[1].device.type == "cpu"  # moved when its own layer runs
