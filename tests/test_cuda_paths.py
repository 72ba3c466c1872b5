"""CUDA-only branches, exercised on a machine without a GPU.

What the GPU decides (its compute capability, whether torch has cuSPARSELt)
is stood in for with ``monkeypatch``, and weights "on the GPU" are fake
tensors (``FakeTensorMode``: a device and a dtype, no data), so these checks
run wherever the CPU suite runs. They guard the first minutes of a lent GPU:
a branch that would fail there is found here, before its time is spent.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.sparse import SparseSemiStructuredTensorCUSPARSELT, SparseSemiStructuredTensorCUTLASS

import feather_sparse as fs
from _guards import guard
from _helpers import script_module, straight_and_resumed, tiny_config, tiny_run
from feather_sparse.nm import export as nm_export
from feather_sparse.nm.export import _semi_structured_backend

ROOT = Path(__file__).resolve().parents[1]


def pretend_gpu(
    monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], cusparselt: bool
) -> None:
    """torch sees one CUDA GPU of ``capability``, with or without cuSPARSELt."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.backends.cusparselt, "is_available", lambda: cusparselt)


def fake_linear(in_features: int, out_features: int) -> nn.Linear:
    """An ``nn.Linear`` whose float16 weight and bias are fake CUDA tensors (inside a
    ``FakeTensorMode``; ``.to("cuda")`` and the init kernels would need CUDA)."""
    layer = nn.Linear(in_features, out_features, device="meta")
    half = torch.float16
    layer.weight = nn.Parameter(torch.empty(out_features, in_features, device="cuda", dtype=half))
    layer.bias = nn.Parameter(torch.empty(out_features, device="cuda", dtype=half))
    return layer


@pytest.mark.parametrize(
    ("capability", "cusparselt", "backend"),
    [
        ((8, 0), True, SparseSemiStructuredTensorCUSPARSELT),  # A100
        ((9, 0), True, SparseSemiStructuredTensorCUSPARSELT),  # H100, H200
        ((8, 6), False, SparseSemiStructuredTensorCUTLASS),  # an Ampere card, torch without it
    ],
    ids=["a100", "h100", "ampere-without-cusparselt"],
)
def test_the_semi_structured_kernels_are_cusparselt_else_cutlass_on_8x(
    monkeypatch: pytest.MonkeyPatch,
    capability: tuple[int, int],
    cusparselt: bool,
    backend: type,
) -> None:
    pretend_gpu(monkeypatch, capability, cusparselt)
    assert _semi_structured_backend() is backend


@guard(
    "`fs.to_semi_structured` on a GPU no semi-structured kernel runs on: below compute "
    "capability 8.0, or a torch without cuSPARSELt on a GPU other than 8.x (an H100)",
    "`RuntimeError` naming the capability and the fix, before any layer changes (CUTLASS's "
    "kernels are built for 8.x only: the converted model failed at its next forward)",
)
@pytest.mark.parametrize(
    ("capability", "cusparselt", "message"),
    [
        ((9, 0), False, r"compute capability 9\.0\) needs cuSPARSELt.*built without cuSPARSELt"),
        ((7, 5), True, r"compute capability 7\.5\) has no sparse tensor cores"),
    ],
    ids=["hopper-without-cusparselt", "turing"],
)
def test_to_semi_structured_refuses_a_gpu_without_kernels_and_keeps_the_model(
    monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], cusparselt: bool, message: str
) -> None:
    pretend_gpu(monkeypatch, capability, cusparselt)

    def too_soon(*args: object) -> None:  # a fake tensor's kernels cannot run on the CPU build
        raise AssertionError("the weights were read before the GPU was checked")

    monkeypatch.setattr(nm_export, "group_view", too_soon)
    with FakeTensorMode():
        model = nn.Sequential(fake_linear(128, 256), fake_linear(256, 64))
        weights = [model[0].weight, model[1].weight]
        with pytest.raises(RuntimeError, match=message):
            fs.to_semi_structured(model)
    assert [model[0].weight, model[1].weight] == weights  # the same Parameters, untouched
    assert all(type(w) is not SparseSemiStructuredTensorCUTLASS for w in weights)


def test_forcing_cutlass_on_a_hopper_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    pretend_gpu(monkeypatch, (9, 0), cusparselt=True)
    monkeypatch.setattr(torch.sparse.SparseSemiStructuredTensor, "_FORCE_CUTLASS", True)
    with pytest.raises(RuntimeError, match=r"_FORCE_CUTLASS set: unset it"):
        _semi_structured_backend()


@pytest.fixture
def bench_nm_linear() -> Iterator[ModuleType]:
    path = ROOT / "benchmarks" / "bench_nm_linear_gpu.py"
    with script_module(path, "_bench_nm_linear_gpu_under_test") as module:
        yield module


def test_the_semi_structured_benchmark_stops_first_where_no_kernel_runs(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    bench_nm_linear: ModuleType,
) -> None:
    """The runbook's nm-linear part exits 1 with the reason, before it allocates anything
    on the GPU (without cuSPARSELt an H100 failed in the first shape's sparse forward)."""
    pretend_gpu(monkeypatch, (9, 0), cusparselt=False)
    monkeypatch.setattr(sys, "argv", ["bench_nm_linear_gpu.py", "--dtype", "float16"])
    assert bench_nm_linear.main() == 1
    err = capsys.readouterr().err
    assert "bench_nm_linear_gpu: this GPU (compute capability 9.0) needs cuSPARSELt" in err


@contextlib.contextmanager
def global_kernel_settings_kept() -> Iterator[None]:
    """Restores torch's deterministic-algorithms mode and cuDNN's flags on exit, so that
    the gpu tests after a training run meet the defaults."""
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
    )
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[2:]


@pytest.mark.gpu
@pytest.mark.parametrize("amp", [None, "float16", "bfloat16"], ids=["fp32", "fp16", "bf16"])
def test_training_on_cuda_resumes_bit_identically(tmp_path: Path, amp: str | None) -> None:
    """``feather-sparse train --device cuda`` (fp32, fp16 autocast with its loss scaler,
    bf16 autocast without one) stopped after 2 of 4 epochs and resumed from the command
    line ends where the uninterrupted run does. With ``deterministic = true``
    (deterministic cuDNN kernels, no autotuning; the runbook sets cuBLAS's workspace) a
    difference is a finding: a state the checkpoint misses on CUDA (an RNG, the loss
    scaler), or a kernel that is not deterministic after all."""
    config = tiny_config(
        tiny_run(train_size=512, test_size=128, eval_batch_size=128),
        epochs=4,
        device="cuda",
        deterministic=True,
        amp=amp is not None,
        amp_dtype=amp or "bfloat16",
    )
    with global_kernel_settings_kept():  # train() sets them for the whole process
        straight, half, a, b = straight_and_resumed(config, tmp_path)
    assert straight.completed and half.epochs == 2
    assert a["step"] == b["step"] == 32
    assert (a["scaler"] is not None) == (amp == "float16")  # bf16 needs no loss scaling
    for key, value in a["model"].items():
        assert value.device.type == "cpu"  # a checkpoint loads on a machine without a GPU
        assert torch.equal(value, b["model"][key]), key
    for x, y in zip(a["pruner"]["thresholds"], b["pruner"]["thresholds"], strict=True):
        assert torch.equal(x, y)
