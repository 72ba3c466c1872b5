"""N:M through the framework-neutral driver behind the HF and Lightning callbacks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from _helpers import needs_safetensors
from feather_sparse.integrations._common import PrunerDriver
from feather_sparse.nm import NMPattern, group_view


def test_driver_trains_and_bakes_an_nm_pattern() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    driver = PrunerDriver("cb", 0.5, {"pattern": "2:4"}, log_layers=True)
    pruner = driver.attach(model, total_steps=3)
    assert pruner.report().pattern == "2:4"
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(4, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        driver.step()
    assert driver.metrics()["feather/sparsity"] == 0.5
    state = model.state_dict()  # plain keys while attached
    assert set(state) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert driver.finish() == 0.5
    for m in (model[0], model[2]):
        assert ((group_view(m.weight, NMPattern(2, 4)) != 0).sum(1) == 2).all()


@pytest.mark.parametrize(
    # transformers (which requires safetensors) imports its Trainer only with it
    "framework",
    ["lightning", pytest.param("hf", marks=needs_safetensors)],
)
def test_a_callback_takes_a_pattern_without_a_sparsity(framework: str) -> None:
    """``FeatherCallback(pattern="2:4")``: the pattern implies the sparsity, as for the Pruner."""
    module = pytest.importorskip("lightning" if framework == "lightning" else "transformers")
    assert module is not None
    if framework == "lightning":
        from feather_sparse.integrations.lightning import FeatherCallback
    else:
        from feather_sparse.integrations.hf import FeatherCallback  # type: ignore[assignment]
    FeatherCallback(pattern="2:4")
    with pytest.raises(ValueError, match="sparsity is required"):
        FeatherCallback()
