"""Timing layers with `to_sparse_inference(..., example_input=...)` leaves the model as it was."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from _guards import guard
from feather_sparse.export.inference import to_sparse_inference


@guard(
    "`to_sparse_inference(model, example_input=x)` of a model in training mode "
    "(BatchNorm, dropout)",
    "the timing forward runs in eval mode: BatchNorm's running statistics are not updated, "
    "each module's mode is restored",
)
@pytest.mark.parametrize("inplace", [False, True])
def test_timing_forward_leaves_batchnorm_statistics_and_modes(inplace: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.Dropout(0.5), nn.Linear(64, 8))
    model[2].eval()  # a mixed model: each module's own mode must come back
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(16, 64) * 5 + 3  # far from the running mean 0 / variance 1
    out = to_sparse_inference(
        model, min_sparsity=0.0, min_weights=0, example_input=x, repeats=1, inplace=inplace
    )
    for key, value in out.state_dict().items():
        if key.startswith("1."):  # the BatchNorm: running_mean, running_var, num_batches_tracked
            assert torch.equal(value, state[key]), key
    assert [m.training for m in out.modules()] == [True, True, True, False, True]
