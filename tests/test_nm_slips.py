"""N:M slips: backbone options checked (not coerced), a damaged one-shot mask refused,
``finalize(sparsity=...)`` of every N:M method refused, and export's N:M warning."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import _helpers
import feather_sparse as fs
from _guards import guard
from feather_sparse.export.run import load_export_source
from feather_sparse.models import create_model
from feather_sparse.nm import NMBackbone
from feather_sparse.pruner_config import PrunerConfig

AT_ONCE = {"total_steps": 4, "schedule": "constant"}  # one-shot's mask taken at attaching
NM_METHODS = ["feather-nm", "hard-nm", "sr-ste", "s-ste", "oneshot-nm"]


def model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 8))


def conv(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(4, 4, 3))  # channels order: 4 channels per kernel position


def parametrized(m: nn.Module) -> list[str]:
    return [name for name, mod in m.named_modules() if hasattr(mod, "parametrizations")]


def train(m: nn.Module, pruner: fs.Pruner, steps: int = 2) -> None:
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        loss = m(torch.randn(4, 16, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()


# ------------------------------------------------------------ F01: options checked


BAD_OPTIONS = [
    ({"rescale": "false"}, r"rescale must be True or False, got 'false'"),
    ({"rescale": 1}, r"rescale must be True or False, got 1"),
    ({"freeze": "no"}, r"freeze must be True or False, got 'no'"),
    ({"freeze": None}, r"freeze must be True or False, got None"),
    ({"decay": True}, r"decay must be >= 0, a finite number .*got True"),
    ({"decay": math.inf}, r"decay must be >= 0, a finite number .*got inf"),
    ({"decay": math.nan}, r"decay must be >= 0, a finite number .*got nan"),
    ({"decay": -1e-4}, r"decay must be >= 0, a finite number .*got -0\.0001"),
    ({"decay": "2e-4"}, r"decay must be >= 0, a finite number .*got '2e-4'"),
    ({"conv_order": ["flat"]}, r"conv_order must be one of flat, channels, got \['flat'\]"),
]


@guard(
    "an N:M backbone option of the wrong type or value (`rescale='false'`, `freeze='no'`, "
    "`decay=True`, `decay=inf`, `decay='2e-4'`)",
    "`ValueError` naming the option, the value and what it takes; the model is left dense",
)
@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS)
def test_nm_backbone_options_are_checked_not_coerced(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NMBackbone("2:4", **options)
    with pytest.raises(ValueError, match=message):
        PrunerConfig(pattern="2:4", backbone={"name": "nm", **options})
    m = model()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(ValueError, match=message):
        fs.Pruner(m, pattern="2:4", backbone={"name": "nm", **options})
    assert parametrized(m) == []
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


def test_nm_backbone_options_take_numpy_numbers_and_bools() -> None:
    for decay in (np.float32(2e-4), np.float64(0.0), np.int64(0), 0, 1e-3):
        backbone = NMBackbone("2:4", decay=decay)
        assert isinstance(backbone.decay, float) and backbone.decay == float(decay)
    backbone = NMBackbone("2:4", rescale=True, freeze=False, conv_order="channels")
    assert (backbone.rescale, backbone.freeze) == (True, False)
    assert backbone.config() == {
        "name": "nm",
        "pattern": "2:4",
        "rescale": True,
        "conv_order": "channels",
    }


# ------------------------------------------------------------ F04: misspelled options


@guard(
    "a misspelled N:M backbone option (`{'name': 'nm', 'conv_ordr': 'channels'}`)",
    "`ValueError` listing the N:M backbone's options, as for every backbone",
)
def test_a_misspelled_nm_backbone_option_lists_the_options() -> None:
    listed = r"invalid backbone options .*'conv_ordr'.* for NMBackbone: .*its options are: "
    listed += "pattern, decay, rescale, freeze, conv_order"
    with pytest.raises(ValueError, match=listed):
        PrunerConfig(pattern="2:4", backbone={"name": "nm", "conv_ordr": "channels"})
    with pytest.raises(ValueError, match=listed):
        PrunerConfig(backbone={"name": "nm", "conv_ordr": "channels"})  # the pattern from it
    m = model()
    with pytest.raises(ValueError, match=listed):
        fs.Pruner(m, pattern="2:4", backbone={"name": "nm", "conv_ordr": "channels"})
    assert parametrized(m) == []


# ------------------------------------------------------------ F02: damaged one-shot mask


def oneshot(m: nn.Module, **kwargs: Any) -> fs.Pruner:
    return fs.make_pruner(m, "oneshot-nm", pattern="2:4", **AT_ONCE, **kwargs)


def all_true(masks: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.ones_like(masks[0]), *masks[1:]]


def one_of_four(masks: list[torch.Tensor]) -> list[torch.Tensor]:
    first = torch.zeros_like(masks[0]).reshape(-1, 4)
    first[:, 0] = True
    return [first.reshape(masks[0].shape), *masks[1:]]


@guard(
    "a one-shot N:M state whose bool mask of the right shape keeps more or fewer than N of "
    "every M weights",
    "`ValueError` naming the layer, damaged, nothing was loaded; `from_state_dict` leaves "
    "the model dense",
)
@pytest.mark.parametrize("change", [all_true, one_of_four], ids=["4-of-4", "1-of-4"])
def test_a_one_shot_mask_that_breaks_the_pattern_is_refused(change: Any) -> None:
    source = model()
    saved = oneshot(source)
    train(source, saved)
    state = copy.deepcopy(saved.state_dict())
    state["backbone"]["masks"] = change(state["backbone"]["masks"])
    kept = 4 if change is all_true else 1
    message = rf"'masks' entry of layer '0' keeps {kept} of 4 .*2:4.*nothing was loaded"

    target = model()
    pruner = oneshot(target)
    before = copy.deepcopy(pruner.state_dict())
    x = torch.randn(3, 16)
    out = target(x)
    with pytest.raises(ValueError, match=message):
        pruner.load_state_dict(state)
    after = pruner.state_dict()
    assert all(
        torch.equal(a, b)
        for a, b in zip(after["backbone"]["masks"], before["backbone"]["masks"], strict=True)
    )
    assert torch.equal(target(x), out)

    fresh = model()
    with pytest.raises(ValueError, match=message):
        fs.Pruner.from_state_dict(fresh, state)
    assert parametrized(fresh) == []


def test_a_mask_is_counted_in_the_layers_group_order() -> None:
    """A mask of a channels-grouped convolution that is 2:4 in the flat order only is damaged;
    the channels-grouped Pruner's own mask loads."""
    channels = {"conv_order": "channels"}
    saved = oneshot(conv(), **channels)
    state = saved.state_dict()
    oneshot(conv(), **channels).load_state_dict(copy.deepcopy(state))  # its own: loads
    weight = conv()[0].weight
    gen = torch.Generator().manual_seed(0)
    rank = torch.rand(weight.numel() // 4, 4, generator=gen).argsort(dim=1).argsort(dim=1)
    flat = (rank < 2).reshape(weight.shape)  # 2 of every 4 along the flattened (in, kh, kw) row
    by_channels = flat.movedim(1, -1).reshape(-1, 4).sum(1)
    assert not bool((by_channels == 2).all())  # not 2:4 by channels
    state["backbone"]["masks"] = [flat]
    with pytest.raises(ValueError, match=r"'masks' entry of layer '0' keeps .*nothing was loaded"):
        oneshot(conv(), **channels).load_state_dict(state)


def test_a_frozen_mask_that_breaks_the_pattern_at_finalize_is_not_blamed_on_sparsity() -> None:
    """finalize()'s check, at the pattern's sparsity, does not tell the user to leave
    sparsity= out."""
    m = model()
    pruner = oneshot(m)
    train(m, pruner)  # the mask is fixed from the first step on
    masks = pruner.backbone._masks
    assert masks is not None
    masks[0] = torch.ones_like(masks[0])  # changed behind the Pruner's back (loads refuse it)
    pruner.update()  # at the pattern's sparsity, as finalize() checks it
    with pytest.raises(ValueError, match="more than the 2:4 pattern allows") as err:
        pruner.backbone.check_final(0, m[0].weight)
    assert "sparsity=" not in str(err.value)
    assert "frozen one-shot mask" in str(err.value)


# ------------------------------------------------------------ F03: finalize(sparsity=...)


@guard(
    "`finalize(sparsity=...)` of a one-shot N:M Pruner (frozen mask) below its pattern",
    "`ValueError` as for every N:M method (call finalize() without sparsity=); the Pruner "
    "is as before the call",
)
@pytest.mark.parametrize("method", NM_METHODS)
@pytest.mark.parametrize("sparsity", [0.3, 0.49])
def test_every_nm_method_refuses_finalize_at_another_sparsity(method: str, sparsity: float) -> None:
    m = model()
    pruner = fs.make_pruner(m, method, pattern="2:4", **AT_ONCE)
    train(m, pruner)
    before = copy.deepcopy(pruner.state_dict())
    x = torch.randn(3, 16)
    out = m(x)
    with pytest.raises(ValueError, match=r"finalize\(\) without sparsity="):
        pruner.finalize(sparsity=sparsity)
    after = pruner.state_dict()
    assert after["current_sparsity"] == before["current_sparsity"]
    assert all(torch.equal(a, b) for a, b in zip(after["thresholds"], before["thresholds"]))
    assert torch.equal(m(x), out)
    assert parametrized(m) == ["0", "2"]
    assert pruner.finalize(sparsity=0.5) == pytest.approx(0.5)  # its own: baked


def test_one_shot_finalize_below_the_pattern_names_the_sparsity() -> None:
    m = model()
    pruner = oneshot(m)
    with pytest.raises(
        ValueError, match=r"finalize\(sparsity=0\.3\) is refused: .*2:4 pattern's sparsity 0\.5"
    ):
        pruner.finalize(sparsity=0.3)


# ------------------------------------------------------------ F05: export's N:M warning


def nm_run(tmp_path: Path, epochs: int) -> Path:
    torch.manual_seed(0)
    net = create_model("mnist1d_mlp")
    pruner = fs.Pruner(net, pattern="2:4")
    return _helpers.training_checkpoint(
        tmp_path / "last.pt", net, pruner, epoch=1, config={"epochs": epochs}
    )


def test_export_of_an_unfinished_nm_run_at_its_pattern_says_it_is_unfinished(
    tmp_path: Path,
) -> None:
    source = load_export_source(nm_run(tmp_path, epochs=3), sparsity=0.5)
    assert source.warning is not None
    assert "not trained for it" not in source.warning
    assert "2:4 pattern's sparsity 0.5" in source.warning
    assert "has not finished" in source.warning and "epoch 1 of 3" in source.warning
    assert source.sparsity == pytest.approx(0.5)


def test_export_of_a_finished_nm_run_at_its_pattern_has_no_warning(tmp_path: Path) -> None:
    path = nm_run(tmp_path, epochs=1)
    for sparsity in (0.5, 0.5 + 1e-10):  # the pattern's, within the check's tolerance
        source = load_export_source(path, sparsity=sparsity)
        assert source.warning is None
        assert source.sparsity == pytest.approx(0.5)
