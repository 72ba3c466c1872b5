"""The Pruner against bad input and shared weights: refused cleanly, the model left as it was.

Tied weights (one Parameter held by several layers) are pruned once, with
one threshold, and every holder sees the pruned weight; names in
``include``/``exclude`` must exist; a damaged Pruner state is refused before
anything is applied; a refused ``finalize`` leaves the Pruner as it was.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import feather_sparse as fs
from _guards import guard
from feather_sparse.nm import nm_threshold
from feather_sparse.pruner_config import PrunerConfig


class Tied(nn.Module):
    """Two Linear layers holding one weight, and an embedding tied to a third (an LM head)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.b.weight = self.a.weight
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.b(torch.relu(self.a(self.embed(tokens)))))


def plain_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def parametrized(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if parametrize.is_parametrized(m)]


# ------------------------------------------------------------------ tied weights
@guard(
    "two layers share one weight (tied weights)",
    "pruned once with one threshold; every holder sees `P_T(w)`; `finalize` bakes it in once",
)
@pytest.mark.parametrize("pattern", [None, "2:4"])
def test_tied_weight_is_pruned_once_and_seen_pruned_by_every_holder(pattern: str | None) -> None:
    torch.manual_seed(0)
    model = Tied()
    kwargs: dict[str, Any] = {"pattern": pattern} if pattern else {"sparsity": 0.5}
    pruner = fs.Pruner(model, total_steps=4, schedule="constant", **kwargs)
    assert [t.name for t in pruner.targets] == ["a", "head"]
    assert sorted((t.name, i) for t, i in pruner.tied) == [("b", 0), ("embed", 1)]
    assert pruner.num_params == 64 + 128  # each weight counted once
    assert sorted(parametrized(model)) == ["a", "b", "embed", "head"]
    # every holder's forward sees the one pruned weight
    assert torch.equal(model.b.weight, model.a.weight)
    assert torch.equal(model.embed.weight, model.head.weight)
    zeros = int((model.a.weight == 0).sum() + (model.head.weight == 0).sum())
    assert zeros == 96  # half of the two weights, each counted once
    # training updates the one Parameter
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = torch.randint(0, 16, (32,))
    for _ in range(3):
        loss = model(tokens).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()
    expected_a = model.a.weight.detach().clone()
    expected_head = model.head.weight.detach().clone()
    dense = pruner.dense_state_dict(pruned=True)
    assert torch.equal(dense["b.weight"], expected_a)
    assert torch.equal(dense["embed.weight"], expected_head)
    assert pruner.finalize() == pytest.approx(0.5, abs=1 / 64)
    assert parametrized(model) == []
    assert model.a.weight is model.b.weight and model.embed.weight is model.head.weight
    assert torch.equal(model.a.weight, expected_a)  # P_T(w) once, not P_T(P_T(w))
    assert torch.equal(model.head.weight, expected_head)


def test_tied_weights_resume_and_remove() -> None:
    torch.manual_seed(0)
    model = Tied()
    dense = copy.deepcopy(model.state_dict())
    pruner = fs.Pruner(model, 0.5, total_steps=4)
    state = pruner.state_dict()
    pruner.remove()
    assert parametrized(model) == []
    assert model.a.weight is model.b.weight
    assert all(torch.equal(v, dense[k]) for k, v in model.state_dict().items())
    again = fs.Pruner.from_state_dict(model, state)
    assert [t.name for t in again.targets] == ["a", "head"]
    assert len(again.tied) == 2


class Twice(nn.Module):
    """One Linear registered under two names (applied twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = self.a

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


@guard(
    "one layer registered under two names (`self.b = self.a`)",
    "pruned once; `dense_state_dict()` has plain keys under both names, loadable into a new model",
)
@pytest.mark.parametrize("pruned", [False, True])
def test_a_layer_under_two_names_gives_plain_keys_under_both(pruned: bool) -> None:
    torch.manual_seed(0)
    model = Twice()
    pruner = fs.Pruner(model, 0.5, total_steps=4, schedule="constant")
    assert [t.name for t in pruner.targets] == ["a"]
    state = pruner.dense_state_dict(pruned=pruned)
    assert sorted(state) == ["a.bias", "a.weight", "b.bias", "b.weight"]
    fresh = Twice()
    fresh.load_state_dict(state)  # strict: every key plain
    x = torch.randn(4, 8)
    if pruned:
        assert torch.equal(fresh(x), model(x))
    else:
        assert torch.equal(fresh.a.weight, pruner.weights()[0])


@guard(
    "an excluded layer shares its weight with a pruned one",
    "`ValueError` naming both layers: exclude both or neither; the model is untouched",
)
def test_excluded_layer_sharing_a_pruned_weight_is_refused() -> None:
    model = Tied()
    with pytest.raises(ValueError, match="'b' is excluded but shares its weight with 'a'"):
        fs.Pruner(model, 0.5, total_steps=4, exclude=["b"])
    assert parametrized(model) == []
    fs.Pruner(model, 0.5, total_steps=4, exclude=["a", "b"])  # both: fine
    assert sorted(parametrized(model)) == ["embed", "head"]


@guard(
    "a pruned layer's weight is also held under another attribute name",
    "`ValueError` naming it (it would not see the pruned weight); the model is untouched",
)
def test_weight_held_under_another_name_is_refused() -> None:
    model = plain_model()
    holder = nn.Module()
    holder.register_parameter("kernel", model[0].weight)
    model.add_module("holder", holder)
    with pytest.raises(ValueError, match=r"also held as 'holder\.kernel'"):
        fs.Pruner(model, 0.5, total_steps=4)
    assert parametrized(model) == []


# ------------------------------------------------------------- include / exclude
@guard(
    "`exclude`/`include` names a layer the model does not have (a typo)",
    "`ValueError` listing the names and the closest module names",
)
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"exclude": ["3"]}, "exclude names no module of the model: '3'"),
        ({"exclude": ["fc"]}, "'fc'"),
        ({"include": ["0", "22"]}, "include names no module of the model: '22' \\(did you mean"),
    ],
)
def test_names_that_match_no_module_are_refused(kwargs: dict[str, Any], message: str) -> None:
    model = plain_model()
    with pytest.raises(ValueError, match=message):
        fs.Pruner(model, 0.5, total_steps=4, **kwargs)
    assert parametrized(model) == []


def test_regex_patterns_and_parent_names_may_select_nothing_or_children() -> None:
    model = nn.Sequential(plain_model(), nn.Linear(4, 4))
    fs.Pruner(model, 0.5, total_steps=4, exclude=["re:nothing\\..*", "0"], include=["re:.*"])
    assert parametrized(model) == ["1"]  # "0" excludes its children


@guard(
    "`include`/`exclude` is None, or holds a number",
    "`ValueError` naming the argument and what it accepts",
)
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"exclude": None}, "exclude must be a list of module names"),
        ({"exclude": [5]}, "exclude must hold module names, 're:' patterns; 5"),
        ({"include": [nn.Linear, 5]}, "include must hold .* or nn.Module types; 5"),
        ({"include": [int]}, "include must hold"),
    ],
)
def test_layer_selection_types(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fs.Pruner(plain_model(), 0.5, total_steps=4, **kwargs)


@guard(
    "a schedule or backbone given with an unknown option or a wrong-type value",
    "`ValueError` naming the options given and the ones it takes",
)
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"schedule": {"name": "cubic", "ende": 0.3}}, "invalid schedule options .*ende.*: .*end"),
        ({"schedule": {"name": "cubic", "end": "0.3"}}, "invalid schedule options"),
        ({"backbone": {"name": "asl+", "lam": "x"}}, "invalid backbone options .*lam"),
    ],
)
def test_option_dicts(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fs.Pruner(plain_model(), 0.5, total_steps=4, **kwargs)


# ------------------------------------------------------------------ sparsities
@guard(
    "`finalize(sparsity=1.0)`, `update(1.0)` or a string sparsity",
    "`ValueError` as the constructor gives; no weight is baked or changed",
)
@pytest.mark.parametrize("value", [1.0, 1.5, "0.9", math.nan])
@pytest.mark.parametrize("call", ["finalize", "update"])
def test_finalize_and_update_check_the_sparsity(call: str, value: Any) -> None:
    model = plain_model()
    pruner = fs.Pruner(model, 0.5, total_steps=4)
    before = copy.deepcopy(pruner.state_dict())
    weights = [w.detach().clone() for w in pruner.weights()]
    with pytest.raises(ValueError, match="sparsity must be"):
        getattr(pruner, call)(sparsity=value)
    assert parametrized(model) == ["0", "2"]
    assert all(torch.equal(a, b) for a, b in zip(pruner.weights(), weights))
    assert all(torch.equal(a, b) for a, b in zip(pruner.thresholds(), before["thresholds"]))


@guard(
    "a custom schedule returns 1.0 (every weight)",
    "`ValueError` naming the step and the range [0, 1)",
)
def test_schedule_returning_one_is_refused() -> None:
    model = plain_model()
    with pytest.raises(ValueError, match=r"returned sparsity 1\.0 at step 0; it must be in"):
        fs.Pruner(model, 0.5, total_steps=4, schedule=lambda step: 1.0)
    assert parametrized(model) == []


@guard(
    "`finalize(sparsity=...)` below an N:M pattern's sparsity",
    "`ValueError`; the Pruner's thresholds, sparsity and state are as before the call",
)
def test_refused_nm_finalize_leaves_the_pruner_as_it_was() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8))
    pruner = fs.Pruner(model, pattern="2:4")
    before = pruner.state_dict()
    out = model(torch.ones(1, 8))
    with pytest.raises(ValueError, match="more than the 2:4 pattern allows"):
        pruner.finalize(sparsity=0.3)
    after = pruner.state_dict()
    assert after["current_sparsity"] == before["current_sparsity"]
    assert all(torch.equal(a, b) for a, b in zip(after["thresholds"], before["thresholds"]))
    assert torch.equal(model(torch.ones(1, 8)), out)
    assert pruner.finalize() == 0.5


# ------------------------------------------------------------------ saved states
def damaged(state: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``state`` with ``path`` (``"a.b"``) set to ``value``, or removed for ``...``."""
    out = copy.deepcopy(state)
    *parents, leaf = path.split(".")
    node = out
    for key in parents:
        node = node[key]
    if value is ...:
        del node[leaf]
    elif leaf.isdigit():
        node[int(leaf)] = value
    else:
        node[leaf] = value
    return out


DAMAGE = [
    ("step", "abc", "'step' must be an int >= 0"),
    ("step", -7, "'step' must be an int >= 0"),
    ("step", ..., "'step' must be an int >= 0"),
    ("current_sparsity", 5.0, "'current_sparsity' must be a number in"),
    ("thresholds", None, "'thresholds' must be a list of tensors"),
    ("thresholds.0", torch.tensor(math.nan), "thresholds\\[0\\] must be finite and >= 0"),
    ("thresholds.1", torch.tensor(-0.5), "thresholds\\[1\\] must be finite and >= 0"),
    ("thresholds.0", 0.1, "thresholds\\[0\\] must be a one-element float tensor"),
    ("backbone", ..., "'backbone' must be a dict"),
    ("config", None, "'config' must be a dict"),
    ("config.operator", ..., "'config' lacks operator"),
    ("config.targets", [1], "config\\['targets'\\] must be a list of layer names"),
]


@guard(
    "a damaged Pruner state (wrong types, NaN or negative thresholds, missing fields)",
    "`ValueError` 'not a valid Pruner state' naming the field; nothing of it is applied",
)
@pytest.mark.parametrize(("path", "value", "message"), DAMAGE)
def test_damaged_state_is_refused_before_anything_is_applied(
    path: str, value: Any, message: str
) -> None:
    model = plain_model()
    source = fs.Pruner(copy.deepcopy(model), 0.5, total_steps=10)
    for _ in range(3):
        source.step()
    bad = damaged(source.state_dict(), path, value)
    pruner = fs.Pruner(model, 0.5, total_steps=10)
    before = pruner.state_dict()
    with pytest.raises(ValueError, match=f"not a valid Pruner state: {message}"):
        pruner.load_state_dict(bad)
    assert pruner.current_step == 0
    assert all(torch.equal(a, b) for a, b in zip(pruner.thresholds(), before["thresholds"]))


@guard(
    "`Pruner.from_state_dict` with a damaged state",
    "`ValueError`; the model is left plain, so a retry with a good state works",
)
@pytest.mark.parametrize(("path", "value", "message"), [DAMAGE[0], DAMAGE[5], DAMAGE[8]])
def test_from_state_dict_leaves_the_model_plain(path: str, value: Any, message: str) -> None:
    model = plain_model()
    good = fs.Pruner(copy.deepcopy(model), 0.5, total_steps=10).state_dict()
    with pytest.raises(ValueError, match=message):
        fs.Pruner.from_state_dict(model, damaged(good, path, value))
    assert parametrized(model) == []
    fs.Pruner.from_state_dict(model, good)
    assert parametrized(model) == ["0", "2"]


def test_from_state_dict_removes_what_it_attached_when_loading_fails() -> None:
    model = plain_model()
    good = fs.Pruner(copy.deepcopy(model), 0.5, total_steps=10).state_dict()
    short = damaged(good, "thresholds", good["thresholds"][:1])  # well formed, one short
    with pytest.raises(ValueError, match="state holds 1 thresholds"):
        fs.Pruner.from_state_dict(model, short)
    assert parametrized(model) == []


def test_a_tied_layer_with_a_parametrization_of_its_own_is_refused() -> None:
    model = Tied()
    parametrize.register_parametrization(model.b, "weight", nn.Identity())
    with pytest.raises(ValueError, match="also the weight of 'b', which already has a param"):
        fs.Pruner(model, 0.5, total_steps=4, include=["a"])
    assert parametrized(model) == ["b"]


@pytest.mark.parametrize("method", ["s-ste", "oneshot-nm"])
def test_updates_before_the_first_step_take_beta_and_the_frozen_mask_again(method: str) -> None:
    """The DDP recipe: attach, let the ranks agree on the weights, then ``update()``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    pruner = fs.make_pruner(model, method, pattern="2:4", total_steps=10)
    torch.manual_seed(1)
    agreed = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    with torch.no_grad():  # what DDP's broadcast from rank 0 does
        for w, v in zip(pruner.weights(), [agreed[0].weight, agreed[2].weight]):
            w.copy_(v)
        for i in (0, 2):
            model[i].bias.copy_(agreed[i].bias)
    pruner.update()
    fresh = fs.make_pruner(agreed, method, pattern="2:4", total_steps=10)
    mine, theirs = pruner.backbone.state_dict(), fresh.backbone.state_dict()
    for key in ("beta", "masks"):
        if theirs[key] is not None:
            assert all(torch.equal(a, b) for a, b in zip(mine[key], theirs[key]))
    x = torch.randn(4, 8)
    assert torch.equal(model(x), agreed(x))
    # once training has started they stay fixed
    pruner.step()
    fixed = pruner.backbone.state_dict()
    with torch.no_grad():
        pruner.weights()[0].mul_(2.0)
    pruner.update()
    later = pruner.backbone.state_dict()
    for key in ("beta", "masks"):
        if fixed[key] is not None:
            assert all(torch.equal(a, b) for a, b in zip(later[key], fixed[key]))


def test_sharded_one_shot_nm_names_the_option_not_a_contradiction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The 'nm' backbone shards, one-shot's frozen mask does not: the message says which."""
    from feather_sparse import distributed

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    pruner = fs.make_pruner(model, "oneshot-nm", pattern="2:4", total_steps=10)
    monkeypatch.setattr(
        distributed, "local_weights", lambda weights, group, gather=None: (weights, object())
    )
    with pytest.raises(ValueError, match="with these options \\(a frozen one-shot N:M mask") as err:
        pruner.step()
    assert "use one that does" not in str(err.value)


@guard(
    "`fs.Pruner(copy.deepcopy(model))` where `model` has a Pruner attached (an EMA copy)",
    "`ValueError` saying the model is a copy of an attached one, with no Pruner to remove, "
    "and to build it from `model.state_dict()` into a plain model; both models left as they were",
)
def test_a_copy_of_an_attached_model_is_named_a_copy() -> None:
    model = plain_model()
    pruner = fs.Pruner(model, 0.5, total_steps=4)
    ema = copy.deepcopy(model)
    with pytest.raises(ValueError, match="this model is a copy") as err:
        fs.Pruner(ema, 0.5, total_steps=4)
    assert "ema.load_state_dict(model.state_dict())" in str(err.value)
    assert "earlier Pruner" not in str(err.value)
    assert parametrized(ema) == parametrized(model) == ["0", "2"]
    # the recipe the message gives: a plain model from the plain keys takes a Pruner
    plain = plain_model()
    plain.load_state_dict(model.state_dict())
    fs.Pruner(plain, 0.5, total_steps=4)
    # the attached model itself keeps the message about its own Pruner, and so does a
    # copy made with its Pruner (which drives it)
    with pytest.raises(ValueError, match="on the earlier Pruner first"):
        fs.Pruner(model, 0.5, total_steps=4)
    model_copy, pruner_copy = copy.deepcopy((model, pruner))
    with pytest.raises(ValueError, match="on the earlier Pruner first"):
        fs.Pruner(model_copy, 0.5, total_steps=4)
    pruner.step()
    pruner_copy.step()


def test_non_finite_weights_before_training_are_not_called_a_divergence() -> None:
    model = plain_model()
    with torch.no_grad():
        model[0].weight[0, 0] = math.nan
    with pytest.raises(RuntimeError, match="in layer 0 at step 0: the model held them before"):
        fs.Pruner(model, 0.5, total_steps=4)
    assert parametrized(model) == []


@guard(
    "a parametrization removed by hand (`parametrize.remove_parametrizations`), then `step()`",
    "`RuntimeError` naming the layer: create a new Pruner",
)
def test_a_parametrization_removed_outside_the_pruner_is_named() -> None:
    model = plain_model()
    pruner = fs.Pruner(model, 0.5, total_steps=4)
    parametrize.remove_parametrizations(model[2], "weight")
    with pytest.raises(RuntimeError, match="layer '2' no longer carries this Pruner's"):
        pruner.step()


# ------------------------------------------------------------------ a backbone object, two Pruners
@guard(
    "one Backbone object given to two Pruners (or one PrunerConfig holding it, reused)",
    "`ValueError`: each Pruner needs its own backbone; the second model is left untouched",
)
@pytest.mark.parametrize("pattern", [None, "2:4"])
def test_a_backbone_object_serves_one_attached_pruner(pattern: str | None) -> None:
    backbone = fs.NMBackbone("2:4") if pattern else fs.GlobalBackbone()
    kwargs: dict[str, Any] = (
        {"pattern": pattern} if pattern else {"sparsity": 0.5, "schedule": "constant"}
    )
    first, second = plain_model(), plain_model()
    pruner = fs.Pruner(first, backbone=backbone, total_steps=4, **kwargs)
    with pytest.raises(ValueError, match=r"already serves another attached Pruner.*its own"):
        fs.Pruner(second, backbone=backbone, total_steps=4, **kwargs)
    assert parametrized(second) == []
    config = PrunerConfig(backbone=fs.NMBackbone("2:4") if pattern else "global", **kwargs)
    if not pattern:  # a name builds a new backbone each time: the config may be reused
        fs.Pruner.from_config(plain_model(), config, total_steps=4)
        config = PrunerConfig(backbone=fs.GlobalBackbone(), **kwargs)
    fs.Pruner.from_config(plain_model(), config, total_steps=4)
    with pytest.raises(ValueError, match="already serves another attached Pruner"):
        fs.Pruner.from_config(plain_model(), config, total_steps=4)
    # once its Pruner is removed, the object may serve a new one, which prunes its own model
    pruner.remove()
    again = fs.Pruner(second, backbone=backbone, total_steps=4, **kwargs)
    original = second[0].parametrizations.weight.original
    if pattern:
        assert torch.equal(second[0].weight, nm_threshold(original, pattern))
    else:  # the new model's own global threshold, half of its weights pruned
        assert torch.equal(second[0].weight == 0, original.abs() <= again.thresholds()[0])
        assert again.sparsity_achieved() == 0.5


@guard(
    "a prunable layer with no weights (`nn.Linear(8, 0)`)", "reported at 0 % and never as collapsed"
)
@pytest.mark.parametrize("pattern", [None, "2:4"])
def test_an_empty_layer_is_reported_not_divided_by(
    pattern: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="zero-element"):  # torch's own, at initialisation
        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 0), nn.Linear(8, 8))
    kwargs: dict[str, Any] = (
        {"pattern": pattern} if pattern else {"sparsity": 0.5, "schedule": "constant"}
    )
    pruner = fs.Pruner(model, total_steps=4, **kwargs)
    pruner.step()
    rows = {layer.name: layer for layer in pruner.report().layers}
    assert rows["1"].sparsity == 0.0 and not rows["1"].collapsed
    assert "collapse" not in caplog.text
    assert pruner.finalize() == 0.5


@guard(
    "a model with `nn.MultiheadAttention` (Q/K/V in the bare `in_proj_weight`)",
    "a warning naming the module and the weights left dense; `out_proj` pruned",
)
def test_multihead_attention_says_its_qkv_stay_dense(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True)
    pruner = fs.Pruner(layer, pattern="2:4")
    assert [t.name for t in pruner.targets] == ["self_attn.out_proj", "linear1", "linear2"]
    assert "1 nn.MultiheadAttention module ('self_attn')" in caplog.text
    assert "(768 weights)" in caplog.text and "in_proj_weight" in caplog.text
    pruner.remove()
    caplog.clear()
    fs.Pruner(layer, pattern="2:4", exclude=["self_attn"])  # attention left alone: nothing to say
    assert "MultiheadAttention" not in caplog.text


@pytest.mark.parametrize("pattern", [None, "2:4"])
def test_finalize_keeps_a_channels_last_weight_channels_last(pattern: str | None) -> None:
    def pruned(channels_last: bool) -> nn.Module:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(4, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        kwargs: dict[str, Any] = {"pattern": pattern} if pattern else {"sparsity": 0.5}
        fs.Pruner(model, total_steps=1, **kwargs).finalize()
        return model

    plain, fast = pruned(False), pruned(True)
    for a, b in zip(plain.state_dict().values(), fast.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert all(fast[i].weight.is_contiguous(memory_format=torch.channels_last) for i in (0, 2))
    assert not fast[0].weight.is_contiguous()
