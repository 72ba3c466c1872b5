"""The Pruner's answers where a newcomer went wrong: after finalize or remove, layer types
given as strings, a state loaded into another model, and what the attach log names."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import feather_sparse as fs
from _guards import guard


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))


def trained(model: nn.Module, **kwargs: Any) -> fs.Pruner:
    """A Pruner driven through a few SGD steps (the schedule at its target from the start)."""
    settings = {"sparsity": 0.5, "schedule": "constant", **kwargs}
    pruner = fs.Pruner(model, total_steps=4, **settings)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()
    return pruner


def parametrized(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if parametrize.is_parametrized(m)]


# ------------------------------------------------------------ after finalize / remove
@pytest.mark.parametrize("kwargs", [{}, {"backbone": "uniform"}, {"pattern": "2:4"}])
def test_a_finalized_pruner_reports_the_baked_model(kwargs: dict[str, Any]) -> None:
    model = mlp()
    if "pattern" in kwargs:
        kwargs = {**kwargs, "sparsity": None, "schedule": None}
    pruner = trained(model, **kwargs)
    before = pruner.report()  # at the target already: finalize recomputes the same thresholds
    thresholds = [t.clone() for t in pruner.thresholds()]
    achieved = pruner.finalize()
    assert parametrized(model) == []

    report = pruner.report()
    layers = [model[0], model[2], model[4]]
    for row, layer, threshold in zip(report.layers, layers, before.layers):
        zeros = int((layer.weight == 0).sum())
        assert row.sparsity == zeros / layer.weight.numel()  # the baked weights' exact zeros
        assert row.threshold == pytest.approx(threshold.threshold)
    assert report.sparsity == pruner.sparsity_achieved() == achieved
    assert report.step == 3 and report.scheduled_sparsity == pruner.sparsity
    assert report.pattern == before.pattern
    for a, b in zip(pruner.thresholds(), thresholds):
        assert torch.equal(a, b)  # the thresholds baked in
    pruner.thresholds()[0].fill_(7.0)  # copies: the record does not change
    assert torch.equal(pruner.thresholds()[0], thresholds[0])
    assert "| **total** |" in report.table()
    assert pruner.config()["targets"] == ["0", "2", "4"]


def test_a_removed_pruner_reports_the_state_it_was_removed_in() -> None:
    model = mlp()
    pruner = trained(model)
    report, thresholds = pruner.report(), [t.clone() for t in pruner.thresholds()]
    dense = [m.parametrizations.weight.original.detach().clone() for m in (model[0], model[2])]
    pruner.remove()
    assert parametrized(model) == []
    assert torch.equal(model[0].weight, dense[0]) and torch.equal(model[2].weight, dense[1])
    assert pruner.report() == report
    assert pruner.sparsity_achieved() == report.sparsity
    assert all(torch.equal(a, b) for a, b in zip(pruner.thresholds(), thresholds))


CALLS = {
    "step()": lambda p: p.step(),
    "update()": lambda p: p.update(),
    "finalize()": lambda p: p.finalize(),
    "remove()": lambda p: p.remove(),
    "state_dict()": lambda p: p.state_dict(),
    "load_state_dict()": lambda p: p.load_state_dict({}),
    "dense_state_dict()": lambda p: p.dense_state_dict(),
}


@guard(
    "`step()`, `update()`, `state_dict()`, ... on a Pruner already finalized or removed",
    "`RuntimeError` naming the call and what was done; `report()`, `sparsity_achieved()`, "
    "`thresholds()` still answer; the model untouched",
)
@pytest.mark.parametrize("end", ["finalize", "remove"])
@pytest.mark.parametrize("call", list(CALLS))
def test_calls_that_prune_or_save_after_the_end_are_refused_by_name(end: str, call: str) -> None:
    model = mlp()
    pruner = trained(model)
    getattr(pruner, end)()
    weights = copy.deepcopy(model.state_dict())
    done = "finalized" if end == "finalize" else "removed"
    with pytest.raises(RuntimeError) as info:
        CALLS[call](pruner)
    message = str(info.value)
    assert message.startswith(f"{call} is refused: this Pruner was {done}")
    assert "report(), sparsity_achieved(), thresholds() and config() still" in message
    if call == "state_dict()":
        assert "save pruner.state_dict() before finalize() or remove()" in message
    elif call != "dense_state_dict()":
        assert "create a new Pruner" in message
    assert parametrized(model) == []
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    pruner.report()  # still answers


# ------------------------------------------------------------------ include strings
@guard(
    "`include=['Linear']`: a layer type's name given as a string (a string is a module name)",
    "`ValueError` saying it is a layer type and to pass the class, `include=[nn.Linear]`",
)
def test_a_layer_type_named_as_a_string_gets_the_class_as_the_fix() -> None:
    model = mlp()
    with pytest.raises(ValueError) as info:
        fs.Pruner(model, 0.9, 10, include=["Linear"])
    message = str(info.value)
    assert "'Linear' (a layer type, not a module name)" in message
    assert "for a layer type pass the class, e.g. include=[nn.Linear]" in message
    assert parametrized(model) == []


class Adapter(nn.Linear):
    """A layer class of the user's own (not in torch.nn)."""


def test_a_model_s_own_layer_class_named_as_a_string_and_a_typo() -> None:
    model = nn.Sequential(Adapter(4, 4), nn.Linear(4, 4))
    with pytest.raises(ValueError) as info:
        fs.Pruner(model, 0.5, 10, include=["Adapter", "11"])
    message = str(info.value)
    assert f"include=[{__name__}.Adapter]" in message
    assert "'11' (did you mean" in message and "model.named_modules()" in message


def test_an_empty_selection_prints_the_default_include_as_classes() -> None:
    with pytest.raises(
        ValueError, match=r"include=\[nn\.Conv1d, nn\.Conv2d, nn\.Conv3d, nn\.Linear\]"
    ):
        fs.Pruner(nn.Sequential(nn.ReLU()), 0.5, 10)
    # "re:0" matches the LSTM: a module with no `weight` (a plain name of it is refused
    # on its own, tests/test_pruner_slips.py)
    with pytest.raises(ValueError, match=r"include=\[nn\.LSTM, 're:0'\]"):
        fs.Pruner(nn.Sequential(nn.LSTM(2, 2)), 0.5, 10, include=[nn.LSTM, "re:0"])


# ------------------------------------------------------------------ from_state_dict
@guard(
    "`Pruner.from_state_dict(model, state)` with a model lacking the layers the state was saved "
    "from",
    "`ValueError` naming the saved layers and those the model lacks (not `include`); "
    "the model untouched",
)
@pytest.mark.parametrize(
    ("other", "lacks"),
    [
        (nn.Sequential(nn.Conv1d(1, 1, 3)), "the model given lacks '2', '4'"),
        (mlp()[:3], "the model given lacks '4'"),
        (nn.ModuleDict({"fc": nn.Linear(2, 2)}), "the model given has none of them"),
    ],
)
def test_from_state_dict_on_another_model_names_the_saved_layers(
    other: nn.Module, lacks: str
) -> None:
    pruner = fs.Pruner(mlp(), 0.5, total_steps=10)
    state = pruner.state_dict()
    with pytest.raises(ValueError) as info:
        fs.Pruner.from_state_dict(other, state)
    message = str(info.value)
    assert "saved from a model with prunable layers '0', '2', '4'" in message
    assert lacks in message and "include" not in message
    assert parametrized(other) == []


# ------------------------------------------------------------------ the attach log
@pytest.mark.parametrize(
    ("method", "sparsity", "line"),
    [
        ("feather", 0.5, "Feather pruner attached to 3 tensors (288 weights), target sparsity"),
        ("gmp", 0.5, "hard-threshold pruner attached to 3 tensors (288 weights), backbone "),
        ("st3", 0.5, "ST-3 pruner attached to 3 tensors"),
        ("soft", 0.5, "soft-threshold pruner attached"),
        (
            "sr-ste",
            None,
            "hard-threshold pruner attached to 3 tensors (288 weights), N:M pattern 2:4",
        ),
        ("feather-nm", None, "Feather pruner attached to 3 tensors (288 weights), N:M pattern 2:4"),
    ],
)
def test_the_attach_log_names_the_operator_and_backbone(
    method: str, sparsity: float | None, line: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="feather_sparse.pruner"):
        fs.make_pruner(mlp(), method, sparsity=sparsity, total_steps=10)
    (message,) = [r.getMessage() for r in caplog.records if "attached" in r.getMessage()]
    assert message.startswith(line)


def test_the_attach_log_names_a_p_of_the_user_s_choice(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="feather_sparse.pruner"):
        fs.Pruner(mlp(), 0.5, 10, p=2.0)
    assert any(r.getMessage().startswith("Feather pruner (p=2) attached") for r in caplog.records)


@guard(
    "a `copy.deepcopy` of the model taken while the Pruner is attached (an EMA model, a "
    "best-so-far snapshot), then `finalize()` or `remove()` on the original",
    "the copy keeps working, with the pruning of the moment it was taken; torch's "
    "parametrize shares the class between the two and removal deleted the copy's `weight`",
)
@pytest.mark.parametrize("end", ["finalize", "remove"])
@pytest.mark.parametrize("pattern", [None, "2:4"])
def test_a_copy_of_the_model_outlives_the_end_of_the_pruner(end: str, pattern: str | None) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    kwargs: dict[str, Any] = {"pattern": pattern} if pattern else {"sparsity": 0.5}
    pruner = fs.Pruner(model, total_steps=2, **kwargs)
    snapshot = copy.deepcopy(model)
    x = torch.randn(3, 8)
    expected = model(x).detach()
    getattr(pruner, end)()
    assert type(model[0]) is nn.Linear and type(model[2]) is nn.Linear
    assert torch.equal(snapshot(x), expected)  # the copy computes what the model did
    # and the copy can still be taken apart the same way torch does it
    parametrize.remove_parametrizations(snapshot[0], "weight", leave_parametrized=True)
    assert type(snapshot[0]) is nn.Linear
    assert torch.equal(snapshot(x), expected)


class _Wrapper(nn.Module):
    """What DDP looks like to ``named_modules``: the model under ``module``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.module = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


@guard(
    "`Pruner.from_state_dict` with a state saved through a wrapper (`module.` names, as DDP "
    "gives them) into the bare model, or the other way round",
    "`ValueError` naming the saved layers and saying the names differ by the wrapper's "
    "prefix, with the model to pass",
)
def test_from_state_dict_across_a_wrapper_names_the_prefix() -> None:
    torch.manual_seed(0)
    wrapped = fs.Pruner(_Wrapper(mlp()), 0.5, total_steps=3)
    saved_wrapped = wrapped.state_dict()
    wrapped.remove()
    bare = fs.Pruner(mlp(), 0.5, total_steps=3)
    saved_bare = bare.state_dict()
    bare.remove()
    with pytest.raises(ValueError, match=r"its names start with 'module\.'.*pass the same wrapper"):
        fs.Pruner.from_state_dict(mlp(), saved_wrapped)
    with pytest.raises(ValueError, match=r"the model given is a wrapper.*ddp\.module"):
        fs.Pruner.from_state_dict(_Wrapper(mlp()), saved_bare)
    with pytest.raises(ValueError) as unrelated:  # no prefix explains it: no hint
        fs.Pruner.from_state_dict(nn.Sequential(nn.Linear(4, 4)), saved_bare)
    assert "wrapper" not in str(unrelated.value)
