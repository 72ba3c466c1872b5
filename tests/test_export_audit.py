"""Export fixes found by an audit: dtypes kept, other files never replaced, atomic ONNX,
compiled and changed models, command-line options checked before anything is written."""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import _helpers
from _guards import guard
from _helpers import needs_safetensors
from feather_sparse import Pruner, cli, export
from feather_sparse.export import export_onnx, inspect_sparse, load_sparse, save_sparse
from feather_sparse.export.run import PatternSparsityError, load_export_source
from feather_sparse.integrity import DiskFullError
from feather_sparse.models import create_model

pytestmark = pytest.mark.usefixtures("one_thread")


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes, so that -0.0, +0.0 and NaN payloads differ."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_bit_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert torch.equal(bits(a[name]), bits(b[name])), f"{name} differs"


def pruned_cnn(dtype: torch.dtype = torch.float32) -> nn.Module:
    """The bundled 1-D CNN at a quarter width, 80 % of each layer's weights zeroed."""
    torch.manual_seed(0)
    model = create_model("mnist1d_cnn", width=0.25).to(dtype)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear | nn.Conv1d):
                w = module.weight
                w[w.abs() <= w.abs().flatten().float().quantile(0.8).to(w.dtype)] = 0
    return model


def training_checkpoint(model: nn.Module, pruner: Pruner | None, path: Path) -> Path:
    """A training checkpoint of a one-epoch run (see :func:`_helpers.training_checkpoint`)."""
    return _helpers.training_checkpoint(path, model, pruner, config={"epochs": 1})


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one line ``feather-sparse ARGV`` prints on stderr, failing with exit status 1."""
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# ---------------------------------------------------------------------------
# 1. load_sparse(path) rebuilds the model in the dtypes of the file's tensors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@needs_safetensors
def test_a_model_rebuilt_from_the_file_keeps_its_dtype_bit_for_bit(
    dtype: torch.dtype, tmp_path: Path
) -> None:
    model = pruned_cnn(dtype)
    path = tmp_path / "m.fsp"
    save_sparse(model, path)
    back = load_sparse(path)
    assert_bit_equal(model.state_dict(), back.state_dict())
    assert {p.dtype for p in back.parameters()} == {dtype}
    # the integer buffer (BatchNorm's step count) stays an integer
    assert back.state_dict()["features.1.num_batches_tracked"].dtype == torch.int64


@needs_safetensors
def test_a_model_of_several_dtypes_comes_back_as_it_was(tmp_path: Path) -> None:
    model = pruned_cnn()
    model.fc.double()  # one layer in float64, one BatchNorm in float16
    model.features[1].half()
    path = tmp_path / "m.fsp"
    save_sparse(model, path)
    assert_bit_equal(model.state_dict(), load_sparse(path).state_dict())
    # a float32 model is built as before, and loading into a given model keeps its dtypes
    plain = pruned_cnn()
    save_sparse(plain, path)
    assert_bit_equal(plain.state_dict(), load_sparse(path).state_dict())
    into = create_model("mnist1d_cnn", width=0.25).double()
    load_sparse(path, into)
    assert {p.dtype for p in into.parameters()} == {torch.float64}


@needs_safetensors
def test_cli_re_export_of_a_float64_file_keeps_float64(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")  # the command verifies the ONNX file it writes
    model = pruned_cnn(torch.float64)
    source, out = tmp_path / "m.fsp", tmp_path / "again.fsp"
    save_sparse(model, source)
    # --onnx with an example input in the model's dtype: the model runs on it
    onnx_file = tmp_path / "m.onnx"
    assert cli.main(["export", str(source), "-o", str(out), "--onnx", str(onnx_file)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and f"wrote {onnx_file}" in printed
    # onnxruntime has no float64 convolution on CPU: said in the line, not a traceback
    assert "matches PyTorch" in printed or "not verified: onnxruntime cannot run" in printed
    assert_bit_equal(model.state_dict(), load_sparse(out).state_dict())
    assert {r.dtype for r in inspect_sparse(out).tensors if r.name.endswith("weight")} == {
        "float64"
    }


# ---------------------------------------------------------------------------
# 2. a safetensors file another program wrote is never replaced by a .fsp
# ---------------------------------------------------------------------------


@guard(
    "`save_sparse`, `export -o` or `export_onnx` over a safetensors file that is not a "
    "feather-sparse checkpoint (a Hugging Face `model.safetensors`)",
    "`FileExistsError` (CLI exit 1) naming the file and what it holds; the file unchanged",
)
@pytest.mark.parametrize("metadata", [None, {"format": "pt"}])
@needs_safetensors
def test_a_plain_safetensors_file_is_never_replaced(
    metadata: dict[str, str] | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import save_file

    hf = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(3)}, str(hf), metadata=metadata)
    before = hf.read_bytes()
    with pytest.raises(FileExistsError, match=r"model\.safetensors already holds a safetensors"):
        save_sparse(pruned_cnn(), hf)
    with pytest.raises(FileExistsError, match="not a feather-sparse checkpoint"):
        export_onnx(nn.Linear(3, 3), hf, torch.randn(2, 3))
    fsp = tmp_path / "m.fsp"
    save_sparse(pruned_cnn(), fsp)
    line = one_line_error(capsys, ["export", str(fsp), "-o", str(hf)])
    assert f"{hf} already holds a safetensors file" in line and "Hugging Face" in line
    assert hf.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.fsp", "model.safetensors"]


@needs_safetensors
def test_a_fsp_and_a_damaged_fsp_are_still_replaced(tmp_path: Path) -> None:
    fsp = tmp_path / "m.fsp"
    save_sparse(nn.Linear(2, 2), fsp)
    save_sparse(nn.Linear(3, 3), fsp)  # a .fsp over a .fsp, as always
    data = fsp.read_bytes()
    fsp.write_bytes(data[:20])  # cut inside its header: what it was cannot be read
    save_sparse(nn.Linear(4, 4), fsp)
    assert inspect_sparse(fsp).tensors[0].shape == (4, 4)


# ---------------------------------------------------------------------------
# 3. ONNX files are written atomically
# ---------------------------------------------------------------------------


@pytest.fixture(params=["default", "legacy"])
def exporter(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    pytest.importorskip("onnx")
    if request.param == "legacy":  # what runs where onnxscript is not installed
        monkeypatch.setattr(export.onnx, "_onnx_exporter", lambda: ("legacy", 20))
    return str(request.param)


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(40, 16), nn.ReLU(), nn.Linear(16, 4)).eval()


@guard(
    "the disk fills up while an ONNX file is written over an existing one",
    "`DiskFullError` naming the file: it is unchanged; no temporary file left",
)
def test_a_full_disk_keeps_the_existing_onnx_file(
    exporter: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnx

    path = tmp_path / "model.onnx"
    export_onnx(small_net(), path, torch.randn(2, 1, 40))
    good = path.read_bytes()

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    other = nn.Sequential(nn.Flatten(), nn.Linear(40, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    with pytest.raises(DiskFullError, match=r"disk is full.*model\.onnx is unchanged"):
        export_onnx(other, path, torch.randn(2, 1, 40))
    assert path.read_bytes() == good
    onnx.checker.check_model(onnx.load(str(path)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


@guard(
    "the ONNX exporter fails (or is killed) half-way through writing its file",
    "the error as it came; the existing `.onnx` unchanged, no temporary file left",
)
def test_an_exporter_that_fails_half_way_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnx")
    monkeypatch.setattr(export.onnx, "_onnx_exporter", lambda: ("legacy", 20))
    path = tmp_path / "model.onnx"
    export_onnx(small_net(), path, torch.randn(2, 1, 40))
    good = path.read_bytes()

    def half_written(model: nn.Module, args: tuple, f: str, **kwargs: object) -> None:
        Path(f).write_bytes(b"\x08\x07partial")  # what a killed or failing writer leaves
        raise RuntimeError("the exporter failed")

    monkeypatch.setattr(torch.onnx, "export", half_written)
    with pytest.raises(RuntimeError, match="the exporter failed"):
        export_onnx(small_net(), path, torch.randn(2, 1, 40))
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


@needs_safetensors
def test_a_large_model_is_written_with_its_weights_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above 1.5 GiB of weights the torch.export-based exporter keeps them in <file>.data;
    the threshold is lowered here so that a small model takes that path."""
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    monkeypatch.setattr(export.onnx, "_large_model_bytes", lambda: 0)
    net, path = small_net(), tmp_path / "model.onnx"
    export_onnx(net, path, torch.randn(2, 1, 40))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]
    assert export.verify_onnx(net, path, torch.randn(3, 1, 40)) < 1e-5
    # a file of another kind where the weights would go is refused, and kept
    save_sparse(nn.Linear(2, 2), tmp_path / "model.onnx.data2")
    os.replace(tmp_path / "model.onnx.data2", tmp_path / "model.onnx.data")
    kept = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(FileExistsError, match=r"model\.onnx\.data already holds a sparse"):
        export_onnx(net, path, torch.randn(2, 1, 40))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == kept


def test_a_failed_opset_check_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnx")
    monkeypatch.setattr(export.onnx, "_onnx_exporter", lambda: ("legacy", 20))
    monkeypatch.setattr(export.onnx, "_opset_of", lambda proto: 11)  # the exporter ignored us
    path = tmp_path / "model.onnx"
    with pytest.raises(ValueError, match="asked for opset 17, but the legacy exporter wrote 11"):
        export_onnx(small_net(), path, torch.randn(2, 1, 40), opset=17)
    assert not path.exists() and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------
# 4. compiled models, and models changed after create_model
# ---------------------------------------------------------------------------


@guard(
    "`save_sparse` of a model wrapped by `torch.compile`",
    "saved as the model it wraps (plain keys, its spec): `load_sparse(path)` rebuilds it",
)
@needs_safetensors
def test_a_compiled_model_is_saved_with_plain_keys(tmp_path: Path) -> None:
    model = pruned_cnn()
    compiled = torch.compile(model)  # no forward: nothing is compiled yet
    path = tmp_path / "m.fsp"
    save_sparse(compiled, path)
    info = inspect_sparse(path)
    assert [r.name for r in info.tensors] == list(model.state_dict())
    assert info.model_spec == model.feather_model_spec
    assert_bit_equal(model.state_dict(), load_sparse(path).state_dict())
    into = torch.compile(create_model("mnist1d_cnn", width=0.25))
    assert load_sparse(path, into) is into  # loaded through the wrapper
    assert_bit_equal(model.state_dict(), into._orig_mod.state_dict())


@needs_safetensors
def test_a_file_saved_from_a_compiled_model_before_the_fix_loads(tmp_path: Path) -> None:
    model = pruned_cnn()
    path = tmp_path / "old.fsp"
    save_sparse({f"_orig_mod.{k}": v for k, v in model.state_dict().items()}, path)
    back = load_sparse(path, create_model("mnist1d_cnn", width=0.25))
    assert_bit_equal(model.state_dict(), back.state_dict())


@guard(
    "`save_sparse` of a `create_model` model changed since (its head replaced)",
    "a warning naming the differences; the file is written without the spec that no longer "
    "fits, and loads with `load_sparse(path, model)`",
)
@needs_safetensors
def test_a_changed_model_is_saved_without_its_stale_spec(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = pruned_cnn()
    model.fc = nn.Linear(model.fc.in_features, 5)  # a new head, for 5 classes
    path = tmp_path / "m.fsp"
    with caplog.at_level(logging.WARNING, logger="feather_sparse.export.fsp"):
        save_sparse(model, path)
    warning = caplog.text
    assert "no longer matches how create_model built it" in warning
    assert "fc.weight: model (5, 64) vs spec (10, 64)" in warning
    assert inspect_sparse(path).model_spec is None
    with pytest.raises(ValueError, match="no model spec"):
        load_sparse(path)
    into = create_model("mnist1d_cnn", width=0.25)
    into.fc = nn.Linear(into.fc.in_features, 5)
    assert_bit_equal(model.state_dict(), load_sparse(path, into).state_dict())
    # an unchanged model keeps its spec, without a word
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="feather_sparse.export.fsp"):
        save_sparse(pruned_cnn(), path)
    assert inspect_sparse(path).model_spec is not None and caplog.text == ""


@needs_safetensors
def test_an_old_file_whose_spec_does_not_fit_says_so_without_blaming_damage(
    tmp_path: Path,
) -> None:
    model = pruned_cnn()
    model.fc = nn.Linear(model.fc.in_features, 5)
    path = tmp_path / "m.fsp"
    state = model.state_dict()
    save_sparse(state, path)
    # what a file written before the check held: the spec create_model gave
    _rewrite_header(path, lambda h: h.update(model_spec=model.feather_model_spec))
    with pytest.raises(ValueError, match="does not fit its own tensors") as caught:
        load_sparse(path)
    message = str(caught.value)
    assert "damaged" not in message and "changed after create_model built it" in message
    assert "load_sparse(path, model)" in message


def _rewrite_header(path: Path, edit: object) -> None:
    """Edit the decoded ``feather.header`` JSON and write it back validly (new CRC-64)."""
    import lzma

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(path), framework="pt") as f:
        metadata = dict(f.metadata())
    entries = load_file(str(path))
    header = json.loads(lzma.decompress(entries["feather.header"].numpy().tobytes()))
    edit(header)  # type: ignore[operator]
    packed = lzma.compress(json.dumps(header).encode(), format=lzma.FORMAT_XZ)
    entries["feather.header"] = torch.frombuffer(bytearray(packed), dtype=torch.uint8)
    save_file(entries, str(path), metadata=metadata)


# ---------------------------------------------------------------------------
# 5. the command line checks every option before it writes anything
# ---------------------------------------------------------------------------


@guard(
    "`export -o out.fsp --onnx x.onnx` with a bad `--input-shape` or `--opset`, a shape the "
    "model cannot take, or without the onnx package; `--opset`/`--input-shape` without `--onnx`",
    "CLI exit 1, one line naming the option; nothing written (an existing `-o` file unchanged)",
)
@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--input-shape", "abc"], "--input-shape must be positive sizes"),
        (["--opset", "3"], "opset 3 is older than this setup exports"),
        (["--opset", "99"], "opset 99 is newer than this setup exports"),
        (["--input-shape", "3,40"], "does not run on an input of shape (2, 3, 40)"),
        (["--input-shape", "3,40", "no-onnx"], "--input-shape applies to the ONNX model only"),
        (["--opset", "17", "no-onnx"], "--opset applies to the ONNX model only"),
        (["no-onnx-package"], "ONNX export needs the onnx package"),
    ],
)
@needs_safetensors
def test_cli_checks_every_option_before_writing(
    extra: list[str],
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("onnx")
    source = tmp_path / "run.fsp"
    save_sparse(pruned_cnn(), source)
    out = tmp_path / "out.fsp"
    save_sparse(nn.Linear(2, 2), out)  # a file an export would replace
    before = out.read_bytes()
    argv = ["export", str(source), "-o", str(out)]
    if "no-onnx-package" in extra:
        monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` fails
    if "no-onnx" not in extra:
        argv += ["--onnx", str(tmp_path / "x.onnx")]
    argv += [a for a in extra if not a.startswith("no-onnx")]
    line = one_line_error(capsys, argv)
    assert expected in line
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.fsp", "run.fsp"]


@guard(
    "`export --onnx --opset N` (or `export_onnx(opset=N)`) for an opset that only the "
    "torch.export-based exporter writes, where onnxscript is not installed",
    "CLI exit 1, one line naming the legacy exporter's newest opset and "
    "`pip install 'feather-sparse[onnx]'`; nothing written",
)
@needs_safetensors
def test_an_opset_that_needs_onnxscript_says_to_install_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnx")
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # `import onnxscript` fails
    legacy = export.onnx.onnx_opset()  # the newest the legacy exporter writes here
    source = tmp_path / "run.fsp"
    save_sparse(pruned_cnn(), source)
    argv = ["export", str(source), "-o", str(tmp_path / "out.fsp")]
    argv += ["--onnx", str(tmp_path / "x.onnx"), "--opset", str(legacy + 1)]
    line = one_line_error(capsys, argv)
    assert f"opset {legacy + 1} is newer than this setup exports (legacy: {legacy})" in line
    assert "need onnxscript" in line and "pip install 'feather-sparse[onnx]'" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.fsp"]
    with pytest.raises(ValueError, match="newer than this setup exports") as caught:
        export.onnx.onnx_opset(999)  # newer than any exporter writes: no install helps
    assert "onnxscript" not in str(caught.value)


# ---------------------------------------------------------------------------
# 6. command-line messages that name the command line's options
# ---------------------------------------------------------------------------


def nm_checkpoint(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = create_model("mnist1d_mlp")
    pruner = Pruner(model, pattern="2:4")
    return training_checkpoint(model, pruner, tmp_path / "last.pt")


@guard(
    "`export` of an N:M run with `--sparsity` other than its pattern's",
    "CLI exit 1: drop --sparsity; `PatternSparsityError` (a `ValueError`) from "
    "`load_export_source`; nothing written",
)
@pytest.mark.parametrize("sparsity", ["0.3", "0.7"])
@needs_safetensors
def test_cli_export_of_an_nm_run_at_another_sparsity_says_drop_sparsity(
    sparsity: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = nm_checkpoint(tmp_path)
    out = tmp_path / "m.fsp"
    line = one_line_error(capsys, ["export", str(source), "-o", str(out), "--sparsity", sparsity])
    assert "2:4 N:M pattern" in line and f"at sparsity {sparsity}" in line
    assert "drop --sparsity" in line and "finalize()" not in line
    assert not out.exists()
    with pytest.raises(PatternSparsityError, match=r"sparsity=None"):
        load_export_source(source, sparsity=float(sparsity))
    # at its pattern's sparsity, or without one, it exports
    assert cli.main(["export", str(source), "-o", str(out), "--sparsity", "0.5"]) == 0
    assert inspect_sparse(out).sparsity == pytest.approx(0.5, abs=0.01)
