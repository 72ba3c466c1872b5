"""torch.compile: a pruned model compiles to one graph that trains like eager, and moving
thresholds never recompile it (they are 0-d tensor buffers, not Python constants).

The fast tests use the ``aot_eager`` backend (dynamo + AOT autograd, no code
generation) behind a frame counter; the inductor test generates C++ with the
system compiler and is marked ``slow`` (about a minute on a busy 2-core CPU).
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest
import torch
import torch._dynamo
from torch import Tensor, nn
from torch._dynamo.testing import CompileCounterWithBackend

import feather_sparse as fs
from _guards import guard
from _helpers import conv1d_net
from _training import sgd_run

STEPS = 6


def _train(backend: str | None, theta: float = 0.5) -> dict[str, Any]:
    """STEPS steps of SGD on fixed batches, eager (``backend=None``) or compiled."""
    torch._dynamo.reset()
    model = conv1d_net()
    pruner = fs.Pruner(model, sparsity=0.8, total_steps=STEPS, theta=theta)
    thresholds: list[Tensor] = []
    run = sgd_run(
        model, pruner, STEPS, backend, lambda: thresholds.append(pruner.thresholds()[0].clone())
    )
    return {**run, "thresholds": torch.stack(thresholds)}


def _assert_same_training(eager: dict[str, Any], compiled: dict[str, Any]) -> None:
    torch.testing.assert_close(compiled["losses"], eager["losses"])
    torch.testing.assert_close(compiled["thresholds"], eager["thresholds"])
    for a, b in zip(compiled["weights"], eager["weights"]):
        torch.testing.assert_close(a, b)
    assert compiled["achieved"] == pytest.approx(eager["achieved"], abs=1e-3)


@pytest.mark.parametrize("theta", [1.0, 0.5])
def test_compiled_training_matches_eager_without_recompiling(theta: float) -> None:
    eager = _train(None, theta)
    compiled = _train("aot_eager", theta)
    # the thresholds really moved (the cubic schedule ramps), yet one graph served every step
    assert len(set(eager["thresholds"].tolist())) == STEPS
    assert compiled["frames"] == 1
    _assert_same_training(eager, compiled)


def test_the_recompile_counter_would_notice() -> None:
    """Control: a threshold held as a Python float (a guarded constant) does recompile."""

    class FloatThreshold(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.t = 0.1

        def forward(self, x: Tensor) -> Tensor:
            return fs.threshold(x, self.t)

    torch._dynamo.reset()
    module = FloatThreshold()
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(module, backend=counter)
    x = torch.randn(8)
    for t in (0.1, 0.2, 0.3):
        module.t = t
        compiled(x)
    assert counter.frame_count > 1


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("gcc") is None, reason="no C++")
def test_inductor_training_matches_eager() -> None:
    eager = _train(None)
    compiled = _train("inductor")
    assert compiled["frames"] == 1
    _assert_same_training(eager, compiled)


@guard(
    "`torch.compile(model)` (without `fullgraph=True`) of a model pruned with θ < 1",
    "one graph, no graph break (the backward's clamp read θ back from a tensor with "
    "`.item()`, and dynamo broke the graph at every pruned layer)",
)
@pytest.mark.parametrize("theta", [1.0, 0.5, 0.0])
def test_a_pruned_model_compiles_without_a_graph_break(theta: float) -> None:
    torch._dynamo.reset()
    model = conv1d_net()
    fs.Pruner(model, sparsity=0.8, total_steps=STEPS, theta=theta)
    explained = torch._dynamo.explain(lambda x: model(x).sum())(torch.randn(4, 2, 16))
    assert [str(b.reason) for b in explained.break_reasons] == []
    assert explained.graph_count == 1


@guard(
    "`torch.compile` of a function calling `fs.threshold(w, t)` with a tensor `t` that "
    "changes between calls",
    "one graph compiled once, equal to eager (reading `t` to check it broke the graph and "
    "recompiled for each new value; eager calls still check it)",
)
@pytest.mark.parametrize("p", [3.0, float("inf")])
def test_the_public_operator_compiles_once_for_moving_thresholds(p: float) -> None:
    torch._dynamo.reset()
    w = torch.randn(4096, generator=torch.Generator().manual_seed(0)).requires_grad_(True)

    def op(w: Tensor, t: Tensor) -> Tensor:
        return fs.threshold(w, t, p=p, theta=0.5)

    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(op, backend=counter)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for t in (0.5, 1.0, 1.5, 0.5):
            got = torch.autograd.grad(compiled(w, torch.tensor(t)).square().sum(), w)[0]
            want = torch.autograd.grad(op(w, torch.tensor(t)).square().sum(), w)[0]
            torch.testing.assert_close(got, want)
    assert counter.frame_count == 1
    with pytest.raises(ValueError, match="threshold"):
        op(w, torch.tensor(-1.0))  # eager: still checked
