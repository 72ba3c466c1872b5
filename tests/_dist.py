"""Run a function on N CPU processes with the ``gloo`` backend (test helper, not a test).

``launch(fn, world)`` starts ``world`` fresh interpreters with
``torch.multiprocessing.spawn``, initialises a process group on a free local
port, calls ``fn(rank, world)`` in each and returns the per-rank results (any
picklable value). An exception on any rank fails the launch with that rank's
traceback; a collective that hangs is cut off by the group's timeout.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: Longest any collective may wait before the group gives up (a hang becomes an error).
COLLECTIVE_TIMEOUT = timedelta(seconds=60)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _entry(rank: int, world: int, port: int, out: str, fn: Callable[[int, int], Any]) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)  # two processes share the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    try:
        result = fn(rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    # Done: leave without the interpreter's teardown. There, now and then, a
    # C++ thread of torch's distributed runtime is destroyed while still
    # joinable and std::terminate aborts the process ("terminate called
    # without an active exception", SIGABRT) after every result is written:
    # about 1 launch in 10 of the FSDP2 N:M scenario on 2 cores, with both
    # result files present. Nothing of the test's work is skipped by this.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def launch(fn: Callable[[int, int], Any], world: int = 2) -> list[Any]:
    """``[fn(0, world), ..., fn(world - 1, world)]``, each run in its own process.

    The processes see no GPU (``CUDA_VISIBLE_DEVICES`` empty), also on a machine that
    has one: these are CPU runs, and with a GPU in view FSDP2's default mesh, a
    ``device="auto"`` and the N processes sharing one GPU would make them GPU runs.
    """
    # the children inherit the variable; this process only waits for them meanwhile
    no_gpu = mock.patch.dict(os.environ, {"CUDA_VISIBLE_DEVICES": ""})
    with tempfile.TemporaryDirectory() as out, no_gpu:
        mp.spawn(_entry, args=(world, free_port(), out, fn), nprocs=world, join=True)
        return [pickle.loads(Path(out, f"rank{r}.pkl").read_bytes()) for r in range(world)]


def recorded(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn()``, or ``{"error": <its traceback>}``: inside a launched function, a scenario
    that raises on every rank alike (no collective left hanging) is reported, and the
    other scenarios of the launch still run."""
    try:
        return fn()
    except Exception:
        return {"error": traceback.format_exc()}


def dcp_resume(
    model: Any, optimizer: torch.optim.Optimizer, pruner: Any, checkpoint_id: str
) -> None:
    """Load a DCP checkpoint of ``{"model", "optim", "pruner"}`` into them in place.

    The resume recipe of docs/distributed.md: the model's and the optimizer's
    state dicts from ``torch.distributed.checkpoint.state_dict`` (the plain
    model's keys), ``dcp.load`` into them, then set back, and the Pruner's own
    state. A collective: every rank calls it.
    """
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state: dict[str, Any] = {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, optimizer),
        "pruner": pruner.state_dict(),
    }
    dcp.load(state, checkpoint_id=checkpoint_id)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])
    pruner.load_state_dict(state["pruner"])
