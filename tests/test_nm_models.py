"""The Linear-heavy mnist1d_mlpmixer under N:M patterns."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs
from feather_sparse.nm import NMPattern, group_view


@pytest.mark.parametrize("spec", ["2:4", "4:8", "1:4"])
def test_every_layer_takes_the_pattern(spec: str) -> None:
    model = fs.create_model("mnist1d_mlpmixer")
    pruner = fs.Pruner(model, pattern=spec)  # no exclusions needed
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(pruner.targets) == len(linears)
    assert pruner.num_params / sum(p.numel() for p in model.parameters()) > 0.95


def test_mixer_trains_with_2_4() -> None:
    torch.manual_seed(0)
    model = fs.create_model("mnist1d_mlpmixer")
    pruner = fs.Pruner(model, pattern="2:4")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 1, 40, generator=gen), torch.randint(0, 10, (64,), generator=gen)
    losses = []
    for _ in range(15):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]  # it fits the batch
    pruner.finalize()
    for m in model.modules():
        if isinstance(m, nn.Linear):
            assert ((group_view(m.weight, NMPattern(2, 4)) != 0).sum(1) <= 2).all()
