"""The registry of the paper's experiments: one module per experiment, each a plan and a summary.

==================  ============================================================
``compare``         Table 1: Feather-Global, Feather-ASL+, ST-3, Spartan, GMP,
                    hard-STE, soft-STE, non-STE × sparsity, and the dense model
``operator``        Fig. 2: hard / soft / Feather (p = 3) operators, θ = 1
``theta``           Fig. 3: θ ∈ {0, 0.25, 0.5, 0.75, 1} × sparsity
``theta-operator``  Fig. 4: θ under each operator at high sparsity
``p``               appendix: p ∈ {1, 2, 3, 4, ∞}, and the operator family (Fig. 1b)
``stability``       appendix: Pearson r of each epoch's mask with the final one, per θ
``backbones``       appendix: Feather vs no Feather on the GMP and ASL+ backbones
``flops``           appendix: accuracy vs FLOPs for the global, global-flops and
                    uniform backbones, and their per-layer sparsity
``nm``              issue 14: Feather-N:M vs SR-STE, S-STE, hard-STE and one-shot N:M
                    × 2:4, 4:8, 1:4 × the CNN and the mixer, θ and p at 2:4
==================  ============================================================

A new experiment is a module with a ``plan(opts) -> runs``, a
``summarize(context) -> (body, figures)`` and an ``EXPERIMENT``, registered below.
"""

from __future__ import annotations

from feather_sparse.bench.experiments import (
    backbones,
    compare,
    flops,
    nm,
    operator,
    p,
    stability,
    theta,
    theta_operator,
)
from feather_sparse.bench.experiments.base import Experiment
from feather_sparse.registry import Registry

__all__ = ["EXPERIMENTS", "Experiment"]

EXPERIMENTS: Registry[Experiment] = Registry("experiment")
for _module in (compare, operator, theta, theta_operator, p, stability, backbones, flops, nm):
    EXPERIMENTS.register(_module.EXPERIMENT.name, _module.EXPERIMENT)
