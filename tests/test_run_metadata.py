"""Run metadata read back later: a run folder's ``config.json`` and a bench run's ``result.json``.

What must hold (docs/reliability.md): both carry a SHA-256 in a top-level
``"sha256"`` field; a changed character is detected (``config.json``: an
``IntegrityError`` naming the file and what to do; ``result.json``: the run
counts as not stored and is repeated); files written before the field still
load; the files stay readable JSON.
"""

from __future__ import annotations

import json
import logging
import random
import string
from pathlib import Path

import pytest

from _guards import guard
from feather_sparse.bench.runner import RunOutcome, load_outcome
from feather_sparse.integrity import (
    JSON_SEAL_KEY,
    IntegrityError,
    read_sealed_json,
    write_sealed_json,
)
from feather_sparse.recipes import load_config
from feather_sparse.train import train
from feather_sparse.train.run_dir import read_run_info

# The default model at a quarter of its width on 256 synthetic samples, 1 epoch.
SMALL = {
    "model_kwargs": {"width": 0.25},
    "dataset": "synthetic-mnist1d",
    "data_options": {"train_size": 256, "test_size": 64},
    "batch_size": 64,
    "eval_batch_size": 64,
    "epochs": 1,
    "tensorboard": False,
    "threads": 1,
}
_POOL = string.ascii_letters + string.digits + string.punctuation


def flip_char(path: Path, rng: random.Random) -> None:
    """Replace one non-blank character of ``path`` by a different one (not its other case)."""
    text = path.read_text(encoding="utf-8")
    where = rng.choice([i for i, c in enumerate(text) if not c.isspace()])
    old = text[where]
    new = rng.choice([c for c in _POOL if c not in (old, old.swapcase())])
    path.write_text(text[:where] + new + text[where + 1 :], encoding="utf-8")


def drop_seal(path: Path, indent: int) -> None:
    """Rewrite ``path`` as a file written before seals: the same JSON without ``"sha256"``."""
    data = json.loads(path.read_text())
    del data[JSON_SEAL_KEY]
    path.write_text(json.dumps(data, indent=indent) + "\n")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(
        load_config("mnist1d", SMALL), tmp_path_factory.mktemp("meta") / "run", progress=False
    ).run_dir


# ------------------------------------------------------------------ the seal
def test_a_sealed_json_file_is_readable_and_round_trips(tmp_path: Path) -> None:
    payload = {"b": [1, 2.5, None], "a": {"x": "é"}, "path": tmp_path, "nan": float("nan")}
    file = tmp_path / "f.json"
    write_sealed_json(file, payload, indent=1)
    text = file.read_text()
    assert text.endswith("\n") and '\n "b": [' in text  # indented, in the payload's order
    raw = json.loads(text)
    assert list(raw)[-1] == JSON_SEAL_KEY and len(raw[JSON_SEAL_KEY]) == 64
    back = read_sealed_json(file)
    assert back.keys() == {"b", "a", "path", "nan"} and back["path"] == str(tmp_path)
    assert back["b"] == [1, 2.5, None] and back["a"] == {"x": "é"} and back["nan"] != back["nan"]
    # The seal covers the values, not the layout: the same JSON re-indented still checks.
    file.write_text(json.dumps(raw, indent=4))
    assert read_sealed_json(file)["b"] == [1, 2.5, None]


@guard("a JSON payload to seal that has a `sha256` field", "`ValueError`: rename the field")
def test_a_payload_with_the_seal_field_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'sha256'.*rename the field"):
        write_sealed_json(tmp_path / "f.json", {"sha256": "x"})
    assert not (tmp_path / "f.json").exists()


# --------------------------------------------------------------- config.json
@guard("a run's `config.json` with a changed character", "`IntegrityError` naming the file")
def test_every_changed_character_of_config_json_is_detected(run: Path, tmp_path: Path) -> None:
    original = (run / "config.json").read_text()
    assert JSON_SEAL_KEY in json.loads(original)
    info = read_run_info(run)
    assert JSON_SEAL_KEY not in info and info["config"]["epochs"] == 1
    rng = random.Random(0)
    copy = tmp_path / "run"
    copy.mkdir()
    for _ in range(40):
        (copy / "config.json").write_text(original)
        flip_char(copy / "config.json", rng)
        with pytest.raises(IntegrityError, match=r"config\.json") as err:
            read_run_info(copy)
        assert "train the run again" in str(err.value) or "not valid JSON" in str(err.value)


def test_a_config_json_written_before_checksums_loads(
    run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    copy = tmp_path / "run"
    copy.mkdir()
    (copy / "config.json").write_text((run / "config.json").read_text())
    drop_seal(copy / "config.json", indent=2)
    with caplog.at_level(logging.DEBUG, logger="feather_sparse"):
        info = read_run_info(copy)
    assert info == read_run_info(run)
    assert "no checksum" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# --------------------------------------------------------------- result.json
def _stored_outcome(folder: Path) -> RunOutcome:
    outcome = RunOutcome(
        key=folder.name, config={"seed": 0}, ok=True, test_accuracy=0.75, sparsity=0.9
    )
    folder.mkdir()
    write_sealed_json(folder / "result.json", outcome.to_json(), indent=1)  # as the runner does
    return outcome


@guard("a bench run's `result.json` with a changed character", "warning naming it; run repeated")
def test_every_changed_character_of_result_json_is_detected(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "k"
    outcome = _stored_outcome(folder)
    assert load_outcome(folder) == outcome
    original = (folder / "result.json").read_text()
    rng = random.Random(1)
    for _ in range(40):
        (folder / "result.json").write_text(original)
        flip_char(folder / "result.json", rng)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="feather_sparse"):
            assert load_outcome(folder) is None
        assert f"ignoring unreadable {folder / 'result.json'}" in caplog.text
        assert "the run is repeated" in caplog.text


def test_a_result_json_written_before_checksums_loads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "k"
    outcome = _stored_outcome(folder)
    drop_seal(folder / "result.json", indent=1)
    with caplog.at_level(logging.DEBUG, logger="feather_sparse"):
        assert load_outcome(folder) == outcome
    assert "no checksum" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
