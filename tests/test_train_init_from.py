"""``init_from``: a run that starts from saved weights (a dense run to prune, say)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from _guards import guard
from _helpers import needs_safetensors, tiny_config, tiny_run, tiny_run_args
from feather_sparse import cli
from feather_sparse.bench.runner import run_key
from feather_sparse.export import load_sparse_state_dict
from feather_sparse.train import checkpoint_path, load_checkpoint, session, train

SMALL = tiny_run(train_size=256, test_size=64, eval_batch_size=64)


@pytest.fixture(scope="module")
def dense_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("dense") / "run"
    train(tiny_config(SMALL, dense=True, epochs=1, seed=3), run, progress=False)
    return run


def spy_on_loading(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, torch.Tensor]]:
    """The model's state right after ``init_from`` was loaded into it, per run."""
    seen: list[dict[str, torch.Tensor]] = []
    real = session.load_init

    def spy(model: torch.nn.Module, path: Path) -> dict[str, Any]:
        out = real(model, path)
        seen.append({k: v.clone() for k, v in model.state_dict().items()})
        return out

    monkeypatch.setattr(session, "load_init", spy)
    return seen


@guard(
    "a run that should start from saved weights (a dense run's `model.fsp`, to prune it) "
    "rather than a random init",
    "`init_from` (`--init-from RUN_OR_FSP`) loads them, bit for bit, into the built model "
    "before the Pruner attaches; `config.json` records the file and its SHA-256",
)
@pytest.mark.parametrize("give", ["folder", "file"])
@needs_safetensors
def test_a_run_starts_from_the_weights_it_is_given(
    dense_run: Path, tmp_path: Path, give: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = spy_on_loading(monkeypatch)
    source = dense_run if give == "folder" else dense_run / "model.fsp"
    run = tmp_path / "pruned"
    result = train(tiny_config(SMALL, epochs=1, init_from=str(source)), run, progress=False)
    expected, _ = load_sparse_state_dict(dense_run / "model.fsp")
    (loaded,) = seen
    assert loaded.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(loaded[key], value), key
    assert result.sparsity == pytest.approx(0.9, abs=1e-3)  # then pruned as usual
    info = json.loads((run / "config.json").read_text())
    digest = hashlib.sha256((dense_run / "model.fsp").read_bytes()).hexdigest()
    assert info["init"] == {"path": str((dense_run / "model.fsp").resolve()), "sha256": digest}
    assert info["config"]["init_from"] == str(source)


def test_without_init_from_the_run_is_as_before(tmp_path: Path) -> None:
    """Unset, the field changes nothing: the run records no init, and the bench's run
    keys of the configs stored before the field existed stay the same."""
    config = tiny_config(SMALL, epochs=1)
    assert config.init_from is None
    stored = config.to_dict()
    del stored["init_from"]  # a config written before the field
    assert run_key(config.to_dict()) == run_key(stored)
    train(config, tmp_path / "run", progress=False)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["init"] is None


@guard(
    "`--init-from` naming nothing, a folder without `model.fsp` (an unfinished run, or one "
    "that saved `model.pt` where safetensors was missing), a training checkpoint, or "
    "another kind of file",
    "CLI exit 1 before the data loads with one line naming the path and what to give "
    "(the `feather-sparse export` command for a checkpoint or an unfinished run; the "
    "safetensors install for a `model.pt`)",
)
@pytest.mark.parametrize(
    "kind",
    [
        # the file's own checks come after the reader's: without safetensors, the error names it
        pytest.param("missing", marks=needs_safetensors),
        "unfinished",
        "plain",
        pytest.param("checkpoint", marks=needs_safetensors),
        pytest.param("text", marks=needs_safetensors),
    ],
)
def test_a_wrong_init_from_is_refused_before_training(
    kind: str, dense_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "source"
    expected = {
        "missing": f"sparse checkpoint '{source}' does not exist",
        "unfinished": f"{source} is a folder without a model.fsp (a run that has not finished, "
        f"or not a run folder); export the model of its last checkpoint first (feather-sparse "
        f"export {source}",
        "plain": f"{source} holds a model.pt, not a model.fsp (its run finished where the "
        "safetensors package was not installed); install it (pip install "
        f"'feather-sparse[export]'), export the run (feather-sparse export {source}",
        "checkpoint": f"{source} is a PyTorch checkpoint, not a sparse checkpoint; make one "
        f"with: feather-sparse export {source} -o model.fsp",
        "text": f"{source} is not a readable feather-sparse checkpoint",
    }[kind]
    if kind == "unfinished":
        source.mkdir()
    elif kind == "plain":
        source.mkdir()
        (source / "model.pt").write_bytes(b"")  # only its name is looked at
    elif kind == "checkpoint":
        source.write_bytes(checkpoint_path(dense_run).read_bytes())
    elif kind == "text":
        source.write_text("hello")
    run = tmp_path / "run"
    argv = [*tiny_run_args(256, 64, epochs=1), "--init-from", str(source), "--run-dir", str(run)]
    assert cli.main(["train", *argv]) == 1
    err = capsys.readouterr().err
    assert f"init_from: {expected}" in err
    assert len(err.strip().splitlines()) == 1
    assert not (run / "metrics.jsonl").exists()


@guard(
    "`--init-from` a model of another architecture (another width, another model)",
    "CLI exit 1 naming the tensors that differ, before the first step; the same folder then "
    "trains with a file that fits",
)
@needs_safetensors
def test_weights_of_another_architecture_are_refused_naming_the_tensors(
    dense_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    argv = [*tiny_run_args(256, 64, epochs=1), "--run-dir", str(run)]
    wide = ["--model-kwargs", "{width = 0.5}"]
    assert cli.main(["train", *argv, *wide, "--init-from", str(dense_run)]) == 1
    err = capsys.readouterr().err
    assert "init_from: " in err and "does not match the model's architecture" in err
    assert "shape mismatch: features.0.weight" in err
    assert cli.main(["train", *argv, "--init-from", str(dense_run)]) == 0


@needs_safetensors
def test_a_resumed_run_keeps_its_weights_and_records_without_the_file(
    dense_run: Path, tmp_path: Path
) -> None:
    """The checkpoint holds the weights: a resume never reads ``init_from`` again (the
    file may be gone), and ends bit for bit where the uninterrupted run does."""
    source = tmp_path / "start.fsp"
    source.write_bytes((dense_run / "model.fsp").read_bytes())
    config = tiny_config(SMALL, epochs=2, init_from=str(source))
    straight = train(config, tmp_path / "straight", progress=False)
    train(config, tmp_path / "resumed", stop_after_epoch=1, progress=False)
    source.unlink()
    assert cli.main(["train", "--resume", str(tmp_path / "resumed"), "--no-progress"]) == 0
    a, b = load_checkpoint(tmp_path / "straight"), load_checkpoint(tmp_path / "resumed")
    for key, value in a["model"].items():
        assert torch.equal(b["model"][key], value), key
    assert a["init"] == b["init"] and a["init"]["path"] == str(source.resolve())
    info = json.loads((tmp_path / "resumed" / "config.json").read_text())
    assert info["init"] == a["init"]
    assert straight.sparsity == pytest.approx(0.9, abs=1e-3)


def test_print_config_shows_init_from(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", "--init-from", "runs/dense", "--print-config"]) == 0
    assert 'init_from = "runs/dense"' in capsys.readouterr().out
