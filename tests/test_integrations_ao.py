"""The torch.ao.pruning-style facade: prepare / step / squash_mask."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from feather_sparse.integrations.ao import FeatherSparsifier


def model() -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)
    )


def test_prepare_step_squash_on_named_tensors() -> None:
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    sparsifier = FeatherSparsifier(sparsity=0.8, total_steps=10)
    sparsifier.prepare(net, config=[{"tensor_fqn": "0.weight"}, {"tensor_fqn": "2.weight"}])
    assert parametrize.is_parametrized(net[0]) and parametrize.is_parametrized(net[2])
    assert not parametrize.is_parametrized(net[4])  # not named: left dense
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    for _ in range(10):
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sparsifier.step()
    achieved = sparsifier.squash_mask()
    zeros = int((net[0].weight == 0).sum() + (net[2].weight == 0).sum())
    assert zeros == round(0.8 * (8 * 32 + 32 * 32))
    assert achieved == zeros / (8 * 32 + 32 * 32)
    assert int((net[4].weight == 0).sum()) == 0
    assert not any(parametrize.is_parametrized(m) for m in net.modules())


def test_default_config_prunes_every_linear_and_state_round_trip() -> None:
    net = model()
    sparsifier = FeatherSparsifier(sparsity=0.5, total_steps=4, schedule="constant")
    sparsifier.prepare(net)
    sparsifier.step()
    state = sparsifier.state_dict()
    other = FeatherSparsifier(sparsity=0.5, total_steps=4, schedule="constant")
    twin = model()
    twin.load_state_dict(
        {
            k.replace(".parametrizations.weight.original", ".weight"): v
            for k, v in net.state_dict().items()
        }
    )
    other.prepare(twin)
    other.load_state_dict(state)
    assert other.pruner is not None and other.pruner.current_step == 1


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ([{"name": "0.weight"}], "tensor_fqn"),
        ([{"tensor_fqn": "0.bias"}], "'weight' only"),
        ([{"tensor_fqn": "9.weight"}], "no module '9'"),
        ([{"tensor_fqn": "0.weight", "sparsity_level": 0.9}], r"\['sparsity_level'\].*global"),
    ],
)
def test_bad_config(config: list[dict[str, str]], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FeatherSparsifier(0.5, 4).prepare(model(), config=config)
    with pytest.raises(RuntimeError, match="prepare"):
        FeatherSparsifier(0.5, 4).step()


def test_preparing_twice_is_refused_until_the_mask_is_squashed() -> None:
    sparsifier, m = FeatherSparsifier(0.5, 4), model()
    sparsifier.prepare(m, config=[{"tensor_fqn": "0.weight"}])
    with pytest.raises(RuntimeError, match=r"prepared already.*squash_mask"):
        sparsifier.prepare(m, config=[{"tensor_fqn": "2.weight"}])
    sparsifier.squash_mask()
    sparsifier.prepare(m, config=[{"tensor_fqn": "2.weight"}])
    sparsifier.squash_mask()
    assert not any("parametrizations" in k for k in m.state_dict())
