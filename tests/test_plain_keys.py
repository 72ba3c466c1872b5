"""``model.state_dict()`` while a Pruner is attached: the plain model's keys, order and loading.

``parametrize`` moves a pruned weight to ``<layer>.parametrizations.weight.original``;
the Pruner presents it under ``<layer>.weight`` instead (module ``plain_keys``), so
a checkpoint written by any code that calls ``model.state_dict()`` loads into the
plain model, and one of the plain model loads into the attached model.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch
from torch import nn

import feather_sparse as fs
from _guards import guard
from _helpers import needs_safetensors

ORIGINAL = "parametrizations.weight.original"


class BiasFirst(nn.Module):
    """A layer that registers its bias before its weight (its state_dict order says so)."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(6))
        self.weight = nn.Parameter(torch.randn(6, 8))
        self.register_buffer("scale", torch.ones(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias) * self.scale


class Net(nn.Module):
    """Conv + BN + Linear, a tied pair, and one layer registered under two names."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 8 * 8, 8)
        self.odd = BiasFirst()
        self.head = nn.Linear(6, 8, bias=False)
        self.out = nn.Linear(8, 6, bias=False)
        self.out.weight = self.odd.weight  # tied (same shape (6, 8))
        self.alias = self.head  # one module, two names

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))
        return self.out(self.head(self.odd(h)))


def make() -> Net:
    torch.manual_seed(0)
    return Net()


def include() -> list[type[nn.Module] | str]:
    return [nn.Conv2d, nn.Linear, "odd"]


def loss_of(model: nn.Module, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(4, 2, 8, 8, generator=g)
    return nn.functional.cross_entropy(model(x), torch.randint(0, 6, (4,), generator=g))


def train(model: nn.Module, pruner: fs.Pruner, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        loss = loss_of(model, g)
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()


def test_attached_state_dict_has_the_plain_models_keys_in_its_order() -> None:
    plain = make()
    model = make()
    pruner = fs.Pruner(model, 0.5, 10, include=include(), backbone="uniform")
    assert {t.name for t in pruner.parametrized_layers()} >= {"conv", "fc", "odd", "out", "head"}
    state = model.state_dict()
    assert list(state) == list(plain.state_dict())
    assert not any(ORIGINAL in key for key in state)
    # the values are the stored dense weights, the very tensors training updates
    assert state["odd.weight"].data_ptr() == model.odd.parametrizations.weight.original.data_ptr()
    assert state["out.weight"].data_ptr() == state["odd.weight"].data_ptr()  # still tied


@guard(
    "`model.state_dict()` saved by hand while a Pruner is attached, loaded into the plain model",
    "keys are the plain model's (`<layer>.weight`): a strict load succeeds with the dense weights",
)
def test_a_checkpoint_taken_during_training_loads_strictly_into_the_plain_model() -> None:
    model = make()
    pruner = fs.Pruner(model, 0.5, 10, include=include())
    train(model, pruner, 3)
    saved = copy.deepcopy(model.state_dict())
    plain = make()
    plain.load_state_dict(saved)  # strict: no missing or unexpected key
    dense = pruner.dense_state_dict()
    for key, value in plain.state_dict().items():
        assert torch.equal(value, dense[key]), key


def test_a_hand_written_resume_through_model_state_dict_is_bit_exact(tmp_path: Path) -> None:
    full = make()
    full_pruner = fs.Pruner(full, 0.5, 8, include=include())
    train(full, full_pruner, 8)

    # the same run, saved at step 4 with torch.save(model.state_dict()) and resumed
    first = make()
    pruner = fs.Pruner(first, 0.5, 8, include=include())
    opt = torch.optim.SGD(first.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(1)

    def steps(model: nn.Module, pruner: fs.Pruner, opt: torch.optim.Optimizer, n: int) -> None:
        for _ in range(n):
            loss = loss_of(model, g)
            opt.zero_grad()
            loss.backward()
            opt.step()
            pruner.step()

    steps(first, pruner, opt, 4)
    path = tmp_path / "ckpt.pt"
    torch.save(
        {"model": first.state_dict(), "pruner": pruner.state_dict(), "opt": opt.state_dict()},
        path,
    )
    ckpt = torch.load(path, weights_only=True)
    second = make()
    resumed = fs.Pruner(second, 0.5, 8, include=include())
    opt2 = torch.optim.SGD(second.parameters(), lr=0.01, momentum=0.9)
    second.load_state_dict(ckpt["model"])  # plain keys into the attached model
    resumed.load_state_dict(ckpt["pruner"])
    opt2.load_state_dict(ckpt["opt"])
    steps(second, resumed, opt2, 4)
    for key, value in full.state_dict().items():
        assert torch.equal(second.state_dict()[key], value), key


@guard(
    "a state saved with the parametrization keys (`<layer>.parametrizations.weight.original`, "
    "as earlier versions wrote) loaded into a model with a Pruner attached",
    "accepted as before: the stored dense weights load, strictly",
)
def test_a_state_with_the_parametrization_keys_still_loads() -> None:
    model = make()
    pruner = fs.Pruner(model, 0.5, 10, include=include())
    train(model, pruner, 2)
    old_style = {}
    for key, value in model.state_dict().items():
        layer = key.removesuffix(".weight")
        module = model.get_submodule(layer) if key.endswith(".weight") else None
        if module is not None and hasattr(module, "parametrizations"):
            key = f"{layer}.{ORIGINAL}"
        old_style[key] = value.clone()
    other = make()
    other_pruner = fs.Pruner(other, 0.5, 10, include=include())
    other.load_state_dict(old_style)
    for key, value in model.state_dict().items():
        assert torch.equal(other.state_dict()[key], value), key
    assert other_pruner.current_step == 0


def test_a_plain_models_state_loads_into_the_attached_model() -> None:
    plain = make()
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(1.0)
    model = make()
    fs.Pruner(model, 0.5, 10, include=include())
    model.load_state_dict(plain.state_dict())
    assert torch.equal(model.fc.parametrizations.weight.original, plain.fc.weight)
    assert model.odd.parametrizations.weight.original is model.out.parametrizations.weight.original


def test_a_missing_weight_is_still_reported_by_a_strict_load() -> None:
    model = make()
    fs.Pruner(model, 0.5, 10, include=include())
    state = model.state_dict()
    del state["fc.weight"]
    with pytest.raises(RuntimeError, match="fc"):
        model.load_state_dict(state)


@guard(
    "a state that holds a pruned weight twice, under `<layer>.weight` and "
    "`<layer>.parametrizations.weight.original`, with different values",
    "`RuntimeError` naming both keys (which to load is ambiguous); nothing is loaded silently",
)
def test_a_state_with_both_keys_of_one_weight_is_refused() -> None:
    model = make()
    fs.Pruner(model, 0.5, 10, include=include())
    state = model.state_dict()
    state[f"fc.{ORIGINAL}"] = state["fc.weight"].clone() + 1
    with pytest.raises(RuntimeError, match=r"'fc\.weight' and 'fc\.parametrizations"):
        model.load_state_dict(state)


@pytest.mark.parametrize("full", [False, True])
def test_torch_distributed_checkpoint_state_dict_round_trips(full: bool) -> None:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    options = StateDictOptions(full_state_dict=full)
    model = make()
    pruner = fs.Pruner(model, 0.5, 10, include=include())
    state = get_model_state_dict(model, options=options)
    assert list(state) == list(make().state_dict())
    changed = {key: value.clone() + 1 for key, value in state.items()}
    set_model_state_dict(model, changed, options=options)
    for key, value in pruner.dense_state_dict().items():
        assert torch.equal(value, changed[key]), key


@pytest.mark.parametrize("end", ["finalize", "remove"])
def test_after_the_pruner_ends_the_model_is_the_plain_model_again(end: str) -> None:
    plain = make()
    model = make()
    pruner = fs.Pruner(model, 0.5, 10, include=include())
    train(model, pruner, 2)
    getattr(pruner, end)()
    assert list(model.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.named_parameters()]
    for layer in ("conv", "fc", "odd", "head", "out"):
        module = model.get_submodule(layer)
        assert not module._state_dict_hooks and not module._load_state_dict_pre_hooks, layer


@guard(
    "an optimizer state saved from the plain model loaded into an optimizer built after finalize()",
    "`model.parameters()` is in the plain model's order again, so each state meets its own tensor",
)
def test_finalize_puts_each_weight_back_in_its_place_among_the_parameters() -> None:
    plain = make()
    opt = torch.optim.Adam(plain.parameters())
    plain(torch.randn(2, 2, 8, 8)).square().mean().backward()
    opt.step()
    model = make()
    fs.Pruner(model, 0.5, 10, include=include()).finalize()
    again = torch.optim.Adam(model.parameters())
    again.load_state_dict(opt.state_dict())
    for p, q in zip(model.parameters(), plain.parameters()):
        assert again.state[p]["exp_avg"].shape == p.shape == q.shape


def test_a_deep_copy_keeps_plain_keys_after_the_original_is_finalized() -> None:
    model = make()
    pruner = fs.Pruner(model, 0.5, 10, include=include())
    train(model, pruner, 2)
    ema = copy.deepcopy(model)
    pruner.finalize()
    assert list(ema.state_dict()) == list(make().state_dict())
    fresh = make()
    fresh.load_state_dict(ema.state_dict())
    ema.load_state_dict(fresh.state_dict())


def test_a_layer_that_is_the_root_module() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(8, 4)
    pruner = fs.Pruner(layer, 0.5, 10)
    assert list(layer.state_dict()) == ["weight", "bias"]
    plain = nn.Linear(8, 4)
    plain.load_state_dict(layer.state_dict())
    layer.load_state_dict(plain.state_dict())
    assert torch.equal(pruner.dense_state_dict()["weight"], plain.weight)


def test_dense_state_dict_pruned_gives_the_forwards_weights_under_the_plain_keys() -> None:
    model = make()
    pruner = fs.Pruner(model, 0.5, 10, include=include())
    train(model, pruner, 3)
    pruned = pruner.dense_state_dict(pruned=True)
    assert list(pruned) == list(make().state_dict())
    for name in ("conv", "fc", "odd", "head", "alias", "out"):
        module = model.get_submodule(name)
        assert torch.equal(pruned[f"{name}.weight"], module.weight), name
        assert pruned[f"{name}.weight"].data_ptr() != module.weight.data_ptr()  # a copy


transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@guard(
    "`model.save_pretrained()` of a Hugging Face model in a hand-written loop while a Pruner is "
    "attached (tied embeddings), then `from_pretrained()`",
    "the folder holds the plain keys: every weight loads (the dense ones), none is re-initialised",
)
@needs_safetensors  # save_pretrained writes model.safetensors (transformers requires it)
def test_save_pretrained_while_attached_loads_back_with_every_weight(tmp_path: Path) -> None:
    config = transformers.GPT2Config(
        vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=32, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    pruner = fs.Pruner(model, 0.8, 6)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()
    model.save_pretrained(tmp_path)
    loaded, info = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    dense = pruner.dense_state_dict()
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, dense[key]), key
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
