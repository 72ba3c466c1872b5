"""Tensor-parallel tests: one training step of a sharded model checked against one process."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

import feather_sparse as fs


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
