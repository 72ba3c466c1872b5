"""Mixed precision: autocast training works with Feather, and the threshold is selected on
the fp32 master weights (the parameters), never on the half-precision copies autocast makes.

bf16 autocast runs on CPU; fp16 autocast with a ``GradScaler`` needs CUDA (``gpu`` marker).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import feather_sparse as fs
from _helpers import conv1d_net
from feather_sparse.selection import select_threshold

STEPS = 12
SPARSITY = 0.7


class SpyBackbone(fs.GlobalBackbone):
    """The global backbone, recording the dtypes of the weights it selects on."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.dtype] = []

    def thresholds(self, weights: Sequence[Tensor], sparsity: float) -> list[Tensor]:
        self.seen.extend(w.dtype for w in weights)
        return super().thresholds(weights, sparsity)


def _model(device: str) -> nn.Module:
    return conv1d_net(seed=0, hidden=64).to(device)


def _train(device: str, dtype: torch.dtype | None) -> dict[str, Any]:
    """Overfit one fixed batch; ``dtype=None`` is plain fp32."""
    model = _model(device)
    spy = SpyBackbone()
    pruner = fs.Pruner(model, sparsity=SPARSITY, total_steps=STEPS, backbone=spy)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    scaler = torch.amp.GradScaler(device, enabled=dtype == torch.float16)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 2, 16, generator=g).to(device)
    y = torch.randint(0, 4, (32,), generator=g).to(device)
    losses, out_dtypes = [], set()
    for _ in range(STEPS):
        with torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y)
        out_dtypes.add(logits.dtype)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        pruner.step()
        losses.append(float(loss.detach()))
    weights = [w.detach() for w in pruner.weights()]
    return {
        "losses": losses,
        "out_dtypes": out_dtypes,
        "seen": set(spy.seen),
        "param_dtypes": {p.dtype for p in model.parameters()},
        "threshold": pruner.thresholds()[0].clone(),
        "threshold_dtypes": {t.dtype for t in pruner.thresholds()},
        "weights": weights,
        "pruned": sum(int((w.abs() <= pruner.thresholds()[0]).sum()) for w in weights),
        "numel": pruner.num_params,
    }


def _check_mixed(run: dict[str, Any], reference: dict[str, Any], half: torch.dtype) -> None:
    assert run["out_dtypes"] == {half}  # autocast really computed in half precision
    assert run["seen"] == {torch.float32}  # ...but selection saw the fp32 masters
    assert run["param_dtypes"] == {torch.float32}
    assert run["threshold_dtypes"] == {torch.float32}
    # The threshold is the exact fp32 selection: exactly round(S·N) weights pruned.
    assert torch.equal(run["threshold"], select_threshold(run["weights"], SPARSITY))
    assert run["pruned"] == round(SPARSITY * run["numel"])
    losses = run["losses"]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.7 * losses[0]  # it trains
    # Close to fp32 training at half precision's resolution.
    assert losses == pytest.approx(reference["losses"], rel=0.05, abs=0.02)


def test_bf16_autocast_on_cpu_selects_on_fp32_masters() -> None:
    reference = _train("cpu", None)
    run = _train("cpu", torch.bfloat16)
    _check_mixed(run, reference, torch.bfloat16)
    # half-precision copies would have given another threshold (a rounded one)
    rounded = select_threshold([w.bfloat16() for w in run["weights"]], SPARSITY)
    assert not torch.equal(rounded.float(), run["threshold"])


@pytest.mark.gpu
def test_fp16_autocast_with_grad_scaler_on_cuda() -> None:
    reference = _train("cuda", None)
    run = _train("cuda", torch.float16)
    _check_mixed(run, reference, torch.float16)


def test_half_precision_weights_get_fp32_thresholds() -> None:
    """Without masters (a model cast to bf16), selection and thresholds still run in fp32."""
    model = _model("cpu").to(torch.bfloat16)
    spy = SpyBackbone()
    pruner = fs.Pruner(model, sparsity=SPARSITY, total_steps=STEPS, backbone=spy)
    x = torch.randn(4, 2, 16, dtype=torch.bfloat16)
    model(x).float().sum().backward()
    pruner.step()
    assert spy.seen and set(spy.seen) == {torch.bfloat16}
    assert {t.dtype for t in pruner.thresholds()} == {torch.float32}
    assert pruner.sparsity_achieved() >= pruner.scheduled_sparsity()
