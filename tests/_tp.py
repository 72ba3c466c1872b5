"""Tensor-parallel tests: the model, its Megatron plan, and one training step of the sharded
model checked against one process."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn

import feather_sparse as fs

#: The mark of every test file here: 2 or 4 gloo processes on the CPU.
NEEDS_GLOO = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed + gloo"
)

INPUTS, HIDDEN, OUTPUTS = 16, 24, 8


def pruner_kinds(steps: int) -> dict[str, dict[str, Any]]:
    """The Pruner settings of each kind these tests run, for ``steps`` training steps:
    unstructured, whose cubic schedule moves the threshold at every step (a resume at
    the wrong step shows), and 2:4; θ < 1 in both."""
    return {
        "unstructured": {"sparsity": 0.7, "total_steps": steps, "theta": 0.5},
        "2:4": {"pattern": "2:4", "theta": 0.5},
    }


def mlp(seed: int = 0, hidden: int = HIDDEN, whole_tail: bool = False) -> nn.Sequential:
    """Linear → ReLU → Linear, the same weights on every rank (as ``parallelize_module``
    expects); ``whole_tail`` adds a ReLU and a Linear that tensor parallelism leaves whole
    (FSDP2 shards it on ``dp`` alone, on a 2-D mesh)."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(INPUTS, hidden), nn.ReLU(), nn.Linear(hidden, OUTPUTS)]
    if whole_tail:
        layers += [nn.ReLU(), nn.Linear(OUTPUTS, OUTPUTS)]
    return nn.Sequential(*layers)


def megatron(model: nn.Module, mesh: Any) -> nn.Module:
    """The Megatron pair on ``mesh``: layer ``0`` column-wise, layer ``2`` row-wise (in place)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return model


def report_of(pruner: fs.Pruner) -> dict[str, Any]:
    """What ``report()`` and ``sparsity_achieved()`` say, as plain data to compare."""
    report = pruner.report()
    return {
        "achieved": pruner.sparsity_achieved(),
        "sparsity": report.sparsity,
        "layers": [(r.name, r.shape, r.params, r.sparsity) for r in report.layers],
        "shown": [r.threshold for r in report.layers],
    }


def step_against_one(
    pruner: fs.Pruner,
    one: fs.Pruner,
    reference: nn.Module,
    before: dict[str, Any],
    opt: Any,
    losses: tuple[Tensor, Tensor],
    outs: tuple[Tensor, Tensor],
) -> dict[str, Any]:
    """Backward both losses, step the sharded model and its Pruner, and step ``one`` (the
    Pruner of ``reference``, one process) from the same state ``before`` on the weights the
    sharded model has now. Returns both sides of every quantity compared: outputs,
    gradients (gathered), next thresholds, reports."""
    loss, loss_one = losses
    out, out_one = outs
    opt.zero_grad()
    reference.zero_grad()
    loss.backward()
    loss_one.backward()
    record: dict[str, Any] = {
        "out": out.detach().clone(),
        "out_one": out_one.detach().clone(),
        "grads": [w.grad.full_tensor() for w in pruner.weights()],  # type: ignore[union-attr]
        "grads_one": [w.grad.clone() for w in one.weights()],  # type: ignore[union-attr]
    }
    opt.step()
    pruner.step()
    reference.load_state_dict(pruner.dense_state_dict(full=True))
    one.load_state_dict(before)
    one.step()
    record["thresholds"] = [t.clone() for t in pruner.thresholds()]
    record["thresholds_one"] = [t.clone() for t in one.thresholds()]
    record["report"], record["report_one"] = report_of(pruner), report_of(one)
    return record


def train_against_one(
    pruner: fs.Pruner,
    one: fs.Pruner,
    reference: nn.Module,
    opt: Any,
    steps: int,
    forward: Any,
) -> list[dict[str, Any]]:
    """``steps`` steps of the sharded model, each checked against one process: before each,
    ``reference`` (one process, Pruner ``one``) takes the sharded model's whole weights and
    Pruner state; ``forward(step)`` returns both losses and both outputs to compare
    (:func:`step_against_one`)."""
    records = []
    for step in range(steps):
        reference.load_state_dict(pruner.dense_state_dict(full=True))
        before = pruner.state_dict()
        one.load_state_dict(before)
        losses, outs = forward(step)
        records.append(step_against_one(pruner, one, reference, before, opt, losses, outs))
    return records
