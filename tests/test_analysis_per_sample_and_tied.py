"""Two counts of feather_sparse.analysis fixed by the mutation audit (docs/mutation-audit.md).

- ``count_flops`` counted a convolution's uses per item of the call's first
  dimension, not per sample of the model's input: a convolution over the
  frames of each sample folded into the batch (``(B·T, C, L)``) was counted
  for one frame, ``1/T`` of its cost.
- ``layer_sparsity`` (and the mask recorder) without a pruner listed a weight
  tied to several layers once per layer, so the overall sparsity was not the
  Pruner's (which counts a tied weight once).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import feather_sparse as fs
from _guards import guard
from feather_sparse.analysis import (
    MaskStabilityRecorder,
    count_flops,
    current_masks,
    layer_sparsity,
)


class _Frames(nn.Module):
    """Each sample is T frames of (C, L); the frames are folded into the batch."""

    def __init__(self, transposed: bool = False) -> None:
        super().__init__()
        conv = nn.ConvTranspose1d if transposed else nn.Conv1d
        self.conv = conv(2, 4, 3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c, n = x.shape
        return self.conv(x.reshape(b * t, c, n))


@guard(
    "`count_flops` of a model that folds several pieces of each sample into the batch "
    "(frames `(B·T, C, L)` through a convolution)",
    "every piece counted: the cost per sample of the model's input; it counted one frame",
)
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_conv_over_frames_folded_into_the_batch_counts_every_frame(
    transposed: bool, batch: int
) -> None:
    model = _Frames(transposed)
    # 5 frames of length 10 per sample; 4·2·3 = 24 weights. A conv applies each weight
    # once per output position (10 − 3 + 1 = 8), a transposed one once per input
    # position (10): per sample 5·8·24 = 960 or 5·10·24 = 1200 MACs.
    expected = 5 * (10 if transposed else 8) * 24
    if batch == 1:
        report = count_flops(model, (5, 2, 10))
    else:
        report = count_flops(model, example=torch.randn(batch, 5, 2, 10))
    assert report.dense_macs == expected
    (row,) = report.layers
    assert row.uses == expected // 24


def _tied_model() -> nn.Module:
    first, second, third = (nn.Linear(4, 4, bias=False) for _ in range(3))
    second.weight = first.weight  # one tensor in two layers
    with torch.no_grad():
        first.weight.fill_(1.0)  # the tied weight: dense
        third.weight.zero_()  # the other: all zero
    return nn.Sequential(first, second, third)


@guard(
    "`layer_sparsity` or the mask recorder of a model with a weight tied to several "
    "layers, without the pruner",
    "the tied weight listed once, as the Pruner counts it; it was counted once per layer",
)
def test_a_tied_weight_counts_once_without_the_pruner() -> None:
    model = _tied_model()
    dist = layer_sparsity(model)
    # 16 tied weights, all kept, and 16 zeros: half the model's 32 weights are zero
    assert [r.name for r in dist.layers] == ["0", "2"]
    assert dist.params == 32
    assert dist.sparsity == 0.5
    assert [name for name, _ in current_masks(model)] == ["0", "2"]
    recorder = MaskStabilityRecorder()
    recorder(1, model)
    assert recorder.result().sparsity == (0.5,)


def test_a_tied_weight_counts_once_with_a_pruner_attached_or_finalized() -> None:
    first, second = nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False)
    second.weight = first.weight
    model = nn.Sequential(first, second)
    pruner = fs.Pruner(model, sparsity=0.5, total_steps=4)
    pruner.update(0.5)
    expected = pruner.sparsity_achieved()
    assert layer_sparsity(model, pruner).sparsity == pytest.approx(expected)
    assert [r.name for r in layer_sparsity(model).layers] == ["0"]  # attached, not passed
    assert layer_sparsity(model).sparsity == pytest.approx(expected)
    pruner.finalize()
    dist = layer_sparsity(model)
    assert dist.params == 64
    assert dist.sparsity == pytest.approx(expected)


def test_the_flops_report_totals_count_a_tied_weight_once() -> None:
    # Each row's MACs count (both layers compute), but params/nonzeros summed the tied
    # tensor once per layer: 48 weights and 32 non-zeros for a model of 32 and 16.
    report = count_flops(_tied_model(), (4,))
    assert [(r.name, r.tied_to) for r in report.layers] == [("0", None), ("1", "0"), ("2", None)]
    assert report.dense_macs == 3 * 16
    assert report.sparse_macs == 2 * 16  # the two layers of the dense tied weight
    assert report.params == 32
    assert report.nonzeros == 16
    model = _tied_model()
    fs.Pruner(model, sparsity=0.25, total_steps=4)  # attached: the tie is through `original`
    assert count_flops(model, (4,)).params == 32
