"""Tests that close the gaps a mutation audit of the Pruner found.

Each test here fails on one hand-made mutant of ``pruner.py`` or
``pruner_config.py`` that the rest of the suite let through
(``docs/mutation-audit.md``, "The Pruner"; the mutant's id is in each test's
docstring) and checks the code against the specification — the paper's θ
rule (§2.2.2), ``ALGORITHMS.md``'s cubic schedule and the docstrings — not
against the code's current output.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import torch
from torch import nn

import feather_sparse as fs
from feather_sparse.pruner_config import PrunerConfig
from test_pruner import SmallCNN

pytestmark = pytest.mark.usefixtures("one_thread")


def cubic(step: int, total: int, final: float) -> float:
    """The default schedule (ALGORITHMS.md): cubic from 0 at step 0 to ``S`` at
    ``t2 = floor(0.5·total)``, then ``S``."""
    t2 = math.floor(0.5 * total)
    if step >= t2:
        return final
    return final - final * (1.0 - step / t2) ** 3


# ------------------------------------------------------------------ step / update
def test_the_report_and_the_state_give_the_sparsity_the_thresholds_were_computed_at() -> None:
    """pr04, pr25: ``scheduled_sparsity`` is "the sparsity the thresholds in force
    were computed at (the last update's ...)" (``PrunerReport``), and the state
    saves it.

    With ``update_every=3`` the thresholds in force at step 4 are step 3's.
    """
    pruner = fs.Pruner(SmallCNN(), 0.8, total_steps=20, update_every=3)
    for _ in range(4):
        pruner.step()
    expected = cubic(3, 20, 0.8)
    assert expected != pytest.approx(cubic(4, 20, 0.8))
    assert pruner.report().scheduled_sparsity == pytest.approx(expected)
    assert pruner.state_dict()["current_sparsity"] == pytest.approx(expected)
    pruner.update(0.3)  # an explicit sparsity is the one in force
    assert pruner.report().scheduled_sparsity == 0.3
    assert pruner.state_dict()["current_sparsity"] == 0.3


# ------------------------------------------------------------------ check_finite
def two_linears() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))


def write_weight(pruner: fs.Pruner, index: int, value: float) -> None:
    with torch.no_grad():
        pruner.weights()[index].view(-1)[0] = value


@pytest.mark.parametrize("backbone", ["global", "uniform"])
def test_check_finite_false_lets_a_step_through_an_inf_weight(backbone: str) -> None:
    """pr08 (global), pr09 (the backbones checked before the search):
    ``check_finite=False`` turns the check off, so a step with an inf weight
    is not refused; the thresholds stay finite (inf is the largest magnitude:
    it is kept)."""
    pruner = fs.Pruner(two_linears(), 0.5, 10, backbone=backbone, check_finite=False)
    write_weight(pruner, 0, float("inf"))
    pruner.step()
    assert all(math.isfinite(float(t)) for t in pruner.thresholds())


def test_a_layer_whose_threshold_equals_its_largest_magnitude_is_warned_as_collapsed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """pr11: ``|w| <= T`` is pruned, so a layer with ``T_l = max |w_l|`` is fully
    pruned: the Pruner warns of the collapse when it computes the thresholds
    (here at attach), not only when a report is asked for.

    Layer 0 holds the 16 smallest of 32 magnitudes; at S = 0.5 the global
    threshold is the 16th smallest, layer 0's largest.
    """
    small, large = nn.Linear(4, 4), nn.Linear(4, 4)
    with torch.no_grad():
        small.weight.copy_(torch.arange(1, 17, dtype=torch.float32).view(4, 4) * 1e-3)
        large.weight.copy_(torch.arange(1, 17, dtype=torch.float32).view(4, 4))
    model = nn.Sequential(small, large)
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        pruner = fs.Pruner(model, 0.5, 10, schedule="constant")
    assert float(pruner.thresholds()[0]) == pytest.approx(16e-3)
    assert "layer collapse: '0'" in caplog.text


# ------------------------------------------------------------------ finalize
def test_finalize_counts_round_s_n_weights_as_requested(caplog: pytest.LogCaptureFixture) -> None:
    """pr15: a Pruner prunes ``k = round(S·N)`` weights (docs/distributed.md);
    ties at the threshold magnitude prune more, and finalize says how many
    more than the ``round(S·N)`` requested.

    10 magnitudes 1..10 with 6 three times, S = 0.56: ``k = round(5.6) = 6``,
    the threshold is the 6th smallest (6) and the three 6s make 8 zeros, +2.
    """
    layer = nn.Linear(5, 2, bias=False)
    values = torch.tensor([1.0, -2.0, 3.0, -4.0, 5.0, 6.0, -6.0, 6.0, 9.0, -10.0])
    with torch.no_grad():
        layer.weight.copy_(values.view(2, 5))
    model = nn.Sequential(layer)
    pruner = fs.Pruner(model, 0.56, 10, schedule="constant")
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        achieved = pruner.finalize()
    assert achieved == pytest.approx(0.8)
    assert "finalize: 8 zeros where 6 were requested (+2)" in caplog.text


# ------------------------------------------------------------------ state
def test_a_state_saved_with_another_update_every_is_refused() -> None:
    """pr21: the next step continues identically only with the same
    ``update_every`` (it decides which steps recompute the thresholds): a state
    saved with another is refused, naming the field."""
    state = fs.Pruner(two_linears(), 0.8, 10, update_every=3).state_dict()
    other = fs.Pruner(two_linears(), 0.8, 10)
    with pytest.raises(ValueError, match=r"update_every=3.*update_every=1"):
        other.load_state_dict(state)


# ------------------------------------------------------------------ pruner_config.py
@pytest.mark.parametrize("sparsity", [0.9, 0.92, 0.94, 0.949])
def test_auto_theta_is_one_below_95_percent(sparsity: float) -> None:
    """prcfg04: the paper's θ = g(S) is "a simple step function, where θ = 1 if
    the final target sparsity S is under 95 % and θ = 0.5 when S ≥ 95 %"
    (§2.2.2): no interpolation below the boundary."""
    assert fs.auto_theta(sparsity) == 1.0
    assert fs.auto_theta(sparsity, rule="released") == 1.0
    assert fs.Pruner(two_linears(), sparsity, 10).theta == 1.0


@pytest.mark.parametrize("field", ["update_every", "min_params"])
def test_a_bool_is_not_a_count(field: str) -> None:
    """prcfg10: ``update_every`` and ``min_params`` are ints; ``True`` (a typo for
    a number, or a flag in the wrong place) is refused, naming the field."""
    with pytest.raises(ValueError, match=f"{field} must be an int"):
        kwargs: dict[str, Any] = {field: True}
        PrunerConfig(sparsity=0.5, **kwargs)


def test_a_layer_cap_equal_to_the_target_is_accepted() -> None:
    """prcfg11: only "a cap below ``sparsity``, which no model could reach, is
    refused"; a cap equal to it can be reached (every layer at the cap)."""
    config = PrunerConfig(sparsity=0.5, max_layer_sparsity=0.5)
    assert config.max_layer_sparsity == 0.5
    with pytest.raises(ValueError, match=r"max_layer_sparsity=0\.4 caps every layer below"):
        PrunerConfig(sparsity=0.5, max_layer_sparsity=0.4)


def test_soft_and_hard_refuse_another_p() -> None:
    """prcfg13: ``"soft"`` fixes p = 1 and ``"hard"`` p = inf; another ``p`` with
    them is refused, with the fix (operator='feather')."""
    for name in ("soft", "hard"):
        with pytest.raises(ValueError, match=f"operator '{name}' fixes p.*operator='feather'"):
            PrunerConfig(sparsity=0.5, operator=name, p=3.0)


def test_from_state_dict_keeps_check_finite_off() -> None:
    """A run made with ``check_finite=False`` resumes with it off (the state records it;
    states saved before it did resume with the default, on)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
    pruner = fs.Pruner(model, 0.5, total_steps=4, check_finite=False)
    pruner.step()
    state = pruner.state_dict()
    assert state["config"]["check_finite"] is False
    pruner.remove()
    resumed = fs.Pruner.from_state_dict(model, state)
    assert resumed.check_finite is False
    resumed.remove()
    del state["config"]["check_finite"]  # a state from before the field
    assert fs.Pruner.from_state_dict(model, state).check_finite is True
