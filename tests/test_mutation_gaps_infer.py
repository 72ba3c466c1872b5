"""Tests that kill the surviving mutants of sparse inference and the N:M export.

See docs/mutation-audit.md, "Sparse inference and the N:M export": each test
asserts the documented contract (the docstrings of ``export/inference.py`` and
``nm/export.py``) or an independent computation, never the code's current output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensorMode

import feather_sparse as fs
from feather_sparse.export import inference
from feather_sparse.export.inference import SparseLinear, SparsePointwiseConv, to_sparse_inference
from feather_sparse.nm import NMPattern, decode_nm, encode_nm, nm_encoded_bytes
from feather_sparse.nm import export as nm_export

M = TypeVar("M", bound=nn.Module)


def zeros_first(module: M, zeros: int) -> M:
    """Exactly ``zeros`` zeros in the weight (the first ones in memory order), the rest nonzero."""
    torch.manual_seed(0)
    with torch.no_grad():
        w = module.weight
        assert isinstance(w, Tensor)
        w.copy_(torch.rand_like(w) + 0.5)
        w.view(-1)[:zeros] = 0
    return module


def sparse_layers(model: nn.Module) -> list[str]:
    return [
        n for n, m in model.named_modules() if isinstance(m, SparseLinear | SparsePointwiseConv)
    ]


# --- the CSR layers ------------------------------------------------------------------


def test_sparse_linear_keeps_the_bias_it_was_built_with() -> None:
    """inf03: the layer is a snapshot of the dense one, bias and weight alike."""
    torch.manual_seed(0)
    linear = nn.Linear(6, 4)
    weight, bias = linear.weight.detach().clone(), linear.bias.detach().clone()
    sparse = SparseLinear.from_dense(linear)
    with torch.no_grad():
        linear.bias.add_(10.0)  # the dense layer trains on
        linear.weight.add_(10.0)
    x = torch.randn(3, 6)
    torch.testing.assert_close(sparse(x), x @ weight.t() + bias)


# --- which layers qualify --------------------------------------------------------------


def test_grouped_pointwise_convolutions_stay_dense() -> None:
    """inf07: "a 1×1 kernel, no padding and one group"."""
    conv = zeros_first(nn.Conv2d(64, 64, 1, groups=2), 2000)
    converted = to_sparse_inference(nn.Sequential(conv), min_sparsity=0.5, min_weights=0)
    assert type(converted.get_submodule("0")) is nn.Conv2d
    with pytest.raises(ValueError, match="single-group"):
        SparsePointwiseConv.from_dense(conv)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_layers_stay_dense(dtype: torch.dtype) -> None:
    """inf09: "a float32/float64 weight"."""
    model = nn.Sequential(zeros_first(nn.Linear(32, 32), 1000)).to(dtype)
    assert sparse_layers(to_sparse_inference(model, min_sparsity=0.5, min_weights=0)) == []
    model64 = nn.Sequential(zeros_first(nn.Linear(32, 32), 1000)).double()
    assert sparse_layers(to_sparse_inference(model64, min_sparsity=0.5, min_weights=0)) == ["0"]


def test_a_layer_of_exactly_min_weights_weights_converts() -> None:
    """inf10: "at least ``min_weights`` entries" (10 × 10 = 100)."""
    model = nn.Sequential(zeros_first(nn.Linear(10, 10), 95))
    assert sparse_layers(to_sparse_inference(model, min_sparsity=0.9, min_weights=100)) == ["0"]
    assert sparse_layers(to_sparse_inference(model, min_sparsity=0.9, min_weights=101)) == []


def test_a_layer_at_exactly_min_sparsity_converts() -> None:
    """inf11: "at least ``min_sparsity`` exact zeros" (50 of 100 at 0.5)."""
    model = nn.Sequential(zeros_first(nn.Linear(10, 10), 50))
    assert sparse_layers(to_sparse_inference(model, min_sparsity=0.5, min_weights=0)) == ["0"]
    assert sparse_layers(to_sparse_inference(model, min_sparsity=0.51, min_weights=0)) == []


# --- the timed decision -----------------------------------------------------------------


def fake_timings(sparse_s: float, dense_s: float) -> Callable[..., float]:
    """A stand-in for ``_median_seconds``: fixed times for the sparse and the dense call."""

    def median_seconds(fn: Any, repeats: int, device: torch.device) -> float:
        fn()
        return sparse_s if isinstance(fn.func, SparseLinear) else dense_s

    return median_seconds


@pytest.mark.parametrize(("sparse_s", "dense_s", "converts"), [(1.0, 2.0, True), (2.0, 1.0, False)])
def test_the_timed_decision_converts_only_where_sparse_is_faster(
    monkeypatch: pytest.MonkeyPatch, sparse_s: float, dense_s: float, converts: bool
) -> None:
    """inf14: "converted only if sparse is faster"; inf16: no timing hook stays behind."""
    monkeypatch.setattr(inference, "_median_seconds", fake_timings(sparse_s, dense_s))
    model = nn.Sequential(zeros_first(nn.Linear(16, 16), 250)).eval()
    x = torch.randn(4, 16)
    converted = to_sparse_inference(model, min_weights=0, example_input=x)
    assert sparse_layers(converted) == (["0"] if converts else [])
    for m in list(converted.modules()) + list(model.modules()):
        assert not m._forward_pre_hooks, f"a timing hook stayed on {m}"


def test_a_layer_the_example_input_does_not_reach_stays_dense(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """inf15: with ``example_input`` only measured layers convert; an unused one is not."""
    monkeypatch.setattr(inference, "_median_seconds", fake_timings(1.0, 2.0))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = zeros_first(nn.Linear(16, 16), 250)
            self.unused = zeros_first(nn.Linear(16, 16), 250)

        def forward(self, x: Tensor) -> Tensor:
            return self.used(x)

    converted = to_sparse_inference(Net(), min_weights=0, example_input=torch.randn(2, 16))
    assert sparse_layers(converted) == ["used"]


# --- argument checks ---------------------------------------------------------------------


def test_repeats_and_min_sparsity_are_checked() -> None:
    """inf18, inf19: "``repeats < 1``" is a ValueError; a bool is not a number here."""
    with pytest.raises(ValueError, match="repeats"):
        to_sparse_inference(nn.Linear(2, 2), repeats=0)
    with pytest.raises(TypeError, match="min_sparsity"):
        to_sparse_inference(nn.Linear(2, 2), min_sparsity=True)


# --- encode_nm / decode_nm / nm_encoded_bytes ----------------------------------------


def test_a_group_with_more_than_n_nonzeros_is_refused_even_when_the_total_fits() -> None:
    """inf22: three nonzeros in one group and one in the next still break 2:4."""
    w = torch.tensor([[1.0, 2.0, 3.0, 0.0, 4.0, 0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match=r"group 0 .* more than 2 nonzeros"):
        encode_nm(w, "2:4")


def test_decode_refuses_a_shape_whose_size_is_not_groups_of_m() -> None:
    """inf23: 17 weights do not split into groups of 4 (the 4 groups of 16 would fit)."""
    values, indices = encode_nm(torch.zeros(2, 8), "2:4")
    with pytest.raises(ValueError, match="do not fit"):
        decode_nm(values, indices, (17,), "2:4")


def test_decode_refuses_too_few_index_bytes() -> None:
    """inf24: 4 groups × 2 positions × 2 bits need 2 bytes; 1 is too few."""
    values, indices = encode_nm(torch.zeros(2, 8), "2:4")
    assert indices.numel() == 2
    with pytest.raises(ValueError, match="too few"):
        decode_nm(values, indices[:1], (2, 8), "2:4")


def test_decode_refuses_a_position_equal_to_m() -> None:
    """inf25: with m = 3 a 2-bit position can read 3, one past the group."""
    pattern = NMPattern.parse("1:3")
    packed = nm_export._pack_bits(torch.tensor([0, 3]), pattern.index_bits)
    with pytest.raises(ValueError, match="corrupted"):
        decode_nm(torch.ones(2, 1), packed, (2, 3), pattern)


@pytest.mark.parametrize(
    ("shape", "pattern"), [((1, 4), "1:4"), ((3, 8), "2:4"), ((5, 3), "1:3"), ((2, 16), "3:8")]
)
def test_the_encoded_size_is_what_encode_writes(shape: tuple[int, int], pattern: str) -> None:
    """inf28: nm_encoded_bytes counts the bytes encode_nm returns, a partial byte included."""
    w = torch.zeros(shape)
    values, indices = encode_nm(w, pattern)
    written = values.numel() * values.element_size() + indices.numel()
    assert nm_encoded_bytes(w.numel(), pattern, w.dtype) == written


# --- to_semi_structured: which layers, what the kernels get --------------------------


def pretend_gpu_layers(
    monkeypatch: pytest.MonkeyPatch, weights: list[Tensor], dtype: torch.dtype = torch.float16
) -> tuple[nn.Sequential, list[tuple[tuple[int, ...], bool]]]:
    """Linear layers with fake CUDA weights (no data) whose values ``group_view`` reads from
    ``weights``, and a stand-in kernel class that records what ``from_dense`` is handed
    (shape, contiguous) and refuses 24-row weights as the kernels refuse some shapes."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    values: dict[int, Tensor] = {}
    layers = []
    for w in weights:
        layer = nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
        with FakeTensorMode():
            layer.weight = nn.Parameter(torch.empty(w.shape, device="cuda", dtype=dtype))
        values[id(layer.weight)] = w
        layers.append(layer)
    monkeypatch.setattr(nm_export, "group_view", lambda w, p: values[id(w)].reshape(-1, p.m))
    handed: list[tuple[tuple[int, ...], bool]] = []

    class Kernels:
        @staticmethod
        def from_dense(w: Tensor) -> Tensor:
            handed.append((tuple(w.shape), w.is_contiguous()))
            if w.shape[0] == 24:
                raise ValueError("shape not supported")  # as the kernels say for some shapes
            return torch.zeros(())

    monkeypatch.setattr(nm_export, "_semi_structured_backend", lambda device=None: Kernels)
    return nn.Sequential(*layers), handed


def test_to_semi_structured_converts_only_2_4_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """inf29: a 3:4 layer stays dense ("at most 2 nonzeros in each group of 4")."""
    two = torch.tensor([[1.0, 2.0, 0.0, 0.0] * 2] * 8)
    three = torch.tensor([[1.0, 2.0, 3.0, 0.0] * 2] * 8)
    model, handed = pretend_gpu_layers(monkeypatch, [two, three])
    assert fs.to_semi_structured(model) == ["0"]
    assert handed == [((8, 8), True)]


@pytest.mark.gpu
def test_to_semi_structured_converts_a_transposed_weight() -> None:
    """inf33: the kernels take a contiguous weight; a transposed 2:4 one is made contiguous
    first and converted (not left dense). Needs a GPU of compute capability 8.0 or newer."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("semi-structured sparsity needs compute capability 8.0 or newer")
    w = torch.tensor([[1.0, 0.0, 2.0, 0.0] * 32] * 128, dtype=torch.float16, device="cuda")
    layer = nn.Linear(128, 128, bias=False).half().cuda()
    layer.weight = nn.Parameter(w.t().contiguous().t())  # the same values, column-major
    assert not layer.weight.is_contiguous()
    x = torch.randn(64, 128, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        assert fs.to_semi_structured(nn.Sequential(layer)) == ["0"]
        torch.testing.assert_close(layer(x), x @ w.t(), rtol=1e-2, atol=1e-2)


def test_to_semi_structured_keeps_a_shape_the_kernels_refuse_dense(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """inf32: a shape the kernels do not support stays dense (ValueError or RuntimeError)."""
    ok = torch.tensor([[1.0, 0.0, 2.0, 0.0] * 2] * 8)
    refused = torch.tensor([[1.0, 0.0, 2.0, 0.0] * 2] * 24)
    model, handed = pretend_gpu_layers(monkeypatch, [refused, ok])
    assert fs.to_semi_structured(model) == ["1"]
    assert [shape for shape, _ in handed] == [(24, 8), (8, 8)]


def test_to_semi_structured_refuses_float32_cuda_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """inf30: "float16 or bfloat16 weights on CUDA"; a float32 CUDA weight is refused."""
    model, handed = pretend_gpu_layers(
        monkeypatch, [torch.tensor([[1.0, 0.0, 2.0, 0.0]] * 8)], dtype=torch.float32
    )
    with pytest.raises(ValueError, match=r"layer '0' is torch.float32 on cuda"):
        fs.to_semi_structured(model)
    assert handed == []


def test_a_nan_after_a_zero_is_stored() -> None:
    """inf20: a NaN is a value, not a zero: stored and restored bit for bit, wherever it sits."""
    w = torch.tensor([[1.0, 0.0, float("nan"), 0.0]])
    values, indices = encode_nm(w, "2:4")
    out = decode_nm(values, indices, w.shape, "2:4")
    assert torch.equal(out.view(torch.int32), w.view(torch.int32))


def test_to_semi_structured_keeps_two_layers_that_share_a_weight_tied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two Linear layers holding one weight get one sparse weight, converted once (they
    got a copy each, and the tie was gone)."""
    w = torch.tensor([[1.0, 2.0, 0.0, 0.0] * 2] * 8)
    model, handed = pretend_gpu_layers(monkeypatch, [w])
    tied = nn.Linear(8, 8, bias=False, device="meta")
    tied.weight = model[0].weight
    model.append(tied)
    assert fs.to_semi_structured(model) == ["0", "1"]
    assert handed == [((8, 8), True)]  # converted once
    assert model[0].weight is model[1].weight
