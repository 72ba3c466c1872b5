"""``save_sparse`` of a sharded model (FSDP2): each rank holds a part of each tensor.

Two CPU processes with the ``gloo`` backend (``tests/_dist.py``). The file
would hold one rank's shards under the whole tensors' names; it is refused
with the way to gather the whole tensors first, and that way saves a file
equal to the single process's.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import feather_sparse as fs
from _dist import launch
from _guards import guard
from _helpers import needs_safetensors

pytestmark = [
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="needs torch.distributed + gloo",
    ),
    needs_safetensors,
]


def _save_sharded(folder: str, rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    pruner = fs.Pruner(model, sparsity=0.5, total_steps=2)
    for layer in (model[0], model[2], model):
        fully_shard(layer)
    out: dict[str, Any] = {}
    try:
        fs.save_sparse(model, Path(folder, f"rank{rank}.fsp"))
    except ValueError as err:
        out["error"] = str(err)
    full = pruner.dense_state_dict(pruned=True, full=True)  # a collective: every rank
    if rank == 0:
        fs.save_sparse(full, Path(folder, "full.fsp"))
    return out


@guard(
    "`save_sparse` of a model sharded by FSDP2 (or tensor parallelism): DTensor weights",
    "`ValueError` naming the tensor and how to gather whole tensors first; nothing written",
)
def test_a_sharded_model_is_refused_with_the_way_to_save_it(tmp_path: Path) -> None:
    results = launch(functools.partial(_save_sharded, str(tmp_path)), 2)
    for out in results:
        assert "is sharded across processes (a DTensor" in out["error"]
        assert "pruner.dense_state_dict(pruned=True, full=True)" in out["error"]
    assert sorted(p.name for p in tmp_path.glob("*.fsp")) == ["full.fsp"]
    # The way the message gives saves the single process's pruned model.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    expected = fs.Pruner(model, sparsity=0.5, total_steps=2).dense_state_dict(pruned=True)
    plain = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    loaded = fs.load_sparse(tmp_path / "full.fsp", plain).state_dict()
    assert loaded.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name
