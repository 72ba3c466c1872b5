"""Tests that kill the mutants of the analysis tools the suite missed (docs/mutation-audit.md).

Each expectation is worked out by hand from the definitions (module docstrings
of ``feather_sparse.analysis``: MACs per sample, ``uses × params`` dense and
``uses × nonzeros`` sparse, tables in MFLOPs = million MACs; Pearson r of 0/1
masks; the flips between consecutive recorded masks), or checked against an
independent computation (``torch.utils.flop_counter`` through
``reference_flops``), never against the code's own output.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from feather_sparse.analysis import (
    Curve,
    MaskStability,
    MaskStabilityRecorder,
    count_flops,
    layer_sparsity,
    reference_flops,
)

# ------------------------------------------------------------------------- FLOPs


def _half_pruned_model() -> nn.Module:
    """Conv1d 1 -> 4, k = 3 on length 103 (101 positions), then Linear 404 -> 3.

    The conv keeps 4 of its 12 weights (1/3), the linear layer 909 of its 1212 (3/4).
    """
    conv, linear = nn.Conv1d(1, 4, 3, bias=False), nn.Linear(404, 3, bias=False)
    with torch.no_grad():
        conv.weight.zero_()
        conv.weight.view(-1)[:4] = 0.5
        linear.weight.fill_(-0.25)
        linear.weight.view(-1)[:303] = 0.0
    return nn.Sequential(conv, nn.Flatten(), linear)


def test_sparse_report_densities_and_table_from_the_counts() -> None:
    """anl02, anl03, anl04, anl05, anl06, anl07."""
    report = count_flops(_half_pruned_model(), (1, 103))
    conv, linear = report.layers
    assert (conv.uses, conv.params, conv.nonzeros) == (101, 12, 4)
    assert (linear.uses, linear.params, linear.nonzeros) == (1, 1212, 909)
    # density = nonzeros / params, per layer
    assert conv.density == pytest.approx(1 / 3)
    assert linear.density == pytest.approx(0.75)
    # dense 101·12 + 1212 = 2424 MACs; sparse 101·4 + 909 = 1313 MACs
    assert (report.dense_macs, report.sparse_macs) == (2424, 1313)
    assert report.density == pytest.approx(1313 / 2424)  # of the MACs, not of the weights
    # torch's count is of the dense model (it ignores zeros): 2 × dense MACs
    assert report.torch_flops == 2 * 2424
    assert report.torch_flops == reference_flops(_half_pruned_model(), (1, 103))
    lines = report.table().splitlines()
    assert lines[2] == "| 0 | Conv1d | 4×1×3 | 33.33% | 0.001212 | 0.000404 |"
    assert lines[3] == "| 2 | Linear | 3×404 | 75.00% | 0.001212 | 0.000909 |"
    # total: weight density 913/1224 = 74.59 %, MFLOPs to 4 significant digits
    assert lines[4] == "| **total** | | | 74.59% | 0.002424 | 0.001313 |"


class _Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(6, 6, bias=False)
        self.unused = nn.Linear(6, 2)  # defined, never called

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(torch.relu(self.shared(x)))


def test_a_layer_called_twice_counts_twice_and_an_unused_one_not_at_all() -> None:
    """anl10, anl11."""
    report = count_flops(_Twice(), (6,))
    assert [r.name for r in report.layers] == ["shared"]
    assert report.dense_macs == 2 * 36
    assert report.torch_flops == reference_flops(_Twice(), (6,))


def test_counting_leaves_the_model_as_it_was() -> None:
    """anl15 (and anl14): no hook left behind, no batch-norm statistics updated."""
    model = nn.Sequential(nn.Conv1d(1, 4, 3), nn.BatchNorm1d(4), nn.Flatten(), nn.Linear(32, 2))
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    count_flops(model, example=torch.randn(3, 1, 10) + 5.0)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert model.training
    assert all(not m._forward_hooks for m in model.modules())


def test_a_float64_model_is_counted() -> None:
    """anl16: the zero input takes the model's dtype."""
    model = nn.Sequential(nn.Conv1d(2, 3, 3, bias=False), nn.Flatten(), nn.Linear(24, 2))
    report = count_flops(model.double(), (2, 10))
    assert report.dense_macs == 8 * 18 + 24 * 2


def test_an_example_batch_reports_one_samples_shape_and_cost() -> None:
    """anl18, anl19: costs and the shape are per sample."""
    model = nn.Sequential(nn.Conv1d(2, 3, 3, bias=False), nn.Flatten(), nn.Linear(24, 2))
    batch = torch.randn(4, 2, 10)
    report = count_flops(model, example=batch)
    assert report.input_shape == (2, 10)
    # per sample: 8 positions · 18 weights + 24 · 2 = 192 MACs = 384 FLOPs
    assert report.dense_macs == 192
    assert reference_flops(model, example=batch) == 384


# ------------------------------------------------------------------ layer sparsity


def test_layer_sparsity_table_has_two_decimals() -> None:
    """anl21: 1 of 3 weights zero shows as 33.33 %, not 33 %."""
    layer = nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 0.0, -2.0]]))
    lines = layer_sparsity(layer).table().splitlines()
    assert lines[2] == "|  | 1×3 | 3 | 33.33% |"
    assert lines[3] == "| **total** | | 3 | 33.33% |"


# ------------------------------------------------------------ stability recorder


def _set(layer: nn.Linear, keep: list[int]) -> None:
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(keep, dtype=torch.float32).reshape(layer.weight.shape))


def test_changed_counts_the_flips_since_the_previous_recorded_mask() -> None:
    """anl30: not since the first one (cumulative)."""
    layer = nn.Linear(8, 1, bias=False)
    recorder = MaskStabilityRecorder()
    masks = ([1, 1, 0, 0, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0, 0, 0])
    for epoch, keep in enumerate(masks, start=1):
        _set(layer, keep)
        recorder(epoch, layer)
    changed = recorder.result().changed
    assert math.isnan(changed[0])
    # each step moves one kept weight: two of eight entries flip
    assert changed[1:] == (2 / 8, 2 / 8)


def test_each_layer_has_its_own_pearson_against_its_final_mask() -> None:
    """anl32."""
    first, second = nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False)
    model = nn.Sequential(first, second)
    recorder = MaskStabilityRecorder()
    _set(first, [1, 1, 0, 0])  # against the final 1100: r = 1
    _set(second, [1, 0, 1, 0])  # against the final 1100: r = 0
    recorder(1, model)
    _set(second, [1, 1, 0, 0])
    recorder(2, model)
    result = recorder.result()
    assert result.layer_pearson == ((1.0, 1.0), (0.0, 1.0))
    # whole model: 11001010 against 11001100: n·both − a·b = 8·3 − 16 = 8, sqrt(4·4·4·4) = 16
    assert result.pearson == (0.5, 1.0)


def test_a_skipped_epoch_is_dropped_once_a_later_one_is_recorded() -> None:
    """anl34: every=2 over epochs 1, 2: epoch 2 is the final mask."""
    layer = nn.Linear(2, 2, bias=False)
    recorder = MaskStabilityRecorder(every=2)
    _set(layer, [1, 0, 1, 0])
    recorder(1, layer)
    _set(layer, [1, 1, 0, 0])
    recorder(2, layer)
    result = recorder.result()
    assert result.epochs == (2,)
    assert result.pearson == (1.0,)
    assert recorder.nbytes == 1


def test_first_epoch_above_is_the_start_of_the_last_run_above_the_level() -> None:
    """anl35: r must stay at or above the level to the end."""
    stability = MaskStability(
        label="",
        epochs=(1, 2, 3, 4),
        pearson=(0.995, 0.5, 0.995, 1.0),
        changed=(math.nan, 0.1, 0.1, 0.0),
        sparsity=(0.9, 0.9, 0.9, 0.9),
        layers=("",),
        layer_pearson=((0.995, 0.5, 0.995, 1.0),),
    )
    assert stability.first_epoch_above(0.99) == 3


# ---------------------------------------------------------------------- summaries


def test_curve_rejects_a_std_of_another_length() -> None:
    """anl38."""
    with pytest.raises(ValueError, match="differ in length"):
        Curve("c", (1.0, 2.0), (1.0, 2.0), (0.0,))
