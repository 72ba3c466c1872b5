"""N:M export: the compact encoding round-trips bit-exactly, its size, semi-structured, ONNX."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import feather_sparse as fs
from _guards import guard
from _helpers import needs_safetensors
from _hypothesis import given, settings, st
from feather_sparse.nm import NMPattern, decode_nm, encode_nm, nm_encoded_bytes, nm_threshold
from feather_sparse.nm.export import _pack_bits, _unpack_bits

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits, so that -0.0 and +0.0 (and NaN payloads) differ."""
    return t.contiguous().view(torch.uint8)


def test_golden_encoding_2_4() -> None:
    w = torch.tensor([[0.0, -4.0, 3.0, 0.0, 0.5, 0.0, 0.0, 8.0]])
    values, indices = encode_nm(w, "2:4")
    assert values.tolist() == [[-4.0, 3.0], [0.5, 8.0]]
    # positions 1, 2, 0, 3 at 2 bits each, little-endian: 0b11_00_10_01
    assert indices.tolist() == [0b11001001]
    assert torch.equal(decode_nm(values, indices, w.shape, "2:4"), w)


@pytest.mark.parametrize("bits_", [1, 2, 3, 4, 5])
def test_bit_packing_round_trips(bits_: int) -> None:
    vals = torch.randint(0, 2**bits_, (37,))
    packed = _pack_bits(vals, bits_)
    assert packed.numel() == math.ceil(37 * bits_ / 8)
    assert torch.equal(_unpack_bits(packed, bits_, 37), vals)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([NMPattern(2, 4), NMPattern(1, 4), NMPattern(4, 8), NMPattern(3, 5)]),
    st.sampled_from(DTYPES),
    st.integers(1, 5),
    st.integers(0, 2**31 - 1),
    st.booleans(),
)
def test_round_trip_is_bit_exact(
    pattern: NMPattern, dtype: torch.dtype, rows: int, seed: int, coarse: bool
) -> None:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, 3, pattern.m, generator=gen)
    if coarse:  # ties, zeros and -0.0 among the kept values
        w = (w * 2).round() / 2
        w[w == 0] = -0.0
    w = nm_threshold(w.to(dtype), pattern, p=math.inf)  # pruned entries +0.0
    values, indices = encode_nm(w, pattern)
    out = decode_nm(values, indices, w.shape, pattern)
    assert out.dtype == dtype
    assert torch.equal(bits(out), bits(w))
    assert values.numel() * values.element_size() + indices.numel() == nm_encoded_bytes(
        w.numel(), pattern, dtype
    )


def test_groups_with_fewer_nonzeros_and_all_zero() -> None:
    # the stored zeros are the first ones: a -0.0 there comes back as it was
    w = torch.tensor([[0.0, 0.0, 0.0, 0.0], [-0.0, 0.0, 0.0, 2.0]])
    values, indices = encode_nm(w, "2:4")
    out = decode_nm(values, indices, w.shape, "2:4")
    assert torch.equal(bits(out), bits(w))


def test_encoding_errors() -> None:
    with pytest.raises(ValueError, match=r"more than 2 nonzeros.*finalize"):
        encode_nm(torch.tensor([[1.0, 2.0, 3.0, 0.0]]), "2:4")
    with pytest.raises(ValueError, match=r"-0\.0"):
        encode_nm(torch.tensor([[1.0, 2.0, -0.0, 0.0]]), "2:4")
    values, indices = encode_nm(torch.tensor([[1.0, 2.0, 0.0, 0.0]]), "2:4")
    with pytest.raises(ValueError, match="do not fit"):
        decode_nm(values, indices, (2, 4), "2:4")


@guard(
    "`decode_nm` with in-group positions out of range or repeated (corrupted indices)",
    "`ValueError` naming the group and what a valid encoding holds; no tensor returned",
)
def test_corrupted_indices_are_refused() -> None:
    w = torch.tensor([[0.0, -4.0, 3.0, 0.0, 0.5, 0.0, 0.0, 8.0]])
    values, _ = encode_nm(w, "2:4")
    for positions, group in (([1, 1, 0, 3], 0), ([1, 2, 3, 0], 1)):  # repeated; decreasing
        indices = _pack_bits(torch.tensor(positions), 2)
        with pytest.raises(ValueError, match=rf"group {group} has in-group positions"):
            decode_nm(values, indices, w.shape, "2:4")
    # 2:3 stores 2-bit positions: 3 is out of its group (it used to raise an IndexError)
    indices = torch.full((2,), 255, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"\[3, 3\].*2 different positions below 3"):
        decode_nm(torch.ones(4, 2), indices, (4, 3), "2:3")


def test_size_against_dense() -> None:
    numel = 1 << 20
    # 2:4: half the values plus 2 bits per kept value
    assert nm_encoded_bytes(numel, "2:4", torch.float16) == numel // 2 * 2 + numel // 2 // 4
    # 1.125 bytes per weight in fp16, 2.125 in fp32
    assert nm_encoded_bytes(numel, "2:4", torch.float16) / (2 * numel) == 0.5625
    assert nm_encoded_bytes(numel, "2:4", torch.float32) / (4 * numel) == 0.53125
    # 1:4 fp16: a quarter of the values, 2 bits each: 0.25·2 + 0.25/4 = 0.5625 bytes per weight
    assert nm_encoded_bytes(numel, "1:4", torch.float16) / (2 * numel) == 0.28125
    # 4:8: 3-bit positions
    assert nm_encoded_bytes(numel, "4:8", torch.float16) == numel // 2 * 2 + numel // 2 * 3 // 8


def test_finalized_model_round_trips() -> None:
    model = fs.create_model("mnist1d_mlpmixer")
    pruner = fs.Pruner(model, pattern="2:4")
    pruner.finalize()
    for name, w in model.state_dict().items():
        if name.endswith("weight") and w.dim() == 2:
            values, indices = encode_nm(w, "2:4")
            assert torch.equal(bits(decode_nm(values, indices, w.shape, "2:4")), bits(w)), name


# ------------------------------------------------------------------- semi-structured
@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the message shown without CUDA")
@guard(
    "`fs.to_semi_structured` without a CUDA GPU",
    "`RuntimeError`: needs a CUDA GPU; keep the dense N:M weights or `encode_nm`/`.fsp`",
)
def test_to_semi_structured_without_cuda_says_why() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64))
    with pytest.raises(RuntimeError, match=r"needs a CUDA GPU.*encode_nm"):
        fs.to_semi_structured(model)


@guard(
    "`fs.to_semi_structured` with a Pruner attached or float32/CPU layers",
    "`RuntimeError`: call pruner.finalize() first; `ValueError`: model.half().cuda()",
)
def test_to_semi_structured_checks_before_converting(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a GPU present (pretended here), an attached Pruner and a float32 CPU
    layer are refused with messages naming the layer and the fix, and nothing is touched."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    pruner = fs.Pruner(model, pattern="2:4")
    with pytest.raises(RuntimeError, match=r"layer '0' still has a Pruner attached.*finalize"):
        fs.to_semi_structured(model)
    pruner.finalize()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"layer '0' is torch.float32 on cpu.*half\(\)\.cuda\(\)"):
        fs.to_semi_structured(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.gpu
def test_to_semi_structured_on_cuda() -> None:
    major, _ = torch.cuda.get_device_capability()
    if major < 8:
        pytest.skip("semi-structured sparsity needs compute capability 8.0 or newer")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 6))
    pruner = fs.Pruner(model, pattern="2:4")
    with pytest.raises(RuntimeError, match="finalize"):
        fs.to_semi_structured(model.half().cuda())
    pruner.finalize()
    model = model.half().cuda().eval()
    x = torch.randn(64, 128, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        dense = model(x)
        converted = fs.to_semi_structured(model)
        assert converted == ["0"]  # the 6-row classifier is below the kernels' minimum shape
        sparse = model(x)
    assert type(model[0].weight).__name__.startswith("SparseSemiStructured")
    torch.testing.assert_close(sparse, dense, rtol=1e-2, atol=1e-2)


# ------------------------------------------------------------------- ONNX
def test_onnx_export_of_an_nm_model(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")  # the legacy exporter cannot export the Mixer's unfold
    model = fs.create_model("mnist1d_mlpmixer")
    fs.Pruner(model, pattern="2:4").finalize()
    model.eval()
    path = tmp_path / "nm.onnx"
    fs.export_onnx(model, path, torch.randn(2, 1, 40))
    from feather_sparse.export import verify_onnx

    assert verify_onnx(model, path, torch.randn(5, 1, 40)) < 1e-4


@needs_safetensors
def test_a_float64_subnormal_is_stored_not_mistaken_for_a_zero(tmp_path: Path) -> None:
    """float64 ranking keys drop the lowest bits; the encoding keeps every nonzero anyway."""
    w = torch.tensor([[1.0, 0.0, 0.0, 5e-324], [0.0, 0.0, 2.0, 0.0]], dtype=torch.float64)
    values, indices = encode_nm(w, "2:4")
    decoded = decode_nm(values, indices, w.shape, "2:4")
    assert torch.equal(decoded.view(torch.int64), w.view(torch.int64))
    model = torch.nn.Linear(4, 2, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(w)
    fs.save_sparse(model, tmp_path / "m.fsp")
    back = torch.nn.Linear(4, 2, bias=False).double()
    fs.load_sparse(tmp_path / "m.fsp", back)
    assert torch.equal(back.weight.view(torch.int64), w.view(torch.int64))


@guard(
    "ONNX export of an N:M model whose Pruner is still attached (the legacy exporter)",
    "exported as its forward computes now, the pruned weights as plain ones; onnxruntime "
    "matches the model",
)
def test_onnx_export_with_an_nm_pruner_attached_exports_the_pruned_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from feather_sparse.export import onnx as onnx_export

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    fs.Pruner(model, pattern="2:4")
    # the legacy exporter (where onnxscript is missing) cannot trace the parametrization
    monkeypatch.setattr(onnx_export, "_onnx_exporter", lambda: ("legacy", 20))
    fs.export_onnx(model, tmp_path / "m.onnx", torch.randn(4, 16))
    assert fs.export.verify_onnx(model, tmp_path / "m.onnx", torch.randn(3, 16)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_nan_payloads_survive_the_encoding_bit_for_bit(dtype: torch.dtype) -> None:
    """decode_nm moves bit patterns: a bfloat16 scatter on CPU would rewrite a NaN."""
    w = nm_threshold(torch.randn(2, 8, generator=torch.Generator().manual_seed(0)), "2:4")
    w = w.to(dtype)
    kept = w.reshape(-1).nonzero().reshape(-1)
    w.view(-1)[kept[0]] = float("nan")
    w.view(-1)[kept[1]] = -float("nan")
    values, indices = encode_nm(w, "2:4")
    back = decode_nm(values, indices, w.shape, "2:4")
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[w.element_size()]
    assert torch.equal(back.view(ints), w.view(ints))
