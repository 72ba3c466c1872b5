"""Slips a user of the Python API makes that must be refused, not pruned silently wrong.

A pruned layer replaced after attaching, a container named in ``include``,
layers under torch's own parametrizations, NumPy numbers for settings, and a
sparsity just below 1 that rounds to every weight of a small model.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations, parametrize

import feather_sparse as fs
from _guards import guard


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def train_step(model: nn.Module, pruner: fs.Pruner) -> None:
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    F.cross_entropy(model(x), y).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    pruner.step()


@guard(
    "a pruned layer replaced in the model after the Pruner attached",
    "`RuntimeError` naming the layer at the next step/update/report/finalize/state_dict",
)
@pytest.mark.parametrize("replace", ["layer", "container"])
def test_a_replaced_layer_is_refused_not_pruned_off_the_model(replace: str) -> None:
    outer = nn.Sequential(mlp())
    pruner = fs.Pruner(outer, sparsity=0.8, total_steps=4)
    train_step(outer, pruner)
    if replace == "layer":
        outer[0][2] = nn.Linear(32, 4)
    else:
        outer[0] = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    calls = {
        "step()": pruner.step,
        "update()": pruner.update,
        "report()": pruner.report,
        "finalize()": pruner.finalize,
        "state_dict()": pruner.state_dict,
    }
    for call, fn in calls.items():
        with pytest.raises(RuntimeError, match="was replaced in the model") as err:
            fn()
        assert str(err.value).startswith(f"{call} is refused: layer '0.")
    assert pruner.current_step == 1  # nothing advanced
    # The way out the message gives: remove, then a new Pruner on the changed model.
    pruner.remove()
    again = fs.Pruner(outer, sparsity=0.8, total_steps=4)
    assert [t.module for t in again.targets] == [outer[0][0], outer[0][2]]
    train_step(outer, again)
    again.finalize()
    assert float((outer[0][2].weight == 0).float().mean()) > 0.5


def test_modules_changed_beside_the_pruned_layers_are_fine() -> None:
    model = mlp()
    pruner = fs.Pruner(model, sparsity=0.8, total_steps=4)
    model[1] = nn.GELU()  # not a pruned layer
    train_step(model, pruner)
    assert pruner.finalize() == pytest.approx(0.8, abs=1e-2)


@guard(
    "`include` naming a container (an `nn.Sequential`) that has no weight of its own",
    "`ValueError` listing its layers and a `re:` pattern; model untouched",
)
def test_a_container_named_in_include_is_an_error_listing_its_layers() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))
            self.fc = nn.Linear(8, 2)

    model = Net()
    with pytest.raises(ValueError, match="include names 'features', a Sequential") as err:
        fs.Pruner(model, sparsity=0.5, total_steps=10, include=["features", "fc"])
    assert "'features.0', 'features.2'" in str(err.value)
    assert not any(parametrize.is_parametrized(m) for m in model.modules())
    # The pattern the message offers selects the block's layers.
    pruner = fs.Pruner(model, sparsity=0.5, total_steps=10, include=[r"re:features\..*", "fc"])
    assert [t.name for t in pruner.targets] == ["features.0", "features.2", "fc"]


@guard(
    "a layer under `weight_norm`/`spectral_norm`, or the older hook-based `weight_norm`",
    "`ValueError` naming the layer and `exclude=[name]`; model untouched",
)
@pytest.mark.parametrize("where", [0, 2])
@pytest.mark.parametrize("norm", ["weight_norm", "spectral_norm", "hook weight_norm"])
def test_layers_under_other_weight_parametrizations_name_the_exclude(norm: str, where: int) -> None:
    model = mlp()
    if norm == "hook weight_norm":
        with pytest.warns(FutureWarning):
            torch.nn.utils.weight_norm(model[where])
        expected = "computed"
    else:
        getattr(parametrizations, norm)(model[where])
        expected = "another parametrization on its weight"
    # (parameters, not the state_dict: reading spectral_norm's weight steps its power iteration)
    before = {k: v.clone() for k, v in model.named_parameters()}
    with pytest.raises(ValueError, match=expected) as err:
        fs.Pruner(model, sparsity=0.5, total_steps=10)
    assert f"exclude=['{where}']" in str(err.value) and "earlier Pruner" not in str(err.value)
    assert all(torch.equal(before[k], v) for k, v in model.named_parameters())
    # The fix the message names works.
    pruner = fs.Pruner(model, sparsity=0.5, total_steps=10, exclude=[str(where)])
    assert [t.name for t in pruner.targets] == [str(2 - where)]


def test_numpy_numbers_are_numbers() -> None:
    model = mlp()
    pruner = fs.Pruner(
        model,
        sparsity=np.float32(0.75),
        total_steps=np.int64(10),
        theta=np.float32(0.5),
        update_every=np.int64(2),
    )
    config = pruner.config()
    assert (config["sparsity"], config["total_steps"], config["update_every"]) == (0.75, 10, 2)
    assert type(config["total_steps"]) is int and type(config["update_every"]) is int
    buffer = io.BytesIO()
    torch.save(pruner.state_dict(), buffer)  # plain Python numbers: loads with weights_only
    buffer.seek(0)
    fs.Pruner.from_state_dict(mlp(), torch.load(buffer, weights_only=True))
    for bad in (np.bool_(True), "0.9", torch.tensor(0.9)):
        with pytest.raises(ValueError, match="sparsity must be a number"):
            fs.Pruner(mlp(), sparsity=bad, total_steps=10)
    with pytest.raises(ValueError, match="total_steps must be a positive int"):
        fs.Pruner(mlp(), sparsity=0.5, total_steps=np.float64(10.0))


@guard(
    "a sparsity below 1 that rounds to every weight of a small model (0.999999 of 768)",
    "`ValueError` giving the largest sparsity that keeps a weight",
)
def test_a_sparsity_that_rounds_to_every_weight_is_refused() -> None:
    model = mlp()  # 16·32 + 32·4 = 640 weights
    with pytest.raises(ValueError, match="prunes all of them") as err:
        fs.Pruner(model, sparsity=0.999999, total_steps=4)
    assert "at most 0.998437" in str(err.value)
    assert not any(parametrize.is_parametrized(m) for m in model.modules())
    pruner = fs.Pruner(model, sparsity=0.998437, total_steps=4, schedule="constant")
    assert pruner.finalize() < 1.0
    assert sum(int(m.weight.count_nonzero()) for m in (model[0], model[2])) >= 1


def test_update_after_loading_weights_prunes_the_new_ones() -> None:
    # concepts.md: weights loaded into an attached model keep the old thresholds
    # until the next step; update() recomputes them at once.
    model, pretrained = mlp(), mlp()
    with torch.no_grad():
        for p in pretrained.parameters():
            p.mul_(5.0)
    pruner = fs.Pruner(model, sparsity=0.9, total_steps=4, schedule="constant")
    model.load_state_dict(pretrained.state_dict())
    stale = pruner.sparsity_achieved()
    pruner.update()
    assert stale < 0.5 and pruner.sparsity_achieved() == pytest.approx(0.9, abs=1e-2)


def test_a_layer_wrapped_or_moved_after_attach_is_still_pruned() -> None:
    # Not replaced: the same layer, under another name (activation checkpointing's
    # wrapper, a new container). The Pruner follows it.
    class Wrapper(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    model = mlp()
    pruner = fs.Pruner(model, sparsity=0.5, total_steps=4, schedule="constant")
    first = model[0]
    model[0] = Wrapper(first)
    train_step(model, pruner)
    assert pruner.finalize() == pytest.approx(0.5, abs=1e-2)
    assert model[0].inner is first and float((first.weight == 0).float().mean()) > 0.3


def test_a_layer_whose_weight_is_a_buffer_is_pruned_as_before() -> None:
    class Fixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("weight", torch.randn(8, 16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.weight.t()

    model = nn.Sequential(Fixed(), nn.Linear(8, 4))
    pruner = fs.Pruner(model, sparsity=0.5, total_steps=4, include=[Fixed, nn.Linear])
    assert [t.name for t in pruner.targets] == ["0", "1"]
    pruner.finalize()
    assert int((model[0].weight == 0).sum()) > 0


def test_nm_options_take_numpy_bools() -> None:
    pruner = fs.make_pruner(mlp(), "s-ste", pattern="2:4", rescale=np.True_)
    assert pruner.config()["backbone"]["rescale"] is True
