"""`feather-sparse export` of a `.fsp` that holds no model spec: re-encoded from its tensors.

A file saved from a model that ``create_model`` did not build names no
architecture. Writing it again (another ``--values`` precision, another name)
needs none: its tensors and their encodings are enough. ONNX needs the model,
and says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from _guards import guard
from _helpers import needs_safetensors
from feather_sparse import cli
from feather_sparse.export import inspect_sparse, load_sparse, load_sparse_state_dict, save_sparse
from feather_sparse.export import run as export_run
from test_export_audit import assert_bit_equal

pytestmark = [pytest.mark.usefixtures("one_thread"), needs_safetensors]


class Custom(nn.Module):
    """A model ``create_model`` did not build: a 2:4 layer, an unstructured one, mixed dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.nm = nn.Linear(64, 64)
        self.sparse = nn.Linear(64, 32)
        self.norm = nn.BatchNorm1d(32)  # an int64 buffer among the floats
        self.register_buffer("scale", torch.zeros(40, dtype=torch.float64))


def custom_model() -> Custom:
    torch.manual_seed(0)
    model = Custom()
    with torch.no_grad():
        groups = model.nm.weight.view(-1, 4)  # (64 * 16, 4): 2 of every 4 kept
        drop = groups.abs().topk(2, dim=1, largest=False).indices
        groups.scatter_(1, drop, 0.0)
        w = model.sparse.weight
        w[w.abs() <= w.abs().flatten().quantile(0.8)] = 0.0
        model.scale[::3] = torch.randn(14, dtype=torch.float64)
    return model


@pytest.fixture
def specless(tmp_path: Path) -> Path:
    """A ``.fsp`` of :class:`Custom`, with metadata and no model spec."""
    path = tmp_path / "plain.fsp"
    info = save_sparse(custom_model(), path, metadata={"epoch": 7})
    assert info.model_spec is None
    assert {r.name: r.encoding for r in info.tensors}["nm.weight"] == "nm+lzma 2:4"
    return path


def encodings(path: Path) -> dict[str, str]:
    return {r.name: r.encoding for r in inspect_sparse(path).tensors}


@guard(
    "`export x.fsp -o y.fsp` of a file without a model spec (a model not built by `create_model`)",
    "re-encoded from its tensors, no model rebuilt: bit-exact at `--values fp32`, "
    "N:M weights keep `nm+lzma`, metadata kept",
)
@pytest.mark.parametrize("name", ["again.fsp", "again.safetensors"])
def test_cli_export_of_a_file_without_a_spec_reencodes_its_tensors(
    name: str, specless: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = specless.parent / name
    assert cli.main(["export", str(specless), "-o", str(out)]) == 0
    printed = capsys.readouterr()
    assert f"wrote {out}" in printed.out and printed.err == ""
    before, source_info = load_sparse_state_dict(specless)
    after, info = load_sparse_state_dict(out)
    assert_bit_equal(before, after)
    assert list(before) == list(after)  # in the same order
    assert encodings(out) == encodings(specless)
    assert info.model_spec is None and info.metadata == source_info.metadata == {"epoch": 7}
    # the same tensors at the same precision: the same bytes, as save_sparse writes them
    assert out.read_bytes() == specless.read_bytes()
    # and it loads into the model it came from
    assert_bit_equal(before, load_sparse(out, Custom()).state_dict())


def test_cli_export_of_a_file_without_a_spec_at_another_precision(
    specless: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = specless.parent / "half.fsp"
    assert cli.main(["export", str(specless), "-o", str(out), "--values", "fp16"]) == 0
    assert capsys.readouterr().err == ""
    info = inspect_sparse(out)
    records = {r.name: r for r in info.tensors}
    assert info.values == "fp16" and info.file_bytes < specless.stat().st_size
    # the N:M layer keeps its N:M encoding; every tensor keeps its own dtype
    assert records["nm.weight"].encoding == "nm+lzma 2:4"
    assert records["nm.weight"].values_dtype == "float16"
    before, _ = load_sparse_state_dict(specless)
    after, _ = load_sparse_state_dict(out)
    for key in before:
        assert after[key].dtype == before[key].dtype, key
        expected = before[key]
        if records[key].is_sparse:  # the non-zeros are stored in fp16, dense tensors as they are
            expected = expected.to(torch.float16).to(expected.dtype)
        assert torch.equal(after[key], expected), key


@guard(
    "`export x.fsp --onnx m.onnx` of a file without a model spec",
    "CLI exit 1: ONNX needs the architecture; load the weights into the model in Python "
    "and call `export_onnx`; nothing written, not even `-o`",
)
def test_cli_onnx_export_of_a_file_without_a_spec_says_how_to_proceed(
    specless: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnx")  # --onnx checks the onnx package before the file
    out, onnx_file = specless.parent / "out.fsp", specless.parent / "m.onnx"
    for argv in (["--onnx", str(onnx_file)], ["-o", str(out), "--onnx", str(onnx_file)]):
        assert cli.main(["export", str(specless), *argv]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        line = err[0]
        assert "holds no model architecture" in line and "ONNX" in line
        assert "load_sparse(path, model)" in line and "export_onnx(model" in line
        assert not out.exists() and not onnx_file.exists()
    assert "drop --onnx" in line  # with -o: the .fsp alone can be written


@guard(
    "`export x.fsp -o` of a file without a model spec onto the file itself or onto a "
    "safetensors file another program wrote",
    "CLI exit 1 (`FileExistsError`), both files unchanged; `reencode_sparse` refuses it too",
)
def test_reencoding_never_writes_over_its_source_or_a_plain_safetensors_file(
    specless: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import save_file

    original = specless.read_bytes()
    hf = specless.parent / "model.safetensors"
    save_file({"w": torch.ones(3)}, str(hf))
    theirs = hf.read_bytes()
    for target in (specless, hf):
        assert cli.main(["export", str(specless), "-o", str(target), "--values", "bf16"]) == 1
        err = capsys.readouterr().err
        assert "being read" in err or "would destroy it" in err, err
        with pytest.raises(FileExistsError):
            export_run.reencode_sparse(specless, target, values="bf16")
    assert specless.read_bytes() == original and hf.read_bytes() == theirs


def test_reencode_sparse_keeps_files_with_a_spec_to_the_model_path(tmp_path: Path) -> None:
    from feather_sparse.models import create_model

    path = tmp_path / "built.fsp"
    save_sparse(create_model("mnist1d_cnn", width=0.25), path)
    with pytest.raises(ValueError, match="has a model spec"):
        export_run.reencode_sparse(path, tmp_path / "out.fsp")
    assert not (tmp_path / "out.fsp").exists()


def test_load_export_source_of_a_file_without_a_spec_is_a_no_model_spec_error(
    specless: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(export_run.NoModelSpecError, match="holds no model architecture") as caught:
        export_run.load_export_source(specless)
    assert isinstance(caught.value, ValueError) and caught.value.path == specless
    assert "load_sparse(path, model)" in str(caught.value)
    # load_sparse's own message is as it was
    with pytest.raises(
        ValueError, match=r"pass the model to load into: load_sparse\(path, model\)"
    ):
        load_sparse(specless)
    # --sparsity applies to training checkpoints only, as for any .fsp
    out = specless.parent / "out.fsp"
    assert cli.main(["export", str(specless), "-o", str(out), "--sparsity", "0.5"]) == 1
    assert "finalized sparse checkpoint" in capsys.readouterr().err
    assert not out.exists()


@guard(
    "`export x.fsp -o y.fsp` without `--values` of an fp16/bf16 `.fsp`",
    "written at the source's own precision (the same bytes), not grown to fp32; "
    "a training checkpoint still defaults to lossless fp32",
)
@pytest.mark.parametrize("values", ["fp16", "bf16"])
def test_export_of_a_fsp_keeps_its_precision_by_default(
    values: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from feather_sparse.models import create_model

    torch.manual_seed(0)
    built = create_model("mnist1d_cnn", width=0.25)
    for source, model in (("plain.fsp", custom_model()), ("built.fsp", built)):
        path, out = tmp_path / source, tmp_path / f"again-{source}"
        save_sparse(model, path, values=values)
        assert cli.main(["export", str(path), "-o", str(out)]) == 0
        assert capsys.readouterr().err == ""
        assert inspect_sparse(out).values == values, source
        assert out.read_bytes() == path.read_bytes(), source
        # an explicit --values still wins
        assert cli.main(["export", str(path), "-o", str(out), "--values", "fp32"]) == 0
        assert inspect_sparse(out).values == "fp32"


def test_reencode_sparse_keeps_the_precision_by_default(specless: Path) -> None:
    half = specless.parent / "half.fsp"
    save_sparse(custom_model(), half, values="bf16")
    out = specless.parent / "again.fsp"
    assert export_run.reencode_sparse(half, out).values == "bf16"
    assert out.read_bytes() == half.read_bytes()
    assert export_run.reencode_sparse(half, out, values="fp32").values == "fp32"
