"""Plain ``state_dict`` keys under unusual but legitimate usage, compared with the plain model.

Each test does the same thing to a model with a Pruner attached and to the
same model without one, and expects the same keys, order, values, reports and
errors (module ``plain_keys``; the basic cases are in ``test_plain_keys.py``).
"""

from __future__ import annotations

import collections
import copy
import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parametrize

import feather_sparse as fs
from _dist import launch
from _guards import guard

ORIGINAL = "parametrizations.weight.original"


def make() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


class Tied(nn.Module):
    """Two layers sharing one weight, and one of them registered under two names."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4, bias=False)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight
        self.alias = self.b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def make_tied() -> Tied:
    torch.manual_seed(0)
    return Tied()


def make_nested() -> nn.Sequential:
    """A model whose Pruner was attached before it became part of a bigger one."""
    torch.manual_seed(0)
    return nn.Sequential(make(), nn.Linear(3, 2))


def make_root() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(4, 3)


#: name: (build the model, attach a Pruner to the model that is built).
MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], Any]]] = {
    "sequential": (make, lambda m: fs.Pruner(m, 0.5, 10)),
    "tied": (make_tied, lambda m: fs.Pruner(m, 0.5, 10)),
    "nested": (make_nested, lambda m: fs.Pruner(m[0], 0.5, 10)),
    "root": (make_root, lambda m: fs.Pruner(m, 0.5, 10)),
    "two-pruners": (
        make,
        lambda m: (fs.Pruner(m, 0.5, 10, include=["0"]), fs.Pruner(m, 0.5, 10, include=["3"])),
    ),
}


def pair(name: str) -> tuple[nn.Module, nn.Module]:
    """The plain model and the same model with its Pruner(s) attached."""
    build, attach = MODELS[name]
    model = build()
    attach(model)
    return build(), model


def pruned_keys(model: nn.Module) -> list[str]:
    return [
        f"{name}.weight" if name else "weight"
        for name, module in model.named_modules(remove_duplicate=False)
        if parametrize.is_parametrized(module, "weight")
    ]


@guard(
    "`model.load_state_dict(state, strict=False)` while a Pruner is attached, the state "
    "lacking a pruned weight (or holding extra keys)",
    "the returned `missing_keys` name it `<layer>.weight`, as the plain model's do, not its "
    "parametrize key",
)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_non_strict_load_reports_what_the_plain_model_reports(name: str) -> None:
    plain, model = pair(name)
    for key in pruned_keys(model):
        state = plain.state_dict()
        del state[key]
        state["extra.weight"] = torch.zeros(1)
        expected = plain.load_state_dict(state, strict=False)
        got = model.load_state_dict(state, strict=False)
        assert got.missing_keys == expected.missing_keys, key
        assert got.unexpected_keys == expected.unexpected_keys, key


@guard(
    "a strict `model.load_state_dict()` while a Pruner is attached, of a state that lacks a "
    "pruned weight or holds it with the wrong shape",
    "the same error as the plain model's: `Missing key(s)` or `size mismatch for "
    "<layer>.weight`, naming the key the state uses",
)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_strict_load_fails_with_the_plain_models_message(name: str) -> None:
    plain, model = pair(name)
    for key in pruned_keys(model):
        missing = plain.state_dict()
        del missing[key]
        wrong = plain.state_dict()
        wrong[key] = torch.zeros(2, 2)
        for state in (missing, wrong):
            with pytest.raises(RuntimeError) as expected:
                plain.load_state_dict(state)
            with pytest.raises(RuntimeError) as got:
                model.load_state_dict(state)
            # past the first line, which names the class (a parametrized root's is
            # ``ParametrizedLinear``)
            assert str(got.value).split("\n")[1:] == str(expected.value).split("\n")[1:], key


def test_an_old_state_with_the_wrong_shape_names_the_key_it_holds() -> None:
    model = make()
    fs.Pruner(model, 0.5, 10)
    state = {key.replace("0.weight", f"0.{ORIGINAL}"): v for key, v in make().state_dict().items()}
    state[f"0.{ORIGINAL}"] = torch.zeros(2, 2)
    with pytest.raises(RuntimeError, match=rf"size mismatch for 0\.{ORIGINAL}:"):
        model.load_state_dict(state)


@guard(
    "a `state_dict` post-hook of the user's own on a layer the Pruner prunes, registered before "
    "or after attaching",
    "it runs after the Pruner's hook: it sees, and may change, the plain `<layer>.weight` "
    "entry as on the plain layer",
)
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_users_state_dict_hook_sees_the_plain_key(when: str) -> None:
    def half(module: nn.Module, state: dict[str, Any], prefix: str, meta: Any) -> None:
        state[prefix + "weight"] = state[prefix + "weight"].half()

    plain, model = make(), make()
    plain[0].register_state_dict_post_hook(half)
    if when == "before":
        model[0].register_state_dict_post_hook(half)
    pruner = fs.Pruner(model, 0.5, 10)
    if when == "after":
        model[0].register_state_dict_post_hook(half)
    expected, got = plain.state_dict(), model.state_dict()
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
    pruner.remove()
    assert list(model.state_dict()) == list(expected)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_state_dict_arguments_give_what_the_plain_model_gives(name: str) -> None:
    plain, model = pair(name)

    def keys(m: nn.Module, **kwargs: Any) -> list[str]:
        return list(m.state_dict(**kwargs))

    assert keys(model, prefix="outer.") == keys(plain, prefix="outer.")
    assert keys(model, keep_vars=True) == keys(plain, keep_vars=True)
    kept = model.state_dict(keep_vars=True)
    for key in pruned_keys(model):
        assert isinstance(kept[key], nn.Parameter) and kept[key].requires_grad, key
    for sub, module in plain.named_modules():  # each submodule on its own
        assert list(model.get_submodule(sub).state_dict()) == list(module.state_dict()), sub
    compiled, compiled_plain = torch.compile(model), torch.compile(plain)
    assert list(compiled.state_dict()) == list(compiled_plain.state_dict())
    compiled.load_state_dict(compiled_plain.state_dict())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_destination_that_holds_entries_already(name: str) -> None:
    plain, model = pair(name)
    for prefix in ("", "0.", "a."):
        filled: dict[str, Any] = collections.OrderedDict(
            [("before", torch.zeros(1)), (f"{prefix}zzz", torch.zeros(1))]
        )
        expected = plain.state_dict(destination=copy.copy(filled), prefix=prefix)
        got = model.state_dict(destination=copy.copy(filled), prefix=prefix)
        assert list(got) == list(expected), prefix


def test_assign_true_loads_new_tensors_that_the_pruner_follows() -> None:
    plain, model = make(), make()
    pruner = fs.Pruner(model, 0.5, 10, backbone="uniform")
    state = {key: value * 100 for key, value in plain.state_dict().items()}
    plain.load_state_dict(state, assign=True)
    model.load_state_dict(state, assign=True)
    stored = model[0].parametrizations.weight.original
    assert isinstance(stored, nn.Parameter) and torch.equal(stored, plain[0].weight)
    assert list(model.state_dict()) == list(plain.state_dict())
    pruner.update(0.5)
    assert float(pruner.thresholds()[0]) > 1.0  # measured on the assigned weights
    assert float((model[0].weight == 0).float().mean()) == 0.5


def test_detach_and_attach_again_leaves_one_set_of_hooks() -> None:
    model = make()
    fs.Pruner(model, 0.5, 10).remove()
    pruner = fs.Pruner(model, 0.5, 10)
    layer = model[0]
    hooks = (
        layer._state_dict_hooks,
        layer._load_state_dict_pre_hooks,
        layer._load_state_dict_post_hooks,
    )
    assert [len(h) for h in hooks] == [1, 1, 1]
    model.load_state_dict(make().state_dict())
    pruner.finalize()
    assert [len(h) for h in hooks] == [0, 0, 0] and "_fqn_modifiers" not in vars(layer)
    assert list(model.state_dict()) == list(make().state_dict())


def test_a_users_own_parametrization_on_the_same_layers_bias() -> None:
    class Double(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * x

    plain, model = make(), make()
    for m in (plain, model):
        parametrize.register_parametrization(m[0], "bias", Double())
    pruner = fs.Pruner(model, 0.5, 10)
    assert list(model.state_dict()) == list(plain.state_dict())
    model.load_state_dict(plain.state_dict())
    pruner.finalize()
    assert list(model.state_dict()) == list(plain.state_dict())


def test_a_deep_copy_reports_missing_keys_by_their_plain_name() -> None:
    model = make()
    pruner = fs.Pruner(model, 0.5, 10)
    ema = copy.deepcopy(model)
    pruner.finalize()
    state = make().state_dict()
    del state["3.weight"]
    assert ema.load_state_dict(state, strict=False).missing_keys == ["3.weight"]
    assert model.load_state_dict(state, strict=False).missing_keys == ["3.weight"]


# ---------------------------------------------------------------- DCP's optimizer state
def test_dcp_optimizer_state_keys_a_pruned_weight_by_its_parametrize_name() -> None:
    """Documented (docs/distributed.md): DCP names optimizer state by ``named_parameters()``,
    which ``_fqn_modifiers`` cannot rename, so it resumes a model with the Pruner attached."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    def run(model: nn.Module, pruner: fs.Pruner, opt: torch.optim.Optimizer, start: int) -> None:
        for step in range(start, start + 3):
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            pruner.step()

    full = make()  # the uninterrupted run
    full_pruner = fs.Pruner(full, 0.5, 6)
    full_opt = torch.optim.Adam(full.parameters(), lr=0.01)
    run(full, full_pruner, full_opt, 0)
    run(full, full_pruner, full_opt, 3)

    model = make()
    pruner = fs.Pruner(model, 0.5, 6)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    run(model, pruner, opt, 0)
    saved = copy.deepcopy(
        {
            "model": get_model_state_dict(model),
            "optim": get_optimizer_state_dict(model, opt),
            "pruner": pruner.state_dict(),
        }
    )
    named = [name for name, _ in model.named_parameters()]  # "0.parametrizations.weight..."
    assert list(saved["optim"]["state"]) == named and f"0.{ORIGINAL}" in named
    assert list(saved["model"]) == list(make().state_dict())

    resumed = make()
    resumed_pruner = fs.Pruner(resumed, 0.5, 6)
    resumed_opt = torch.optim.Adam(resumed.parameters(), lr=0.01)
    set_model_state_dict(resumed, saved["model"])
    set_optimizer_state_dict(resumed, resumed_opt, saved["optim"])
    resumed_pruner.load_state_dict(saved["pruner"])
    run(resumed, resumed_pruner, resumed_opt, 3)
    for key, value in full.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key


# ---------------------------------------------------------------- FSDP2, one process
def _fsdp2_loads(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    fs.Pruner(model, 0.5, 10)
    fully_shard(model)
    state = dict(model.state_dict())
    del state["0.weight"]
    out: dict[str, Any] = {}
    try:
        out["non_strict"] = list(model.load_state_dict(state, strict=False).missing_keys)
    except RuntimeError as err:
        out["non_strict"] = str(err)
    try:
        model.load_state_dict(state)
        out["strict"] = ""
    except RuntimeError as err:
        out["strict"] = str(err)
    return out


@guard(
    "`load_state_dict(state, strict=False)` into an FSDP2-sharded model with a Pruner attached, "
    "the state lacking a pruned weight",
    "returns it among the missing keys (`<layer>.weight`), as the plain sharded model does; a "
    "strict load fails naming the key and the likely cause",
)
@pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed + gloo"
)
def test_an_fsdp2_non_strict_load_reports_a_missing_pruned_weight() -> None:
    (out,) = launch(functools.partial(_fsdp2_loads), 1)
    assert out["non_strict"] == ["0.weight"]
    assert 'Missing key(s) in state_dict: "0.weight"' in out["strict"]
    assert "broadcast_from_rank0" in out["strict"]


@guard(
    "a Pruner attached to a model built on the meta device (before `to_empty()` and loading)",
    "`ValueError` naming the meta device and the order that works (materialise, load, then "
    "attach); the model is left as it was",
)
def test_a_model_on_the_meta_device_is_refused_with_the_order_that_works() -> None:
    with torch.device("meta"):
        model = make()
    with pytest.raises(ValueError, match=r"meta device.*to_empty"):
        fs.Pruner(model, 0.5, 10)
    assert not parametrize.is_parametrized(model[0])
    model.to_empty(device="cpu")
    model.load_state_dict(make().state_dict())
    fs.Pruner(model, 0.5, 10)
    assert list(model.state_dict()) == list(make().state_dict())
