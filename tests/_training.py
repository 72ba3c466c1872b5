"""A short SGD run, eager or under torch.compile, that the compile tests share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import feather_sparse as fs


def sgd_run(
    model: nn.Module,
    pruner: fs.Pruner,
    steps: int,
    backend: str | None,
    after_step: Callable[[], object] | None = None,
) -> dict[str, Any]:
    """Train ``steps`` steps of SGD on fixed seeded batches, eager (``backend=None``) or compiled.

    The compiled model is one full graph behind a frame counter, and a
    recompilation raises instead of silently happening. ``after_step`` runs
    after each ``pruner.step()``, to record something per step.

    Returns:
        The losses (stacked), copies of the pruned weights, the frames compiled
        (0 in eager mode) and the sparsity achieved.
    """
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    counter = CompileCounterWithBackend(backend) if backend else None
    forward = torch.compile(model, backend=counter, fullgraph=True) if counter else model
    g = torch.Generator().manual_seed(1)
    losses = []
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(steps):
            x, y = torch.randn(16, 2, 16, generator=g), torch.randint(0, 4, (16,), generator=g)
            loss = nn.functional.cross_entropy(forward(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            pruner.step()
            losses.append(loss.detach())
            if after_step is not None:
                after_step()
    return {
        "losses": torch.stack(losses),
        "weights": [w.detach().clone() for w in pruner.weights()],
        "frames": counter.frame_count if counter else 0,
        "achieved": pruner.sparsity_achieved(),
    }
