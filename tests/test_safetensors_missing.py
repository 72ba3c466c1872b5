"""The library and the suite where safetensors (the ``export`` extra) is not installed.

A sparse checkpoint (``.fsp``) is a safetensors file: without the package the
library names the install in its errors, and a training run saves a plain
``model.pt`` instead of ``model.fsp``. The tests that write or read a ``.fsp``
are marked ``needs_safetensors`` (``tests/_helpers.py``) and skip there, naming
the install; they used to fail, about 200 of them, with the library's own error.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests._helpers import needs_safetensors
from torch import nn

from feather_sparse.export import save_sparse
from feather_sparse.train import run_dir

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
INSTALL = "pip install 'feather-sparse[export]'"


@pytest.fixture
def no_safetensors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "safetensors", None)  # as if it were not installed


def test_without_safetensors_a_run_saves_model_pt_and_names_the_install(
    no_safetensors: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    spec = {"name": "mnist1d_mlp", "kwargs": {}}  # only stored: the file is read below by hand
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        path = run_dir._save_model(model, spec, tmp_path, {})
    assert path == tmp_path / "model.pt" and not (tmp_path / "model.fsp").exists()
    assert f"safetensors is not installed ({INSTALL})" in caplog.text
    saved = torch.load(path, map_location="cpu", weights_only=True)
    assert saved["model"] == spec
    for key, value in model.state_dict().items():
        assert torch.equal(saved["state_dict"][key], value), key


def test_without_safetensors_save_sparse_names_the_install_and_writes_nothing(
    no_safetensors: None, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=r"need the safetensors package") as caught:
        save_sparse(nn.Linear(4, 4), tmp_path / "m.fsp")
    assert INSTALL in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_without_safetensors_the_tests_that_need_it_skip_naming_the_install(
    tmp_path: Path,
) -> None:
    code = """
import sys
import pytest

class Blind:  # finds nothing for safetensors: import fails, find_spec gives None
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "safetensors":
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, name):  # find_distributions: pytest's plugins, by entry point
        return getattr(self.finder, name)

sys.meta_path[:] = [Blind(f) for f in sys.meta_path]
sys.exit(pytest.main(sys.argv[1:]))
"""
    tests = [TESTS / "test_fsp_views.py", TESTS / "test_temp_files_hosts.py"]
    argv = [sys.executable, "-c", code, *map(str, tests), "-q", "-rs"]
    argv += ["-p", "no:cacheprovider", "--rootdir", str(ROOT)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "1 passed, 3 skipped" in out, out
    assert "safetensors is not installed; install it with: pip install -e '.[export]'" in out


@needs_safetensors
def test_without_safetensors_a_wrong_path_is_named_before_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing file, a folder or a PyTorch checkpoint is named as such: installing
    safetensors would not have helped. A real ``.fsp`` then names the install."""
    from feather_sparse.export import inspect_sparse, load_sparse

    fsp = tmp_path / "m.fsp"
    save_sparse(nn.Linear(4, 4), fsp)  # written while the package is there
    torch.save({"state_dict": {}}, tmp_path / "ckpt.pt")
    monkeypatch.setitem(sys.modules, "safetensors", None)
    for read in (load_sparse, inspect_sparse):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            read(tmp_path / "missing.fsp")
        with pytest.raises(IsADirectoryError, match="is a folder"):
            read(tmp_path)
        with pytest.raises(ValueError, match="is a PyTorch checkpoint"):
            read(tmp_path / "ckpt.pt")
        with pytest.raises(ValueError, match="need the safetensors package") as caught:
            read(fsp)
        assert INSTALL in str(caught.value)
