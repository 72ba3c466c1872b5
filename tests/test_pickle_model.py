"""``torch.save(model, path)`` of a model with a Pruner attached (``plain_keys._PickleAsPlain``).

torch refuses to pickle a parametrized module, and ``torch.save`` meets that
refusal after it has emptied the file at ``path``. Each pruned layer now
pickles as the plain layer holding what its forward computes at that moment.
"""

from __future__ import annotations

import copy
import io
import logging
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import feather_sparse as fs
from _guards import guard
from feather_sparse import plain_keys


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def trained(model: nn.Module, steps: int = 4, **kwargs: object) -> fs.Pruner:
    """A Pruner at ``steps`` of 8 optimizer steps, with weights moved by SGD."""
    pruner = fs.make_pruner(model, total_steps=8, **kwargs)  # type: ignore[arg-type]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        loss = model(torch.randn(8, 16, generator=gen)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()
    return pruner


def pickled(model: nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    return buffer.getvalue()


def unpickled(data: bytes) -> nn.Module:
    model: nn.Module = torch.load(io.BytesIO(data), weights_only=False)
    return model


@guard(
    "`torch.save(model, path)` with a Pruner attached, over an earlier checkpoint at `path`",
    "saved: each pruned layer is pickled as the plain layer holding what its forward computes "
    "now (`P_T(w)`), with one warning; torch refused parametrized modules after emptying the "
    "file, so the earlier checkpoint was lost",
)
def test_torch_save_of_an_attached_model_writes_the_forward_it_computes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = mlp()
    path = tmp_path / "best.pt"
    torch.save(mlp(), path)  # the earlier checkpoint under that name
    pruner = trained(model, method="feather", sparsity=0.8)
    x = torch.randn(5, 16)
    expected = model(x).detach()
    pruned = pruner.dense_state_dict(pruned=True)
    plain_keys._PICKLE_WARNED = False
    caplog.set_level(logging.WARNING, logger="feather_sparse")
    torch.save(model, path)
    assert "pickling (torch.save(model, ...)) a model with a Pruner attached" in caplog.text
    loaded = torch.load(path, weights_only=False)
    assert [type(m) for m in loaded] == [nn.Linear, nn.ReLU, nn.Linear]
    assert not any(parametrize.is_parametrized(m) for m in loaded.modules())
    assert list(loaded.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert torch.equal(loaded(x), expected)
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, pruned[key]), key
    assert isinstance(loaded[0].weight, nn.Parameter) and loaded[0].weight.requires_grad
    assert float((loaded[0].weight == 0).float().mean()) > 0.3  # thresholded, not dense
    for layer in (loaded[0], loaded[2]):  # none of the Pruner's hooks or attributes came along
        assert not {"__reduce_ex__", plain_keys.FQN_MODIFIERS} & set(layer.__dict__)
        hooks = [
            *layer._state_dict_hooks.values(),
            *layer._load_state_dict_pre_hooks.values(),
            *layer._load_state_dict_post_hooks.values(),
        ]
        assert not hooks
    # and it loads a plain state as the plain model does
    loaded.load_state_dict(mlp().state_dict())
    assert torch.equal(loaded[0].weight, mlp()[0].weight)
    # the model itself is untouched and still pruned by its Pruner
    assert parametrize.is_parametrized(model[0], "weight")
    assert torch.equal(model(x), expected)
    assert pruner.dense_state_dict()["0.weight"].count_nonzero() == 16 * 32


def test_the_pickle_loads_without_feather_sparse(tmp_path: Path) -> None:
    model = mlp()
    trained(model, method="feather", sparsity=0.8)
    path = tmp_path / "m.pt"
    torch.save(model, path)
    with zipfile.ZipFile(path) as z:
        (pkl,) = [n for n in z.namelist() if n.endswith("data.pkl")]
        assert b"feather" not in z.read(pkl)
    code = (
        "import sys; sys.modules['feather_sparse'] = None\n"
        "import torch\n"
        f"m = torch.load({str(path)!r}, weights_only=False)\n"
        "print(type(m[0]).__name__, int(m[0].weight.count_nonzero()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "Linear"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"method": "feather-nm", "pattern": "2:4"},
        {"method": "sr-ste", "pattern": "2:4"},
        {"method": "st3", "sparsity": 0.8},
        {"method": "spartan", "sparsity": 0.8},
    ],
    ids=["feather-nm", "sr-ste", "st3", "spartan"],
)
def test_every_method_pickles_as_its_forward(kwargs: dict[str, object]) -> None:
    model = mlp()
    trained(model, steps=8, **kwargs)
    x = torch.randn(5, 16)
    loaded = unpickled(pickled(model))
    assert torch.equal(loaded(x), model(x))
    if "pattern" in kwargs:  # the full 2:4 pattern: at most 2 nonzeros in each group of 4
        for layer in (loaded[0], loaded[2]):
            groups = layer.weight.reshape(-1, 4)
            assert int((groups != 0).sum(1).max()) <= 2


def test_a_tied_weight_stays_one_tensor_in_the_pickle() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    model[1].weight = model[0].weight
    fs.Pruner(model, sparsity=0.5, total_steps=2).step()
    loaded = unpickled(pickled(model))
    assert loaded[0].weight is loaded[1].weight
    assert torch.equal(loaded[0].weight, model[0].weight)


def test_the_pickle_is_computed_when_it_is_made_not_cached() -> None:
    model = mlp()
    pruner = trained(model, steps=1, method="feather", sparsity=0.8)
    first = unpickled(pickled(model))
    pruner.step()  # a higher threshold
    pruner.step()
    second = unpickled(pickled(model))
    assert second[0].weight.count_nonzero() < first[0].weight.count_nonzero()
    assert torch.equal(second[0].weight, model[0].weight)


def test_a_deep_copy_pickles_its_own_weights() -> None:
    model = mlp()
    trained(model, method="feather", sparsity=0.8)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin[0].parametrizations.weight.original.mul_(2.0)
    loaded = unpickled(pickled(twin))
    assert torch.equal(loaded[0].weight, twin[0].weight)
    assert not torch.equal(loaded[0].weight, model[0].weight)


def test_another_parametrization_keeps_torchs_refusal() -> None:
    class Double(nn.Module):
        def forward(self, b: torch.Tensor) -> torch.Tensor:
            return 2 * b

    model = mlp()
    fs.Pruner(model, sparsity=0.5, total_steps=2)
    parametrize.register_parametrization(model[0], "bias", Double())
    with pytest.raises(RuntimeError, match="Serialization of parametrized modules"):
        pickled(model)


@pytest.mark.parametrize("end", ["finalize", "remove"])
def test_after_the_pruner_ends_the_layer_pickles_as_usual(end: str) -> None:
    model = mlp()
    pruner = trained(model, steps=8, method="feather", sparsity=0.8)
    getattr(pruner, end)()
    assert "__reduce_ex__" not in model[0].__dict__
    x = torch.randn(3, 16)
    assert torch.equal(unpickled(pickled(model))(x), model(x))
