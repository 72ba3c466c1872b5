"""Tests that close the gaps a mutation audit of the method registry found.

Each test here fails on one or more hand-made mutants of ``methods.py`` that
the rest of the suite let through (``docs/mutation-audit.md``, "The method
registry and the config-to-Pruner mapping"; the mutants' ids are in each
test's docstring) and checks the code against what the documentation says —
the methods' tables (``methods.py``, ``nm/methods.py``, ``docs/guide/nm.md``),
``docs/guide/settings.md`` and the docstrings — written out here, not against
the code's current output. Nothing trains: the tests compare Pruner configs
and a Pruner's attributes.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

import feather_sparse as fs
from _guards import guard
from feather_sparse.methods import METHODS, build_pruner, pruner_config
from feather_sparse.ops import OPERATORS
from feather_sparse.recipes import TrainConfig, load_config
from test_methods import SmallCNN  # conv1's reduction dimension 3·3·3 = 27: no multiple of 4

pytestmark = pytest.mark.usefixtures("one_thread")

INF = math.inf


def config(**overrides: Any) -> TrainConfig:
    return load_config("mnist1d", overrides)


NM = {"name": "nm", "pattern": "2:4"}
UNIFORM_FIRST_DENSE = {"name": "uniform", "keep_first_dense": True}


# ------------------------------------------------------------------ a real bug
@guard(
    '`make_pruner(model, "sr-ste", backbone={"name": "nm", "conv_order": ...})` '
    "(the N:M backbone as a mapping with options, as docs/guide/nm.md shows)",
    "the method's own options are kept (SR-STE's decay, S-STE's β, one-shot's frozen mask, "
    "GMP's first conv dense); the mapping's options are added to them",
)
@pytest.mark.parametrize(
    ("name", "own"),
    [
        ("sr-ste", {"decay": 2e-4}),
        ("s-ste", {"rescale": True}),
        ("oneshot-nm", {"freeze": True}),
    ],
)
def test_a_backbone_mapping_naming_the_methods_own_keeps_its_options(
    name: str, own: dict[str, Any]
) -> None:
    """Found by the audit (not a mutant): given as a mapping, the method's own
    backbone lost the options that define the method, so SR-STE trained without
    its decay (hard-STE), S-STE without β and one-shot without its frozen mask,
    under their names; by name as a string they were kept. ``backbone`` "is
    compared by name, so its options may still be given" (``Method``), and
    docs/guide/nm.md gives ``conv_order`` as ``backbone={"name": "nm",
    "conv_order": ...}``."""
    pruner = fs.make_pruner(
        SmallCNN(),
        name,
        pattern="2:4",
        total_steps=100,
        exclude=["conv1"],  # 3 input channels: no 2:4 by channels
        backbone={"name": "nm", "conv_order": "channels"},
    )
    assert pruner.backbone.config() == {
        "name": "nm",
        "pattern": "2:4",
        "conv_order": "channels",
        **own,
    }
    assert (
        pruner.backbone.config()
        == fs.make_pruner(
            SmallCNN(),
            name,
            pattern="2:4",
            total_steps=100,
            exclude=["conv1"],
            conv_order="channels",
        ).backbone.config()
    )  # the same as the option given alone
    gmp = fs.make_pruner(
        SmallCNN(), "gmp", sparsity=0.9, total_steps=100, backbone={"name": "uniform"}
    )
    assert gmp.backbone.config() == UNIFORM_FIRST_DENSE
    if name == "sr-ste":  # an option the mapping names replaces the method's
        other = fs.make_pruner(
            SmallCNN(),
            name,
            pattern="2:4",
            total_steps=100,
            exclude=["conv1"],
            backbone={"name": "nm", "decay": 1e-3},
        )
        assert other.backbone.config()["decay"] == 1e-3


# ------------------------------------------------------------------ what each method is
#: The methods' tables (methods.py, nm/methods.py, docs/guide/nm.md, ALGORITHMS.md):
#: operator and its p, θ, backbone (name and the options the method sets), schedule.
PUBLISHED: dict[str, tuple[dict[str, Any], Any, dict[str, Any], dict[str, Any]]] = {
    # P_T, p = 3, θ automatic; the paper's schedule, cubic from 0 to half-way
    "feather": ({"name": "feather", "p": 3.0}, "auto", {"name": "global"}, {"name": "cubic"}),
    "feather-gmp": ({"name": "feather", "p": 3.0}, "auto", UNIFORM_FIRST_DENSE, {"name": "cubic"}),
    "hard": ({"name": "hard", "p": INF}, 1.0, {"name": "global"}, {"name": "cubic"}),  # plain STE
    "soft": ({"name": "soft", "p": 1.0}, 1.0, {"name": "global"}, {"name": "cubic"}),  # plain STE
    "nonste": ({"name": "feather", "p": 3.0}, 0.0, {"name": "global"}, {"name": "cubic"}),
    "gmp": ({"name": "hard", "p": INF}, 0.0, UNIFORM_FIRST_DENSE, {"name": "cubic"}),
    # ST-3: soft threshold with a rescale, identity backward (θ = 1)
    "st3": ({"name": "st3"}, 1.0, {"name": "global"}, {"name": "cubic"}),
    # Spartan: its soft top-k backbone, the hard part straight-through (θ = 1),
    # density from 1 to the target over the first 20 %
    "spartan": (
        {"name": "hard", "p": INF},
        1.0,
        {"name": "spartan"},
        {"name": "linear", "start": 0.0, "end": 0.2},
    ),
    # N:M, 2:4 unless given, the full pattern from the first step
    "feather-nm": ({"name": "feather", "p": 3.0}, "auto", NM, {"name": "constant", "start": 0.0}),
    "hard-nm": ({"name": "hard", "p": INF}, 1.0, NM, {"name": "constant", "start": 0.0}),
    "sr-ste": (
        {"name": "hard", "p": INF},
        1.0,
        {**NM, "decay": 2e-4},  # λ_W = 2e-4 (Zhou et al. 2021)
        {"name": "constant", "start": 0.0},
    ),
    "s-ste": (
        {"name": "soft", "p": 1.0},
        1.0,
        {**NM, "rescale": True},  # the fixed per-tensor β
        {"name": "constant", "start": 0.0},
    ),
    # dense to half-way, one-shot magnitude mask kept fixed, gradient g·mask (θ = 0)
    "oneshot-nm": (
        {"name": "hard", "p": INF},
        0.0,
        {**NM, "freeze": True},
        {"name": "constant", "start": 0.5},
    ),
}


def test_every_registered_method_is_in_the_table() -> None:
    assert set(METHODS.names()) == set(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_method_builds_the_pruner_its_documentation_describes(name: str) -> None:
    """meth15–meth27: every method's operator, p, θ, backbone options and schedule.

    Checked twice: the library's ``make_pruner`` (N:M methods without a
    pattern: 2:4) and a training config (``--pattern 2:4`` for the N:M
    methods), whose unset fields are the method's.
    """
    operator, theta, backbone, schedule = PUBLISHED[name]
    nm = backbone["name"] == "nm"
    pruner = fs.make_pruner(
        SmallCNN(),
        name,
        sparsity=None if nm else 0.9,
        total_steps=100,
        exclude=["conv1"] if nm else (),  # conv1 cannot hold 2:4
    )
    cfg = pruner_config(config(method=name, pattern="2:4" if nm else None))
    for record in (pruner.pruner_config.to_dict(), cfg.to_dict()):
        assert record["operator"] == operator
        assert record["theta"] == theta
        assert {k: record["backbone"][k] for k in backbone} == backbone
        assert {k: record["schedule"][k] for k in schedule} == schedule
        assert record["pattern"] == ("2:4" if nm else None)
    assert pruner.theta == (1.0 if theta == "auto" else theta)  # auto: 1 below 95 %


# ------------------------------------------------------------------ the same value is fine
@pytest.mark.parametrize("name", ["hard", "soft", "gmp", "st3", "spartan", "hard-nm", "sr-ste"])
def test_the_methods_own_operator_given_as_an_object_is_accepted(name: str) -> None:
    """meth02: "a set value that contradicts the method is an error", the same one is not —
    also when it is the registered operator object rather than its name."""
    own = PUBLISHED[name][0]["name"]
    nm = name in ("hard-nm", "sr-ste")
    sparsity, exclude = (None, ["conv1"]) if nm else (0.9, [])
    pruner = fs.make_pruner(
        SmallCNN(),
        name,
        sparsity=sparsity,
        total_steps=100,
        exclude=exclude,
        operator=OPERATORS.get(own),
    )
    assert pruner.operator.config() == PUBLISHED[name][0]
    other = "feather" if own != "feather" else "soft"
    with pytest.raises(
        ValueError, match=rf"method '{name}' fixes operator='{own}'.*method='feather'"
    ):
        fs.make_pruner(
            SmallCNN(),
            name,
            sparsity=sparsity,
            total_steps=100,
            exclude=exclude,
            operator=OPERATORS.get(other),
        )


@guard(
    '`make_pruner(model, "sr-ste", backbone=NMBackbone("2:4"))`: the method\'s own backbone '
    "as an object without the option that defines the method (SR-STE's decay, S-STE's β, "
    "one-shot's frozen mask, GMP's first conv dense)",
    "`ValueError` naming the option the object lacks and the two ways to give it",
)
@pytest.mark.parametrize(
    ("name", "bare", "carrying", "message"),
    [
        (
            "sr-ste",
            lambda: fs.NMBackbone("2:4"),
            lambda: fs.NMBackbone("2:4", decay=2e-4),
            r"has decay=0\.0, but the method sets decay=0\.0002",
        ),
        (
            "s-ste",
            lambda: fs.NMBackbone("2:4"),
            lambda: fs.NMBackbone("2:4", rescale=True),
            r"has rescale=False, but the method sets rescale=True",
        ),
        (
            "oneshot-nm",
            lambda: fs.NMBackbone("2:4"),
            lambda: fs.NMBackbone("2:4", freeze=True),
            r"has freeze=False, but the method sets freeze=True",
        ),
        (
            "gmp",
            lambda: fs.UniformBackbone(),
            lambda: fs.UniformBackbone(keep_first_dense=True),
            r"has keep_first_dense=False, but the method sets keep_first_dense=True",
        ),
    ],
    ids=["sr-ste", "s-ste", "oneshot-nm", "gmp"],
)
def test_a_backbone_object_must_carry_the_options_that_define_the_method(
    name: str, bare: Any, carrying: Any, message: str
) -> None:
    """Left by the audit (not a mutant): an object was taken as given, so
    ``NMBackbone("2:4")`` made ``sr-ste`` a hard STE with no decay, silently. The same
    object with the method's option builds; a mapping still replaces the option."""
    nm = name != "gmp"
    kwargs: dict[str, Any] = {"total_steps": 100}
    kwargs.update(exclude=["conv1"]) if nm else kwargs.update(sparsity=0.9)
    with pytest.raises(ValueError, match=message + r".*construct it with.*as a mapping"):
        fs.make_pruner(SmallCNN(), name, backbone=bare(), **kwargs)
    backbone = carrying()
    assert fs.make_pruner(SmallCNN(), name, backbone=backbone, **kwargs).backbone is backbone
    option, value = next(
        (k, v) for k, v in PUBLISHED[name][2].items() if k not in ("name", "pattern")
    )
    mapping = {"name": PUBLISHED[name][2]["name"], option: type(value)(0)}
    built = fs.make_pruner(SmallCNN(), name, backbone=mapping, **kwargs)
    assert getattr(built.backbone, option) == type(value)(0)  # the mapping replaced it


def test_an_operator_object_is_compared_by_what_it_computes_not_its_name() -> None:
    """Left by the audit (not a mutant): ``ThresholdOperator(p=2, name="hard")`` passed
    ``method="hard"``'s check by its name and trained p = 2 as "hard"."""
    with pytest.raises(ValueError, match=r"method 'hard' fixes operator='hard'"):
        fs.make_pruner(
            SmallCNN(),
            "hard",
            sparsity=0.9,
            total_steps=100,
            operator=fs.ThresholdOperator(p=2.0, name="hard"),
        )
    renamed = fs.ThresholdOperator(p=INF, name="mine")  # the hard threshold by another name
    pruner = fs.make_pruner(SmallCNN(), "hard", sparsity=0.9, total_steps=100, operator=renamed)
    assert pruner.operator is renamed


def test_a_backbone_with_options_is_compared_by_its_name() -> None:
    """meth03: ``backbone`` "is compared by name, so its options may still be given"."""
    gmp = fs.make_pruner(
        SmallCNN(),
        "gmp",
        sparsity=0.9,
        total_steps=100,
        backbone={"name": "uniform", "keep_first_dense": False},
    )
    assert gmp.backbone.config() == {"name": "uniform", "keep_first_dense": False}
    spartan = fs.make_pruner(
        SmallCNN(),
        "spartan",
        sparsity=0.9,
        total_steps=100,
        backbone={"name": "spartan", "tol": 0.1},
    )
    assert spartan.backbone.config()["tol"] == 0.1
    with pytest.raises(ValueError, match=r"method 'gmp' fixes backbone='uniform'"):
        fs.make_pruner(
            SmallCNN(), "gmp", sparsity=0.9, total_steps=100, backbone={"name": "global"}
        )


def test_a_theta_of_zero_is_a_value_not_unset() -> None:
    """meth05: only ``None`` leaves a setting to the method; θ = 0 (the non-STE
    variant, settings.md: "a fixed number in [0, 1] overrides the rule") is a value."""
    pruner = fs.make_pruner(SmallCNN(), "feather", sparsity=0.9, total_steps=100, theta=0.0)
    assert (pruner.pruner_config.theta, pruner.theta) == (0.0, 0.0)
    assert pruner_config(config(theta=0.0)).theta == 0.0
    feather_nm = pruner_config(config(method="feather-nm", pattern="2:4", theta=0.0))
    assert feather_nm.theta == 0.0


# ------------------------------------------------------------------ backbone options
def test_an_unknown_option_names_it_and_both_lists() -> None:
    """meth09: an argument that is neither a Pruner argument nor an option of the
    method's backbone is refused here, naming it and what is accepted."""
    with pytest.raises(
        ValueError, match=r"unknown argument \['keep_frist_dense'\]: neither Pruner"
    ):
        fs.make_pruner(SmallCNN(), "gmp", sparsity=0.9, total_steps=100, keep_frist_dense=False)
    with pytest.raises(
        ValueError, match=r"unknown argument \['lam'\]: .* nor options of backbone 'global'"
    ):
        fs.make_pruner(SmallCNN(), "feather", sparsity=0.9, total_steps=100, lam=3.0)


def test_options_with_a_backbone_object_are_refused() -> None:
    """meth10: options belong in the object's constructor (pruner_kwargs' Raises)."""
    with pytest.raises(ValueError, match=r"backbone options \['keep_first_dense'\] given with a "):
        fs.make_pruner(
            SmallCNN(),
            "feather",
            sparsity=0.9,
            total_steps=100,
            backbone=fs.UniformBackbone(),
            keep_first_dense=True,
        )


def test_a_config_takes_no_pruner_only_argument() -> None:
    """meth14: ``Method.config``'s kwargs are "limited to the config's fields (not
    ``process_group``, which is no setting)"."""
    with pytest.raises(ValueError, match=r"not PrunerConfig fields: \['process_group'\]"):
        METHODS.get("feather").config(0.5, process_group=object())


# ------------------------------------------------------------------ N:M form
#: docs/guide/nm.md: the methods that train a pattern, and those that have no N:M form.
TAKE_A_PATTERN = {
    "feather",
    "hard",
    "soft",
    "nonste",
    "feather-nm",
    "hard-nm",
    "sr-ste",
    "s-ste",
    "oneshot-nm",
}


@pytest.mark.parametrize("name", ["gmp", "feather-gmp", "spartan", "st3"])
def test_a_pattern_with_a_method_without_an_nm_form_lists_those_with_one(name: str) -> None:
    """meth11–meth13: refused by the method (not later by the config), the message
    listing exactly the methods that train a pattern."""
    with pytest.raises(ValueError, match=rf"method '{name}' has no N:M form") as err:
        fs.make_pruner(SmallCNN(), name, pattern="2:4", total_steps=100)
    listed = str(err.value).split("choose a method that trains one: ")[1]
    assert set(listed.split(", ")) == TAKE_A_PATTERN
    with pytest.raises(ValueError, match=rf"method '{name}' has no N:M form"):
        pruner_config(config(method=name, pattern="2:4"))


@pytest.mark.parametrize("name", sorted(TAKE_A_PATTERN))
def test_every_method_with_an_nm_form_takes_a_pattern(name: str) -> None:
    """The other side of meth13: the methods listed all train 4:8 when asked."""
    pruner = fs.make_pruner(SmallCNN(), name, pattern="4:8", total_steps=100, exclude=["conv1"])
    assert pruner.pruner_config.pattern == "4:8"


@pytest.mark.parametrize("name", ["sr-ste", "s-ste", "oneshot-nm"])
def test_the_nm_baselines_fix_their_backbone(name: str) -> None:
    """meth23: the N:M baselines are settings of the N:M backbone; another backbone
    (``"global"``, which a pattern would silently turn into the plain N:M one,
    without the decay, β or frozen mask) contradicts them."""
    with pytest.raises(ValueError, match=rf"method '{name}' fixes backbone='nm'"):
        fs.make_pruner(SmallCNN(), name, pattern="2:4", backbone="global", exclude=["conv1"])
    own = PUBLISHED[name][2]
    by_name = fs.make_pruner(
        SmallCNN(), name, pattern="2:4", total_steps=100, backbone="nm", exclude=["conv1"]
    )
    assert {k: by_name.backbone.config()[k] for k in own} == own


# ------------------------------------------------------------------ from a training config
def test_schedule_fields_pass_through_unless_all_unset_and_the_method_has_its_own() -> None:
    """meth30, meth31: settings.md / pruner_config: the schedule fields are passed
    on unless they *all* hold their defaults and the method has its own schedule
    (Spartan's, one-shot's) or a pattern is set (then the full pattern from the
    first step)."""
    expect = {"name": "cubic", "start": 0.0, "end": 0.5}
    assert pruner_config(config()).to_dict()["schedule"] == expect  # Feather: the config's
    spartan = pruner_config(config(method="spartan", schedule_start=0.1)).to_dict()
    assert spartan["schedule"] == {"name": "cubic", "start": 0.1, "end": 0.5}
    oneshot = pruner_config(config(method="oneshot-nm", pattern="2:4", schedule_start=0.2))
    assert oneshot.to_dict()["schedule"] == {"name": "cubic", "start": 0.2, "end": 0.5}
    own = pruner_config(config(method="oneshot-nm", pattern="2:4")).to_dict()["schedule"]
    assert own == {"name": "constant", "start": 0.5, "end": 0.5}
    for name in ("feather", "feather-nm", "hard-nm", "sr-ste", "s-ste"):
        nm = pruner_config(config(method=name, pattern="2:4")).to_dict()["schedule"]
        assert nm == {"name": "constant", "start": 0.0, "end": 0.0}, name
        given = pruner_config(config(method=name, pattern="2:4", schedule="linear"))
        assert given.to_dict()["schedule"] == {"name": "linear", "start": 0.0, "end": 0.5}


def test_the_configs_other_pruning_fields_reach_the_pruner_config() -> None:
    """meth33–meth36: theta_rule, update_every, max_layer_sparsity and conv_order
    of a training config are the Pruner's."""
    paper = pruner_config(config(sparsity=0.95))
    released = pruner_config(config(sparsity=0.95, theta_rule="released"))
    assert (paper.theta_value, released.theta_value) == (0.5, 1.0)  # S >= 0.95 vs S > 0.95
    assert released.theta_rule == "released"
    assert pruner_config(config(update_every=3)).update_every == 3
    assert pruner_config(config(max_layer_sparsity=0.99)).max_layer_sparsity == 0.99
    for name in ("feather-nm", "sr-ste"):
        channels = pruner_config(config(method=name, pattern="2:4", conv_order="channels"))
        assert channels.make_backbone().config()["conv_order"] == "channels", name


# ------------------------------------------------------------------ build_pruner
class ChannelsMisfit(nn.Module):
    """conv: 6 input channels, 2×2 kernel — 24 per output (a multiple of 4 in the
    flat order), but 6 input channels (none in the channels order); fc: 8 inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(6, 8, 2)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean((2, 3)))


def test_build_pruner_leaves_dense_the_layers_that_cannot_hold_the_order_asked() -> None:
    """meth37: which layers cannot hold the pattern depends on conv_order."""
    flat = build_pruner(config(method="feather-nm", pattern="2:4"), ChannelsMisfit(), 100)
    assert flat is not None and [t.name for t in flat.targets] == ["conv", "fc"]
    channels = build_pruner(
        config(method="feather-nm", pattern="2:4", conv_order="channels"), ChannelsMisfit(), 100
    )
    assert channels is not None
    assert [t.name for t in channels.targets] == ["fc"]
    assert channels.pruner_config.exclude == ("conv",)


def test_build_pruner_adds_the_misfits_to_the_configs_exclude(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """meth38, meth39: build_pruner's docstring — layers that cannot hold the pattern
    "are added to ``exclude``", with a warning naming them: the config's own
    exclusions stay, and a layer it already excludes is neither named nor added
    again (the recorded exclude rebuilds the same Pruner on resume)."""
    pruner = build_pruner(config(method="sr-ste", pattern="2:4", exclude=("fc",)), SmallCNN(), 100)
    assert pruner is not None
    assert pruner.pruner_config.exclude == ("fc", "conv1")
    assert [t.name for t in pruner.targets] == ["conv2"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="feather_sparse.methods"):
        pruner = build_pruner(
            config(method="sr-ste", pattern="2:4", exclude=("conv1",)), SmallCNN(), 100
        )
    assert pruner is not None
    assert pruner.pruner_config.exclude == ("conv1",)
    assert [t.name for t in pruner.targets] == ["conv2", "fc"]
    assert not [r for r in caplog.records if r.name == "feather_sparse.methods"]
