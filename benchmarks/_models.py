"""Model helpers shared by the benchmark scripts.

Benchmarks of the sparse file format and of sparse inference need models with
a given fraction of exact zeros; they get them by one-shot magnitude pruning
here rather than by training, which is enough to fix the sparsity pattern's
size and layout.
"""

from __future__ import annotations

import torch
from torch import nn


def prune_(model: nn.Module, sparsity: float) -> nn.Module:
    """Zero the smallest-magnitude fraction of every conv/linear weight (per layer)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear | nn.Conv1d | nn.Conv2d):
                w = module.weight
                k = int(sparsity * w.numel())
                if k:
                    w[w.abs() <= w.abs().flatten().kthvalue(k).values] = 0
    return model
