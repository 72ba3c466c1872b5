"""Analysis: FLOPs, Pearson of masks, the stability recorder, layer sparsity, plots."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import feather_sparse as fs
from feather_sparse.analysis import (
    Curve,
    MaskCounts,
    MaskStabilityRecorder,
    PackedMask,
    count_flops,
    current_masks,
    layer_sparsity,
    mask_pearson,
    mean_std,
    reference_flops,
)

# ------------------------------------------------------------------------- FLOPs


def test_flops_of_a_single_conv_by_hand() -> None:
    # 3 -> 8 channels, 3x3 kernel, padding 1 on 16x16: 16·16 output positions,
    # each using all 8·3·3·3 = 216 weights once: 256 · 216 = 55 296 MACs.
    conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
    report = count_flops(conv, (3, 16, 16))
    assert report.dense_macs == 55_296
    assert report.torch_flops == 110_592
    (row,) = report.layers
    assert (row.params, row.uses, row.shape) == (216, 256, (8, 3, 3, 3))


def test_flops_strided_grouped_dilated_conv_and_linear_by_hand() -> None:
    # Conv1d 4 -> 6, k = 5, stride 2, dilation 2, groups 2 on length 40:
    # out length = floor((40 - 2·4 - 1)/2) + 1 = 16; weights 6·2·5 = 60 -> 960 MACs.
    # Linear 96 -> 10 on the flattened 6·16 = 96 features: 960 MACs.
    model = nn.Sequential(
        nn.Conv1d(4, 6, 5, stride=2, dilation=2, groups=2), nn.Flatten(), nn.Linear(96, 10)
    )
    report = count_flops(model, (4, 40))
    assert [r.macs for r in report.layers] == [960, 960]
    assert report.dense_macs == 1920


def test_sparse_flops_scale_with_the_effective_weight_density() -> None:
    conv = nn.Conv2d(2, 4, 3, bias=False)  # 72 weights, 6x6 = 36 positions on 8x8
    with torch.no_grad():
        conv.weight.zero_()
        conv.weight.view(-1)[:18] = 1.0  # 25 % dense
    report = count_flops(conv, (2, 8, 8))
    assert report.dense_macs == 72 * 36
    assert report.sparse_macs == 18 * 36
    assert report.density == pytest.approx(0.25)


def test_flops_see_the_pruned_weight_of_an_attached_pruner() -> None:
    model = nn.Sequential(nn.Conv1d(1, 16, 5), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 36, 10))
    pruner = fs.Pruner(model, sparsity=0.9, total_steps=10)
    pruner.update(0.9)
    report = count_flops(model, (1, 40))
    assert report.nonzeros == pytest.approx(0.1 * report.params, abs=1)
    sparse_by_layer = sum(r.uses * r.nonzeros for r in report.layers)
    assert report.sparse_macs == sparse_by_layer < report.dense_macs
    pruner.finalize()
    assert count_flops(model, (1, 40)).sparse_macs == report.sparse_macs


@pytest.mark.parametrize(
    ("model", "shape"),
    [
        (nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3)), (3, 12, 12)),
        (nn.Conv2d(8, 16, 3, stride=2, groups=4, dilation=2), (8, 15, 15)),
        (nn.Sequential(nn.Conv1d(1, 8, 5), nn.Flatten(), nn.Linear(8 * 36, 10)), (1, 40)),
        (nn.Conv3d(2, 4, (1, 3, 3)), (2, 4, 6, 6)),
        (nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2), (4, 5, 5)),
        (nn.Linear(7, 5), (3, 4, 7)),  # applied to every row of a 3-D input
    ],
)
def test_dense_flops_match_torch_flop_counter(model: nn.Module, shape: tuple[int, ...]) -> None:
    assert count_flops(model, shape).torch_flops == reference_flops(model, shape)


def test_flops_with_an_example_batch_are_per_sample_and_restore_the_mode() -> None:
    model = nn.Sequential(nn.Conv1d(1, 4, 3), nn.BatchNorm1d(4), nn.Flatten(), nn.Linear(152, 3))
    model.train()
    one = count_flops(model, (1, 40)).dense_macs
    batch = count_flops(model, example=torch.randn(5, 1, 40)).dense_macs
    assert one == batch == 4 * 3 * 38 + 152 * 3
    assert model.training


def test_flops_bad_input_raises() -> None:
    conv = nn.Conv1d(1, 2, 3)
    with pytest.raises(ValueError, match="exactly one"):
        count_flops(conv)
    with pytest.raises(ValueError, match="positive sizes"):
        count_flops(conv, (0, 5))
    with pytest.raises(ValueError, match="no convolution or linear"):
        count_flops(nn.ReLU(), (3,))


def test_flops_table_lists_layers_and_total() -> None:
    text = count_flops(nn.Conv2d(3, 8, 3, padding=1, bias=False), (3, 16, 16)).table()
    assert "| **total** |" in text and "0.0553" in text


# ------------------------------------------------------------------------ Pearson


def test_pearson_of_known_masks() -> None:
    a = torch.tensor([1, 1, 0, 0], dtype=torch.bool)
    b = torch.tensor([1, 0, 1, 0], dtype=torch.bool)
    assert mask_pearson(a, b) == 0.0
    assert mask_pearson(a, a) == 1.0
    assert mask_pearson(a, ~a) == -1.0
    # a = 1110, b = 1000: n·both − a·b = 4·1 − 3·1 = 1; sqrt(3·1·1·3) = 3 -> r = 1/3
    assert mask_pearson(torch.tensor([1, 1, 1, 0]), torch.tensor([1, 0, 0, 0])) == pytest.approx(
        1 / 3
    )


def test_pearson_of_a_constant_mask_is_nan() -> None:
    assert math.isnan(mask_pearson(torch.ones(10, dtype=torch.bool), torch.rand(10) > 0.5))


def test_pearson_matches_numpy_corrcoef_over_several_layers() -> None:
    gen = torch.Generator().manual_seed(1)
    xs = [torch.rand(n, generator=gen) > 0.7 for n in (13, 100, 7)]
    ys = [x ^ (torch.rand(x.shape, generator=gen) > 0.9) for x in xs]
    flat_x = torch.cat(xs).numpy().astype(float)
    flat_y = torch.cat(ys).numpy().astype(float)
    expected = np.corrcoef(flat_x, flat_y)[0, 1]
    assert mask_pearson(xs, ys) == pytest.approx(expected, abs=1e-12)
    packed = [PackedMask.from_tensor(x) for x in xs]
    assert mask_pearson(packed, ys) == pytest.approx(expected, abs=1e-12)


def test_pearson_rejects_mismatched_masks() -> None:
    with pytest.raises(ValueError, match="different sizes"):
        mask_pearson(torch.ones(3, dtype=torch.bool), torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="numbers of masks"):
        mask_pearson([torch.ones(3)], [torch.ones(3), torch.ones(3)])


def test_packed_mask_round_trips_and_uses_one_bit_per_entry() -> None:
    mask = torch.rand(3, 7, 5) > 0.5  # 105 entries -> 14 bytes
    packed = PackedMask.from_tensor(mask)
    assert len(packed.bits) == 14
    assert packed.ones == int(mask.sum())
    assert np.array_equal(packed.unpack(), mask.reshape(-1).numpy())


def test_mask_counts_changed_is_the_hamming_fraction() -> None:
    # 1100 vs 1010: two entries differ out of four
    assert MaskCounts(n=4, a=2, b=2, both=1).changed == 0.5


# ----------------------------------------------------------- stability recorder


def _set_mask(layer: nn.Linear, keep: torch.Tensor) -> None:
    with torch.no_grad():
        layer.weight.copy_(keep.float().reshape(layer.weight.shape))


def test_recorder_pearson_against_the_final_mask() -> None:
    layer = nn.Linear(2, 2, bias=False)  # 4 weights
    recorder = MaskStabilityRecorder("run")
    _set_mask(layer, torch.tensor([1, 1, 1, 1]))  # dense: constant mask -> NaN
    recorder(1, layer, None, {})
    _set_mask(layer, torch.tensor([1, 0, 1, 0]))  # r = 0 against the final 1100
    recorder(2, layer, None, {})
    _set_mask(layer, torch.tensor([1, 1, 0, 0]))
    recorder(3, layer, None, {})
    result = recorder.result()
    assert result.epochs == (1, 2, 3)
    assert math.isnan(result.pearson[0])
    assert result.pearson[1:] == (0.0, 1.0)
    assert math.isnan(result.changed[0])
    assert result.changed[1:] == (0.5, 0.5)
    assert result.sparsity == (0.0, 0.5, 0.5)
    assert result.first_epoch_above(0.99) == 3
    assert result.layers == ("",)


def test_recorder_every_keeps_the_last_epoch_as_final() -> None:
    layer = nn.Linear(2, 2, bias=False)
    recorder = MaskStabilityRecorder(every=2)
    for epoch, keep in enumerate(([1, 0, 0, 1], [1, 0, 1, 0], [1, 1, 0, 0]), start=1):
        _set_mask(layer, torch.tensor(keep))
        recorder(epoch, layer)
    result = recorder.result()
    assert result.epochs == (2, 3)
    assert result.pearson == (0.0, 1.0)


def test_recorder_with_a_pruner_during_training() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pruner = fs.Pruner(model, sparsity=0.8, total_steps=40, theta=0.0)
    recorder = MaskStabilityRecorder("θ=0")
    x, y = torch.randn(64, 8), torch.randint(0, 4, (64,))
    for epoch in range(1, 5):
        for _ in range(10):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            pruner.step()
        recorder(epoch, model, pruner, {})
    result = recorder.result()
    assert result.layers == ("0", "2")
    assert result.pearson[-1] == 1.0
    assert all(-1.0 <= r <= 1.0 for r in result.pearson if not math.isnan(r))
    assert result.sparsity[-1] == pytest.approx(pruner.sparsity_achieved())
    masks = current_masks(model, pruner)
    assert sum(m.numel for _, m in masks) == pruner.num_params
    assert recorder.nbytes == sum(len(m.bits) for _, m in masks) * 4


def test_recorder_without_records_raises() -> None:
    with pytest.raises(ValueError, match="no epoch was recorded"):
        MaskStabilityRecorder().result()
    with pytest.raises(ValueError, match="every"):
        MaskStabilityRecorder(every=0)


# ------------------------------------------------------------------ layer sparsity


def test_layer_sparsity_per_layer_and_total() -> None:
    model = nn.Sequential(nn.Linear(4, 5, bias=False), nn.Linear(5, 2, bias=False))
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].weight[0, :2] = 1.0  # 2 of 20 kept: 90 %
        model[1].weight.fill_(1.0)  # dense
    dist = layer_sparsity(model)
    assert [r.name for r in dist.layers] == ["0", "1"]
    assert [r.sparsity for r in dist.layers] == [0.9, 0.0]
    assert dist.sparsity == pytest.approx(18 / 30)
    assert "| **total** | | 30 |" in dist.table()


def test_layer_sparsity_lists_only_the_pruners_layers() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 3))
    pruner = fs.Pruner(model, sparsity=0.5, total_steps=4, exclude=["1"])
    pruner.update(0.5)
    dist = layer_sparsity(model, pruner)
    assert [r.name for r in dist.layers] == ["0"]
    assert dist.sparsity == pytest.approx(0.5)


# ---------------------------------------------------------------------- summaries


def test_mean_std_and_curve() -> None:
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(math.sqrt(2)))
    assert mean_std([5.0]) == (5.0, 0.0)
    assert all(math.isnan(v) for v in mean_std([]))
    with pytest.raises(ValueError, match="differ in length"):
        Curve("c", (1.0, 2.0), (1.0,), (0.0,))


# -------------------------------------------------------------------------- plots


def test_plots_write_pngs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plots = pytest.importorskip("feather_sparse.plots")
    pytest.importorskip("matplotlib")
    layer = nn.Linear(2, 2, bias=False)
    recorder = MaskStabilityRecorder("θ=1")
    for epoch, keep in enumerate(([1, 0, 1, 0], [1, 1, 0, 0]), start=1):
        _set_mask(layer, torch.tensor(keep))
        recorder(epoch, layer)
    model = nn.Sequential(nn.Conv1d(1, 4, 3), nn.Flatten(), nn.Linear(152, 3))
    curves = [Curve("a", (0.9, 0.95), (80.0, 70.0), (1.0, 2.0))]
    paths = [
        plots.plot_curves(
            curves,
            tmp_path / "c.png",
            xlabel="x",
            ylabel="y",
            baseline=("dense", 85.0, 0.5),
            categorical_x=True,
        ),
        plots.plot_stability([recorder.result()], tmp_path / "s.png"),
        plots.plot_layer_sparsity({"m": layer_sparsity(model)}, tmp_path / "l.png"),
        plots.plot_flops({"m": count_flops(model, (1, 40))}, tmp_path / "f.png"),
        plots.plot_operator_family([1, 2, 3, math.inf], tmp_path / "o.png"),
    ]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_analysis_does_not_import_matplotlib() -> None:
    import subprocess
    import sys

    code = "import sys, feather_sparse.analysis; print('matplotlib' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="."
    )
    assert out.stdout.strip() == "False"


def test_batch_independent_work_counts_its_share_of_the_batch() -> None:
    """count_flops' documented contract for work that does not depend on the batch:
    with input_shape (one sample) a learned query's projection counts all its rows,
    with an example batch of B the rows divided by B, rounded down."""
    from torch import nn

    from feather_sparse.analysis.flops import count_flops

    class Query(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.query = nn.Parameter(torch.randn(1, 6, 16))
            self.project_query = nn.Linear(16, 16, bias=False)
            self.project_input = nn.Linear(16, 16, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q = self.project_query(self.query).expand(x.shape[0], -1, -1)
            return q @ self.project_input(x).transpose(1, 2)

    model = Query()
    alone = {layer.name: layer.uses for layer in count_flops(model, (5, 16)).layers}
    batch = {
        layer.name: layer.uses for layer in count_flops(model, example=torch.randn(4, 5, 16)).layers
    }
    assert alone == {"project_query": 6, "project_input": 5}
    assert batch == {"project_query": 6 // 4, "project_input": 5}
