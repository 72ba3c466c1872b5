"""Runs trained on several nodes: the run records its processes per node, and every hint
to continue it is the ``torchrun --nnodes=K --nproc_per_node=P`` command."""

from __future__ import annotations

import functools
import os
import re
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from _dist import launch
from _guards import guard
from _helpers import tiny_config, tiny_run
from feather_sparse import cli
from feather_sparse.cli import train as cli_train
from feather_sparse.integrity import DiskFullError
from feather_sparse.train import DistContext, TrainingInterrupted, checkpoint_path, loop, train
from feather_sparse.train.dist import distributed_context
from feather_sparse.train.result import resume_command
from feather_sparse.train.run_dir import read_run_info

SMALL = tiny_run(train_size=256, test_size=64, eval_batch_size=64)
#: The torchrun flags that bring the nodes together: the hint names them, it cannot know them.
RENDEZVOUS = (
    "--rdzv-backend, --rdzv-endpoint and --rdzv-id, or --node-rank, --master-addr and --master-port"
)


def _on_nodes(run: Path | str, nodes: int, per_node: int) -> str:
    return (
        f"torchrun --nnodes={nodes} --nproc_per_node={per_node} -m feather_sparse train "
        f"--resume {run}, on each of the {nodes} nodes, with the rendezvous flags the run "
        f"was launched with ({RENDEZVOUS})"
    )


def test_the_resume_command_names_the_nodes_and_the_processes_on_each() -> None:
    assert resume_command("runs/r", 8, 4) == _on_nodes("runs/r", 2, 4)
    assert resume_command("runs/r", 8, 1) == _on_nodes("runs/r", 8, 1)
    one_node = "torchrun --nproc_per_node=4 -m feather_sparse train --resume runs/r"
    assert resume_command("runs/r", 4, 4) == one_node  # every process on one node
    # not known (a run recorded before the processes per node were), or not a layout
    # torchrun makes: the one-node command, as before
    for local in (None, 3, 0, 8):
        assert resume_command("runs/r", 4, local) == one_node
    assert resume_command("runs/r", 1, 1) == "feather-sparse train --resume runs/r"
    err = TrainingInterrupted(Path("runs/r"), 1, 8, 3, 1, world_size=8, local_world_size=4)
    assert str(err).endswith(f"continue with: {_on_nodes('runs/r', 2, 4)}")


def test_each_process_takes_the_processes_per_node_from_torchrun(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dist = torch.distributed
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 5)
    monkeypatch.setattr(dist, "get_world_size", lambda: 8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun --nnodes=2 --nproc_per_node=4
    assert distributed_context() == DistContext(rank=5, world_size=8, local_world_size=4)
    for unusable in ("3", "16", "0", "four"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", unusable)
        assert distributed_context().local_world_size is None
    monkeypatch.delenv("LOCAL_WORLD_SIZE")  # a process group initialised by hand
    assert distributed_context() == DistContext(rank=5, world_size=8)


@guard(
    "a run trained on several nodes (`torchrun --nnodes=K --nproc_per_node=P`) stopped "
    "by `--stop-after-epoch`, Ctrl-C, a full disk, or resumed with another process count",
    "the hint to continue is `torchrun --nnodes=K --nproc_per_node=P -m feather_sparse "
    "train --resume RUN` on each node, naming the rendezvous flags it needs; a run recorded "
    "before the processes per node were gets the one-node command",
)
def test_hints_to_continue_a_run_of_several_nodes_name_the_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    two_by_two = DistContext(0, 4, 2)
    hint = _on_nodes(tmp_path, 2, 2)
    # The CLI's line after --stop-after-epoch, as rank 0 of 2 nodes × 2 prints it.
    stopped = types.SimpleNamespace(
        completed=False, epochs=1, test_accuracy=0.5, run_dir=tmp_path, table=""
    )
    monkeypatch.setattr(cli_train, "init_distributed", lambda device: False)
    monkeypatch.setattr(cli_train, "distributed_context", lambda: two_by_two)
    monkeypatch.setattr(cli_train, "train", lambda *args, **kwargs: stopped)
    assert cli.main(["train", "--run-dir", str(tmp_path), "--stop-after-epoch", "1"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"continue with: {hint}")

    # A full disk while rank 0 writes the checkpoint.
    def full(*args: Any, **kwargs: Any) -> None:
        raise DiskFullError("no space left")

    monkeypatch.setattr(loop, "save_checkpoint", full)
    monkeypatch.setattr(loop, "_checkpoint_state", lambda s, row: {})
    session = types.SimpleNamespace(run_dir=tmp_path, epoch=2, saved_epoch=1, ctx=two_by_two)
    with pytest.raises(DiskFullError, match=re.escape(f"then continue with: {hint}") + "$"):
        loop._save(session, {})  # type: ignore[arg-type]

    # One process resuming it is told the command of the run's own layout ...
    recorded = {"world_size": 4, "local_world_size": 2}
    monkeypatch.setattr(loop, "read_run_info", lambda run: recorded)
    with pytest.raises(ValueError, match=re.escape(f"resume with {hint}") + "$"):
        loop._check_world_size(tmp_path, 1)
    # ... and a run recorded before the processes per node were, the one-node command.
    monkeypatch.setattr(loop, "read_run_info", lambda run: {"world_size": 4})
    older = f"torchrun --nproc_per_node=4 -m feather_sparse train --resume {tmp_path}"
    with pytest.raises(ValueError, match=re.escape(f"resume with {older}") + "$"):
        loop._check_world_size(tmp_path, 1)


def _one_epoch_on_two_nodes(rank: int, world: int, run: str) -> bool:
    """Rank ``rank`` of ``torchrun --nnodes=2 --nproc_per_node=1``: one epoch of the run."""
    os.environ["LOCAL_WORLD_SIZE"] = "1"  # what torchrun tells each process of that launch
    return train(tiny_config(SMALL), Path(run), stop_after_epoch=1, progress=False).completed


@pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="needs torch.distributed + gloo",
)
def test_a_run_of_two_nodes_records_them_and_one_process_is_told_how_to_resume(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    assert launch(functools.partial(_one_epoch_on_two_nodes, run=str(run)), 2) == [False] * 2
    info = read_run_info(run)
    assert (info["world_size"], info["local_world_size"]) == (2, 1)
    before = checkpoint_path(run).read_bytes()
    with pytest.raises(ValueError, match=re.escape(f"resume with {_on_nodes(run, 2, 1)}") + "$"):
        train(tiny_config(SMALL), run, resume=True, progress=False)
    assert checkpoint_path(run).read_bytes() == before


def test_a_run_of_one_process_records_no_processes_per_node(tmp_path: Path) -> None:
    train(tiny_config(SMALL, epochs=1), tmp_path / "run", progress=False)
    info = read_run_info(tmp_path / "run")
    assert info["world_size"] == 1 and info["local_world_size"] is None
