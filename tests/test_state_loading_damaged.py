"""A damaged backbone state is refused before anything of it is loaded.

ASL+, Spartan and the N:M backbone (S-STE, one-shot) each check the whole of
their saved state (its keys, the number and shapes of its per-layer entries,
their types and values) before they change anything, and refuse a bad one
with a ``ValueError``: "not a valid Pruner state: ... (the state is damaged,
...); nothing was loaded", or "...: it was saved from another model" for
entries that do not fit the layers. The Pruner that refused a state goes on
exactly as its twin that was never given one: the same state, and after one
more training step the same forward.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

import feather_sparse as fs
from _guards import guard
from test_pruner_guards import damaged

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS = 10  # Spartan freezes its masks at step 8 (freeze_at = 0.8)


def mlp(hidden: int = 32) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 8))


def batch(step: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(step)
    return torch.randn(8, 16, generator=gen), torch.randint(0, 8, (8,), generator=gen)


@dataclass
class Run:
    """A model, its Pruner and an optimizer of both (ASL+'s thresholds train too)."""

    model: nn.Module
    pruner: fs.Pruner
    optimizer: torch.optim.Optimizer

    def step(self) -> None:
        x, y = batch(self.pruner.current_step)
        loss = F.cross_entropy(self.model(x), y) + self.pruner.regularizer()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.pruner.step()


def run(method: str, steps: int, hidden: int = 32) -> Run:
    """A Run of ``method`` (a backbone, or a method of ``make_pruner``), trained ``steps``."""
    model = mlp(hidden)
    if method == "asl+":
        pruner = fs.Pruner(model, 0.8, total_steps=STEPS, backbone="asl+")
    elif method == "spartan":
        pruner = fs.make_pruner(model, "spartan", sparsity=0.8, total_steps=STEPS)
    else:
        pruner = fs.make_pruner(model, method, pattern="2:4", total_steps=STEPS)
    optimizer = torch.optim.SGD(list(model.parameters()) + pruner.parameters(), lr=0.1)
    out = Run(model, pruner, optimizer)
    for _ in range(steps):
        out.step()
    return out


def assert_same(a: Any, b: Any) -> None:
    """Two states hold the same keys, types and values (tensors bit for bit)."""
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    else:
        assert a == b


def assert_refused_and_goes_on(method: str, steps: int, bad: dict[str, Any], message: str) -> None:
    """A Pruner of ``method`` trained ``steps`` refuses ``bad`` with ``message``; nothing of
    it is loaded: its state is as before, and one more step gives its twin's forward."""
    live, twin = run(method, steps), run(method, steps)
    before = copy.deepcopy(live.pruner.state_dict())
    with pytest.raises(ValueError, match=message):
        live.pruner.load_state_dict(bad)
    assert_same(live.pruner.state_dict(), before)
    for each in (live, twin):
        each.step()
    assert_same(live.pruner.state_dict(), twin.pruner.state_dict())
    x, _ = batch(STEPS)
    assert torch.equal(live.model(x), twin.model(x))


NOTHING = r"\(the state is damaged, or was not written by Pruner.state_dict\); nothing was loaded"
ANOTHER_MODEL = "it was saved from another model; nothing was loaded"


# ---------------------------------------------------------------------- ASL+
def short(values: Tensor) -> Tensor:
    return values[:1].clone()


def nan_at(index: int) -> Callable[[Tensor], Tensor]:
    def change(values: Tensor) -> Tensor:
        out = values.clone()
        out[index] = math.nan
        return out

    return change


ASL_DAMAGE: list[tuple[str, Any, str]] = [
    ("r", ..., "the ASL\\+ backbone's state lacks 'r'"),
    ("sigma", ..., "the ASL\\+ backbone's state lacks 'sigma'"),
    ("target", ..., "the ASL\\+ backbone's state lacks 'target'"),
    ("initialized", ..., "the ASL\\+ backbone's state lacks 'initialized'"),
    ("r", [0.5, 0.5], "the ASL\\+ backbone's 'r' is list, where state_dict\\(\\) writes a 1-d"),
    ("sigma", short, "the ASL\\+ backbone's 'sigma' holds 1 values for its 2 thresholds"),
    ("r", nan_at(1), "the ASL\\+ backbone's 'r' entry of layer '2' is nan"),
    ("sigma", nan_at(0), "the ASL\\+ backbone's 'sigma' entry of layer '0' is nan"),
    ("target", 7.0, "the ASL\\+ backbone's 'target' must be a number in \\[0, 1\\), got 7.0"),
    ("initialized", "yes", "the ASL\\+ backbone's 'initialized' must be a bool, got 'yes'"),
]


@guard(
    "`Pruner.load_state_dict` of a damaged ASL+ state (a key missing, `sigma` short, NaN)",
    "`ValueError` saying nothing was loaded; the learned thresholds `r_l` untouched",
)
@pytest.mark.parametrize(
    ("key", "value", "message"),
    ASL_DAMAGE,
    ids=[
        "no-r",
        "no-sigma",
        "no-target",
        "no-initialized",
        "r-list",
        "sigma-short",
        "r-nan",
        "sigma-nan",
        "target-7",
        "initialized-str",
    ],
)
def test_a_damaged_asl_state_is_refused_and_the_thresholds_are_kept(
    key: str, value: Any, message: str
) -> None:
    """A missing 'sigma' was a bare KeyError after the state's r had overwritten the
    live, trained r_l; a short 'sigma' was accepted and the next step failed."""
    saved = run("asl+", 2).pruner.state_dict()
    if callable(value):
        value = value(saved["backbone"][key])
    bad = damaged(saved, f"backbone.{key}", value)
    assert_refused_and_goes_on("asl+", 6, bad, f"not a valid Pruner state: {message}.*{NOTHING}")


def test_an_asl_state_of_another_model_says_so() -> None:
    three = fs.Pruner(
        nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)), 0.5, 10, backbone="asl+"
    )
    two = run("asl+", 2)
    r = [p.detach().clone() for p in two.pruner.parameters()]
    with pytest.raises(
        ValueError, match=f"ASL\\+ backbone holds 3 thresholds, this model has 2: {ANOTHER_MODEL}"
    ):
        two.pruner.backbone.load_state_dict(three.backbone.state_dict())
    assert all(torch.equal(a, b.detach()) for a, b in zip(r, two.pruner.parameters()))


# ---------------------------------------------------------------------- Spartan
@pytest.fixture(scope="module")
def frozen_state() -> dict[str, Any]:
    """A Spartan state saved after the freeze (step 9 of 10)."""
    state = run("spartan", 9).pruner.state_dict()
    assert state["backbone"]["frozen"]
    return state


@guard(
    "a Spartan Pruner state saved from a model with other layer shapes",
    "`ValueError` naming the layer (saved from another model); model untouched",
)
def test_a_spartan_state_of_a_model_with_other_shapes_is_refused_naming_the_layer(
    frozen_state: dict[str, Any],
) -> None:
    """The same layer names, wider: accepted before, and the first forward failed
    with a raw shape error."""
    model = mlp(hidden=64)
    with pytest.raises(
        ValueError,
        match=(
            r"the Spartan backbone's 'frozen_masks' entry of layer '0' has shape \(32, 16\), "
            rf"the layer needs \(64, 16\): {ANOTHER_MODEL}"
        ),
    ):
        fs.Pruner.from_state_dict(model, frozen_state)
    assert not any(parametrize.is_parametrized(m) for m in model.modules())


def scaled(factor: float, index: int = 0) -> Callable[[list[Tensor]], list[Tensor]]:
    def change(masks: list[Tensor]) -> list[Tensor]:
        out = [m.clone() for m in masks]
        out[index] = out[index] * factor
        return out

    return change


def masks_as(dtype: torch.dtype) -> Callable[[list[Tensor]], list[Tensor]]:
    return lambda masks: [m.to(dtype) for m in masks]


SPARTAN_DAMAGE: list[tuple[str, Any, str]] = [
    ("frozen_masks", ..., f"the Spartan backbone's state lacks 'frozen_masks'.*{NOTHING}"),
    ("threshold", ..., f"the Spartan backbone's state lacks 'threshold'.*{NOTHING}"),
    (
        "frozen_masks",
        lambda m: m[:1],
        f"'frozen_masks' holds 1 masks for 2 layers: {ANOTHER_MODEL}",
    ),
    (
        "beta",
        math.nan,
        f"the Spartan backbone's 'beta' must be a finite number > 0, got nan.*{NOTHING}",
    ),
    ("beta", -5.0, "the Spartan backbone's 'beta' must be a finite number > 0, got -5.0"),
    ("frozen", "yes", "the Spartan backbone's 'frozen' must be a bool, got 'yes'"),
    ("sparsity", 7.0, "the Spartan backbone's 'sparsity' must be a number in \\[0, 1\\), got 7.0"),
    (
        "threshold",
        torch.tensor(math.nan),
        "the Spartan backbone's 'threshold' must be finite and >= 0",
    ),
    ("threshold", 0.1, "the Spartan backbone's 'threshold' must be a one-element float tensor"),
    (
        "frozen_masks",
        scaled(3.0),
        "'frozen_masks' entry of layer '0' holds values outside \\[0, 1\\]",
    ),
    ("frozen_masks", scaled(math.nan, 1), "'frozen_masks' entry of layer '2' holds values outside"),
    ("frozen_masks", masks_as(torch.bool), "'frozen_masks' entry of layer '0' is torch.bool"),
]


@guard(
    "a damaged Spartan state (masks missing or short, NaN/negative β, NaN threshold)",
    "`ValueError` saying nothing was loaded; the Pruner goes on as it was",
)
@pytest.mark.parametrize(
    ("key", "value", "message"),
    SPARTAN_DAMAGE,
    ids=[
        "no-masks",
        "no-threshold",
        "one-mask-short",
        "beta-nan",
        "beta-negative",
        "frozen-str",
        "sparsity-7",
        "threshold-nan",
        "threshold-float",
        "mask-above-1",
        "mask-nan",
        "mask-bool",
    ],
)
def test_a_damaged_spartan_state_is_refused_before_anything_is_set(
    frozen_state: dict[str, Any], key: str, value: Any, message: str
) -> None:
    """Before, β and the frozen flag were set first (a missing key then left a
    frozen Pruner without masks), and the rest was taken as it came."""
    if callable(value):
        value = value(frozen_state["backbone"][key])
    bad = damaged(frozen_state, f"backbone.{key}", value)
    assert_refused_and_goes_on("spartan", 3, bad, message)


@guard(
    "an S-STE / one-shot N:M state that says its β or masks were taken but lacks them",
    "`ValueError` (damaged state), not a β measured again",
)
# ---------------------------------------------------------------------- S-STE, one-shot
@pytest.mark.parametrize(
    ("method", "key", "value"),
    [("s-ste", "beta", ...), ("s-ste", "beta", None), ("oneshot-nm", "masks", ...)],
    ids=["s-ste-no-beta", "s-ste-beta-none", "oneshot-no-masks"],
)
def test_an_nm_state_taken_without_its_beta_or_masks_is_refused(
    method: str, key: str, value: Any
) -> None:
    """``taken`` says β (S-STE) or the masks (one-shot) were taken: a state without
    them is damaged, not an earlier version's "not taken yet" (β was measured again
    from the current weights, and the resumed forward differed from the saved run's)."""
    saved = run(method, 6).pruner.state_dict()
    assert saved["backbone"]["taken"] is True
    bad = damaged(saved, f"backbone.{key}", value)
    missing = "missing" if value is ... else "None"
    assert_refused_and_goes_on(
        method,
        6,
        bad,
        f"not a valid Pruner state: the N:M backbone's '{key}' is {missing}, where "
        f"state_dict\\(\\) writes one entry per layer.*{NOTHING}",
    )
