"""The training loop, recipes and the ``feather-sparse train`` command.

Every run here trains the default small model on a few hundred synthetic
MNIST-1D-shaped samples for a handful of steps, into ``tmp_path``.
"""

from __future__ import annotations

import json
import math
import random
import re
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import feather_sparse as fs
from _guards import guard
from _helpers import (
    checkpoint_state,
    needs_safetensors,
    straight_and_resumed,
    tiny_config,
    tiny_run,
    tiny_run_args,
)
from feather_sparse import cli
from feather_sparse.methods import pruner_config
from feather_sparse.provenance import numerics
from feather_sparse.recipes import TrainConfig, list_recipes, load_config, load_recipe
from feather_sparse.train import (
    CHECKPOINT_FORMAT,
    build_optimizer,
    checkpoint_path,
    load_checkpoint,
    lr_factor,
    save_checkpoint,
    session,
    train,
)

# A few hundred synthetic samples: 8 steps of 64 per epoch, the default model
# at a quarter of its width.
SMALL = tiny_run(train_size=512, test_size=128, eval_batch_size=128)
SMALL_ARGS = tiny_run_args(train_size=512, test_size=128, epochs=3)


def small_config(**overrides: Any) -> TrainConfig:
    return tiny_config(SMALL, **overrides)


def model_file(run_dir: Path) -> Path:
    """model.fsp when the export module is present, else the model.pt fallback."""
    found = [p for p in (run_dir / "model.fsp", run_dir / "model.pt") if p.is_file()]
    assert len(found) == 1, f"expected one saved model in {run_dir}, found {found}"
    return found[0]


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------ recipes
def test_bundled_recipes_are_the_papers() -> None:
    assert {"cifar100", "imagenet", "mnist1d"} <= set(list_recipes())
    c = load_config("cifar100")
    assert (c.epochs, c.batch_size, c.optimizer, c.lr, c.momentum) == (160, 128, "sgd", 0.1, 0.9)
    assert (c.weight_decay, c.lr_schedule, c.warmup_epochs, c.grad_clip) == (5e-4, "cosine", 0, 3)
    assert (c.label_smoothing, c.model, c.dataset) == (0, "resnet20", "cifar100")
    i = load_config("imagenet")
    assert (i.epochs, i.batch_size, i.lr, i.momentum, i.weight_decay) == (100, 256, 0.2, 0.9, 5e-5)
    assert (i.warmup_epochs, i.label_smoothing, i.model) == (5, 0.1, "resnet50")
    for name in ("cifar100", "imagenet", "mnist1d"):
        cfg = load_config(name)
        # operator, p, theta and backbone are left to the method: Feather's.
        assert (cfg.sparsity, cfg.operator, cfg.p, cfg.theta) == (0.9, None, None, None)
        assert (cfg.backbone, cfg.method, cfg.recipe) == (None, "feather", name)
        settings = pruner_config(cfg)
        assert (settings.make_operator(), settings.theta) == (fs.OPERATORS.get("feather"), "auto")
        assert settings.make_backbone().config() == {"name": "global"}
        assert (cfg.schedule, cfg.schedule_start, cfg.schedule_end) == ("cubic", 0.0, 0.5)
    d = load_config("mnist1d")
    assert (d.model, d.dataset) == ("mnist1d_cnn", "mnist1d")


def test_regime_recipe_is_mnist1d_with_only_the_chosen_setting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # docs/results/mnist1d-regime/regime.md chose a narrower model and kept
    # the paper's clipping; every other field must stay the mnist1d recipe's.
    assert "mnist1d-regime" in list_recipes()
    regime, base = load_config("mnist1d-regime"), load_config("mnist1d")
    assert set(regime.diff(base)) == {"recipe", "model_kwargs", "grad_clip"}
    assert regime.recipe == "mnist1d-regime"
    assert regime.grad_clip == 3.0
    assert set(regime.model_kwargs) == {"width"}
    assert 0 < regime.model_kwargs["width"] < 1
    assert cli.main(["train", "--recipe", "mnist1d-regime", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert 'recipe = "mnist1d-regime"' in out and "grad_clip = 3.0" in out


def test_overrides_are_converted_like_recipe_values() -> None:
    cfg = load_config(
        "cifar100",
        {"sparsity": "0.98", "epochs": "2", "theta": "0.5", "p": "inf", "nesterov": "true"},
        exclude="fc,conv1",
        grad_clip="none",
    )
    assert cfg.sparsity == 0.98 and cfg.epochs == 2 and cfg.theta == 0.5
    assert math.isinf(cfg.p or 0.0) and cfg.nesterov is True
    assert cfg.exclude == ("fc", "conv1") and cfg.grad_clip is None
    assert load_config("mnist1d", theta="auto").theta == "auto"
    assert load_config("mnist1d", model_kwargs="{channels = 8}").model_kwargs == {"channels": 8}
    # A config survives the round trip through the checkpoint's dict.
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    # ... also when the record names the model by its spec {name, kwargs}.
    spec = {"name": "resnet20", "kwargs": {"num_classes": 100, "width": 2}}
    assert TrainConfig.from_dict(cfg.to_dict(spec)) == cfg
    rebuilt = TrainConfig.from_dict({"model": spec})
    assert rebuilt.model == "resnet20" and rebuilt.model_kwargs == {"width": 2}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"sparsty": 0.9}, "sparsty"),  # unknown key, with a suggestion
        ({"epochs": "many"}, "epochs"),
        ({"epochs": 2.5}, "epochs"),
        ({"epochs": 0}, "epochs"),
        ({"eval_every": -1}, "eval_every"),
        ({"sparsity": 1.0}, "sparsity"),
        ({"theta": "sometimes"}, "theta"),
        ({"theta": 1.5}, "theta"),
        ({"optimizer": "rmsprop"}, "optimizer"),
        ({"operator": "nope"}, "operator"),
        ({"backbone": "nope"}, "backbone"),
        ({"schedule_end": 1.5}, "schedule_end"),
        ({"amp": "maybe"}, "amp"),
        ({"nesterov": True, "momentum": 0}, "nesterov"),
        ({"device": "tpu"}, "device"),
        ({"model_kwargs": "[1, 2]"}, "model_kwargs"),
        ({"lr": math.inf}, "lr must be a finite number"),
        ({"lr": 0.01, "min_lr": 5.0}, "min_lr \\(5.0\\) must not exceed lr"),
    ],
)
def test_bad_keys_and_values_name_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        load_config("mnist1d", overrides)


def test_unknown_key_in_a_recipe_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('model = "mnist1d_cnn"\nlearning_rate = 0.1\n')
    with pytest.raises(ValueError, match="learning_rate"):
        load_recipe(path)
    path.write_text("epochs = 3\n")
    cfg = load_config(path)
    assert cfg.recipe == "mine" and cfg.epochs == 3
    with pytest.raises(ValueError, match="unknown recipe 'cifar1000'"):
        load_config("cifar1000")


@guard(
    "`--recipe` names a folder, or a binary file",
    "`IsADirectoryError`/`ValueError` naming the path (not a decoding error without it)",
)
def test_a_recipe_that_is_a_folder_or_not_text_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "mine.toml"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match=r"is a folder; give the \.toml file inside it"):
        load_recipe(folder)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(ValueError, match=re.escape(f"recipe {binary} is not a text")):
        load_recipe(binary)


def test_lr_factor_phases() -> None:
    # 10 warm-up steps rise linearly to the peak, then a cosine to 0 over 90 steps.
    f = lambda t: lr_factor(t, total_steps=100, warmup_steps=10)  # noqa: E731
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(55) == pytest.approx(0.5) and f(100) == 0.0
    assert lr_factor(50, total_steps=100, schedule="constant") == 1.0
    assert lr_factor(100, total_steps=100, min_ratio=0.1) == pytest.approx(0.1)


def test_no_weight_decay_on_norm_parameters_and_biases() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    opt = build_optimizer(load_config("cifar100"), model)
    decay = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decay == {id(model[0].weight), id(model[3].weight)}
    assert opt.param_groups[0]["weight_decay"] == 5e-4
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


# ---------------------------------------------------------------------- CLI
def test_cli_smoke_writes_the_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    assert cli.main(["train", *SMALL_ARGS, "--sparsity", "0.8", "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "final test accuracy" in out and "| **total** |" in out

    info = json.loads((run / "config.json").read_text())
    assert info["model"]["name"] == "mnist1d_cnn" and info["model"]["kwargs"]["num_classes"] == 10
    assert info["config"]["model"] == info["model"]  # the record alone rebuilds the model
    assert info["config"]["sparsity"] == 0.8 and info["config"]["epochs"] == 3
    assert "epoch 3/3" in (run / "train.log").read_text()
    rows = read_metrics(run)
    assert [r["epoch"] for r in rows] == [1, 2, 3, 3] and rows[-1]["final"] is True
    assert rows[-1]["sparsity"] == pytest.approx(0.8, abs=1e-3)
    ckpt = load_checkpoint(run)
    assert ckpt["format"] == CHECKPOINT_FORMAT and ckpt["epoch"] == 3 and ckpt["step"] == 24
    assert ckpt["config"]["model"] == info["model"]
    assert set(ckpt) >= {"version", "config", "model", "pruner", "optimizer", "lr_scheduler", "rng"}
    assert "| **total** |" in (run / "report.md").read_text()
    assert model_file(run).stat().st_size > 0


def test_cli_dense_baseline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default run folder goes under ./runs
    assert cli.main(["train", *SMALL_ARGS, "--epochs", "1", "--dense"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("mnist1d-dense-s0-")
    ckpt = load_checkpoint(run)
    assert ckpt["pruner"] is None
    weights = [v for k, v in ckpt["model"].items() if k.endswith("weight") and v.ndim > 1]
    assert all(int((w == 0).sum()) == 0 for w in weights)  # nothing pruned
    final = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["sparsity"] == 0.0 and final["target_sparsity"] == 0.0


@guard(
    "`feather-sparse train --dense` given a pruning flag (`--sparsity`, `--pattern`, ...)",
    "one-line error naming the flags that would be ignored; nothing is trained or written",
)
def test_cli_dense_with_pruning_flags_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    base = ["train", *SMALL_ARGS, "--run-dir", str(run)]
    assert cli.main([*base, "--dense", "--sparsity", "0.5"]) == 1
    assert "--sparsity would be ignored" in capsys.readouterr().err
    assert cli.main([*base, "--dense", "--set", "pattern=2:4", "--schedule-end", "0.3"]) == 1
    assert "--pattern, --schedule-end would be ignored" in capsys.readouterr().err
    assert not run.exists()
    # --no-dense with the same flags is an ordinary pruned run's config
    assert cli.main([*base, "--no-dense", "--sparsity", "0.5", "--print-config"]) == 0
    assert "sparsity = 0.5" in capsys.readouterr().out


def test_cli_errors_name_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-folder"
    run = tmp_path / "run"
    args = ["--recipe", "cifar100", "--data-dir", str(missing), "--run-dir", str(run)]
    assert cli.main(["train", *args]) == 1
    assert str(missing) in capsys.readouterr().err
    assert not run.exists()  # a run that never started leaves no folder
    assert cli.main(["train", "--set", "lrate=0.1"]) == 1
    assert "lrate" in capsys.readouterr().err
    assert cli.main(["train", "--momentum", "1.5"]) == 1
    assert "momentum" in capsys.readouterr().err
    assert cli.main(["train", "--model", "resnet2000"]) == 1
    assert "resnet2000" in capsys.readouterr().err
    assert cli.main(["train", "--method", "no-such-method"]) == 1
    assert "method" in capsys.readouterr().err
    assert cli.main(["train", "--dataset", "no-such-data"]) == 1
    assert "dataset" in capsys.readouterr().err


# ------------------------------------------------------------------- resume
def test_resume_is_bit_identical_to_a_straight_run(tmp_path: Path) -> None:
    # Once straight, once stopped after 2 epochs and continued from the command line.
    straight, half, a, b = straight_and_resumed(small_config(epochs=4), tmp_path)
    assert not half.completed and half.epochs == 2 and half.model_path is None
    assert a["step"] == b["step"] == 32
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for x, y in zip(a["pruner"]["thresholds"], b["pruner"]["thresholds"]):
        assert torch.equal(x, y)
    for key, state in a["optimizer"]["state"].items():
        momentum = b["optimizer"]["state"][key]["momentum_buffer"]
        assert torch.equal(state["momentum_buffer"], momentum)
    # The finalized models and the metrics agree too.
    rows_a, rows_b = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    for row in rows_a + rows_b:
        row.pop("epoch_time", None)
    assert rows_a == rows_b
    assert straight.test_accuracy == rows_b[-1]["test_acc"]


def test_resume_refuses_a_contradicting_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    train(small_config(), run, stop_after_epoch=1, progress=False)
    assert cli.main(["train", "--resume", str(run), "--sparsity", "0.95"]) == 1
    err = capsys.readouterr().err
    assert "sparsity" in err and "0.95" in err
    with pytest.raises(ValueError, match="lr"):
        train(small_config(lr=0.05), run, resume=True, progress=False)
    # A fresh run into a folder that holds one is refused, too.
    with pytest.raises(ValueError, match="already holds a run"):
        train(small_config(), run, progress=False)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(small_config(), tmp_path / "empty", resume=True, progress=False)


def test_resume_on_another_kernel_set_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint records its floating-point environment; resuming elsewhere says so."""
    run = tmp_path / "run"
    train(small_config(), run, stop_after_epoch=1, progress=False)
    assert load_checkpoint(run)["numerics"] == numerics("cpu")
    assert json.loads((run / "config.json").read_text())["numerics"] == numerics("cpu")
    with caplog.at_level("WARNING", logger="feather_sparse"):
        train(small_config(), run, resume=True, stop_after_epoch=2, progress=False)
    assert "another floating-point environment" not in caplog.text  # same machine: silent
    monkeypatch.setattr(session, "numerics", lambda device: "torch 0.0, CPU other, X kernels")
    with caplog.at_level("WARNING", logger="feather_sparse"):
        result = train(small_config(), run, resume=True, progress=False)
    assert result.completed
    assert "resuming on another floating-point environment" in caplog.text
    assert numerics("cpu") in caplog.text and "CPU other, X kernels" in caplog.text


def test_interrupted_checkpoint_write_keeps_the_previous_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    train(small_config(), run, stop_after_epoch=1, progress=False)
    path = checkpoint_path(run)
    before = path.read_bytes()

    real_save = torch.save

    def crash_midway(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        real_save(obj, f, *args, **kwargs)
        f.truncate(100)  # half a file on disk ...
        raise OSError("simulated crash while writing the checkpoint")  # ... then the crash

    monkeypatch.setattr(torch, "save", crash_midway)
    with pytest.raises(OSError, match="simulated crash"):
        train(small_config(), run, resume=True, progress=False)
    monkeypatch.undo()

    assert path.read_bytes() == before  # untouched: the previous checkpoint loads
    assert load_checkpoint(run)["epoch"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temporary left
    # ... and the run continues from it.
    result = train(small_config(), run, resume=True, progress=False)
    assert result.completed and load_checkpoint(run)["epoch"] == 3


def test_save_checkpoint_is_atomic_and_load_rejects_garbage(tmp_path: Path) -> None:
    path = tmp_path / "ckpt" / "last.pt"
    save_checkpoint(checkpoint_state(epoch=1), path)
    (path.parent / ".last.pt.999999999.0a1b2c3d.tmp").write_bytes(b"half a checkpoint")  # killed
    save_checkpoint(checkpoint_state(epoch=2), path)
    assert load_checkpoint(path)["epoch"] == 2
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="unreadable"):
        load_checkpoint(path)


# -------------------------------------------------------------- python API
def test_train_api_callbacks_and_finalized_model(tmp_path: Path) -> None:
    seen: list[tuple[int, float]] = []

    def record(epoch: int, model: nn.Module, pruner: Any, metrics: dict[str, Any]) -> None:
        assert pruner is not None and metrics["epoch"] == epoch
        seen.append((epoch, pruner.sparsity_achieved()))

    result = train(small_config(sparsity=0.7), tmp_path / "run", callbacks=[record], progress=False)
    assert [e for e, _ in seen] == [1, 2, 3]
    assert seen[-1][1] == pytest.approx(0.7, abs=1e-3)  # the schedule ended at 50 %
    assert result.completed and result.sparsity == pytest.approx(0.7, abs=1e-3)
    assert result.report is not None and result.report.sparsity == pytest.approx(0.7, abs=1e-3)
    # The returned model is plain (no parametrization) and holds exact zeros.
    weights = [m.weight for m in result.model.modules() if isinstance(m, (nn.Conv1d, nn.Linear))]
    zeros = sum(int((w == 0).sum()) for w in weights)
    assert zeros / sum(w.numel() for w in weights) == pytest.approx(result.sparsity)
    assert not any("parametrizations" in name for name, _ in result.model.named_parameters())


@pytest.mark.parametrize(("every", "tested"), [(2, [2, 4, 5]), (0, [])])
def test_eval_every_tests_on_schedule_and_changes_no_weight(
    tmp_path: Path, every: int, tested: list[int]
) -> None:
    straight = train(small_config(epochs=5), tmp_path / "every-epoch", progress=False)
    sparse = train(small_config(epochs=5, eval_every=every), tmp_path / "sparse", progress=False)
    rows = read_metrics(tmp_path / "sparse")
    assert [r["epoch"] for r in rows if "test_acc" in r and not r.get("final")] == tested
    assert rows[-1]["final"] and rows[-1]["test_acc"] == sparse.test_accuracy
    # Testing reads the model only: the weights and the final accuracy are the same.
    for a, b in zip(straight.model.state_dict().values(), sparse.model.state_dict().values()):
        assert torch.equal(a, b)
    assert sparse.test_accuracy == straight.test_accuracy


def test_eval_every_zero_still_tests_where_training_stops(tmp_path: Path) -> None:
    half = train(
        small_config(epochs=4, eval_every=0), tmp_path / "run", stop_after_epoch=2, progress=False
    )
    assert not half.completed and 0.0 <= half.test_accuracy <= 1.0
    assert [r["epoch"] for r in read_metrics(tmp_path / "run") if "test_acc" in r] == [2]


def test_resume_restores_every_rng(tmp_path: Path) -> None:
    """A callback that draws from torch's, numpy's and Python's global RNGs and
    perturbs the weights: the resumed run must draw the same numbers."""

    def jitter(epoch: int, model: nn.Module, pruner: Any, metrics: dict[str, Any]) -> None:
        noise = torch.randn(()) + float(np.random.rand()) + random.random()
        with torch.no_grad():
            next(model.parameters()).add_(1e-3 * noise)

    train(small_config(), tmp_path / "a", callbacks=[jitter], progress=False)
    train(small_config(), tmp_path / "b", callbacks=[jitter], stop_after_epoch=1, progress=False)
    train(small_config(), tmp_path / "b", callbacks=[jitter], resume=True, progress=False)
    a, b = load_checkpoint(tmp_path / "a"), load_checkpoint(tmp_path / "b")
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key


@needs_safetensors
def test_saved_model_and_export_of_the_run_agree(tmp_path: Path) -> None:
    """``model.fsp`` holds the finalized model, and ``feather-sparse export RUN_DIR``
    rebuilds the same weights from the last checkpoint."""
    export = pytest.importorskip("feather_sparse.export")
    run = tmp_path / "run"
    result = train(small_config(), run, progress=False)
    assert result.model_path == run / "model.fsp"
    expected = result.model.state_dict()
    saved = export.load_sparse(result.model_path).state_dict()
    assert all(torch.equal(expected[k], saved[k]) for k in expected)
    out = tmp_path / "exported.fsp"
    assert cli.main(["export", str(run), "-o", str(out)]) == 0
    exported = export.load_sparse(out).state_dict()
    assert all(torch.equal(expected[k], exported[k]) for k in expected)


def test_tensorboard_gets_the_epoch_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With tensorboard installed (a stand-in here), every epoch's numbers are logged."""
    logged: list[tuple[str, float, int]] = []

    class FakeWriter:
        def __init__(self, log_dir: str) -> None:
            assert Path(log_dir) == tmp_path / "run" / "tensorboard"

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            logged.append((tag, value, step))

        def flush(self) -> None: ...

        def close(self) -> None: ...

    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = FakeWriter  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    train(small_config(tensorboard=True), tmp_path / "run", progress=False)
    assert {step for tag, _, step in logged if tag == "test_acc"} == {1, 2, 3}
    assert {"train_loss", "sparsity", "threshold", "lr", "final/test_acc"} <= {
        t for t, _, _ in logged
    }
