"""Tests that close the gaps a mutation audit of the training configuration found.

Each test here fails on one or more hand-made mutants of ``recipes/__init__.py``,
``rules.py``, ``registry.py`` or ``--print-config``'s writer (``cli/train.py``)
that the rest of the suite let through (``docs/mutation-audit.md``, "The
training configuration"; the mutants' ids are in each test's docstring). Each
asserts the documented contract (the docstrings of :mod:`feather_sparse.rules`
and :class:`~feather_sparse.recipes.TrainConfig`, its checks' messages,
``docs/training.md``), worked out here, never the code's current output. None
of them trains.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

from _guards import guard
from feather_sparse import cli
from feather_sparse.recipes import (
    TrainConfig,
    load_config,
    load_recipe,
    parse_override,
    recipe_path,
)
from feather_sparse.rules import check_p, check_sparsity, check_theta, check_threshold

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

NAN, INF = float("nan"), float("inf")


# ------------------------------------------------------------------ rules.py
def _accepts(check: Any, value: Any, **kwargs: Any) -> bool:
    try:
        check(value, **kwargs)
    except ValueError:
        return False
    return True


# (check, value, keyword arguments, accepted?) at each end of each range the
# module docstring of feather_sparse.rules states: S in [0, 1), p in [1, inf],
# theta in [0, 1] ("auto" only where allowed), T in [0, inf); NaN and bools never.
RULE_EDGES = [
    (check_sparsity, 0.0, {}, True),
    (check_sparsity, 0, {}, True),
    (check_sparsity, math.nextafter(1.0, 0.0), {}, True),
    (check_sparsity, 1.0, {}, False),
    (check_sparsity, -1e-12, {}, False),
    (check_sparsity, NAN, {}, False),
    (check_sparsity, False, {}, False),
    (check_p, 1.0, {}, True),
    (check_p, INF, {}, True),
    (check_p, math.nextafter(1.0, 0.0), {}, False),
    (check_p, NAN, {}, False),
    (check_p, True, {}, False),
    (check_theta, 0.0, {}, True),
    (check_theta, 1.0, {}, True),
    (check_theta, 1, {}, True),
    (check_theta, math.nextafter(1.0, 2.0), {}, False),
    (check_theta, -1e-12, {}, False),
    (check_theta, NAN, {}, False),
    (check_theta, True, {}, False),
    (check_theta, "auto", {}, False),
    (check_theta, "auto", {"allow_auto": True}, True),
    (check_theta, " Auto", {"allow_auto": True}, True),  # read as --method and --pattern are
    (check_theta, "automatic", {"allow_auto": True}, False),
    (check_threshold, 0.0, {}, True),
    (check_threshold, 1e300, {}, True),
    (check_threshold, -1e-300, {}, False),
    (check_threshold, INF, {}, False),
    (check_threshold, NAN, {}, False),
]


@guard(
    "a sparsity, p, theta or threshold just outside its range (S = 1, p < 1, theta > 1, "
    "T = inf), NaN, or a bool",
    "`ValueError` naming the parameter and its range; each end inside the range accepted",
)
@pytest.mark.parametrize(
    ("check", "value", "kwargs", "accepted"),
    RULE_EDGES,
    ids=[f"{c.__name__}-{v!r}-{k}" for c, v, k, _ in RULE_EDGES],
)
def test_each_rule_holds_at_the_exact_ends_of_its_range(
    check: Any, value: Any, kwargs: dict[str, Any], accepted: bool
) -> None:
    """cf09 (a bool), cf12 (p = NaN), cf15 ("auto" not allowed), cf17 (T = inf)."""
    assert _accepts(check, value, **kwargs) is accepted


def test_a_sparsity_checked_under_another_name_is_named_so() -> None:
    """cf10: ``check_sparsity(value, name)`` names ``name`` in its message."""
    with pytest.raises(ValueError, match=r"^max_layer_sparsity must be in \[0, 1\)"):
        check_sparsity(1.0, "max_layer_sparsity")


# ------------------------------------------------------- TrainConfig's checks
# Values at the ends of the ranges TrainConfig's messages state: "min_lr must not
# exceed lr", "warmup_epochs must not exceed epochs", "0 <= schedule_start <=
# schedule_end <= 1" are inclusive; "momentum in [0, 1)" and "grad_clip > 0" are not.
ACCEPTED_EDGES = [
    {"lr": 0.05, "min_lr": 0.05},
    {"epochs": 4, "warmup_epochs": 4},
    {"schedule_start": 0.3, "schedule_end": 0.3},
    {"schedule_start": 1.0, "schedule_end": 1.0},
    {"momentum": 0.0},
    {"max_layer_sparsity": 0.0},
]


@pytest.mark.parametrize("values", ACCEPTED_EDGES, ids=[str(v) for v in ACCEPTED_EDGES])
def test_the_inclusive_ends_of_the_configs_ranges_are_accepted(values: dict[str, Any]) -> None:
    """cf31 (min_lr = lr), cf33 (warm-up over every epoch), cf35 (start = end)."""
    cfg = TrainConfig(**values)
    assert {k: getattr(cfg, k) for k in values} == values


REFUSED_EDGES = [
    ({"momentum": 1.0}, "momentum"),
    ({"grad_clip": 0.0}, "grad_clip"),
    ({"max_layer_sparsity": 1.0}, "max_layer_sparsity"),
    ({"max_layer_sparsity": -0.1}, "max_layer_sparsity"),
    ({"min_lr": NAN}, "min_lr"),
    ({"min_lr": "nan"}, "min_lr"),
    ({"weight_decay": NAN}, "weight_decay"),
    ({"warmup_epochs": "nan"}, "warmup_epochs"),
]


@guard(
    "a config value at the open end of its range (`momentum = 1`, `grad_clip = 0`, "
    "`max_layer_sparsity = 1`) or NaN (`--min-lr nan`)",
    "`ValueError` naming the field, before anything runs",
)
@pytest.mark.parametrize(("values", "field"), REFUSED_EDGES, ids=[str(v) for v, _ in REFUSED_EDGES])
def test_the_open_ends_of_the_configs_ranges_and_nan_are_refused(
    values: dict[str, Any], field: str
) -> None:
    """cf27 (NaN), cf32 (momentum = 1), cf34 (grad_clip = 0), cf36 (max_layer_sparsity)."""
    with pytest.raises(ValueError, match=f"^{field} "):
        TrainConfig(**values)


# ------------------------------------------------------------- conversions
@pytest.mark.parametrize(
    ("text", "value"),
    [
        *[("true", True), ("Yes", True), ("on", True), ("1", True)],
        *[("false", False), ("FALSE", False), ("no", False), ("off", False), ("0", False)],
    ],
)
def test_a_bool_field_reads_the_words_for_false_as_false(text: str, value: bool) -> None:
    """cf25: ``--set nesterov=false`` (or ``--amp off``) is false, not true."""
    assert TrainConfig(nesterov=text).nesterov is value
    assert load_config("mnist1d", {"amp": text}).amp is value


def test_a_list_field_given_as_a_toml_array_string_is_that_array() -> None:
    """cf28: ``--set 'exclude=["re:.*shortcut.*"]'`` (docs/training.md) is read as TOML,
    not split at its commas."""
    array = '["re:.*shortcut.*", "fc", "re:a,b"]'
    assert TrainConfig(exclude=array).exclude == ("re:.*shortcut.*", "fc", "re:a,b")
    assert TrainConfig(exclude="fc, conv1").exclude == ("fc", "conv1")


def test_set_reads_dashes_as_underscores_and_splits_at_the_first_equals_sign() -> None:
    """cf29, cf30: ``parse_override``'s docstring: dashes in the key are underscores; the
    value is what follows the first ``=`` (a table or a regex may hold more)."""
    assert parse_override("batch-size=64") == ("batch_size", "64")
    assert parse_override("model_kwargs={width = 2}") == ("model_kwargs", "{width = 2}")
    assert parse_override("exclude = re:a=b ") == ("exclude", "re:a=b")
    cfg = load_config("mnist1d", dict([parse_override("model-kwargs={width = 2}")]))
    assert cfg.model_kwargs == {"width": 2}


# ------------------------------------------------------------- recipes
def test_a_recipe_path_with_a_folder_and_no_suffix_is_read_as_a_file(tmp_path: Path) -> None:
    """cf21 (``recipe_path``'s docstring: "a name with a .toml suffix or a folder part is
    read as a path")."""
    path = tmp_path / "recipes" / "short-run"
    path.parent.mkdir()
    path.write_text("epochs = 3\nsparsity = 0.8\n")
    assert recipe_path(str(path)) == path
    cfg = load_config(str(path))
    assert (cfg.epochs, cfg.sparsity, cfg.recipe) == (3, 0.8, "short-run")
    assert load_recipe(path)["epochs"] == 3


def test_replace_refuses_an_unknown_field_by_name() -> None:
    """cf22: ``TrainConfig.replace`` raises ``ValueError`` naming an unknown field, with
    the suggestion, as its docstring says (not dataclasses' ``TypeError``)."""
    with pytest.raises(ValueError, match=r"unknown config field 'sparsty' \(did you mean sparsity"):
        TrainConfig().replace(sparsty=0.5)
    assert TrainConfig().replace(sparsity="0.5").sparsity == 0.5


def test_a_record_with_only_some_of_the_legacy_defaults_keeps_its_values() -> None:
    """cf23: ``from_record`` reads operator, theta and backbone as unset only when all
    three hold their old defaults together."""
    for values in (
        {"operator": "feather", "theta": 0.3, "backbone": "uniform"},
        {"operator": "soft", "theta": "auto", "backbone": "global"},
        {"operator": "feather", "theta": "auto", "backbone": "global-flops"},
    ):
        cfg = TrainConfig(**values)
        assert TrainConfig.from_record(cfg.to_dict()) == cfg
    legacy = TrainConfig.from_record({"operator": "feather", "theta": "auto", "backbone": "global"})
    assert (legacy.operator, legacy.theta, legacy.backbone) == (None, None, None)


def test_given_model_kwargs_win_over_a_model_tables_kwargs() -> None:
    """cf24: ``from_dict`` takes a model table's kwargs only "when model_kwargs is not
    given"."""
    spec = {"name": "mnist1d_cnn", "kwargs": {"width": 2, "num_classes": 10}}
    assert TrainConfig.from_dict({"model": spec, "model_kwargs": {"width": 3}}).model_kwargs == {
        "width": 3
    }
    assert TrainConfig.from_dict({"model": spec}).model_kwargs == {"width": 2}


# ------------------------------------------------------------- --print-config
def test_print_config_writes_every_float_so_it_reads_back_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """cf37: floats that need all 17 digits (1/3, 1.2345678e-05) read back unchanged."""
    lr, decay = 1 / 3, 1.2345678e-05
    argv = ["train", "--lr", repr(lr), "--weight-decay", repr(decay), "--print-config"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    values = tomllib.loads(printed)
    assert (values["lr"], values["weight_decay"]) == (lr, decay)
    path = tmp_path / "my.toml"
    path.write_text(printed)
    assert load_config(path) == load_config("mnist1d", lr=lr, weight_decay=decay)


def test_a_sparsity_given_with_a_pattern_must_be_the_patterns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """cf19: "``pattern`` replaces the recipe's unstructured ``sparsity`` (a different
    ``--sparsity`` given with it is refused)" (docs/guide/nm.md): 2:4 prunes 1/2."""
    assert load_config("mnist1d", pattern="2:4").sparsity == 0.5  # the recipe's 0.9 gives way
    assert load_config("mnist1d", {"pattern": "2:4", "sparsity": "0.5"}).sparsity == 0.5
    with pytest.raises(ValueError, match=r"sparsity 0\.9 was given with it: leave sparsity out"):
        load_config("mnist1d", pattern="2:4", sparsity=0.9)
    argv = ["train", "--pattern", "1:4", "--set", "sparsity=0.5", "--print-config"]
    assert cli.main(argv) == 1
    assert "pattern 1:4 prunes 0.75 of the weights" in capsys.readouterr().err


# ------------------------------------------------- found on the way (real bugs)
@guard(
    "`threshold(w, t, theta='auto')` (the automatic rule is the Pruner's, not the operator's)",
    "`ValueError` giving theta's range, without offering 'auto' where it is refused",
)
@pytest.mark.parametrize("theta", ["auto", "sometimes", 1.5])
def test_the_operators_theta_error_does_not_offer_auto(theta: Any) -> None:
    """``check_theta`` without ``allow_auto`` refused ``'auto'`` with "theta must be a
    number in [0, 1] or 'auto', got 'auto'": a message that offers what it refuses."""
    torch = pytest.importorskip("torch")
    import feather_sparse as fs

    with pytest.raises(ValueError, match=r"theta must be") as info:
        fs.threshold(torch.ones(3), 0.5, theta=theta)
    assert "or 'auto'" not in str(info.value)
    with pytest.raises(ValueError, match=r"\(1 = plain STE, 0 = non-STE\) or 'auto', got 2\.0"):
        check_theta(2.0, allow_auto=True)  # where 'auto' is accepted, the message offers it


@guard(
    "a recipe whose `model` table has kwargs that are not a table "
    '(`model = {name = "mnist1d_cnn", kwargs = [1, 2]}`)',
    "`ValueError` naming model's kwargs and the table it needs (CLI exit 1, no traceback)",
)
@pytest.mark.parametrize("kwargs", ["[1, 2]", '"wide"'])
def test_a_model_tables_kwargs_that_are_not_a_table_are_named(
    kwargs: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``from_dict`` turned a list into a ``TypeError`` traceback (and a string into a
    ``ValueError`` that named no field) instead of saying what ``kwargs`` must be."""
    path = tmp_path / "mine.toml"
    path.write_text(f'model = {{name = "mnist1d_cnn", kwargs = {kwargs}}}\n')
    with pytest.raises(
        ValueError, match=r"model's kwargs must be a table \(e\.g\. \{width = 2\}\)"
    ):
        load_config(path)
    assert cli.main(["train", "--recipe", str(path), "--print-config"]) == 1
    assert "model's kwargs must be a table" in capsys.readouterr().err
