"""N:M in the training path: TrainConfig.pattern, ``train --pattern``, resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import feather_sparse as fs
from _guards import guard
from _helpers import needs_safetensors, straight_and_resumed, tiny_config, tiny_run, tiny_run_args
from feather_sparse import cli
from feather_sparse.methods import pruner_config
from feather_sparse.nm import NMPattern, group_view
from feather_sparse.recipes import TrainConfig, load_config
from feather_sparse.train import load_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = tiny_run(train_size=512, test_size=128, eval_batch_size=128)
SMALL_ARGS = tiny_run_args(train_size=512, test_size=128, epochs=2)


def small_config(**overrides: Any) -> TrainConfig:
    return tiny_config(SMALL, **overrides)


def test_pattern_field_sets_the_sparsity_and_reaches_the_pruner_config() -> None:
    cfg = small_config(pattern="2:4", method="feather-nm")
    assert cfg.pattern == "2:4" and cfg.sparsity == 0.5  # the recipe's 0.9 gives way
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    settings = pruner_config(cfg)
    assert settings.pattern == "2:4" and settings.sparsity == 0.5
    assert settings.make_schedule().name == "constant"  # the N:M default, not the recipe's cubic
    assert pruner_config(small_config(pattern=" 4:8 ", method="feather")).pattern == "4:8"
    oneshot = pruner_config(small_config(pattern="1:4", method="oneshot-nm"))
    assert oneshot.make_schedule().start == 0.5 and oneshot.sparsity == 0.75
    # The default job is unchanged: unstructured, the recipe's sparsity and schedule.
    plain = pruner_config(load_config("mnist1d"))
    assert plain.pattern is None and plain.sparsity == 0.9
    assert plain.make_schedule().name == "cubic"


@guard(
    "`--pattern` with another `--sparsity`, a malformed pattern, or an N:M method without it",
    "`ValueError` naming the option to change",
)
def test_pattern_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"pattern 2:4 prunes 0\.5 .* sparsity 0\.9"):
        small_config(pattern="2:4", sparsity=0.9)
    small_config(pattern="2:4", sparsity=0.5)  # agreeing is fine
    with pytest.raises(ValueError, match="'N:M'"):
        small_config(pattern="2/4")
    with pytest.raises(ValueError, match=r"method 'sr-ste' trains an N:M pattern.*--pattern 2:4"):
        pruner_config(small_config(method="sr-ste"))
    with pytest.raises(ValueError, match=r"method .gmp. has no N:M form"):
        pruner_config(small_config(pattern="2:4", method="gmp"))
    for backbone in ("global", "uniform"):  # named explicitly: refused, not silently replaced
        with pytest.raises(ValueError, match=rf"backbone '{backbone}' cannot be combined"):
            small_config(pattern="2:4", backbone=backbone)
    assert small_config(pattern="2:4", backbone="nm").backbone == "nm"
    with pytest.raises(ValueError, match=r"seed must be below 2\*\*63"):
        small_config(seed=2**64)


@needs_safetensors
def test_cli_trains_an_nm_model_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    args = ["train", *SMALL_ARGS, "--pattern", "2:4", "--method", "feather-nm"]
    assert cli.main([*args, "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "N:M pattern 2:4" in out
    info = json.loads((run / "config.json").read_text())
    assert info["config"]["pattern"] == "2:4" and info["config"]["sparsity"] == 0.5
    ckpt = load_checkpoint(run)
    saved = ckpt["pruner"]["config"]
    assert saved["pattern"] == "2:4" and saved["backbone"] == {"name": "nm", "pattern": "2:4"}
    # The first conv (1 channel, kernel 5: reduction 5) cannot hold 2:4 and stays dense.
    assert "features.0" in saved["exclude"] and "features.0" not in saved["targets"]
    model = fs.load_sparse(run / "model.fsp")
    pattern = NMPattern.parse("2:4")
    for name in saved["targets"]:
        weight = model.get_submodule(name).weight.detach()
        counts = (group_view(weight, pattern) != 0).sum(dim=1)
        assert int(counts.max()) <= 2, name
    assert int((model.get_submodule("features.0").weight == 0).sum()) == 0


@pytest.mark.parametrize("method", ["feather-nm", "oneshot-nm"])
def test_nm_resume_is_bit_identical_to_a_straight_run(tmp_path: Path, method: str) -> None:
    cfg = small_config(epochs=4, pattern="2:4", method=method)
    _, half, a, b = straight_and_resumed(cfg, tmp_path)
    assert not half.completed and half.epochs == 2
    assert a["step"] == b["step"] == 32
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    masks_a, masks_b = a["pruner"]["backbone"]["masks"], b["pruner"]["backbone"]["masks"]
    assert (masks_a is None) == (method == "feather-nm")
    for x, y in zip(masks_a or [], masks_b or []):
        assert torch.equal(x, y)
    rows = [
        [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        for d in (tmp_path / "straight", tmp_path / "resumed")
    ]
    for row in rows[0] + rows[1]:
        row.pop("epoch_time", None)
    assert rows[0] == rows[1]


def test_cli_log_names_the_nm_ramp_not_a_threshold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An N:M run's per-epoch line shows the ramp r of r·T_g, labelled so (not as a threshold)."""
    args = tiny_run_args(train_size=256, test_size=64, epochs=1)
    run = tmp_path / "run"
    assert cli.main(["train", *args, "--pattern", "2:4", "--run-dir", str(run)]) == 0
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("epoch 1/1")]
    assert "  ramp 1  " in line and " thr " not in line
    assert cli.main(["train", *args, "--run-dir", str(tmp_path / "unstructured")]) == 0
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("epoch 1/1")]
    assert " thr " in line and "ramp" not in line
