"""Slips in the ONNX export, the sparse inference layers and ``create_model``.

Each test feeds one of the cases an exploratory test found mishandled (an
invalid ONNX file reported as written, float64 differences rounded to float32,
a layer at exactly ``min_sparsity`` left dense, a converted model that could
not be reloaded or copied, unclear messages) and checks the documented answer.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from _guards import guard
from feather_sparse import cli, export
from feather_sparse.export import export_onnx, save_sparse, verify_onnx
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
