"""N:M under FSDP2 (``fully_shard``, gloo on CPU): a dim-0 shard holds whole groups.

Each rank's forward uses the pattern of the full weight, the report counts
exactly half the weights of the full tensors (2:4), and no collective is
needed to find the group thresholds.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import feather_sparse as fs
from _dist import launch
from feather_sparse.nm import NMPattern, group_view, nm_threshold

WORLD = 2
STEPS = 3

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo"
)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 8))


def _scenario(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    model = _model()
    reference = copy.deepcopy(model)
    pruner = fs.Pruner(model, pattern="2:4", theta=0.5)
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    steps = []
    for _ in range(STEPS):
        x, y = torch.randn(4, 16, generator=gen), torch.randint(0, 8, (4,), generator=gen)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()
        full = [w.detach().full_tensor() for w in pruner.weights()]
        with torch.no_grad():
            refs = [m for m in reference if isinstance(m, nn.Linear)]
            mods = [m for m in model if isinstance(m, nn.Linear)]
            for r, m, w in zip(refs, mods, full):
                r.weight.copy_(nm_threshold(w, "2:4"))
                r.bias.copy_(m.bias.full_tensor())
            x_eval = torch.randn(4, 16, generator=torch.Generator().manual_seed(99))
            steps.append(
                {
                    "achieved": pruner.sparsity_achieved(),
                    "out": model(x_eval),
                    "out_reference": reference(x_eval),
                    "local_rows": [w.to_local().shape[0] for w in pruner.weights()],
                }
            )
    dense = pruner.dense_state_dict(pruned=True)
    counts = [
        (group_view(v.full_tensor(), NMPattern(2, 4)) != 0).sum(1)
        for k, v in dense.items()
        if k.endswith("weight")
    ]
    return {"steps": steps, "counts": counts}


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    return launch(_scenario, WORLD)


def test_fsdp2_nm_forward_report_and_pattern(runs: list[dict[str, Any]]) -> None:
    for rank in range(WORLD):
        for step in runs[rank]["steps"]:
            assert step["achieved"] == 0.5
            assert step["local_rows"] == [12, 4]  # really sharded: half the rows each
            torch.testing.assert_close(step["out"], step["out_reference"])
        assert all((c == 2).all() for c in runs[rank]["counts"])
