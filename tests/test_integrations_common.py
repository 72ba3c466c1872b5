"""The framework-neutral part of the callbacks, on a plain model (no framework needed)."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
from torch import nn

from _guards import guard
from feather_sparse.integrations._common import PrunerDriver, pruner_keyword_arguments


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_accepts_exactly_the_pruners_arguments() -> None:
    names = pruner_keyword_arguments()
    assert "model" not in names and "total_steps" not in names
    assert {"operator", "theta", "backbone", "exclude", "schedule"} <= set(names)
    PrunerDriver("cb", 0.5, {"exclude": ["2"], "theta": 1.0})
    with pytest.raises(ValueError, match="unknown argument 'thetta'"):
        PrunerDriver("cb", 0.5, {"thetta": 1.0})


def test_checkpoint_keys_are_the_dense_models_while_attached() -> None:
    model = mlp()
    driver = PrunerDriver("cb", 0.5, {})
    driver.attach(model, total_steps=4)
    state = model.state_dict()
    assert set(state) == set(mlp().state_dict())  # "0.weight", not "0.parametrizations..."
    assert torch.equal(state["0.weight"], model[0].parametrizations.weight.original)

    dense = mlp()
    dense.load_state_dict(state, strict=True)

    # Plain keys also load back into the attached model, into the dense weights.
    changed = {k: v + 1 for k, v in state.items()}  # new tensors (state aliases the model)
    model.load_state_dict(changed, strict=True)
    assert torch.equal(model[0].parametrizations.weight.original, changed["0.weight"])
    driver.finish()
    assert set(model.state_dict()) == set(dense.state_dict())


def test_steps_and_metrics_follow_the_pruner() -> None:
    model = mlp()
    driver = PrunerDriver("cb", 0.5, {"schedule": "constant"}, log_layers=True)
    assert driver.metrics() == {}
    pruner = driver.attach(model, total_steps=2)
    driver.step()
    metrics = driver.metrics()
    assert metrics["feather/scheduled_sparsity"] == 0.5
    assert metrics["feather/sparsity"] == pytest.approx(pruner.sparsity_achieved())
    assert metrics["feather/threshold"] == pytest.approx(float(pruner.thresholds()[0]))
    assert set(metrics) >= {"feather/sparsity/0", "feather/threshold/2"}


def test_attaching_again_replaces_the_previous_pruner_and_restores_pending_state() -> None:
    model = mlp()
    driver = PrunerDriver("cb", 0.5, {})
    first = driver.attach(model, total_steps=4)
    driver.step()
    driver.step()
    saved = driver.state_dict()
    driver.load_state_dict(saved)
    second = driver.attach(model, total_steps=4)  # e.g. train() again in the same process
    assert second is not first and second.current_step == 2
    assert len(model[0].parametrizations.weight) == 1  # one parametrization, not two
    for a, b in zip(second.thresholds(), saved["thresholds"]):
        assert torch.equal(a, b)


def test_a_state_that_does_not_fit_leaves_the_model_plain() -> None:
    model = mlp()
    driver = PrunerDriver("cb", 0.5, {})
    driver.attach(model, total_steps=4)
    state = driver.state_dict()
    driver.finish()
    other = mlp()
    driver = PrunerDriver("cb", 0.7, {})
    driver.load_state_dict(state)
    with pytest.raises(ValueError, match="sparsity"):
        driver.attach(other, total_steps=4)
    assert driver.pruner is None and not driver.attached
    assert not any(hasattr(m, "parametrizations") for m in other.modules())


def test_finish_bakes_or_detaches() -> None:
    baked, kept = mlp(), mlp()
    dense_weight = kept[0].weight.detach().clone()
    driver = PrunerDriver("cb", 0.5, {"schedule": "constant"})
    driver.attach(baked, total_steps=1)
    assert driver.finish() == pytest.approx(0.5, abs=1e-2)
    assert driver.finish() == driver.final_sparsity  # a second call changes nothing
    n = sum(m.weight.numel() for m in (baked[0], baked[2]))
    assert sum(int((m.weight == 0).sum()) for m in (baked[0], baked[2])) == round(0.5 * n)

    driver = PrunerDriver("cb", 0.5, {"schedule": "constant"}, finalize=False)
    driver.attach(kept, total_steps=1)
    assert driver.finish() is None
    assert torch.equal(kept[0].weight, dense_weight)
    assert not hasattr(kept[0], "parametrizations")


@guard(
    "a callback's Pruner setting out of range or misspelt, or `finalize='no'`",
    "`ValueError` when the callback is made (the Pruner's checks and messages); nothing baked",
)
@pytest.mark.parametrize(
    ("sparsity", "kwargs", "message"),
    [
        (1.5, {}, r"sparsity must be in \[0, 1\)"),
        (0.5, {"theta": 7}, r"theta must be in \[0, 1\]"),
        (0.5, {"backbone": "globl"}, "unknown backbone 'globl'"),
        (0.5, {"schedule": {"name": "cubic", "end": 2.0}}, "CubicSchedule needs"),
        (0.5, {"check_finite": "no"}, "check_finite must be True or False"),
        (0.5, {"finalize": "no"}, "finalize must be True or False"),
        (0.5, {"log_layers": 1}, "log_layers must be True or False"),
    ],
)
def test_settings_are_checked_when_the_driver_is_made(
    sparsity: float, kwargs: dict[str, object], message: str
) -> None:
    flags = {k: v for k, v in kwargs.items() if k in ("finalize", "log_layers")}
    settings = {k: v for k, v in kwargs.items() if k not in flags}
    with pytest.raises(ValueError, match=message):
        PrunerDriver("cb", sparsity, settings, **flags)  # type: ignore[arg-type]


@pytest.mark.parametrize("backbone", ["asl+", {"name": "asl+", "lam": 1.0}])
def test_a_trainable_backbone_is_refused_when_the_driver_is_made(backbone: object) -> None:
    with pytest.raises(ValueError, match=r"backbone 'asl\+' has trainable parameters.*cb cannot"):
        PrunerDriver("cb", 0.5, {"backbone": backbone})


def test_a_backbone_object_is_probed_without_being_touched() -> None:
    from feather_sparse.backbones import ASLPlusBackbone, UniformBackbone

    mine = ASLPlusBackbone()
    with pytest.raises(ValueError, match="trainable parameters"):
        PrunerDriver("cb", 0.5, {"backbone": mine})
    assert mine.r == [] and not hasattr(mine, "targets")  # the probe set up a copy
    uniform = UniformBackbone()
    driver = PrunerDriver("cb", 0.5, {"backbone": uniform})
    assert not hasattr(uniform, "targets")
    assert driver.attach(mlp(), total_steps=2).backbone is uniform


@pytest.mark.parametrize("finalize", [True, False])
def test_the_pruner_answers_after_finish(finalize: bool) -> None:
    model = mlp()
    driver = PrunerDriver("cb", 0.5, {"schedule": "constant"}, finalize=finalize)
    pruner = driver.attach(model, total_steps=2)
    driver.step()
    before = pruner.report()
    driver.finish()
    report = pruner.report()
    assert report.sparsity == pytest.approx(before.sparsity, abs=1 / 64)
    if finalize:
        zeros = sum(int((m.weight == 0).sum()) for m in (model[0], model[2]))
        assert report.sparsity == zeros / pruner.num_params == driver.final_sparsity
    else:
        assert report == before  # the state it detached in; the weights are dense again
    assert driver.metrics() == {}  # nothing attached to log about


@pytest.mark.parametrize("finalize", [True, False])
def test_a_step_after_finish_says_the_pruner_ended(finalize: bool) -> None:
    # It said "training stepped before the Pruner was attached", after training.
    driver = PrunerDriver("cb", 0.5, {"schedule": "constant"}, finalize=finalize)
    with pytest.raises(RuntimeError, match="stepped before the Pruner was attached"):
        driver.step()
    driver.attach(mlp(), total_steps=2)
    driver.finish()
    how = "finalized" if finalize else "detached"
    with pytest.raises(RuntimeError, match=f"cb: training stepped after the Pruner was {how}"):
        driver.step()


@pytest.mark.parametrize("schedule", ["cubic", "callable"])
def test_bake_pending_writes_the_saved_forward_into_a_plain_model(schedule: str) -> None:
    """What ``validate(ckpt_path=...)`` of a checkpoint taken mid-training evaluates."""
    chosen: object = (lambda step: 0.5 * min(step / 4, 1.0)) if schedule == "callable" else "cubic"
    model = mlp()
    driver = PrunerDriver("cb", 0.5, {"schedule": chosen})
    pruner = driver.attach(model, total_steps=8)
    for _ in range(3):
        driver.step()
    x = torch.randn(5, 8)
    expected, pruned = model(x), pruner.dense_state_dict(pruned=True)
    saved, dense = driver.state_dict(), {k: v.clone() for k, v in model.state_dict().items()}

    other = mlp()  # what the framework restores first: the checkpoint's dense weights
    other.load_state_dict(dense)
    evaluator = PrunerDriver("cb", 0.5, {"schedule": chosen})
    assert evaluator.bake_pending(other) is None  # nothing pending: nothing done
    evaluator.load_state_dict(saved)
    assert evaluator.bake_pending(other) == 3
    assert not evaluator.has_pending() and evaluator.pruner is None
    assert not any(hasattr(m, "parametrizations") for m in other.modules())
    for key, value in other.state_dict().items():
        assert torch.equal(value, pruned[key]), key
    assert torch.equal(other(x), expected)


@guard(
    "`feather_sparse.integrations.hf` or `.lightning` imported where its framework is not "
    "installed",
    "`ImportError` naming the framework and `pip install 'feather-sparse[hf]'` (`[lightning]`)",
)
@pytest.mark.parametrize(
    ("module", "framework", "extra"),
    [("hf", "transformers", "hf"), ("lightning", "lightning", "lightning")],
)
def test_a_missing_framework_is_named_with_its_install(
    module: str, framework: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not the framework's bare ModuleNotFoundError: the extra that brings it."""
    monkeypatch.setitem(sys.modules, framework, None)  # import fails as if not installed
    monkeypatch.delitem(sys.modules, f"feather_sparse.integrations.{module}", raising=False)
    with pytest.raises(ImportError) as caught:
        importlib.import_module(f"feather_sparse.integrations.{module}")
    message = str(caught.value)
    assert f"feather_sparse.integrations.{module} needs {framework}" in message
    assert f"install it with: pip install 'feather-sparse[{extra}]'" in message
    # by this name a caller (the API test's import of every module) tells which package is missing
    assert caught.value.name == framework
