"""Tests that close the gaps a second mutation audit of the Pruner found.

Each test here fails on one or more hand-made mutants of ``pruner.py`` that the
rest of the suite let through (``docs/mutation-audit.md``, "The Pruner's layer
selection, attach, resume and report"; the mutants' ids are in each test's
docstring): which layers ``include`` and ``exclude`` select, GPT-2's ``Conv1D``,
how a layer class is written, tied weights, a failed attach, the sparsity in
effect at attach, the collapse warning at sparsity 0,
``dense_state_dict(pruned=True)`` of a tied weight, ``config()`` and
``from_state_dict``, the checks of a saved state, the report's table and a
threshold kept through ``model.half()``. The expected values come from the
docstrings of ``Pruner``, ``PrunerConfig``, ``FeatherParametrization`` and
``_check_state`` and from small models worked out by hand, not from the code's
output. Nothing trains. One more test checks a fix made on the way (recurrent
cells left dense are named, as ``nn.LSTM`` is).
"""

from __future__ import annotations

import copy
import logging
import math
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import feather_sparse as fs
from _guards import guard
from feather_sparse.ops import Operator
from feather_sparse.pruner_config import PrunerConfig
from test_pruner_guards import Tied, damaged, parametrized, plain_model

pytestmark = pytest.mark.usefixtures("one_thread")


class Named(nn.Module):
    """Layers whose names prefix one another: ``fc``, ``fc2``, and ``block.0`` in a container."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)
        self.block = nn.Sequential(nn.Linear(4, 4))


class WithInner(nn.Module):
    """A layer with a weight of its own and a Linear below it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.inner = nn.Linear(4, 4)


class Owner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.own = WithInner()


def targets(**kwargs: Any) -> list[str]:
    """The layers a Pruner on a new :class:`Named` takes (it is removed again)."""
    pruner = fs.Pruner(Named(), 0.5, total_steps=10, **kwargs)
    names = [t.name for t in pruner.targets]
    pruner.remove()
    return names


# ------------------------------------------------------------------ layer selection
def test_names_and_patterns_match_whole_module_names() -> None:
    """pr201, pr202 (and pr203, which the suite killed already): a ``"re:"``
    pattern is "matched in full" (``PrunerConfig``: "``"re:<regex>"`` patterns
    (full match)"), a name in ``exclude`` "also excludes its children" (the
    modules below it: ``block.0`` for ``block``), not every name it happens to
    prefix (``fc2`` for ``fc``); a name in ``include`` is that module alone (only
    ``exclude`` is documented to reach the children)."""
    assert targets() == ["fc", "fc2", "block.0"]
    assert targets(exclude=["re:fc"]) == ["fc2", "block.0"]  # not a prefix match
    assert targets(exclude=["re:fc.*"]) == ["block.0"]
    assert targets(exclude=["fc"]) == ["fc2", "block.0"]
    assert targets(exclude=["block"]) == ["fc", "fc2"]  # its children
    with pytest.raises(ValueError, match="include names 'block', a Sequential"):
        targets(include=["fc", "block"])  # a container's name would take no layer: refused
    assert targets(include=["re:block\\..*"]) == ["block.0"]
    # A layer with a weight of its own and a layer below it: its name takes it alone.
    pruner = fs.Pruner(Owner(), 0.5, total_steps=10, include=["own"])
    assert [t.name for t in pruner.targets] == ["own"]


def test_an_explicit_include_does_not_take_gpt2s_conv1d() -> None:
    """pr205: the default ``include`` "also takes" GPT-2's ``Conv1D`` (a Linear
    stored (in, out)); an ``include`` of one's own takes the types it names."""
    conv1d = pytest.importorskip("transformers.pytorch_utils").Conv1D
    model = nn.Sequential(conv1d(8, 4), nn.Linear(8, 8))
    pruner = fs.Pruner(model, 0.5, total_steps=10)
    assert [t.name for t in pruner.targets] == ["0", "1"]
    pruner.remove()
    pruner = fs.Pruner(model, 0.5, total_steps=10, include=[nn.Linear])
    assert [t.name for t in pruner.targets] == ["1"]


#: A layer class of the user's own that shares its name with ``torch.nn.Linear``.
OwnLinear = type("Linear", (nn.Module,), {})


def test_a_users_class_named_like_a_torch_layer_is_written_with_its_module() -> None:
    """pr206: the messages write a layer class as code names it: ``nn.Linear``
    for torch's, the module path for another class of the same name."""
    with pytest.raises(ValueError) as info:
        fs.Pruner(
            nn.Sequential(nn.ReLU()),
            0.5,
            total_steps=10,
            include=[OwnLinear, nn.Linear],
        )
    assert f"include=[{__name__}.Linear, nn.Linear]" in str(info.value)


# ------------------------------------------------------------------ tied weights
@guard(
    "a pruned layer holds its own weight under a second attribute name as well",
    "`ValueError` naming the second name (it would not see the pruned weight); the model untouched",
)
def test_a_layer_holding_its_weight_under_a_second_name_is_refused() -> None:
    """pr207: "a module holds a target's weight under another name than
    ``weight``" is refused — also when that module is the layer itself."""
    model = plain_model()
    first = model[0]
    assert isinstance(first, nn.Linear)
    weight = first.weight
    assert isinstance(weight, nn.Parameter)
    first.register_parameter("kernel", weight)
    with pytest.raises(ValueError, match=r"also held as '0\.kernel', which would not see it"):
        fs.Pruner(model, 0.5, total_steps=4)
    assert parametrized(model) == []


class TiedUnder(nn.Module):
    """A layer ``a`` whose weight ``enc.0`` (inside a container) also holds, and ``out``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.enc = nn.Sequential(nn.Linear(8, 8))
        self.enc[0].weight = self.a.weight
        self.out = nn.Linear(8, 2)


@guard(
    "a layer inside an excluded container shares its weight with a pruned layer",
    "`ValueError` naming both layers: a tied weight is pruned everywhere or nowhere",
)
def test_a_tied_layer_under_an_excluded_parent_is_refused() -> None:
    """pr208: a name in ``exclude`` also excludes its children, so ``enc.0`` is
    excluded by ``"enc"``, and it shares the weight of ``a``, which is pruned."""
    model = TiedUnder()
    with pytest.raises(ValueError, match=r"'enc\.0' is excluded but shares its weight with 'a'"):
        fs.Pruner(model, 0.5, total_steps=4, exclude=["enc"])
    assert parametrized(model) == []
    fs.Pruner(model, 0.5, total_steps=4, exclude=["enc", "a"])  # both: fine
    assert parametrized(model) == ["out"]


# ------------------------------------------------------------------ attach
@guard(
    "`total_steps=True` (a flag in the place of a count)",
    "`ValueError`, as for 0 or 2.5",
)
def test_total_steps_true_is_refused() -> None:
    """pr210: "total_steps must be a positive int"; ``True`` is a bool."""
    model = plain_model()
    with pytest.raises(ValueError, match=r"total_steps must be a positive int.*got True"):
        fs.Pruner(model, 0.5, total_steps=True)
    config = PrunerConfig(0.5)
    with pytest.raises(ValueError, match="total_steps must be a positive int"):
        fs.Pruner.from_config(model, config, total_steps=True)
    assert parametrized(model) == []


class Picky(Operator):
    """An operator that fails on weights of 4 rows (the model's last layer)."""

    name = "picky"

    def __call__(self, w: Tensor, t: Tensor, theta: float) -> Tensor:
        if w.shape[0] == 4:
            raise RuntimeError("picky: no weights of 4 rows")
        return torch.where(w.abs() > t, w, 0.0)


@guard(
    "attaching fails on a later layer (its operator or parametrization raises)",
    "the error is raised and the layers already parametrized are restored: the model is as before",
)
def test_a_failure_while_attaching_leaves_the_model_as_it_was() -> None:
    """pr213: "Nothing in the model is modified then" (``Pruner``, Raises): the
    first layer's parametrization is taken off again when the last one fails."""
    model = plain_model()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(RuntimeError, match="picky"):
        fs.Pruner(model, 0.5, total_steps=4, operator=Picky())
    assert parametrized(model) == []
    assert list(model[0]._parameters) == ["weight", "bias"]
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
    fs.Pruner(model, 0.5, total_steps=4)  # and the model takes a Pruner


def cubic(step: int, total: int, final: float) -> float:
    """The default schedule (ALGORITHMS.md): cubic from 0 at step 0 to ``S`` at
    ``floor(0.5·total)``, then ``S``."""
    t2 = math.floor(0.5 * total)
    return final if step >= t2 else final - final * (1.0 - step / t2) ** 3


def test_the_sparsity_in_effect_at_attach_is_the_schedules_at_step_0() -> None:
    """pr214: at attach the thresholds are computed at the schedule's sparsity for
    step 0 (0 for the default cubic), and the report and the state give that one."""
    pruner = fs.Pruner(plain_model(), 0.9, total_steps=10)
    assert pruner.report().scheduled_sparsity == 0.0
    assert pruner.state_dict()["current_sparsity"] == 0.0
    assert pruner.sparsity_achieved() == 0.0


def model_with_a_zero_head() -> nn.Module:
    """``plain_model()`` with its head (``"2"``) zero-initialised."""
    model = plain_model()
    head = model[2]
    assert isinstance(head, nn.Linear)
    with torch.no_grad():
        head.weight.zero_()
    return model


def test_an_all_zero_layer_is_not_called_collapsed_at_sparsity_0(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """pr218: a zero-initialised layer (a classifier head, as timm initialises some)
    is not "pruned to 100 % (every weight below the global threshold)" when the
    schedule asks for no pruning at all (sparsity 0 at step 0)."""
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        fs.Pruner(model_with_a_zero_head(), 0.9, total_steps=10)
    assert "layer collapse" not in caplog.text


def test_report_does_not_call_an_all_zero_layer_collapsed_at_sparsity_0(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The report agrees with the check at attach: at scheduled sparsity 0 the
    zeros of a zero-initialised head are the user's, not a collapse ("every
    weight below the global threshold" would be untrue); once the schedule
    prunes, the same all-zero layer is flagged and warned about."""
    pruner = fs.Pruner(model_with_a_zero_head(), 0.9, total_steps=10)
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        report = pruner.report()
    assert report.scheduled_sparsity == 0.0
    assert report.collapsed == []
    assert "collapsed" not in report.table()
    assert "layer collapse" not in caplog.text
    pruner.update(0.5)  # now it prunes: an all-zero layer is fully pruned
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        report = pruner.report()
    assert report.scheduled_sparsity > 0
    assert report.collapsed == ["2"]
    assert "layer collapse" in caplog.text


# ------------------------------------------------------------------ dense_state_dict
def test_the_pruned_state_dict_holds_a_tied_weight_once() -> None:
    """pr228: ``dense_state_dict(pruned=True)``: "a tied weight is one tensor under
    each of its keys, as in ``state_dict``": one storage, saved once."""
    torch.manual_seed(0)
    model = Tied()
    pruner = fs.Pruner(model, 0.5, total_steps=4, schedule="constant")
    plain = model.state_dict()
    state = pruner.dense_state_dict(pruned=True)

    def storage(d: dict[str, Tensor], key: str) -> int:
        return d[key].untyped_storage().data_ptr()

    for a, b in (("a.weight", "b.weight"), ("head.weight", "embed.weight")):
        assert storage(plain, a) == storage(plain, b)
        assert storage(state, a) == storage(state, b)
        layer = model.get_submodule(a.split(".")[0])
        assert isinstance(layer, (nn.Linear, nn.Embedding))
        assert torch.equal(state[a], layer.weight)


# ------------------------------------------------------------------ config / from_state_dict
def test_config_keeps_theta_as_it_was_given() -> None:
    """pr229: ``config()`` is "the constructor's arguments, ... so a run can be
    rebuilt exactly": ``theta="auto"`` stays ``"auto"`` (its value at S = 0.95,
    0.5, is ``theta_resolved``), also through ``from_state_dict``."""
    model = plain_model()
    pruner = fs.Pruner(model, 0.95, total_steps=10)
    assert (pruner.config()["theta"], pruner.config()["theta_resolved"]) == (
        "auto",
        0.5,
    )
    state = pruner.state_dict()
    pruner.remove()
    again = fs.Pruner.from_state_dict(model, state)
    assert again.pruner_config.theta == "auto" and again.config()["theta"] == "auto"


@pytest.mark.parametrize(
    ("sparsity", "kwargs", "attribute", "value"),
    [
        (0.9, {"max_layer_sparsity": 0.95}, "max_layer_sparsity", 0.95),
        (0.95, {"theta_rule": "released"}, "theta", 1.0),  # the paper's rule gives 0.5
        (0.5, {"p": 2.0}, "config", {"name": "feather", "p": 2.0}),
    ],
)
def test_from_state_dict_rebuilds_the_saved_settings(
    sparsity: float, kwargs: dict[str, Any], attribute: str, value: Any
) -> None:
    """pr230, pr231, pr232: ``from_state_dict`` rebuilds "a Pruner on ``model``
    from a saved state (config included)": the layer cap, the θ rule and ``p``
    saved are the rebuilt Pruner's."""
    model = plain_model()
    pruner = fs.Pruner(model, sparsity, total_steps=10, **kwargs)
    pruner.step()
    state = pruner.state_dict()
    pruner.remove()
    again = fs.Pruner.from_state_dict(model, state)
    got = again.operator.config() if attribute == "config" else getattr(again, attribute)
    assert got == value
    assert again.config() == state["config"]
    assert again.current_step == 1


@guard(
    "`Pruner.from_state_dict` of a run made with a custom schedule callable, without it",
    "`ValueError`: pass `schedule=` again (a callable cannot be saved); the model left plain",
)
def test_a_custom_schedule_must_be_given_again() -> None:
    """pr233: a callable schedule is saved as ``{"name": "<callable>"}``;
    ``from_state_dict`` asks for it with the fix, and takes it as an override."""
    model = plain_model()
    pruner = fs.Pruner(model, 0.5, total_steps=10, schedule=lambda step: 0.25)
    state = pruner.state_dict()
    pruner.remove()
    with pytest.raises(ValueError, match=r"custom schedule callable: pass schedule=\.\.\. again"):
        fs.Pruner.from_state_dict(model, state)
    assert parametrized(model) == []
    again = fs.Pruner.from_state_dict(model, state, schedule=lambda step: 0.25)
    assert again.scheduled_sparsity(7) == 0.25


# ------------------------------------------------------------------ saved states
@guard(
    "an N:M Pruner state whose ramp (its 'threshold') is above 1",
    "`ValueError` naming the layer and the bound; nothing loaded",
)
def test_an_nm_ramp_above_one_is_refused() -> None:
    """pr234: an N:M layer's "threshold" is the ramp ``r``, at most 1."""
    source = fs.Pruner(plain_model(), pattern="2:4")
    bad = damaged(source.state_dict(), "thresholds.1", torch.tensor(1.5))
    pruner = fs.Pruner(plain_model(), pattern="2:4")
    before = [t.clone() for t in pruner.thresholds()]
    with pytest.raises(ValueError, match=r"thresholds\[1\] \('2'\) is an N:M ramp, at most 1"):
        pruner.load_state_dict(bad)
    assert all(torch.equal(a, b) for a, b in zip(pruner.thresholds(), before))


@guard(
    "a Pruner state with current_sparsity 1.0 or an infinite threshold",
    "`ValueError` 'not a valid Pruner state' naming the field; nothing applied",
)
@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            "current_sparsity",
            1.0,
            r"'current_sparsity' must be a number in \[0, 1\), got 1\.0",
        ),
        (
            "thresholds.0",
            torch.tensor(math.inf),
            r"thresholds\[0\] must be finite and >= 0",
        ),
    ],
)
def test_a_state_at_the_edge_of_its_ranges_is_refused(path: str, value: Any, message: str) -> None:
    """pr235, pr236: ``current_sparsity`` lies in [0, 1) like every sparsity, and a
    threshold is finite (``_check_state``: "must be finite and >= 0")."""
    source = fs.Pruner(plain_model(), 0.5, total_steps=10)
    source.step()
    bad = damaged(source.state_dict(), path, value)
    pruner = fs.Pruner(plain_model(), 0.5, total_steps=10)
    with pytest.raises(ValueError, match=f"not a valid Pruner state: {message}"):
        pruner.load_state_dict(bad)
    assert pruner.current_step == 0


#: What ``from_state_dict`` reads from a state's ``config`` (its kwargs).
READ = [
    "sparsity",
    "total_steps",
    "operator",
    "theta",
    "theta_rule",
    "backbone",
    "schedule",
    "update_every",
    "targets",
    "max_layer_sparsity",
]


@guard(
    "a Pruner state whose config lacks a field `from_state_dict` reads",
    "`ValueError` naming the field (not a `KeyError`); the model left plain",
)
@pytest.mark.parametrize("key", READ)
def test_a_state_lacking_a_setting_is_refused_naming_it(key: str) -> None:
    """pr237: every setting ``from_state_dict`` reads is required by the check
    that runs before anything is attached."""
    model = plain_model()
    state = fs.Pruner(copy.deepcopy(model), 0.5, total_steps=10).state_dict()
    with pytest.raises(ValueError, match=f"not a valid Pruner state: 'config' lacks {key}"):
        fs.Pruner.from_state_dict(model, damaged(state, f"config.{key}", ...))
    assert parametrized(model) == []


# ------------------------------------------------------------------ report
def test_the_report_table_worked_out_by_hand() -> None:
    """pr238: the table shows each layer's threshold to 4 significant digits
    (``1.6e-3`` is ``0.016``, not ``0.02``), its shape, weights, sparsity and the
    collapse flag. Layer 0 holds magnitudes 1..16·1e-3, layer 1 17..32·1e-3: at
    S = 0.5 the threshold is the 16th smallest, 0.016, all of layer 0."""
    small, large = nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        small.weight.copy_(torch.arange(1, 17, dtype=torch.float32).view(4, 4) * 1e-3)
        large.weight.copy_(-torch.arange(17, 33, dtype=torch.float32).view(4, 4) * 1e-3)
    pruner = fs.Pruner(nn.Sequential(small, large), 0.5, total_steps=10, schedule="constant")
    assert pruner.report().table() == "\n".join(
        [
            "| layer | shape | params | threshold | sparsity |",
            "|---|---|---:|---:|---:|",
            "| 0 | 4×4 | 16 | 0.016 | 100.00% **collapsed** |",
            "| 1 | 4×4 | 16 | 0.016 | 0.00% |",
            "| **total** | | 32 | | 50.00% |",
        ]
    )


# ------------------------------------------------------------------ a dtype move
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_conversion_after_attaching_keeps_the_threshold_exactly(
    dtype: torch.dtype,
) -> None:
    """pr239: after ``model.half()`` (or bfloat16) "the threshold stays in the
    operator's compute dtype (float32 for half weights) ... without the round trip
    through the half type that would change its value" (``FeatherParametrization``)."""
    model = plain_model()
    pruner = fs.Pruner(model, 0.5, total_steps=10, schedule="constant")
    before = [t.clone() for t in pruner.thresholds()]
    assert before[0].dtype == torch.float32
    assert float(before[0].to(dtype)) != float(before[0])  # the round trip would show
    model.to(dtype)
    after = pruner.thresholds()
    assert [t.dtype for t in after] == [torch.float32, torch.float32]
    assert all(torch.equal(a, b) for a, b in zip(after, before))


# ------------------------------------------------------------------ found on the way
class CellTagger(nn.Module):
    """A model stepping an ``nn.LSTMCell`` by hand, and a GRU beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(8, 8)
        self.cell = nn.LSTMCell(16, 32)
        self.head = nn.Linear(32, 5)


def test_recurrent_cells_left_dense_are_named(caplog: pytest.LogCaptureFixture) -> None:
    """Found on the way (fixed in ``_recurrent_weights``): a recurrent cell holds its
    weights as ``weight_ih``/``weight_hh``, no layer's ``weight``, so it stays dense;
    the Pruner says so as it does for ``nn.LSTM``. ``nn.LSTMCell(16, 32)``:
    4 gates × 32 × (16 + 32) = 6,144 weights; ``nn.GRU(8, 8)``: 3 × 8 × (8 + 8) = 384."""
    caplog.set_level(logging.WARNING, logger="feather_sparse")
    fs.Pruner(CellTagger(), 0.9, total_steps=10, exclude=["rnn"])
    assert (
        "1 recurrent module (nn.LSTMCell 'cell') keeps 6,144 weights dense: they are "
        "weight_ih/weight_hh parameters" in caplog.text
    )
    caplog.clear()
    fs.Pruner(CellTagger(), 0.9, total_steps=10)
    assert (
        "2 recurrent modules (nn.GRU 'rnn', nn.LSTMCell 'cell') keep 6,528 weights dense: "
        "they are weight_ih*/weight_hh* parameters" in caplog.text
    )
    caplog.clear()
    fs.Pruner(CellTagger(), 0.9, total_steps=10, exclude=["rnn", "cell"])
    assert "recurrent" not in caplog.text
