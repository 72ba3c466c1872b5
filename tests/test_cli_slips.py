"""Slips a user makes on the command line that must not lose work or train the wrong run.

An unset shell variable (``--run-dir "$OUT"``), ``--run-dir .`` in a project's
folder, a method typed in capitals, a misspelled ``--exclude`` checked only by
``--print-config``, an N:M pattern no layer can hold, a file where ``bench``
wants a folder: each is refused (or read as meant) before anything is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import feather_sparse as fs
from _guards import guard
from _helpers import tiny_config, tiny_run, tiny_run_args
from feather_sparse import cli
from feather_sparse.recipes import load_config, parse_override
from feather_sparse.train import ProcessLost, train
from feather_sparse.train.loop import _backend_words, _lost_contact

SMALL = tiny_run(train_size=128, test_size=32, eval_batch_size=32)
ARGS = tiny_run_args(train_size=128, test_size=32, epochs=1)

USER_FILES = {"config.json": '{"my": "project settings"}\n', "report.md": "# my notes\n"}


def _user_folder(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    for name, text in USER_FILES.items():
        (folder / name).write_text(text)
    return folder


def _unchanged(folder: Path) -> bool:
    return all((folder / n).read_text() == t for n, t in USER_FILES.items())


@guard(
    "`train --run-dir` naming a folder with the user's own `config.json`/`report.md`",
    "CLI exit 1 naming the files; nothing in the folder changes",
)
def test_a_run_does_not_write_over_the_users_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _user_folder(tmp_path / "project")
    assert cli.main(["train", *ARGS, "--run-dir", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "config.json, report.md" in err and "no run wrote" in err
    assert _unchanged(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "report.md"]


def test_a_run_folder_left_by_a_failed_run_is_used_again(tmp_path: Path) -> None:
    # What a run that failed before its first epoch leaves: its own config.json and log.
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"format": "feather-sparse-run"}))
    (run / "train.log").write_text("failed\n")
    result = train(tiny_config(SMALL, epochs=1), run, progress=False)
    assert result.completed
    assert json.loads((run / "config.json").read_text())["config"]["epochs"] == 1


@guard('`train --run-dir ""` (an unset shell variable)', "CLI exit 1; nothing is written")
def test_an_empty_run_dir_is_refused_not_read_as_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _user_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", *ARGS, "--run-dir", ""]) == 1
    assert "empty path" in capsys.readouterr().err
    assert _unchanged(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "report.md"]


@guard('`train --init-from ""` (an unset shell variable)', "CLI exit 1, before anything runs")
def test_an_empty_init_from_is_refused_not_a_random_init(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", *ARGS, "--init-from", "", "--run-dir", str(tmp_path / "run")]
    assert cli.main(argv) == 1
    assert "init_from: an empty path" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert cli.main([*argv[:-2], "--print-config"]) == 1


@guard('`train --recipe ""`', "CLI exit 1: unknown recipe (not the default one)")
def test_an_empty_recipe_is_refused_not_the_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["train", *ARGS, "--recipe", "", "--print-config"]) == 1
    assert "unknown recipe ''" in capsys.readouterr().err


def test_names_typed_in_another_case_are_stored_as_registered() -> None:
    config = load_config("mnist1d", {"method": "Feather", "backbone": "GLOBAL"})
    assert (config.method, config.backbone) == ("feather", "global")
    assert load_config("mnist1d", {"schedule": "Cubic", "operator": "FEATHER"}).schedule == "cubic"
    assert load_config("mnist1d", {"theta": " Auto"}).theta == "auto"
    assert fs.Pruner(nn.Linear(8, 8), 0.5, 4, theta="AUTO").config()["theta"] == "auto"


def test_a_run_started_as_Feather_resumes_as_feather(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert cli.main(["train", *ARGS, "--method", "Feather", "--run-dir", str(run)]) == 0
    # The canonical name is the one recorded, so the canonical spelling resumes it.
    assert json.loads((run / "config.json").read_text())["config"]["method"] == "feather"
    assert cli.main(["train", "--resume", str(run), "--method", "feather"]) == 0


@guard(
    "`train --exclude` naming no module, checked with `--print-config`",
    "CLI exit 1 with training's message (did you mean ...)",
)
def test_print_config_checks_exclude_names_against_the_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["train", *ARGS, "--exclude", "fcc", "--print-config"]) == 1
    err = capsys.readouterr().err
    assert "exclude names no module" in err and "'fc'" in err
    assert cli.main(["train", *ARGS, "--exclude", "fc", "--print-config"]) == 0


@guard(
    "`train --pattern 2:7`, which no layer's reduction dimension fits",
    "CLI exit 1 naming the layers and an M that fits (also with `--print-config`)",
)
def test_a_pattern_that_fits_no_layer_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for extra in (["--print-config"], ["--run-dir", str(tmp_path / "run")]):
        assert cli.main(["train", *ARGS, "--pattern", "2:7", *extra]) == 1
        err = capsys.readouterr().err
        assert "pattern 2:7 fits no prunable layer" in err and "e.g. 2:4" in err, err
        assert "relax exclude" not in err
    assert not (tmp_path / "run").exists()


@guard("`bench --out`/`--runs-dir` naming an existing file", "CLI exit 1 naming the flag")
@pytest.mark.parametrize("flag", ["--out", "--runs-dir"])
def test_bench_folders_that_are_files_are_refused(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    for folder in (afile, afile / "sub"):
        argv = ["bench", "operator", "--quick", "--plan", "--jobs", "1", flag, str(folder)]
        if flag == "--runs-dir":
            argv += ["--out", str(tmp_path / "res")]
        assert cli.main(argv) == 1
        assert f"{flag} {folder}" in capsys.readouterr().err
    assert afile.read_text() == "mine\n"


def test_set_reads_a_quoted_string_as_toml_does() -> None:
    assert parse_override('dataset="synthetic-mnist1d"') == ("dataset", "synthetic-mnist1d")
    assert parse_override("data_dir='/data/c'") == ("data_dir", "/data/c")
    assert parse_override('data_dir="a') == ("data_dir", '"a')  # not a TOML string: as typed
    config = load_config("mnist1d", dict([parse_override('dataset="synthetic-mnist1d"')]))
    assert config.dataset == "synthetic-mnist1d"


@guard(
    "another process of a multi-process run killed mid-training (out of memory, a lost node)",
    "`ProcessLost` (CLI exit 1) naming the epoch the checkpoint holds and the resume command",
)
def test_a_lost_process_is_told_with_the_command_that_continues_the_run(tmp_path: Path) -> None:
    gone = RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection reset by peer")
    assert _lost_contact(gone)
    assert _lost_contact(torch.distributed.DistBackendError("NCCL communicator was aborted"))
    assert not _lost_contact(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not _lost_contact(ValueError("connection reset"))  # not a backend's error
    err = ProcessLost("Connection reset by peer", tmp_path, 2, 40, 5, 2, world_size=2)
    text = str(err)
    assert "lost contact with another process of the run in epoch 3/5 at step 40" in text
    assert "(Connection reset by peer)" in text
    assert text.endswith(
        f"the last checkpoint holds epoch 2; continue with: "
        f"torchrun --nproc_per_node=2 -m feather_sparse train --resume {tmp_path}"
    )
    assert "start the run again" in str(ProcessLost("x", tmp_path, 0, 3, 5, None, world_size=2))
    gloo = (
        "[/w/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:13196. "
        "This is typically caused by a remote worker crashing. GLHF!"
    )
    assert _backend_words(gloo) == "Connection closed by peer [127.0.0.1]:13196"


@guard(
    "an error in the middle of training (an unreadable image, a callback that raises)",
    "the error, after a log line naming the checkpoint's epoch and the `--resume` command",
)
def test_an_error_mid_training_says_the_checkpoint_is_kept_and_how_to_continue(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def failing(epoch: int, *_: Any) -> None:
        if epoch == 2:
            raise OSError("cannot read image train/x.JPEG: truncated; remove or replace it")

    run = tmp_path / "run"
    with pytest.raises(OSError, match="truncated"):
        train(tiny_config(SMALL, epochs=3), run, callbacks=[failing], progress=False)
    said = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert said == [
        "training stopped by the error below; the last checkpoint holds epoch 1/3: once its "
        f"cause is fixed, continue with: feather-sparse train --resume {run}"
    ]
    assert train(tiny_config(SMALL, epochs=3), run, resume=True, progress=False).completed


def test_training_never_builds_the_model_on_the_meta_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A factory that caches its model would hand the run a meta model: the config
    # checks before the run build none (only --print-config does, for its layer
    # checks). save_sparse's spec check builds one after training, at the end.
    from feather_sparse import models
    from feather_sparse.train import loop

    devices: list[str] = []
    real = models.create_model

    def spy(*args: Any, **kwargs: Any) -> nn.Module:
        model = real(*args, **kwargs)
        devices.append(next(model.parameters()).device.type)
        return model

    monkeypatch.setattr(models, "create_model", spy)
    monkeypatch.setattr(loop, "create_model", spy)
    train(tiny_config(SMALL, epochs=1), tmp_path / "run", progress=False)
    assert devices[0] == "cpu" and devices.count("cpu") == 1
    assert cli.main(["train", *ARGS, "--print-config"]) == 0
    assert devices[-1] == "meta"
