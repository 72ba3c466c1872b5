"""Tests that close the gaps a mutation audit of the N:M methods found.

Each test here fails on a hand-made mutant of ``nm/backbone.py`` or
``nm/fused.py`` that the rest of the suite let through (``docs/mutation-audit.md``,
"The N:M methods": the mutant's id is in each test's docstring), and checks the
code against the formulas written out here from ``ALGORITHMS.md``, the papers
and the docstrings (SR-STE: ``g + λ·(1 − mask)⊙w``, λ = 2e-4, Zhou et al. 2021;
S-STE: ``β·sign(w)·(|w| − t)₊`` with ``β = ⟨w, S⟩ / ⟨S, S⟩``, Hu et al. 2024),
not against the code's own output.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs
from feather_sparse.nm import NMBackbone
from feather_sparse.ops import OPERATORS

LAMBDA = 2e-4  # SR-STE's λ_W (Zhou et al., ICLR 2021)


def by_channels(w: torch.Tensor) -> torch.Tensor:
    """A conv weight ``(out, in, kh, kw)`` as rows of ``m`` consecutive input channels at
    each kernel position: ``(out, kh, kw, in)`` flattened to groups."""
    return w.permute(0, 2, 3, 1).reshape(-1, 4)


def from_channels(groups: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The inverse of :func:`by_channels`."""
    out, cin, kh, kw = shape
    return groups.reshape(out, kh, kw, cin).permute(0, 3, 1, 2)


def top_n(groups: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` largest magnitudes of each row kept (ties: the lower position), as bool."""
    order = torch.sort(-groups.abs(), dim=1, stable=True).indices[:, :n]
    return torch.zeros_like(groups, dtype=torch.bool).scatter_(1, order, True)


def t_g(groups: torch.Tensor, n: int) -> torch.Tensor:
    """Each row's ``T_g``: the largest magnitude among its ``m − n`` smallest, ``(G, 1)``."""
    m = groups.shape[1]
    return groups.abs().sort(dim=1).values[:, m - n - 1 : m - n]


def soft(groups: torch.Tensor, n: int) -> torch.Tensor:
    """S-STE's soft threshold ``sign(w)·(|w| − T_g)₊`` of each row, in float64."""
    g = groups.double()
    return torch.sign(g) * (g.abs() - t_g(g, n)).clamp_min(0)


def beta_of(w: torch.Tensor, s: torch.Tensor) -> float:
    """``β = ⟨w, S⟩ / ⟨S, S⟩`` in float64 (the least-squares fit of ``w`` by ``β·S``)."""
    w, s = w.double(), s.double()
    return float((w * s).sum() / (s * s).sum())


def conv(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(8, 4, 3, bias=False))  # 3×3: the two orders differ


# --------------------------------------------------------------- SR-STE's decay, S-STE's β
def test_sr_ste_decay_reaches_a_conv_grouped_by_channels() -> None:
    """nmb03: the layers grouped by input channels (``conv_order="channels"``) get
    SR-STE's ``λ·(1 − mask)⊙w`` too.

    The SR-STE tests used Linear layers, which take the flat branch.
    """
    model = conv()
    pruner = fs.make_pruner(model, "sr-ste", conv_order="channels", total_steps=4)
    w = pruner.weights()[0]
    x = torch.randn(2, 8, 5, 5, generator=torch.Generator().manual_seed(1))
    model(x).square().sum().backward()
    keep = from_channels(top_n(by_channels(w.detach()), 2), w.shape)
    pruned_w = (w.detach() * keep).requires_grad_()
    F.conv2d(x, pruned_w).square().sum().backward()  # dL/dW̃, W̃ the pruned weight
    assert pruned_w.grad is not None and w.grad is not None
    expected = pruned_w.grad + LAMBDA * (~keep) * w.detach()
    torch.testing.assert_close(w.grad, expected, rtol=1e-5, atol=1e-7)
    # the decay is there to be seen: λ·w is above the tolerance on the pruned weights
    assert (LAMBDA * w.detach()[~keep]).abs().max() > 1e-5


def test_s_ste_beta_of_a_conv_grouped_by_channels_uses_those_groups() -> None:
    """nmb09: β of a conv grouped by channels is fitted with the soft threshold of the
    channel groups (those of the forward), not of the flat storage order."""
    model = conv()
    pruner = fs.make_pruner(model, "s-ste", conv_order="channels", total_steps=4)
    w = pruner.weights()[0].detach()
    s = soft(by_channels(w), 2)
    beta = beta_of(by_channels(w), s)
    flat = soft(w.reshape(-1, 4), 2)
    assert abs(beta - beta_of(w.reshape(-1, 4), flat)) > 1e-3 * beta  # the orders differ
    assert pruner.state_dict()["backbone"]["beta"][0].item() == pytest.approx(beta, rel=1e-6)
    expected = from_channels(beta * s, w.shape).float()
    torch.testing.assert_close(model[0].weight, expected, rtol=1e-6, atol=1e-7)


def test_s_ste_layer_of_zeros_gets_beta_one_and_trains_out_of_zero() -> None:
    """nmb08: an all-zero layer (zero-initialised, as output projections often are)
    has ``S = 0`` and β = 1, as the docstring says, not 0.

    β = 0 would be fixed for the rest of training and keep the layer's forward at
    zero however its weights move, and a state holding it would not load
    (``load_state_dict`` accepts only β > 0).
    """
    torch.manual_seed(0)
    last = nn.Linear(8, 4, bias=False)
    model = nn.Sequential(nn.Linear(8, 8, bias=False), last)
    with torch.no_grad():
        last.weight.zero_()
    pruner = fs.make_pruner(model, "s-ste", total_steps=4)
    state = pruner.state_dict()
    assert state["backbone"]["beta"][1].item() == 1.0
    fresh = fs.make_pruner(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4)), "s-ste", total_steps=4)
    fresh.load_state_dict(state)  # a state holding β = 0 would be refused
    rows = torch.tensor([[0.4, -0.3, 0.2, -0.1] * 2] * 4)  # the layer once training moved it
    with torch.no_grad():
        pruner.weights()[1].copy_(rows)
    pruner.step()
    expected = soft(rows.reshape(-1, 4), 2).reshape(4, 8).float()  # β = 1
    torch.testing.assert_close(model[1].weight, expected)


# ------------------------------------------------------------------ what the Pruner reports
def test_report_during_the_ramp_shows_r_times_the_mean_group_threshold_and_its_zeros() -> None:
    """nmb22, nmb24: during the ramp (``r = s(t)/S < 1``) the report's threshold is the
    mean of ``r·T_g`` (LayerReport's docstring) and its sparsity counts the weights
    the Feather forward zeroes, ``|w| <= r·T_g``.

    The report tests ran at the full pattern, where ``r = 1``.
    """
    torch.manual_seed(0)
    layer = nn.Linear(16, 8, bias=False)
    model = nn.Sequential(layer)
    pruner = fs.Pruner(model, pattern="2:4", schedule="linear", total_steps=20)
    for _ in range(5):  # linear from 0 at step 0 to S at step 10: s = S/2, r = 1/2
        pruner.step()
    w = pruner.weights()[0].detach().reshape(-1, 4)
    r = 0.5
    rt = r * t_g(w, 2).double()
    row = pruner.report().layers[0]
    assert row.threshold == pytest.approx(float(rt.mean()), rel=1e-6)
    zeros = int((w.double().abs() <= rt).sum())
    assert zeros < w.numel() // 2  # fewer than the full pattern's
    assert row.sparsity == zeros / w.numel()
    assert int((layer.weight == 0).sum()) == zeros  # what the forward zeroes


def test_keep_and_pruned_masks_at_a_lowered_threshold_and_with_zero_weights() -> None:
    """nmb23, nmb25: the hard forward at ramp ``r < 1`` keeps the ``n`` largest and every
    ``|w| > r·T_g`` (a weight *at* ``r·T_g`` is zeroed), and a zero weight among the
    kept is zeroed too; ``keep_mask``/``pruned_mask`` (and the achieved sparsity) say so.
    """
    w0 = torch.tensor([[4.0, 1.0, 2.0, 0.5, 3.0, 0.0, 0.0, 0.0]])  # T_g = 1, then 0
    layer = nn.Linear(8, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(w0)
    pruner = fs.Pruner(nn.Sequential(layer), pattern="2:4", operator="hard")
    backbone, w = pruner.backbone, pruner.weights()[0]
    assert isinstance(backbone, NMBackbone)
    half = torch.tensor(0.5)
    # group 1 at r = 1/2: r·T_g = 0.5, so 4, 2 (ranked) and 1 (> 0.5) kept, 0.5 zeroed
    keep = backbone.keep_mask(w, half, 0)
    assert keep[0, :4].tolist() == [True, True, True, False]
    # group 2: 3 and the first 0 are ranked (ties: lower position); the 0 is still a zero
    pruned = backbone.pruned_mask(0, w, torch.tensor(1.0))
    assert pruned[0, 4:].tolist() == [False, True, True, True]
    assert pruner.sparsity_achieved() == 5 / 8  # 1 and 0.5, and the three zeros
    assert int((layer.weight == 0).sum()) == 5


# --------------------------------------------------------------- the fused forward's cache
def test_loading_a_backbone_state_drops_forwards_cached_with_the_old_beta() -> None:
    """nmb19: ``NMBackbone.load_state_dict`` drops the fused cache, whose forwards were
    scaled by the β before the load (the cache checks weights, ramps and ``p``, not β).

    (``Pruner.load_state_dict`` also rewrites the ramp buffers, which invalidates the
    cache on its own; the backbone's method is public and must not rely on that.)
    """
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    pruner = fs.make_pruner(model, "s-ste", total_steps=4)
    x = torch.randn(2, 16)
    model(x)
    model(x)  # the fused pass holds both layers' forwards now
    state = pruner.backbone.state_dict()
    state["beta"] = [b * 2 for b in state["beta"]]
    pruner.backbone.load_state_dict(state)
    for layer, w, b in zip((model[0], model[2]), pruner.weights(), state["beta"]):
        s = soft(w.detach().reshape(-1, 4), 2).reshape(w.shape)
        torch.testing.assert_close(layer.weight, (float(b) * s).float(), rtol=1e-6, atol=1e-7)


def test_a_cached_forward_is_not_reused_for_another_p() -> None:
    """nmb26: a forward cached for one ``p`` is not handed out for another: the backbone
    called with the soft operator after Feather's gives the soft threshold."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    pruner = fs.Pruner(model, pattern="2:4")  # Feather, p = 3
    x = torch.randn(2, 16)
    model(x)
    model(x)  # cached for p = 3
    backbone, w = pruner.backbone, pruner.weights()[0]
    ramp = pruner.thresholds()[0]
    out = backbone.forward_weight(0, w, ramp, OPERATORS.get("soft"), 1.0)
    s = soft(w.detach().reshape(-1, 4), 2).reshape(w.shape).float()
    torch.testing.assert_close(out, s, rtol=1e-6, atol=1e-7)
