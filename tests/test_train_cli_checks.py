"""``feather-sparse train``'s arguments and hints: ``--print-config`` as a recipe, custom
recipe files, device strings, what ``--resume`` accepts, and the command that continues
a run trained by several processes."""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from _guards import guard
from _helpers import tiny_config, tiny_run, tiny_run_args
from feather_sparse import cli
from feather_sparse.cli import train as cli_train
from feather_sparse.integrity import DiskFullError
from feather_sparse.recipes import TrainConfig, load_config
from feather_sparse.train import DistContext, TrainingInterrupted, checkpoint_path, loop, train
from feather_sparse.train.dist import resolve_device
from feather_sparse.train.result import resume_command

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

# 4 steps of 64 an epoch: the default model at a quarter of its width.
SMALL = tiny_run(train_size=256, test_size=64, eval_batch_size=64)


@pytest.fixture(scope="module")
def half_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run stopped after 1 of 3 epochs."""
    run = tmp_path_factory.mktemp("half") / "run"
    train(tiny_config(SMALL), run, stop_after_epoch=1, progress=False)
    return run


def snapshot(run: Path) -> dict[Path, bytes]:
    """Every file of a run folder but the run lock (which records who last held it)."""
    return {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}


def print_config(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(["train", *argv, "--print-config"]) == 0
    return capsys.readouterr().out


# ------------------------------------------------------------ --print-config
@pytest.mark.parametrize(
    ("recipe", "overrides"),
    [
        ("mnist1d", {}),
        ("cifar100", {"p": "inf", "sparsity": "0.95", "theta": "0.5", "grad_clip": "none"}),
        (
            "mnist1d-regime",
            {
                "model_kwargs": (
                    '{width = 0.5, "odd key" = "say \\"hi\\"\\n\\\\ ok", deep = {a = [1, 2]}}'
                ),
                "data_options": "{train_size = 256}",
                "exclude": '["re:.*fc.*", "features.0"]',
                "data_dir": "some dir/with 'quotes'",
                "min_lr": "1e-05",
                "lr": "0.001",
                "warmup_epochs": "0.5",
                "max_layer_sparsity": "0.99",
                "device": "cpu",
                "threads": "2",
            },
        ),
        ("mnist1d", {"pattern": "2:4", "method": "feather-nm", "conv_order": "channels"}),
        ("imagenet", {"dense": "true", "seed": str(2**63 - 1), "recipe": "my label"}),
    ],
)
def test_print_config_is_a_recipe_that_reads_back_to_the_same_config(
    recipe: str,
    overrides: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The model_kwargs and data_options keys are made up to test TOML's quoting;
    # checking their names against the model and the data has tests of its own
    # (REFUSED_CONFIGS).
    monkeypatch.setattr(loop, "check_model_kwargs", lambda name, **kwargs: None)
    monkeypatch.setattr(loop, "check_dataset_options", lambda name, **options: None)
    sets = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    expected = load_config(recipe, overrides)
    printed = print_config(["--recipe", recipe, *sets], capsys)
    tomllib.loads(printed)  # valid TOML: no null, no Infinity, no JSON objects
    path = tmp_path / "my.toml"
    path.write_text(printed)
    assert load_config(path) == expected
    assert print_config(["--recipe", str(path)], capsys) == printed  # and prints the same


def test_every_field_print_config_leaves_unset_is_unset_by_default() -> None:
    """``--print-config`` writes an unset field as a comment: reading the file back
    gives the field its default, which must then be unset too."""
    for f in dataclasses.fields(TrainConfig):
        if f.default is not dataclasses.MISSING and "None" in str(f.type):
            assert f.default is None, f.name


def test_a_recipe_file_is_read_on_its_own_as_the_help_and_docs_say(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A field a custom file leaves out takes TrainConfig's default, not the default
    recipe's; ``recipe = "cifar100"`` in it is a label, not the cifar100 recipe."""
    path = tmp_path / "mine.toml"
    path.write_text("sparsity = 0.95\n")
    mine, neutral = load_config(path), TrainConfig()
    assert (mine.epochs, mine.batch_size, mine.sparsity) == (neutral.epochs, 128, 0.95)
    assert mine.epochs != load_config("mnist1d").epochs
    path.write_text('recipe = "cifar100"\nsparsity = 0.95\n')
    labelled = load_config(path)
    assert labelled.recipe == "cifar100" and labelled.epochs == neutral.epochs
    assert labelled.model != load_config("cifar100").model
    monkeypatch.setenv("COLUMNS", "10000")
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "a field a .toml file leaves out takes TrainConfig's default, not the mnist1d" in text
    assert "as a TOML recipe (--recipe reads it back)" in text
    docs = " ".join((Path(__file__).parents[1] / "docs" / "training.md").read_text().split())
    assert "*not* the value of the bundled `mnist1d` recipe" in docs
    assert "is only the run's label" in docs


# Configs training refuses before it starts, with (a part of) its one-line error.
REFUSED_CONFIGS = [
    (["--method", "nope"], "method: unknown method 'nope'; choose one of: feather,"),
    (["--method", "hard", "--operator", "feather"], "method 'hard' fixes operator='hard'"),
    (["--method", "gmp", "--backbone", "global"], "method 'gmp' fixes backbone='uniform'"),
    (["--method", "feather-nm"], "method 'feather-nm' trains an N:M pattern: set pattern"),
    (["--method", "st3", "--p", "2"], "p applies to the thresholding operators only"),
    (["--method", "gmp", "--pattern", "2:4"], "method 'gmp' has no N:M form"),
    (["--pattern", "3:2"], "an N:M pattern needs integers 0 < N < M"),
    (["--sparsity", "1.5"], "sparsity must be in [0, 1)"),
    (["--schedule-start", "0.6", "--schedule-end", "0.4"], "need 0 <= schedule_start <="),
    (["--exclude", "re:("], "invalid regular expression in 're:('"),
    (["--model", "nope"], "model: unknown model 'nope'"),
    (["--dataset", "nope"], "dataset: unknown dataset 'nope'"),
    (["--model-kwargs", "{num_classes = 3}"], "num_classes comes from the data set"),
    (
        ["--model-kwargs", "{widht = 8}"],
        "model_kwargs: model 'mnist1d_cnn' does not accept these arguments (got an "
        "unexpected keyword argument 'widht'); it accepts: width",
    ),
    (
        ["--data-options", "{train_sise = 8}"],
        "data_options: dataset 'synthetic-mnist1d' does not take option train_sise; its "
        "options: input_shape, num_classes, train_size, test_size",
    ),
    (["--stop-after-epoch", "0"], "stop_after_epoch must be >= 1, got 0"),
]


@guard(
    "`train --print-config` given a config training refuses (`--method nope`, `--method hard "
    "--operator feather`, `--method feather-nm` without `--pattern`, ...)",
    "CLI exit 1 with training's one-line error (the same checks), no recipe printed",
)
@pytest.mark.parametrize(
    ("argv", "message"), REFUSED_CONFIGS, ids=[" ".join(a) for a, _ in REFUSED_CONFIGS]
)
def test_print_config_refuses_what_training_refuses_with_the_same_error(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A printed recipe trains: ``--print-config`` makes the checks training makes
    before it starts, and answers a config it refuses with the same line and code."""
    argv = [*tiny_run_args(256, 64, epochs=1), *argv]
    trained = cli.main(["train", *argv, "--run-dir", str(tmp_path / "run")])
    training = capsys.readouterr()
    printed = cli.main(["train", *argv, "--print-config"])
    printing = capsys.readouterr()
    assert trained == printed == 1
    assert message in training.err
    assert printing.err == training.err
    assert printing.out == ""
    assert not (tmp_path / "run").exists()


@guard(
    "`--model-kwargs`/`--data-options` typed as JSON (`'{\"width\": 8}'`), as a shell user "
    "types a table",
    "read as the TOML inline table it spells (`{width = 8}`), where it was refused as not a table",
)
def test_a_table_on_the_command_line_may_be_json(capsys: pytest.CaptureFixture[str]) -> None:
    toml = print_config(["--model-kwargs", "{width = 8}"], capsys)
    json = print_config(["--model-kwargs", '{"width": 8}'], capsys)
    assert json == toml and "model_kwargs = {width = 8}" in toml
    # JSON's null is the model's default, as create_model reads None (TOML has no null)
    assert "model_kwargs = {}" in print_config(["--model-kwargs", '{"width": null}'], capsys)
    assert cli.main(["train", "--model-kwargs", "{width: 8}", "--print-config"]) == 1
    err = capsys.readouterr().err
    assert 'model_kwargs must be a table (e.g. {key = 1}, or JSON: {"key": 1})' in err


# ------------------------------------------------------------- model vs data
@guard(
    "`feather-sparse train --model resnet20` on MNIST-1D (a model built for other data)",
    "CLI exit 1 before the first step with one line naming the model, the data set, the "
    "sample shape and the recipe made for that data, where a conv shape error came from "
    "the first training step; the same folder then trains with a model that fits",
)
def test_a_model_that_does_not_take_the_data_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*tiny_run_args(256, 64, epochs=1, quarter_width=False), "--run-dir", str(tmp_path)]
    assert cli.main(["train", *argv, "--model", "resnet20"]) == 1
    err = capsys.readouterr().err
    assert "model 'resnet20' does not take data set 'synthetic-mnist1d'" in err
    assert "one sample is (1, 40)" in err
    assert "give a --model that takes it (of the bundled recipes' models: mnist1d_cnn" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "metrics.jsonl").exists()
    assert cli.main(["train", *argv]) == 0  # nothing of the failed start is in the way


def test_the_model_check_leaves_the_model_and_the_random_state_as_they_were() -> None:
    """One forward in evaluation mode inside a forked random state: the batch norm's
    running statistics, the training mode and what a seeded run draws next are unchanged."""
    from feather_sparse.models import create_model
    from feather_sparse.train.fit import check_model_takes

    model = create_model("mnist1d_cnn", num_classes=10)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    check_model_takes(
        model, model_name="mnist1d_cnn", dataset="mnist1d", shape=(1, 40), num_classes=10
    )
    assert torch.equal(torch.rand(3), expected)
    assert model.training
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


# ------------------------------------------------------------------- device
@guard(
    "`--device cuda:x` (a device string torch cannot parse)",
    "`ValueError` naming `device` and the valid forms when the config is read (also for "
    "`--print-config`)",
)
@pytest.mark.parametrize(
    "device", ["cuda:x", "cuda:", "cuda:01", "cuda: 1", "CUDA", "xpu:0", "cpu:"]
)
def test_a_device_string_torch_cannot_parse_is_refused_up_front(
    device: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match=r"device must be auto, cpu, cuda, cuda:N .* or mps"):
        load_config("mnist1d", device=device)
    assert cli.main(["train", "--device", device, "--print-config"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "device must be" in captured.err


@pytest.mark.parametrize("device", ["auto", "cpu", "cpu:0", "cuda", "cuda:0", "cuda:12", "mps"])
def test_every_device_string_the_config_accepts_is_one_torch_accepts(device: str) -> None:
    assert load_config("mnist1d", device=device).device == device
    if device != "auto":
        torch.device(device)
    assert (
        "mps"
        in next(f for f in dataclasses.fields(TrainConfig) if f.name == "device").metadata["help"]
    )


@pytest.mark.parametrize("present", [1, 2])
def test_a_cuda_index_past_the_devices_counts_them_in_their_number(
    present: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: present)
    devices = "1 CUDA device" if present == 1 else f"{present} CUDA devices"
    with pytest.raises(ValueError, match=f"^device 'cuda:3': only {devices} present$"):
        resolve_device("cuda:3")


# ------------------------------------------------------------------- resume
@guard(
    "`--resume RUN/checkpoints/last.pt` (a checkpoint file, not the run folder)",
    "`ValueError`: give the run folder, naming it; nothing changes",
)
def test_resume_given_a_checkpoint_file_names_the_run_folder(
    half_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(half_run)
    for name in ("last.pt", "prev.pt"):
        file = half_run / "checkpoints" / name
        if not file.is_file():
            continue
        assert cli.main(["train", "--resume", str(file)]) == 1
        err = capsys.readouterr().err
        assert f"give its run folder: --resume {half_run} " in err
        assert "checkpoints/last.pt/checkpoints" not in err
        with pytest.raises(ValueError, match="--resume takes a run folder"):
            train(tiny_config(SMALL), file, resume=True, progress=False)
    assert snapshot(half_run) == before


@guard(
    "`--resume RUN --recipe R` where the recipe `R` differs from the run's config",
    "`ValueError` naming the recipe (and the flags given) as the source of each field, "
    "not overrides never typed",
)
def test_resume_with_a_recipe_names_the_recipe_not_overrides(
    half_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(half_run)
    assert cli.main(["train", "--resume", str(half_run), "--recipe", "mnist1d-regime"]) == 1
    err = capsys.readouterr().err
    assert "cannot resume: recipe mnist1d-regime contradicts the checkpoint" in err
    assert "grad_clip=None in the checkpoint but 3.0 in recipe mnist1d-regime" in err
    assert "drop --recipe mnist1d-regime:" in err and "drop these overrides" not in err
    argv = ["train", "--resume", str(half_run), "--recipe", "mnist1d-regime", "--lr", "0.2"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "lr=0.1 in the checkpoint but 0.2 given on the command line" in err
    assert "drop --recipe mnist1d-regime, --lr:" in err
    assert snapshot(half_run) == before


# ----------------------------------------------------- hints under torchrun
def test_the_resume_command_names_torchrun_for_several_processes() -> None:
    assert resume_command("runs/r", 1) == "feather-sparse train --resume runs/r"
    assert resume_command(Path("runs/ddp2"), 2) == (
        "torchrun --nproc_per_node=2 -m feather_sparse train --resume runs/ddp2"
    )
    err = TrainingInterrupted(Path("runs/ddp2"), 1, 8, 3, 1, world_size=2)
    assert str(err).endswith(
        "continue with: torchrun --nproc_per_node=2 -m feather_sparse train --resume runs/ddp2"
    )
    assert str(TrainingInterrupted(Path("r"), 1, 8, 3, 1)).endswith(
        "feather-sparse train --resume r"
    )


@guard(
    "`torchrun --nproc_per_node=N -m feather_sparse train ... --stop-after-epoch K` "
    "(and Ctrl-C, a full disk, a resume with another process count)",
    "the hint to continue is the `torchrun --nproc_per_node=N -m feather_sparse train "
    "--resume RUN` command",
)
def test_hints_to_continue_a_multi_process_run_give_the_torchrun_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    torchrun = f"torchrun --nproc_per_node=2 -m feather_sparse train --resume {tmp_path}"
    # The CLI's line after --stop-after-epoch, as rank 0 of two prints it.
    stopped = types.SimpleNamespace(
        completed=False, epochs=1, test_accuracy=0.5, run_dir=tmp_path, table=""
    )
    monkeypatch.setattr(cli_train, "init_distributed", lambda device: False)
    monkeypatch.setattr(cli_train, "distributed_context", lambda: DistContext(0, 2))
    monkeypatch.setattr(cli_train, "train", lambda *args, **kwargs: stopped)
    assert cli.main(["train", "--run-dir", str(tmp_path), "--stop-after-epoch", "1"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"continue with: {torchrun}")

    # A full disk while rank 0 writes the checkpoint.
    def full(*args: Any, **kwargs: Any) -> None:
        raise DiskFullError("no space left")

    monkeypatch.setattr(loop, "save_checkpoint", full)
    monkeypatch.setattr(loop, "_checkpoint_state", lambda s, row: {})
    session = types.SimpleNamespace(run_dir=tmp_path, epoch=2, saved_epoch=1, ctx=DistContext(0, 2))
    with pytest.raises(DiskFullError, match=re.escape(f"then continue with: {torchrun}") + "$"):
        loop._save(session, {})  # type: ignore[arg-type]

    # One process resuming a run of two is told the command that fits.
    monkeypatch.setattr(loop, "read_run_info", lambda run: {"world_size": 2})
    with pytest.raises(ValueError, match=re.escape(f"resume with {torchrun}") + "$"):
        loop._check_world_size(tmp_path, 1)


def test_the_run_line_counts_one_epoch_in_the_singular(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="feather_sparse"):
        train(tiny_config(SMALL, epochs=1), tmp_path / "run", progress=False)
    assert "1 epoch × 4 steps" in caplog.text and "1 epochs" not in caplog.text
    assert checkpoint_path(tmp_path / "run").is_file()
