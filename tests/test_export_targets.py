"""What export writes over, and what it writes from a model whose Pruner is still attached.

1. Each writer (``save_sparse``, ``reencode_sparse``, ``export_onnx``, the
   command's ``-o`` and ``--onnx``) replaces only a file of the kind it writes
   (or an empty one); a file of another or unknown kind is refused, and a
   name that says the other format is refused before anything is written.
2. ``save_sparse`` and ``export_onnx`` on a model whose Pruner was never
   finalized write the model as its forward computes now, under the plain
   model's names, and leave the model (and its Pruner) as it was.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from _guards import guard
from _helpers import needs_safetensors
from feather_sparse import Pruner, cli, export
from feather_sparse.export import (
    export_onnx,
    inspect_sparse,
    load_sparse,
    reencode_sparse,
    save_sparse,
    verify_onnx,
)
from feather_sparse.models import create_model

pytestmark = pytest.mark.usefixtures("one_thread")


def pruned_cnn() -> nn.Module:
    """The bundled 1-D CNN at a quarter width, 80 % of each layer's weights zeroed."""
    torch.manual_seed(0)
    model = create_model("mnist1d_cnn", width=0.25)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear | nn.Conv1d):
                w = module.weight
                w[w.abs() <= w.abs().flatten().quantile(0.8)] = 0
    return model.eval()


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(40, 16), nn.ReLU(), nn.Linear(16, 4)).eval()


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one line ``feather-sparse ARGV`` prints on stderr, failing with exit status 1."""
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def onnx_file(tmp_path: Path) -> Path:
    """A real ONNX model, in a folder of its own."""
    pytest.importorskip("onnx")
    folder = tmp_path / "onnx"
    folder.mkdir()
    path = folder / "real.onnx"
    export_onnx(small_net(), path, torch.randn(2, 1, 40))
    return path


# ---------------------------------------------------------------------------
# 1. only a file of the kind written is replaced
# ---------------------------------------------------------------------------


@needs_safetensors
def test_is_onnx_tells_onnx_models_from_everything_else(onnx_file: Path, tmp_path: Path) -> None:
    from feather_sparse.export.files import is_onnx

    data = onnx_file.read_bytes()
    assert is_onnx(onnx_file)
    fsp = tmp_path / "m.fsp"
    save_sparse(pruned_cnn(), fsp)
    assert not is_onnx(fsp)
    others = {
        "empty": b"",
        "text": b"my notes\nabout the run\n",
        "json": b'{"model": {"name": "mlp"}}\n',
        "raw weights": torch.randn(64).numpy().tobytes(),
    }
    for cut in (1, 2, 10, len(data) // 2, len(data) - 1):  # truncated: not a whole model
        others[f"cut at {cut}"] = data[:cut]
    for name, content in others.items():
        path = tmp_path / "other"
        path.write_bytes(content)
        assert not is_onnx(path), name


@guard(
    "`save_sparse`, `export -o`, `export_onnx` or `--onnx` over an existing file of unknown kind "
    "(a text file), or a `.fsp` writer over an ONNX model (`export -o m.onnx` for `--onnx`)",
    "`FileExistsError` (CLI exit 1) naming the file, what it holds and the fix; the file "
    "unchanged, nothing written",
)
@needs_safetensors
def test_a_file_of_unknown_kind_or_an_onnx_model_is_never_replaced(
    onnx_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = onnx_file.parent
    notes = folder / "notes.txt"
    notes.write_text("results of run 7: keep\n")
    config = folder / "config.json"  # its ninth byte is "{": sniffed as safetensors before
    config.write_text('{"model":{"name": "mnist1d_cnn"}}\n')
    renamed = folder / "model.bin"  # an ONNX model under a name that says nothing
    renamed.write_bytes(onnx_file.read_bytes())
    before = files(folder)

    for path in (notes, config):
        with pytest.raises(FileExistsError, match=rf"{path.name} already holds a file of unknown"):
            save_sparse(pruned_cnn(), path)
        with pytest.raises(FileExistsError, match=r"unknown kind.*delete .* first"):
            export_onnx(small_net(), path, torch.randn(2, 1, 40))
    with pytest.raises(
        FileExistsError, match=r"model\.bin already holds an ONNX model.*export_onnx"
    ):
        save_sparse(pruned_cnn(), renamed)

    fsp = tmp_path / "source.fsp"
    save_sparse(pruned_cnn(), fsp)
    # the audit's slip: -o for --onnx, over the ONNX model written a moment ago
    line = one_line_error(capsys, ["export", str(fsp), "-o", str(onnx_file)])
    assert f"{onnx_file} already holds an ONNX model" in line and "--onnx" in line
    line = one_line_error(capsys, ["export", str(fsp), "--onnx", str(notes)])
    assert f"{notes} already holds a file of unknown kind" in line
    assert f"e.g. {notes.with_suffix('.onnx')}" in line
    line = one_line_error(capsys, ["export", str(fsp), "-o", str(notes)])
    assert "unknown kind" in line and f"e.g. {notes.with_suffix('.fsp')}" in line
    assert files(folder) == before


@needs_safetensors
def test_a_file_of_the_same_kind_or_an_empty_file_is_replaced(
    onnx_file: Path, tmp_path: Path
) -> None:
    pytest.importorskip("onnxruntime")  # verify_onnx runs the file
    import onnx

    other = nn.Sequential(nn.Flatten(), nn.Linear(40, 3)).eval()
    export_onnx(other, onnx_file, torch.randn(2, 1, 40))  # an ONNX model over an ONNX model
    assert verify_onnx(other, onnx_file, torch.randn(2, 1, 40)) < 1e-5
    proto = onnx.load(str(onnx_file))
    proto.producer_name = "abcd{"  # a "{" as its ninth byte, as a safetensors file has
    onnx.save(proto, str(onnx_file))
    assert onnx_file.read_bytes()[8:9] == b"{"
    export_onnx(small_net(), onnx_file, torch.randn(2, 1, 40))
    assert verify_onnx(small_net(), onnx_file, torch.randn(2, 1, 40)) < 1e-5
    empty_fsp, empty_onnx = tmp_path / "new.fsp", tmp_path / "new.onnx"
    empty_fsp.touch()  # what `touch` leaves: nothing to lose
    empty_onnx.touch()
    save_sparse(pruned_cnn(), empty_fsp)
    export_onnx(small_net(), empty_onnx, torch.randn(2, 1, 40))
    assert inspect_sparse(empty_fsp).tensors and empty_onnx.stat().st_size > 0


@guard(
    "`reencode_sparse` (`export x.fsp -o y`, a file without a model spec) over a file of "
    "unknown kind",
    "`FileExistsError` naming the file; the file unchanged",
)
@needs_safetensors
def test_reencode_never_replaces_a_file_of_unknown_kind(tmp_path: Path) -> None:
    source = tmp_path / "weights.fsp"
    save_sparse(pruned_cnn().state_dict(), source)  # a state_dict: no model spec
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me\n")
    with pytest.raises(FileExistsError, match=r"notes\.txt already holds a file of unknown kind"):
        reencode_sparse(source, notes)
    assert notes.read_text() == "keep me\n"


@guard(
    "`-o model.onnx` (a `.fsp` under an ONNX name) or `--onnx model.fsp`; "
    "`save_sparse(model, 'x.onnx')`, `export_onnx(model, 'x.fsp')`",
    "`ValueError` (CLI exit 1) naming the file, the suffix to use and the right writer; "
    "nothing written",
)
@needs_safetensors
def test_a_name_that_says_the_other_format_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnx")
    fsp = tmp_path / "source.fsp"
    save_sparse(pruned_cnn(), fsp)
    before = files(tmp_path)
    new_onnx, new_fsp = tmp_path / "m.onnx", tmp_path / "m.fsp"
    with pytest.raises(ValueError, match=r"m\.onnx is named as an ONNX model.*name it .*m\.fsp"):
        save_sparse(pruned_cnn(), new_onnx)
    with pytest.raises(ValueError, match=r"m\.fsp is named as a sparse checkpoint.*m\.onnx"):
        export_onnx(small_net(), new_fsp, torch.randn(2, 1, 40))
    with pytest.raises(ValueError, match=r"m\.safetensors is named as a sparse checkpoint"):
        export_onnx(small_net(), tmp_path / "m.safetensors", torch.randn(2, 1, 40))
    line = one_line_error(capsys, ["export", str(fsp), "-o", str(new_onnx)])
    assert f"{new_onnx} is named as an ONNX model" in line and "--onnx on the command line" in line
    line = one_line_error(capsys, ["export", str(fsp), "-o", str(new_fsp), "--onnx", str(new_fsp)])
    assert "both name" in line
    line = one_line_error(capsys, ["export", str(fsp), "--onnx", str(tmp_path / "x.fsp")])
    assert "is named as a sparse checkpoint" in line
    assert files(tmp_path) == before


@needs_safetensors
def test_an_output_named_neither_way_is_written_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fsp = tmp_path / "source.fsp"
    save_sparse(pruned_cnn(), fsp)
    out = tmp_path / "model.pt"
    assert cli.main(["export", str(fsp), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"warning: {out} will hold a sparse checkpoint (.fsp)" in captured.err
    assert "(model.fsp would)" in captured.err
    assert f"wrote {out}" in captured.out and inspect_sparse(out).tensors
    assert cli.main(["export", str(fsp), "-o", str(tmp_path / "again.fsp")]) == 0
    assert capsys.readouterr().err == ""  # a .fsp name: nothing to say


@guard(
    "an ONNX model with external weights exported again, or a file of unknown kind where its "
    "weights (`model.onnx.data`) would go",
    "the weights the model names are replaced; any other file: `FileExistsError` naming it, "
    "both files unchanged",
)
def test_the_weights_beside_a_large_onnx_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")  # verify_onnx runs the file
    monkeypatch.setattr(export.onnx, "_large_model_bytes", lambda: 0)  # every model is large
    path, data = tmp_path / "model.onnx", tmp_path / "model.onnx.data"
    export_onnx(small_net(), path, torch.randn(2, 1, 40))
    other = nn.Sequential(nn.Flatten(), nn.Linear(40, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    export_onnx(other, path, torch.randn(2, 1, 40))  # its own weights are replaced
    assert verify_onnx(other, path, torch.randn(3, 1, 40)) < 1e-5
    data.write_text("not weights: notes\n")
    path.unlink()  # no model names the file any more
    export_onnx(small_net(), tmp_path / "keep.onnx", torch.randn(2, 1, 40))
    (tmp_path / "keep.onnx").rename(path)  # a model that names keep.onnx.data, not this file
    kept = files(tmp_path)
    with pytest.raises(FileExistsError, match=r"model\.onnx\.data already holds a file of unknown"):
        export_onnx(small_net(), path, torch.randn(2, 1, 40))
    assert files(tmp_path) == kept


# ---------------------------------------------------------------------------
# 2. a model whose Pruner is still attached
# ---------------------------------------------------------------------------


def attached_cnn() -> tuple[nn.Module, Pruner]:
    """The bundled CNN mid-training: a Pruner attached, at 60 % of its 80 % target."""
    torch.manual_seed(0)
    model = create_model("mnist1d_cnn", width=0.25)
    pruner = Pruner(model, sparsity=0.8, total_steps=10, exclude=["fc"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(3):
        loss = model(torch.randn(8, 1, 40)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        pruner.step()
    return model.eval(), pruner


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@guard(
    "`save_sparse` of a model whose Pruner was never finalized",
    "saved as its forward computes now (P_T(w) at the thresholds in use) under the plain "
    "model's names, with a warning naming `pruner.finalize()`; loads into the plain model; "
    "the model and its Pruner unchanged",
)
@needs_safetensors
def test_save_sparse_with_a_pruner_attached_saves_what_the_forward_computes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, pruner = attached_cnn()
    path = tmp_path / "model.fsp"
    save_sparse(pruned_cnn(), path)  # a good model.fsp, replaced by the new one as always
    pruned = pruner.dense_state_dict(pruned=True)
    before = snapshot(model)
    with caplog.at_level(logging.WARNING, logger="feather_sparse.export.fsp"):
        info = save_sparse(model, path)
    assert "still has a Pruner attached (layers features.0" in caplog.text
    assert "pruner.finalize()" in caplog.text and "thresholds in use" in caplog.text
    assert not any("parametrizations" in r.name for r in info.tensors)
    assert info.model_spec is not None  # the spec still fits: load_sparse(path) rebuilds it
    plain = load_sparse(path)
    assert not any(parametrize.is_parametrized(m) for m in plain.modules())
    assert plain.state_dict().keys() == pruned.keys()
    for name, tensor in pruned.items():
        assert torch.equal(plain.state_dict()[name], tensor), name
    x = torch.randn(5, 1, 40)
    assert torch.equal(plain.eval()(x), model(x))
    # what inspect says is the weights' own sparsity, not the raw weights' none
    names = {f"{t.name}.weight" for t in pruner.targets}
    weights = [r for r in info.tensors if r.name in names]
    zeros = sum(r.numel - r.nnz for r in weights) / sum(r.numel for r in weights)
    assert zeros == pytest.approx(pruner.sparsity_achieved(), abs=1e-6) and 0.3 < zeros < 0.8
    # the model keeps its Pruner, its raw weights, and goes on training
    after = snapshot(model)
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    pruner.step()
    assert pruner.finalize() == pytest.approx(0.8, abs=1e-3)


@needs_safetensors
def test_save_sparse_keeps_other_parametrizations_as_they_are(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only a Pruner's parametrizations are computed; the model's own state_dict loads back."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 2))
    nn.utils.parametrizations.orthogonal(model[0])
    with caplog.at_level(logging.WARNING, logger="feather_sparse.export.fsp"):
        save_sparse(model, tmp_path / "m.fsp")
    assert caplog.text == ""
    again = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 2))
    nn.utils.parametrizations.orthogonal(again[0])
    load_sparse(tmp_path / "m.fsp", again)
    x = torch.randn(3, 6)
    assert torch.allclose(again(x), model(x))


@pytest.fixture(params=["default", "legacy"])
def exporter(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    if request.param == "legacy":  # what runs where onnxscript is not installed
        monkeypatch.setattr(export.onnx, "_onnx_exporter", lambda: ("legacy", 20))
    else:  # the torch.export-based exporter: its initializers keep the model's names
        pytest.importorskip("onnxscript")
    return str(request.param)


@guard(
    "`export_onnx` of a model whose Pruner was never finalized",
    "exported as its forward computes now: P_T(w) as plain, named weights (no thresholding "
    "in the graph), with a warning naming `pruner.finalize()`; the model and its Pruner unchanged",
)
def test_export_onnx_with_a_pruner_attached_exports_the_pruned_weights(
    exporter: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import onnx
    from onnx import numpy_helper

    model, pruner = attached_cnn()
    pruned = pruner.dense_state_dict(pruned=True)
    before = snapshot(model)
    path = tmp_path / "model.onnx"
    with caplog.at_level(logging.WARNING, logger="feather_sparse.export.onnx"):
        export_onnx(model, path, torch.randn(2, 1, 40))
    assert "still has a Pruner attached" in caplog.text and "pruner.finalize()" in caplog.text
    assert verify_onnx(model, path, torch.randn(4, 1, 40)) < 1e-5
    graph = onnx.load(str(path)).graph
    initializers = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    zeros = sum(int((pruned[f"{t.name}.weight"] == 0).sum()) for t in pruner.targets)
    assert sum(int((a == 0).sum()) for a in initializers.values()) >= zeros > 0
    if exporter == "default":  # stored by their names (the legacy exporter renames them)
        for name in ("features.0.weight", "features.3.weight"):
            stored = torch.from_numpy(initializers[name].copy())  # BatchNorm may be folded in
            assert torch.equal(stored == 0, pruned[name] == 0), name
    assert not {"Abs", "Sign", "Pow", "Where"} & {n.op_type for n in graph.node}
    after = snapshot(model)
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert all(parametrize.is_parametrized(model.features[i]) for i in (0, 3, 6, 9))
    pruner.step()
    assert pruner.finalize() == pytest.approx(0.8, abs=1e-3)


class Scale(nn.Module):
    """A parametrization of another library: ``bias -> 2 * bias``."""

    def forward(self, bias: torch.Tensor) -> torch.Tensor:
        return 2 * bias


@guard(
    "`export_onnx` of a model whose Pruner is attached to a layer that also carries another "
    "parametrization",
    "`ValueError` naming the layer and `pruner.finalize()`; an existing `.onnx` unchanged",
)
def test_export_onnx_refuses_a_pruned_layer_with_another_parametrization(
    tmp_path: Path,
) -> None:
    pytest.importorskip("onnx")
    path = tmp_path / "model.onnx"
    export_onnx(small_net(), path, torch.randn(2, 1, 40))
    good = path.read_bytes()
    model = small_net()
    pruner = Pruner(model, sparsity=0.5, total_steps=4)
    pruner.step()
    parametrize.register_parametrization(model[1], "bias", Scale())
    with pytest.raises(ValueError, match=r"layer '1' also has its \['bias'\].*pruner\.finalize"):
        export_onnx(model, path, torch.randn(2, 1, 40))
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_an_exporter_failure_with_another_parametrization_says_how_to_remove_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnx")
    model = small_net()
    parametrize.register_parametrization(model[1], "bias", Scale())

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("\x1b[96mNo ONNX function found\x1b[0m for aten.view.dtype")

    monkeypatch.setattr(export.onnx.torch.onnx, "export", broken)
    with pytest.raises(ValueError, match=r"dtype\) on a model whose layers 1 carry a param"):
        export_onnx(model, tmp_path / "m.onnx", torch.randn(2, 1, 40))
    assert not (tmp_path / "m.onnx").exists()
