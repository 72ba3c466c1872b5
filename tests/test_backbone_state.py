"""A backbone's own state stays consistent with the Pruner and the model.

- What an N:M backbone counts as pruned depends on the operator's ``p``; the
  operator is the one source of it (passed to ``pruned_mask``, or the one the
  layer's forward applies), never a copy kept in the backbone.
- ASL+'s learned thresholds are parameters of the backbone, in the user's
  optimizer: a model moved after attaching takes them along in place, as
  ``model.to`` moves the model's own parameters. The meta device stands in for
  a GPU here; the Feather operator's kernels do not run on it, so those tests
  use a plain masking operator (ASL+ works with any operator).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

import feather_sparse as fs
from _guards import guard
from _helpers import frozen_spartan
from feather_sparse.nm.backbone import NMBackbone
from feather_sparse.ops import Operator, ThresholdOperator

# 2:4 groups with magnitudes tied at the group threshold T_g (the 2nd smallest):
# the first group is [1, 1, 1, 0.5], T_g = 1. The hard operator keeps two of the
# tied ones; a finite p zeroes every |w| <= T_g, i.e. the whole group.
TIED = [[1.0, -1.0, 1.0, 0.5], [0.25, 2.0, -3.0, 1.0]]


def tied_layer() -> nn.Linear:
    layer = nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(TIED))
    return layer


def forward_zeros(layer: nn.Linear) -> Tensor:
    with torch.no_grad():
        return layer.weight == 0


# ---------------------------------------------------------------- N:M and p
def test_nm_pruned_mask_follows_the_attached_operator_not_a_copy_of_p() -> None:
    layer = tied_layer()
    pruner = fs.Pruner(layer, pattern="2:4", operator="hard")
    zeros = forward_zeros(layer)
    assert int(zeros.sum()) == 4  # two per group: the hard forward breaks the tie
    backbone = pruner.backbone
    assert isinstance(backbone, NMBackbone)
    backbone.p = 3.0  # a stale value (a reused backbone, another Pruner's p): never read
    w, t = pruner.weights()[0], pruner.thresholds()[0]
    assert torch.equal(backbone.pruned_mask(0, w, t), zeros)
    assert pruner.sparsity_achieved() == 0.5
    assert pruner.report().layers[0].sparsity == 0.5


def test_nm_pruned_mask_takes_the_operator_it_is_given() -> None:
    layer = tied_layer()
    pruner = fs.Pruner(layer, pattern="2:4")  # Feather, p = 3
    backbone = pruner.backbone
    w, t = pruner.weights()[0], pruner.thresholds()[0]
    feather = backbone.pruned_mask(0, w, t)
    assert torch.equal(feather, forward_zeros(layer))
    assert int(feather.sum()) == 6  # the tied group entirely, and two of the other
    assert torch.equal(backbone.pruned_mask(0, w, t, operator=pruner.operator), feather)
    hard = backbone.pruned_mask(0, w, t, operator=ThresholdOperator(math.inf, "hard"))
    assert int(hard.sum()) == 4  # what a hard forward zeroes, whatever is attached

    hard_layer = tied_layer()
    fs.Pruner(hard_layer, pattern="2:4", operator="hard")
    assert torch.equal(hard, forward_zeros(hard_layer))


@guard(
    "an N:M backbone asked which weights are pruned, with no operator given and none "
    "attached to the layer (the Pruner removed, the backbone driven by hand)",
    "`ValueError` naming the layer and the fix (pass `operator=`, e.g. `pruner.operator`)",
)
def test_nm_pruned_mask_without_an_operator_names_the_fix() -> None:
    pruner = fs.Pruner(nn.Sequential(tied_layer()), pattern="2:4")
    w, t = pruner.weights()[0].detach().clone(), pruner.thresholds()[0]
    pruner.remove()
    with pytest.raises(ValueError, match=r"layer '0'.*no operator attached.*pass operator="):
        pruner.backbone.pruned_mask(0, w, t)
    mask = pruner.backbone.pruned_mask(0, w, t, operator=fs.OPERATORS.get("feather"))
    assert int(mask.sum()) == 6


# ---------------------------------------------------------------- ASL+ and devices
class _Mask(Operator):
    """Plain masking, ``w·1[|w| > T]``: runs on the meta device (the Feather kernels do not)."""

    name = "mask"

    def __call__(self, w: Tensor, t: Tensor, theta: float) -> Tensor:
        return torch.where(w.abs() > t, w, 0.0)


def asl_mlp() -> tuple[nn.Sequential, fs.Pruner]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    return model, fs.Pruner(model, 0.5, 10, backbone="asl+", operator=_Mask())


@guard(
    'a model moved to another device (`model.to("cuda")`) after attaching an ASL+ Pruner',
    "ASL+'s learned thresholds follow in place (the same `Parameter`s, so the optimizer "
    "keeps training them), as `model.to` moves the model's own parameters",
)
def test_asl_thresholds_follow_a_model_moved_after_attaching() -> None:
    model, pruner = asl_mlp()
    r = pruner.parameters()
    optimizer = torch.optim.SGD([*model.parameters(), *r], lr=0.1, momentum=0.9)
    model.to("meta")
    out = model(torch.randn(4, 16, device="meta"))
    loss = out.square().mean() + pruner.regularizer()
    loss.backward()
    assert loss.device.type == "meta"
    assert all(p.device.type == "meta" for p in r)
    assert all(p.grad is not None and p.grad.device.type == "meta" for p in r)
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in r)
    assert [id(p) for p in pruner.parameters()] == [id(p) for p in r]  # the optimizer's
    optimizer.step()  # updates the moved thresholds (torch's SGD, momentum made on meta)
    assert all(optimizer.state[p]["momentum_buffer"].device.type == "meta" for p in r)


def test_asl_thresholds_follow_before_the_first_forward() -> None:
    """The regularizer or parameters() asked for first (an optimizer built after the move,
    ``reg + task_loss`` evaluated left to right) already see the weights' device."""
    model, pruner = asl_mlp()
    r = list(pruner.backbone.parameters())
    model.to("meta")
    reg = pruner.regularizer()
    assert reg.device.type == "meta" and reg.requires_grad
    assert all(p.device.type == "meta" for p in pruner.parameters())
    assert [id(p) for p in pruner.parameters()] == [id(p) for p in r]

    model, pruner = asl_mlp()
    model.to("meta")
    params = pruner.parameters()
    assert all(p.device.type == "meta" for p in params)
    (model(torch.randn(2, 16, device="meta")).sum() + pruner.regularizer()).backward()
    assert all(p.grad is not None and p.grad.device.type == "meta" for p in params)


def test_asl_thresholds_moved_in_inference_mode_still_train() -> None:
    """An evaluation in ``torch.inference_mode`` right after the move must not leave
    inference tensors behind: the next training forward saves them for its backward."""
    model, pruner = asl_mlp()
    r = pruner.parameters()
    model.to("meta")
    with torch.inference_mode():
        model(torch.randn(2, 16, device="meta"))
    assert all(p.device.type == "meta" and not p.is_inference() for p in r)
    model(torch.randn(2, 16, device="meta")).sum().backward()
    assert all(p.grad is not None and p.grad.device.type == "meta" for p in r)


def test_asl_gradient_accumulated_before_the_move_follows() -> None:
    """A gradient not yet zeroed moves with its threshold, as ``model.to`` moves the
    weights' gradients: the next backward accumulates into it."""
    model, pruner = asl_mlp()
    model(torch.randn(4, 16)).square().mean().backward()
    r = pruner.parameters()
    assert all(p.grad is not None and p.grad.device.type == "cpu" for p in r)
    model.to("meta")
    model(torch.randn(4, 16, device="meta")).square().mean().backward()
    assert all(p.grad is not None and p.grad.device.type == "meta" for p in r)


# ---------------------------------------------------------------- kept state and inference mode
@guard(
    "the first forward after a device move run in `torch.inference_mode()` (an evaluation), "
    "with a backbone that keeps per-layer state (Spartan's frozen masks, ASL+)",
    "the state is moved outside inference mode, so the next training step can save it for "
    "its backward",
)
def test_state_moved_in_an_inference_forward_still_trains() -> None:
    model, pruner = frozen_spartan()
    model.to("meta")
    with torch.inference_mode():
        model(torch.randn(4, 16, device="meta"))
    masks = pruner.backbone._frozen_masks
    assert all(m.device.type == "meta" and not m.is_inference() for m in masks)
    model(torch.randn(4, 16, device="meta")).sum().backward()
