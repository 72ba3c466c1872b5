"""torch.compile with the N:M Pruner: one graph, trains like eager, a moving ramp never recompiles.

Uses the ``aot_eager`` backend (dynamo + AOT autograd) behind a frame
counter, as tests/test_compile.py does for the unstructured Pruner.
"""

from __future__ import annotations

import math
import shutil
from typing import Any

import pytest
import torch
import torch._dynamo
from torch import nn

import feather_sparse as fs
from _training import sgd_run

STEPS = 6


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv1d(2, 8, 4, padding=2),  # reduction 2·4 = 8
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 17, 32),
        nn.ReLU(),
        nn.Linear(32, 4),
    )


def _train(backend: str | None, p: float, theta: float, method: str | None) -> dict[str, Any]:
    torch._dynamo.reset()
    model = _model()
    if method is None:  # ramped: the ramp buffer moves every step
        pruner = fs.Pruner(
            model, pattern="2:4", p=p, theta=theta, schedule="cubic", total_steps=STEPS
        )
    else:
        pruner = fs.make_pruner(model, method)
    return sgd_run(model, pruner, STEPS, backend)


@pytest.mark.parametrize(
    ("p", "theta", "method"),
    # the threshold path (finite p) and the mask path (hard, with SR-STE's decay)
    [(3.0, 0.5, None), (math.inf, 1.0, "sr-ste")],
)
def test_compiled_nm_training_matches_eager(p: float, theta: float, method: str | None) -> None:
    eager = _train(None, p, theta, method)
    compiled = _train("aot_eager", p, theta, method)
    assert compiled["frames"] == 1
    torch.testing.assert_close(compiled["losses"], eager["losses"])
    for a, b in zip(compiled["weights"], eager["weights"]):
        torch.testing.assert_close(a, b)
    assert compiled["achieved"] == eager["achieved"] == pytest.approx(0.5)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("gcc") is None, reason="no C++")
def test_inductor_nm_training_matches_eager() -> None:
    eager = _train(None, 3.0, 0.5, None)
    compiled = _train("inductor", 3.0, 0.5, None)
    assert compiled["frames"] == 1
    torch.testing.assert_close(compiled["losses"], eager["losses"])
    for a, b in zip(compiled["weights"], eager["weights"]):
        torch.testing.assert_close(a, b)
