"""One path from a config to a Pruner: methods, PrunerConfig, and one rule per parameter."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import feather_sparse as fs
from _guards import guard
from feather_sparse.methods import METHODS, build_pruner, check_method, pruner_config
from feather_sparse.pruner_config import FORMAT_VERSION, PrunerConfig
from feather_sparse.recipes import TrainConfig, load_config

pytestmark = pytest.mark.usefixtures("one_thread")

SRC = Path(fs.__file__).parent


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv2(torch.relu(self.conv1(x)))
        return self.fc(x.mean((2, 3)))


def build(**overrides: Any) -> fs.Pruner:
    pruner = build_pruner(load_config("mnist1d", overrides), SmallCNN(), 100)
    assert isinstance(pruner, fs.Pruner)
    return pruner


# ------------------------------------------------------------------ the two bugs
def test_a_method_refuses_an_explicit_value_it_fixes_otherwise() -> None:
    # Once silently ignored: "feather" equalled the config's old default.
    with pytest.raises(ValueError, match=r"method 'hard' fixes operator='hard' \(got 'feather'\)"):
        build(method="hard", operator="feather")
    with pytest.raises(ValueError, match=r"method 'hard' fixes operator='hard' \(got 'soft'\)"):
        build(method="hard", operator="soft")
    with pytest.raises(ValueError, match=r"method 'hard' fixes theta=1\.0 \(got 'auto'\)"):
        build(method="hard", theta="auto")
    with pytest.raises(ValueError, match=r"method 'gmp' fixes backbone='uniform'"):
        build(method="gmp", backbone="global")


def test_an_explicit_value_equal_to_the_methods_is_fine() -> None:
    hard = build(method="hard", operator="hard", theta=1.0, p=math.inf)
    assert (hard.operator.config(), hard.theta) == ({"name": "hard", "p": math.inf}, 1.0)
    gmp = build(method="gmp", backbone="uniform")  # by name: the method's options kept
    assert gmp.backbone.config() == {"name": "uniform", "keep_first_dense": True}


def test_unset_settings_are_the_methods() -> None:
    feather = build()
    assert feather.config()["operator"] == {"name": "feather", "p": 3.0}
    assert (feather.pruner_config.theta, feather.theta, feather.backbone.name) == (
        "auto",
        1.0,
        "global",
    )
    assert build(sparsity=0.95).theta == 0.5  # the automatic rule at S >= 0.95
    soft = build(method="soft")
    assert (soft.operator.config(), soft.theta) == ({"name": "soft", "p": 1.0}, 1.0)
    spartan = build(method="spartan")
    assert spartan.schedule == fs.LinearSchedule(0.0, 0.2)  # its own schedule
    assert build(method="spartan", schedule_end=0.4).schedule == fs.CubicSchedule(0.0, 0.4)


def test_feather_gmp_is_an_ordinary_method() -> None:
    assert "feather-gmp" in METHODS
    pruner = build(method="feather-gmp", theta=0.5, p=2.0)
    expected = fs.make_pruner(
        SmallCNN(),
        "feather",
        sparsity=0.9,
        total_steps=100,
        p=2.0,
        theta=0.5,
        backbone={"name": "uniform", "keep_first_dense": True},
    )
    assert pruner.config() == expected.config()
    assert pruner.backbone.config() == {"name": "uniform", "keep_first_dense": True}
    with pytest.raises(ValueError, match="method 'feather-gmp' fixes backbone='uniform'"):
        build(method="feather-gmp", backbone="asl+")


def test_unknown_methods_name_the_field_and_the_choices() -> None:
    cfg = load_config("mnist1d", method="rigl")
    with pytest.raises(ValueError, match=r"method: unknown method 'rigl'; choose one of: .*gmp"):
        check_method(cfg)
    with pytest.raises(ValueError, match="method: unknown method 'rigl'"):
        build_pruner(cfg, SmallCNN(), 100)
    check_method(cfg.replace(dense=True))  # dense runs have no method to check
    assert build_pruner(cfg.replace(dense=True), SmallCNN(), 100) is None


# ------------------------------------------------------------------ PrunerConfig
def test_pruner_config_is_frozen_checked_and_builds_the_pruner() -> None:
    cfg = PrunerConfig(0.8, operator="soft", theta=0.25, exclude="fc")
    assert cfg.exclude == ("fc",) and cfg.theta_value == 0.25
    with pytest.raises(AttributeError):
        cfg.sparsity = 0.5  # type: ignore[misc]
    model = SmallCNN()
    pruner = fs.Pruner.from_config(model, cfg, total_steps=10)
    assert pruner.pruner_config is cfg
    assert [t.name for t in pruner.targets] == ["conv1", "conv2"]
    same = fs.Pruner(SmallCNN(), 0.8, 10, operator="soft", theta=0.25, exclude="fc")
    assert same.pruner_config == cfg and same.config() == pruner.config()
    record = cfg.to_dict()
    assert record["version"] == FORMAT_VERSION
    assert record["operator"] == {"name": "soft", "p": 1.0}
    assert record["schedule"] == {"name": "cubic", "start": 0.0, "end": 0.5}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sparsity": 1.0}, r"sparsity must be in \[0, 1\)"),
        ({"sparsity": True}, "sparsity must be a number"),
        ({"sparsity": 0.5, "p": 0.5}, "p must be >= 1"),
        ({"sparsity": 0.5, "theta": -0.1}, r"theta must be in \[0, 1\]"),
        ({"sparsity": 0.5, "theta": math.nan}, r"theta must be in \[0, 1\]"),
        ({"sparsity": 0.5, "backbone": {"name": "asl+", "lam": -1.0}}, "lam must be"),
        ({"sparsity": 0.5, "schedule": {"name": "cubic", "end": 2.0}}, "end"),
        ({"sparsity": 0.5, "min_params": -1}, "min_params must be an int >= 0"),
    ],
)
def test_pruner_config_refuses_bad_values(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PrunerConfig(**kwargs)


@guard(
    "`p < 1` in `fs.threshold`, `Pruner` or `TrainConfig`",
    "the same `ValueError` everywhere: p must be >= 1",
)
@pytest.mark.parametrize("p", [0.5, 0.0, -1.0])
def test_one_rule_for_p_everywhere(p: float) -> None:
    message = "p must be >= 1"
    with pytest.raises(ValueError, match=message):
        fs.threshold(torch.ones(2), 0.5, p=p)
    with pytest.raises(ValueError, match=message):
        fs.ThresholdOperator(p=p)
    with pytest.raises(ValueError, match=message):
        fs.Pruner(SmallCNN(), 0.5, 10, p=p)
    with pytest.raises(ValueError, match=message):
        TrainConfig(p=p)
    assert fs.Pruner(SmallCNN(), 0.5, 10, p=1.0).operator.config()["p"] == 1.0


def test_one_rule_for_theta_and_sparsity_everywhere() -> None:
    for make in (
        lambda: fs.threshold(torch.ones(2), 0.5, theta=1.5),
        lambda: fs.Pruner(SmallCNN(), 0.5, 10, theta=1.5),
        lambda: TrainConfig(theta=1.5),
    ):
        with pytest.raises(ValueError, match=r"theta must be in \[0, 1\] \(1 = plain STE"):
            make()
    for make in (
        lambda: fs.Pruner(SmallCNN(), 1.0, 10),
        lambda: TrainConfig(sparsity=1.0),
    ):
        with pytest.raises(ValueError, match=r"sparsity must be in \[0, 1\) \(e\.g\. 0\.9 keeps"):
            make()


# ------------------------------------------------------------------ saved state
def test_state_dict_has_a_format_version_and_old_states_still_load() -> None:
    model = SmallCNN()
    pruner = fs.Pruner(model, 0.5, 10)
    pruner.step()
    state = pruner.state_dict()
    assert state["format_version"] == FORMAT_VERSION
    old = {k: v for k, v in state.items() if k != "format_version"}  # saved before versions
    again = fs.Pruner.from_state_dict(SmallCNN(), old)
    assert again.current_step == 1
    newer = {**state, "format_version": FORMAT_VERSION + 1}
    with pytest.raises(ValueError, match="newer than the 1 this feather-sparse"):
        fs.Pruner.from_state_dict(SmallCNN(), newer)


# ------------------------------------------------------------------ registration
def test_baseline_names_resolve_without_the_package_init() -> None:
    # The package's __init__ imports everything; here it never runs, and only
    # the config path's own imports decide whether "st3" and "spartan" exist.
    code = textwrap.dedent(
        f"""
        import sys, types
        package = types.ModuleType("feather_sparse")
        package.__path__ = [{str(SRC)!r}]
        sys.modules["feather_sparse"] = package
        from torch import nn
        from feather_sparse.pruner import Pruner
        pruner = Pruner(nn.Linear(4, 4), 0.5, 10, operator="st3")
        print(type(pruner.operator).__name__)
        from feather_sparse.recipes import TrainConfig
        print(TrainConfig(operator="st3", backbone="spartan").operator)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["ST3Operator", "st3"]


def test_methods_stay_importable_from_baselines() -> None:
    from feather_sparse import baselines

    assert baselines.METHODS is METHODS and baselines.make_pruner is fs.make_pruner
    assert baselines.Method is fs.Method
    with pytest.raises(AttributeError):
        _ = baselines.no_such_name


# ------------------------------------------------------------------ old run records
@pytest.mark.parametrize("method", ["feather", "hard", "gmp", "spartan"])
def test_records_written_before_unset_settings_still_build(method: str) -> None:
    # A run folder's config.json from before: the three settings at their old defaults.
    record = {
        **load_config("mnist1d", method=method).to_dict(),
        "operator": "feather",
        "theta": "auto",
        "backbone": "global",
    }
    cfg = TrainConfig.from_record(record)
    assert (cfg.operator, cfg.theta, cfg.backbone) == (None, None, None)
    assert cfg == load_config("mnist1d", method=method)  # resuming compares these
    assert pruner_config(cfg) == pruner_config(load_config("mnist1d", method=method))
    if method != "feather":  # typed by a person, the same values contradict the method
        with pytest.raises(ValueError, match=f"method '{method}' fixes"):
            pruner_config(TrainConfig.from_dict(record))
    # A newer record keeps what it says.
    newer = load_config("mnist1d", method=method, theta=1.0 if method != "gmp" else 0.0)
    assert TrainConfig.from_record(newer.to_dict()) == newer
