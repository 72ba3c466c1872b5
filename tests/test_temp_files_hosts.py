"""Temporary files carry their writer's host as well as its pid, so that a folder
shared between machines (a network file system) never loses a live writer's file
to another machine's clean-up: a pid is only meaningful on its own host."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from _guards import guard
from _helpers import needs_safetensors
from feather_sparse import integrity
from feather_sparse.export import save_sparse
from feather_sparse.train.run_dir import _prepare


@guard(
    "a run folder shared between hosts: preparing it removed another machine's live "
    "writer's temporary file, whose pid is not running here",
    "temporary files are named with a tag of their host; only this host's dead "
    "writers' files (and untagged ones, as before) are removed",
)
def test_only_this_hosts_dead_writers_files_are_removed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    here = integrity._HOST
    elsewhere = "0" * 8 if here != "0" * 8 else "1" * 8
    dead_here = run / f".model.fsp.999999999-{here}.0a1b2c3d.tmp"
    alive_here = run / f".model.fsp.{os.getppid()}-{here}.0a1b2c3d.tmp"
    other_host = run / f".model.fsp.999999999-{elsewhere}.0a1b2c3d.tmp"  # pid not ours to judge
    legacy_dead = run / ".model.fsp.999999999.0a1b2c3d.tmp"  # named before the tag
    for f in (dead_here, alive_here, other_host, legacy_dead):
        f.write_bytes(b"x")
    _prepare(run)
    assert alive_here.exists() and other_host.exists()
    assert not dead_here.exists() and not legacy_dead.exists()
    # the same rule for one target's writers (export, before it writes the target)
    integrity.remove_stale_temps(run / "model.fsp")
    assert alive_here.exists() and other_host.exists()


@needs_safetensors
def test_a_temporary_file_is_named_with_this_process_and_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    real = integrity._temp_in

    def spy(folder: Path, name: str) -> tuple[int, str]:
        fd, path = real(folder, name)
        seen.append(Path(path).name)
        return fd, path

    monkeypatch.setattr(integrity, "_temp_in", spy)
    save_sparse(torch.nn.Linear(4, 4), tmp_path / "m.fsp")
    assert seen and all(
        name.startswith(f".m.fsp.{os.getpid()}-{integrity._HOST}.") and name.endswith(".tmp")
        for name in seen
    )
    assert not list(tmp_path.glob("*.tmp"))  # renamed into place
