"""Slips in the ONNX export, the sparse inference layers and ``create_model``.

Each test feeds one of the cases an exploratory test found mishandled (an
invalid ONNX file reported as written, float64 differences rounded to float32,
a layer at exactly ``min_sparsity`` left dense, a converted model that could
not be reloaded or copied, unclear messages) and checks the documented answer.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from _guards import guard
from _helpers import needs_safetensors
from feather_sparse import Pruner, cli, export
from feather_sparse.export import (
    SparseLinear,
    SparsePointwiseConv,
    export_onnx,
    inspect_sparse,
    load_sparse,
    save_sparse,
    to_sparse_inference,
    verify_onnx,
)
from feather_sparse.export.onnx import onnx_opset
from feather_sparse.models import create_model

pytestmark = pytest.mark.usefixtures("one_thread")


def small_net(dtype: torch.dtype = torch.float32) -> nn.Sequential:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(40, 16), nn.ReLU(), nn.Linear(16, 4))
    return net.to(dtype).eval()


def bf16_mlp() -> nn.Module:
    """A bfloat16 MLP with BatchNorm: torch's exporter stores a Gemm weight of it as float32."""
    torch.manual_seed(0)
    return create_model("mnist1d_mlp", hidden=[16]).to(torch.bfloat16).eval()


# ---------------------------------------------------------------------------
# 1. an ONNX file onnx.checker rejects is never written; onnxruntime failing is an error
# ---------------------------------------------------------------------------


@guard(
    "`export_onnx` of a bfloat16 model that torch's exporter writes as invalid ONNX",
    "`ValueError` naming `onnx.checker`'s complaint and a float32 copy; nothing written",
)
def test_an_export_onnx_checker_rejects_is_refused_and_not_written(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    path = tmp_path / "m.onnx"
    export_onnx(small_net(), path, torch.randn(2, 1, 40))  # a good file there already
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"onnx\.checker rejects .*nothing was written.*float32"):
        export_onnx(bf16_mlp(), path, torch.randn(2, 1, 40, dtype=torch.bfloat16))
    assert path.read_bytes() == before
    with pytest.raises(ValueError, match=r"onnx\.checker rejects"):
        export_onnx(bf16_mlp(), tmp_path / "new.onnx", torch.randn(2, 1, 40, dtype=torch.bfloat16))
    assert not (tmp_path / "new.onnx").exists()


def test_a_large_model_onnx_checker_rejects_is_removed_with_its_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    monkeypatch.setattr(export.onnx, "_large_model_bytes", lambda: 0)  # every model is large
    with pytest.raises(ValueError, match=r"onnx\.checker rejects .*\.data were removed"):
        export_onnx(bf16_mlp(), tmp_path / "m.onnx", torch.randn(2, 1, 40, dtype=torch.bfloat16))
    assert list(tmp_path.iterdir()) == []
    export_onnx(small_net(), tmp_path / "m.onnx", torch.randn(2, 1, 40))  # a valid one is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]


@guard(
    "`export --onnx` of a bfloat16 `.fsp` whose ONNX export is invalid",
    "exit 1, the error naming `onnx.checker`; no `.onnx` written",
)
@needs_safetensors
def test_cli_export_of_an_invalid_onnx_model_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    source = tmp_path / "bf16.fsp"
    save_sparse(bf16_mlp(), source)
    onnx_file = tmp_path / "bf16.onnx"
    assert cli.main(["export", str(source), "--onnx", str(onnx_file)]) == 1
    assert "onnx.checker rejects" in capsys.readouterr().err
    assert not onnx_file.exists()


@guard(
    "`export --onnx` writes a file onnxruntime (installed) cannot run",
    "exit 1, the error naming onnxruntime's complaint; not reported as unverified",
)
@needs_safetensors
def test_cli_onnxruntime_failing_on_the_file_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnx")
    source = tmp_path / "m.fsp"
    save_sparse(create_model("mnist1d_mlp", hidden=[8]), source)
    onnx_file = tmp_path / "m.onnx"

    def cannot_run(*_: object) -> None:
        raise ValueError(f"onnxruntime cannot run {onnx_file} (Type Error: bound to two types)")

    monkeypatch.setattr("feather_sparse.cli.export._verify_onnx", cannot_run)
    assert cli.main(["export", str(source), "--onnx", str(onnx_file)]) == 1
    out = capsys.readouterr()
    assert f"wrote {onnx_file}" in out.out and "not verified" not in out.out
    assert "onnxruntime cannot run" in out.err and "do not deploy it" in out.err


@needs_safetensors
def test_cli_without_onnxruntime_says_not_verified_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnx")
    source = tmp_path / "m.fsp"
    save_sparse(create_model("mnist1d_mlp", hidden=[8]), source)
    onnx_file = tmp_path / "m.onnx"
    real_import = export.onnx.importlib.import_module

    def no_onnxruntime(name: str, *args: object) -> object:
        if name == "onnxruntime":
            raise ImportError(name)
        return real_import(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(export.onnx.importlib, "import_module", no_onnxruntime)
    assert cli.main(["export", str(source), "--onnx", str(onnx_file)]) == 0
    assert "not verified: verifying ONNX needs onnxruntime" in capsys.readouterr().out


def test_a_missing_onnxruntime_kernel_is_told_apart(tmp_path: Path) -> None:
    """onnxruntime has no float64 Conv on CPU: a valid file it cannot verify, not a broken one."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv1d(1, 2, 3), nn.Flatten()).double().eval()
    x = torch.randn(2, 1, 8, dtype=torch.float64)
    path = tmp_path / "conv.onnx"
    export_onnx(net, path, x)
    with pytest.raises(export.onnx._NoKernel, match="onnxruntime cannot run"):
        verify_onnx(net, path, x)


# ---------------------------------------------------------------------------
# 2. verify_onnx measures float64 outputs in float64
# ---------------------------------------------------------------------------


def test_verify_onnx_measures_a_float64_difference_in_float64(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    net = small_net(torch.float64)
    x = torch.randn(3, 1, 40, dtype=torch.float64)
    path = tmp_path / "net.onnx"
    export_onnx(net, path, x)
    assert verify_onnx(net, path, x) < 1e-13
    other = copy.deepcopy(net)
    with torch.no_grad():
        other[3].bias.add_(1e-11)  # every output off by 1e-11: vanishes in float32
    assert verify_onnx(other, path, x) == pytest.approx(1e-11, rel=1e-2)


# ---------------------------------------------------------------------------
# 3. a layer with exactly min_sparsity zeros converts
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("numel_out", "zeros", "min_sparsity"), [(100, 93_000, 0.93), (10, 7, 0.7)]
)
def test_a_layer_at_exactly_min_sparsity_converts(
    numel_out: int, zeros: int, min_sparsity: float
) -> None:
    """1 - 7000/100000 is 0.9299999999999999 in floats: the zeros must be counted."""
    linear = nn.Linear(1000 if numel_out == 100 else 1, numel_out)
    with torch.no_grad():
        linear.weight.fill_(1.0)
        linear.weight.view(-1)[:zeros] = 0.0
    model = nn.Sequential(linear)
    converted = to_sparse_inference(model, min_sparsity=min_sparsity, min_weights=0)
    assert isinstance(converted[0], SparseLinear)
    with torch.no_grad():  # one zero fewer: below the threshold, stays dense
        linear.weight.view(-1)[0] = 1.0
    assert isinstance(
        to_sparse_inference(model, min_sparsity=min_sparsity, min_weights=0)[0], nn.Linear
    )


# ---------------------------------------------------------------------------
# 4. a converted model's state_dict loads into another converted model
# ---------------------------------------------------------------------------


def converted_mlp(seed: int) -> nn.Module:
    """``mnist1d_mlp`` pruned at 90 % (its own non-zeros per seed), BatchNorm moved, converted."""
    torch.manual_seed(seed)
    model = create_model("mnist1d_mlp", hidden=[64, 32])
    Pruner(model, sparsity=0.9, total_steps=1, max_layer_sparsity=0.95).finalize()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm1d):
                module.running_mean.normal_()
                module.bias.normal_()
    return to_sparse_inference(model.eval(), min_weights=0, min_sparsity=0.5)


def test_a_converted_state_dict_with_other_non_zeros_loads(tmp_path: Path) -> None:
    a, b = converted_mlp(0), converted_mlp(1)
    nnz = [m.nnz for m in a.modules() if isinstance(m, SparseLinear)]
    assert nnz != [m.nnz for m in b.modules() if isinstance(m, SparseLinear)]
    path = tmp_path / "sparse_state.pt"
    torch.save(a.state_dict(), path)
    b.load_state_dict(torch.load(path))
    x = torch.randn(5, 1, 40)
    with torch.no_grad():
        assert torch.equal(b(x), a(x))
    assert [m.nnz for m in b.modules() if isinstance(m, SparseLinear)] == nnz
    assert {
        m.weight_csr.crow_indices().dtype for m in b.modules() if isinstance(m, SparseLinear)
    } == {torch.int32}


def test_a_sparse_pointwise_conv_loads_other_non_zeros() -> None:
    def conv(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        layer = nn.Conv2d(8, 4, 1)
        with torch.no_grad():
            layer.weight[layer.weight.abs() < 0.3 + 0.05 * seed] = 0
        return to_sparse_inference(nn.Sequential(layer), min_sparsity=0.1, min_weights=0)

    a, b = conv(0), conv(1)
    assert isinstance(a[0], SparsePointwiseConv) and a[0].nnz != b[0].nnz
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 8, 3, 3)
    with torch.no_grad():
        assert torch.equal(b(x), a(x))


@guard(
    "`load_state_dict` into a converted model of a sparse weight of another shape",
    "`RuntimeError` naming the weight and both shapes; nothing of the model is loaded",
)
def test_a_refused_sparse_weight_leaves_the_model_unchanged() -> None:
    a, b = converted_mlp(0), converted_mlp(1)
    state = a.state_dict()
    state["fc.weight_csr"] = torch.ones(10, 16).to_sparse_csr()  # the last layer: loaded last
    x = torch.randn(5, 1, 40)
    with torch.no_grad():
        before = b(x)
    with pytest.raises(RuntimeError, match=r"fc\.weight_csr has shape \(10, 16\), the layer "):
        b.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(b(x), before)
    # a sparse layer loaded on its own refuses it too, through torch's error list
    fc = b.fc
    with pytest.raises(RuntimeError, match=r"weight_csr has shape \(10, 16\)"):
        fc.load_state_dict({"weight_csr": state["fc.weight_csr"], "bias_column": fc.bias_column})


# ---------------------------------------------------------------------------
# 5. a converted model deep-copies
# ---------------------------------------------------------------------------


def test_a_converted_model_deep_copies_and_converts_again() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(400, 200),
        nn.ReLU(),
        nn.Linear(200, 10),
        nn.Unflatten(1, (10, 1, 1)),
        nn.Conv2d(10, 6, 1),
    )
    Pruner(model, sparsity=0.95, total_steps=1).finalize()
    converted = to_sparse_inference(model.eval(), min_weights=1000)
    assert isinstance(converted[0], SparseLinear) and isinstance(converted[2], nn.Linear)
    twin = copy.deepcopy(converted)
    x = torch.randn(3, 400)
    with torch.no_grad():
        assert torch.equal(twin(x), converted(x))
    twin[0].weight_csr.values().zero_()  # its own tensors, not the original's
    with torch.no_grad():
        assert not torch.equal(twin(x), converted(x))
    more = to_sparse_inference(converted, min_weights=0, min_sparsity=0.0)  # deep-copies
    assert isinstance(more[2], SparseLinear) and isinstance(more[4], SparsePointwiseConv)
    assert isinstance(converted[2], nn.Linear)
    pointwise = copy.deepcopy(more)
    with torch.no_grad():
        assert torch.equal(pointwise(x), more(x))
        torch.testing.assert_close(more(x), model(x))


# ---------------------------------------------------------------------------
# 6. export_onnx of a converted model: one line naming the fix
# ---------------------------------------------------------------------------


@guard(
    "`export_onnx` of a model converted by `to_sparse_inference`",
    "one-line `ValueError` naming the sparse layer: export before converting; nothing written",
)
def test_export_onnx_of_a_converted_model_says_to_export_before_converting(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(400, 200), nn.ReLU(), nn.Linear(200, 10))
    Pruner(model, sparsity=0.95, total_steps=1).finalize()
    converted = to_sparse_inference(model.eval(), min_weights=1000)
    path = tmp_path / "c.onnx"
    with pytest.raises(ValueError, match=r"SparseLinear '0'.*before converting") as info:
        export_onnx(converted, path, torch.randn(2, 400))
    assert "\n" not in str(info.value)
    assert not path.exists()


# ---------------------------------------------------------------------------
# 7. export_onnx: the input's dtype and the opset named
# ---------------------------------------------------------------------------


@guard(
    "`export_onnx` with a float64 example input for a float32 model",
    "`ValueError` naming the input's dtype and the weights' (not the shape)",
)
def test_an_example_input_of_the_wrong_dtype_is_blamed_on_the_dtype(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    with pytest.raises(ValueError, match=r"dtype float64 .*weights are float32") as info:
        export_onnx(small_net(), tmp_path / "a.onnx", torch.randn(2, 1, 40, dtype=torch.float64))
    assert "shape" not in str(info.value)
    with pytest.raises(ValueError, match=r"shape \(2, 1, 41\)"):  # the shape, when it is the shape
        export_onnx(small_net(), tmp_path / "a.onnx", torch.randn(2, 1, 41))


@guard(
    "`export_onnx(opset=...)` given a string, a float or a bool",
    "`TypeError` naming `opset` and the value; nothing written",
)
@pytest.mark.parametrize("opset", ["abc", "18", 18.7, 18.0, True])
def test_an_opset_that_is_not_an_int_is_refused(opset: object, tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    with pytest.raises(TypeError, match=rf"opset must be an int.*got {re.escape(repr(opset))}"):
        export_onnx(small_net(), tmp_path / "b.onnx", torch.randn(2, 1, 40), opset=opset)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="opset must be an int"):
        onnx_opset(opset)  # type: ignore[arg-type]
    assert not (tmp_path / "b.onnx").exists()


def test_a_numpy_integer_opset_is_taken() -> None:
    pytest.importorskip("onnx")
    np = pytest.importorskip("numpy")
    assert onnx_opset(np.int64(18)) == 18


def test_a_wrong_dtype_and_a_wrong_shape_is_blamed_on_the_shape(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    with pytest.raises(ValueError, match=r"shape \(2, 1, 41\) and dtype float64"):
        export_onnx(small_net(), tmp_path / "a.onnx", torch.randn(2, 1, 41, dtype=torch.float64))


# ---------------------------------------------------------------------------
# 8. an ONNX model given where a .fsp is expected is named as one
# ---------------------------------------------------------------------------


@guard(
    "`inspect`, `inspect_sparse` or `load_sparse` given an intact ONNX model",
    "`ValueError` (CLI exit 1) saying it is an ONNX model, not a sparse checkpoint",
)
@needs_safetensors
def test_an_onnx_model_is_named_as_one_where_a_fsp_is_expected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnx")
    path = tmp_path / "model.onnx"
    export_onnx(small_net(), path, torch.randn(2, 1, 40))
    for read in (inspect_sparse, load_sparse):
        with pytest.raises(ValueError, match=r"is an ONNX model, not a sparse checkpoint") as info:
            read(path)
        assert "corrupted" not in str(info.value)
    assert cli.main(["inspect", str(path)]) == 1
    assert "is an ONNX model" in capsys.readouterr().err
    cut = tmp_path / "cut.onnx"  # a truncated one is not an ONNX model: the old message
    cut.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(ValueError, match="truncated or corrupted"):
        inspect_sparse(cut)


# ---------------------------------------------------------------------------
# 9. create_model records NumPy values and iterators as plain Python
# ---------------------------------------------------------------------------


@guard(
    "`create_model` given NumPy scalars or a one-shot iterator as options",
    "the spec records Python numbers and lists, so the `.fsp` keeps it and rebuilds the model",
)
@needs_safetensors
def test_create_model_records_numpy_values_and_iterators_as_plain_python(
    tmp_path: Path,
) -> None:
    np = pytest.importorskip("numpy")
    model = create_model("resnet20", num_classes=np.int64(10), width=np.int64(1))
    spec = model.feather_model_spec
    assert spec == {"name": "resnet20", "kwargs": {"num_classes": 10, "width": 1}}
    assert type(spec["kwargs"]["width"]) is int
    json.dumps(spec)
    path = tmp_path / "m.fsp"
    save_sparse(model, path)
    rebuilt = load_sparse(path)  # the spec was saved: no model needed
    assert rebuilt.feather_model_spec == spec

    mlp = create_model("mnist1d_mlp", hidden=iter([32, np.int32(16)]))
    assert mlp.feather_model_spec["kwargs"]["hidden"] == [32, 16]
    again = create_model(**{"name": "mnist1d_mlp", **mlp.feather_model_spec["kwargs"]})
    shapes = {k: v.shape for k, v in mlp.state_dict().items()}
    assert {k: v.shape for k, v in again.state_dict().items()} == shapes
    assert any(v == (16, 32) for v in shapes.values())  # the iterator reached the factory

    kept = create_model("mnist1d_mlp", hidden=(np.int64(8),))  # a tuple stays a tuple
    assert kept.feather_model_spec["kwargs"]["hidden"] == (8,)
    assert type(kept.feather_model_spec["kwargs"]["hidden"][0]) is int
