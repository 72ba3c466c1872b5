"""A model moved to the GPU after its Pruner attached trains there as one attached
on the GPU (docs/guide/concepts.md, "A model moved to another device after
attaching"): the thresholds, the masks a backbone froze (one-shot N:M, Spartan's
last steps), S-STE's β and ASL+'s learned thresholds follow the weights.

The CPU suite checks the same moves on the meta device
(``tests/test_backbone_state.py``, ``tests/test_nm_usage.py``); here the other
device is a real one, so the trained weights themselves are compared.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs

CASES: list[tuple[str, dict[str, Any]]] = [
    ("feather", {"sparsity": 0.8}),
    ("spartan", {"sparsity": 0.8}),
    ("st3", {"sparsity": 0.8}),
    ("feather", {"sparsity": 0.8, "backbone": "asl+"}),
    ("feather-nm", {"pattern": "2:4"}),
    ("s-ste", {"pattern": "2:4"}),
    ("oneshot-nm", {"pattern": "2:4"}),
]
STEPS = 8


def _train(move_first: bool, method: str, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    if move_first:
        model.cuda()
    pruner = fs.make_pruner(model, method, total_steps=STEPS, **kwargs)
    if not move_first:
        model.cuda()  # after attaching: the Pruner's state must follow
    params = [*model.parameters(), *pruner.parameters()]
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    for i in range(STEPS):
        g = torch.Generator().manual_seed(100 + i)
        x, y = torch.randn(8, 16, generator=g).cuda(), torch.randint(0, 8, (8,), generator=g).cuda()
        loss = F.cross_entropy(model(x), y) + pruner.regularizer()
        opt.zero_grad()
        loss.backward()
        opt.step()
        pruner.step()
    pruner.finalize()
    return [t.detach() for t in model.state_dict().values()]


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("method", "kwargs"),
    CASES,
    ids=[f"{m}-{k.get('backbone', k.get('pattern', 'global'))}" for m, k in CASES],
)
def test_a_model_moved_after_attaching_trains_as_one_attached_on_the_gpu(
    method: str, kwargs: dict[str, Any]
) -> None:
    moved = _train(False, method, kwargs)
    attached = _train(True, method, kwargs)
    for a, b in zip(moved, attached, strict=True):
        assert a.device.type == "cuda" and b.device.type == "cuda"
        # the thresholds of the moved model were first selected on the CPU: the same
        # value to the bit, but P_T's cube roots may round differently on the GPU
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert torch.equal(a == 0, b == 0)
