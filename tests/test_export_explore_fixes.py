"""Export and file-writing fixes found by exploratory testing.

`to_sparse_inference` keeps every layer whose call is more than ``x Wᵀ + b``;
a changed `create_model` model is saved without its spec; `load_sparse` into a
meta-device model; a damaged `last.pt` of a finished run; `write_atomic` over a
symlink or a file with its own permissions; the temp-file clean-up; messages.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch
from torch import nn

import feather_sparse as fs
from _guards import guard
from _helpers import needs_safetensors, tiny_config, tiny_run
from feather_sparse import cli, integrity
from feather_sparse.export.header import smaller_or_larger
from feather_sparse.export.inference import SparseLinear, to_sparse_inference
from feather_sparse.export.run import load_export_source
from feather_sparse.train import train


# ============================================================ to_sparse_inference
class _ScaledLinear(nn.Linear):
    """An ``nn.Linear`` subclass with its own forward (a LoRA-style projection, say)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 0.5


class _TaggedLinear(nn.Linear):
    """A subclass that keeps ``nn.Linear``'s forward: it computes what nn.Linear does."""


def _convert(model: nn.Module) -> nn.Module:
    return to_sparse_inference(model.eval(), min_sparsity=0.0, min_weights=0)


@guard(
    "`to_sparse_inference` on a Linear subclass with its own forward, or a layer with hooks",
    "the layer stays dense, named in the log with the reason; outputs unchanged",
)
def test_a_linear_subclass_with_its_own_forward_stays_dense(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = nn.Sequential(_ScaledLinear(8, 8), nn.ReLU(), _TaggedLinear(8, 4))
    x = torch.randn(3, 8)
    with caplog.at_level(logging.INFO, logger="feather_sparse.export.inference"):
        out = _convert(model)
    assert type(out[0]) is _ScaledLinear
    assert isinstance(out[2], SparseLinear)  # same forward as nn.Linear: converted
    torch.testing.assert_close(out(x), model(x))
    assert "0 stays dense: its class _ScaledLinear has its own forward" in caplog.text


def test_a_layer_with_forward_hooks_or_a_replaced_forward_stays_dense(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 4))
    model[0].register_forward_hook(lambda _m, _i, out: out.clamp(min=0))
    model[1].register_forward_pre_hook(lambda _m, args: (args[0] * 2,))
    plain = model[2].forward
    model[2].forward = lambda x: plain(x) + 1  # as accelerate-style wrappers do
    x = torch.randn(3, 8)
    with caplog.at_level(logging.INFO, logger="feather_sparse.export.inference"):
        out = _convert(model)
    assert [type(m) for m in out] == [nn.Linear, nn.Linear, nn.Linear, SparseLinear]
    torch.testing.assert_close(out(x), model(x))
    assert "0 stays dense: it carries forward hooks" in caplog.text
    assert "1 stays dense: it carries forward hooks" in caplog.text
    assert "2 stays dense: its forward was replaced on the instance" in caplog.text


def test_a_1x1_conv_subclass_with_its_own_forward_stays_dense() -> None:
    class Doubled(nn.Conv2d):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    model = nn.Sequential(Doubled(4, 4, 1), nn.Conv2d(4, 4, 1))
    x = torch.randn(2, 4, 3, 3)
    out = _convert(model)
    assert type(out[0]) is Doubled and type(out[1]) is not nn.Conv2d
    torch.testing.assert_close(out(x), model(x))


@guard(
    "`to_sparse_inference` on `nn.MultiheadAttention` / `nn.TransformerEncoderLayer`",
    "their projections stay dense (they read `.weight`); the model still runs",
)
def test_multihead_attention_and_encoder_layers_keep_the_layers_they_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = nn.Sequential(
        nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True),
        nn.Linear(16, 16),
    )
    x = torch.randn(2, 5, 16)
    with torch.inference_mode():
        expected = model.eval()(x)
    with caplog.at_level(logging.INFO, logger="feather_sparse.export.inference"):
        out = _convert(model)
    layer = out[0]
    assert type(layer.self_attn.out_proj) is type(model[0].self_attn.out_proj)
    assert type(layer.linear1) is nn.Linear and type(layer.linear2) is nn.Linear
    assert isinstance(out[1], SparseLinear)
    with torch.inference_mode():  # the encoder layer's fast path reads linear1.weight
        torch.testing.assert_close(out(x), expected)
    assert "0.self_attn.out_proj stays dense: it belongs to an nn.MultiheadAttention" in caplog.text
    assert "0.linear1 stays dense: it belongs to an nn.TransformerEncoderLayer" in caplog.text


def test_a_bare_multihead_attention_runs_after_conversion() -> None:
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(2, 5, 16)
    out = _convert(mha)
    assert not any(isinstance(m, SparseLinear) for m in out.modules())
    torch.testing.assert_close(out(x, x, x)[0], mha(x, x, x)[0])


@guard(
    "`save_sparse` of a `create_model` model changed where its tensors do not show it (GELU)",
    "warning naming the modules; the file is written without the spec",
)
# ============================================================ create_model spec
@needs_safetensors
def test_a_model_changed_without_changing_its_tensors_is_saved_without_its_spec(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = fs.create_model("mnist1d_cnn")
    for i, module in enumerate(model.features):  # fine-tuned with GELU: same keys and shapes
        if isinstance(module, nn.ReLU):
            model.features[i] = nn.GELU()
    with caplog.at_level(logging.WARNING, logger="feather_sparse.export.fsp"):
        info = fs.save_sparse(model, tmp_path / "m.fsp")
    assert info.model_spec is None
    assert "features.2: model GELU(approximate='none') vs spec ReLU(inplace=True)" in caplog.text
    with pytest.raises(ValueError):  # no spec: nothing to rebuild a wrong model from
        fs.load_sparse(tmp_path / "m.fsp")


@needs_safetensors
def test_an_unchanged_model_keeps_its_spec_with_a_pruner_attached(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = fs.create_model("mnist1d_mlp")
    fs.Pruner(model, sparsity=0.5, total_steps=1)  # parametrized layers: the same tree
    with caplog.at_level(logging.WARNING, logger="feather_sparse.export.fsp"):
        info = fs.save_sparse(model, tmp_path / "m.fsp")
    assert info.model_spec is not None and info.model_spec["name"] == "mnist1d_mlp"
    assert "no longer matches" not in caplog.text


# ============================================================ load into a meta model
class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.mid = nn.Linear(6, 6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.mid(self.embed(x)))


@guard(
    "`load_sparse(path, model)` into a model built on the meta device",
    "the model gets the file's tensors (ties kept); a buffer the file lacks: `ValueError`",
)
@needs_safetensors
def test_load_sparse_into_a_meta_model_gives_it_the_files_tensors(tmp_path: Path) -> None:
    saved = _Tied()
    fs.save_sparse(saved, tmp_path / "m.fsp")
    with torch.device("meta"):
        model = _Tied().double()  # its own dtype is kept, as for a real model
    out = fs.load_sparse(tmp_path / "m.fsp", model)
    assert out is model
    assert all(t.device.type == "cpu" for t in [*model.parameters(), *model.buffers()])
    assert model.head.weight is model.embed.weight  # the tie is kept
    assert model.mid.weight.dtype == torch.float64 and model.mid.weight.requires_grad
    for key, value in saved.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value.double(), rtol=0, atol=0)
    x = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(model(x), saved.double()(x), rtol=0, atol=0)


@needs_safetensors
def test_load_sparse_keeps_a_meta_models_untied_weights_apart(tmp_path: Path) -> None:
    fs.save_sparse(_Tied(), tmp_path / "m.fsp")  # the file ties head to embed
    with torch.device("meta"):
        model = _Tied()
        model.head.weight = nn.Parameter(torch.empty(10, 6))  # this model does not
    fs.load_sparse(tmp_path / "m.fsp", model)
    assert model.head.weight is not model.embed.weight
    assert model.head.weight.data_ptr() != model.embed.weight.data_ptr()
    torch.testing.assert_close(model.head.weight, model.embed.weight)


@needs_safetensors
def test_load_sparse_refuses_a_meta_model_whose_buffers_the_file_does_not_hold(
    tmp_path: Path,
) -> None:
    class WithTable(nn.Linear):
        def __init__(self) -> None:
            super().__init__(4, 4)
            self.register_buffer("table", torch.arange(4.0), persistent=False)

    fs.save_sparse(WithTable(), tmp_path / "m.fsp")
    with torch.device("meta"):
        model = WithTable()
    with pytest.raises(ValueError, match=r"table is on the meta device.*to_empty"):
        fs.load_sparse(tmp_path / "m.fsp", model)
    assert model.weight.is_meta  # refused before anything changed


# ============================================================ export RUN, last.pt damaged
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 3-epoch tiny run: model.fsp, last.pt (epoch 3) and prev.pt (epoch 2)."""
    run = tmp_path_factory.mktemp("finished") / "run"
    train(tiny_config(tiny_run(train_size=128, test_size=64, eval_batch_size=64)), run)
    return run


def _damaged_copy(run: Path, tmp_path: Path, *, keep_previous: bool) -> Path:
    copy = Path(shutil.copytree(run, tmp_path / "run"))
    last = copy / "checkpoints" / "last.pt"
    data = bytearray(last.read_bytes())
    data[len(data) // 2] ^= 0xFF
    last.write_bytes(bytes(data))
    if not keep_previous:
        (copy / "checkpoints" / "prev.pt").unlink()
    return copy


def _same_model(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@guard(
    "`export RUN` of a finished run whose `last.pt` is damaged",
    "exports the intact `RUN/model.fsp`, saying so (not `prev.pt`)",
)
@pytest.mark.parametrize("keep_previous", [True, False])
@needs_safetensors
def test_a_finished_run_with_a_damaged_last_checkpoint_exports_its_model_fsp(
    finished_run: Path, tmp_path: Path, keep_previous: bool
) -> None:
    run = _damaged_copy(finished_run, tmp_path, keep_previous=keep_previous)
    source = load_export_source(run)
    assert source.path == run / "model.fsp"
    assert _same_model(source.model, fs.load_sparse(run / "model.fsp"))
    assert source.warning is not None
    assert "last.pt" in source.warning and f"final model {run / 'model.fsp'}" in source.warning


@needs_safetensors
def test_the_command_line_names_model_fsp_when_it_exports_it_for_last_pt(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _damaged_copy(finished_run, tmp_path, keep_previous=False)
    assert cli.main(["export", str(run), "-o", str(tmp_path / "out.fsp")]) == 0
    assert f"exported the run's final model {run / 'model.fsp'} instead" in capsys.readouterr().err
    assert _same_model(fs.load_sparse(tmp_path / "out.fsp"), fs.load_sparse(run / "model.fsp"))


@needs_safetensors
def test_a_damaged_model_fsp_is_not_exported_for_a_damaged_last_pt(
    finished_run: Path, tmp_path: Path
) -> None:
    run = _damaged_copy(finished_run, tmp_path, keep_previous=True)
    final = run / "model.fsp"
    data = bytearray(final.read_bytes())
    data[-10] ^= 0xFF  # in the tensor data: the checksum of that tensor fails
    final.write_bytes(bytes(data))
    source = load_export_source(run)  # prev.pt, as before, and the warning says why
    assert source.path == run / "checkpoints" / "prev.pt"
    assert source.warning is not None and f"{final} is damaged too" in source.warning
    (run / "checkpoints" / "prev.pt").unlink()
    with pytest.raises(ValueError, match=r"final model .*model\.fsp cannot be read either"):
        load_export_source(run)


@guard(
    "`save_sparse`/`export -o` over a symbolic link",
    "writes the file the link points to; the link kept",
)
# ============================================================ write_atomic and temp files
@needs_safetensors
def test_write_atomic_writes_through_a_symlink_and_keeps_it(tmp_path: Path) -> None:
    real, link = tmp_path / "runs" / "model.fsp", tmp_path / "latest.fsp"
    fs.save_sparse(nn.Linear(4, 4), real)
    link.symlink_to(real)
    chain = tmp_path / "chain.fsp"
    chain.symlink_to(link)  # a link to the link: followed to the end
    new = nn.Linear(4, 4)
    fs.save_sparse(new, chain)
    assert link.is_symlink() and chain.is_symlink()
    assert torch.equal(fs.load_sparse(real, nn.Linear(4, 4)).weight, new.weight)
    integrity.write_atomic(link, b"plain bytes")
    assert link.is_symlink() and real.read_bytes() == b"plain bytes"


def test_write_atomic_keeps_the_permissions_of_the_file_it_replaces(tmp_path: Path) -> None:
    path = tmp_path / "model.fsp"
    integrity.write_atomic(path, b"one")
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~integrity._umask()  # a new file
    for mode in (0o600, 0o640, 0o444):
        path.chmod(mode)
        integrity.write_atomic(path, b"two")
        assert stat.S_IMODE(path.stat().st_mode) == mode, oct(mode)
        assert path.read_bytes() == b"two"


@guard(
    "a user's own `.*.tmp` file in a run folder",
    "kept: only the library's own temporary names are cleaned up",
)
def test_the_temp_file_clean_up_removes_only_this_librarys_temporary_files(
    tmp_path: Path,
) -> None:
    dead = f"999999999-{integrity._HOST}"
    ours = [tmp_path / f".model.fsp.{dead}.a1b2c3d4.tmp", tmp_path / ".last.999999999.x_y9z0ab.tmp"]
    users = [
        tmp_path / ".draft.tmp",
        tmp_path / ".notes.backup.tmp",
        tmp_path / ".model.fsp.draft.tmp",
        tmp_path / ".model.fsp.old.a1b2c3d4.tmp",
        tmp_path / ".model.fsp.12ab.a1b2c3d4.tmp",
    ]
    for f in ours + users:
        f.write_bytes(b"x")
    integrity.remove_stale_temps(tmp_path / "model.fsp")
    assert all(f.exists() for f in users)
    assert not ours[0].exists()
    probe = tmp_path / ".write-check.k2j4_x9q.tmp"  # a run folder's write check, left by a kill
    probe.write_bytes(b"")
    integrity.remove_stale_temps_in(tmp_path)
    assert all(f.exists() for f in users)
    assert not any(f.exists() for f in [*ours, probe])


def test_a_failed_write_names_the_target_not_its_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "x.fsp"

    def refuse(folder: Path, name: str) -> tuple[int, str]:
        tmp = folder / f".{name}.{os.getpid()}-{integrity._HOST}.abcdefgh.tmp"
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(tmp))

    monkeypatch.setattr(integrity, "_temp_in", refuse)
    with pytest.raises(FileNotFoundError) as caught:
        integrity.write_atomic(target, b"x")
    assert str(caught.value) == f"[Errno 2] cannot write {target}: No such file or directory"


# ============================================================ messages
def test_a_size_within_a_hundredth_of_dense_or_against_none_is_told_in_bytes() -> None:
    assert smaller_or_larger(10_000, 10_040) == "40 B larger"  # read "1.00x larger" before
    assert smaller_or_larger(10_040, 10_000) == "40 B smaller"
    assert smaller_or_larger(0, 420) == "420 B larger"  # read "420.00x larger" before
    assert smaller_or_larger(900, 100) == "9.00x smaller"  # a factor as before
    assert smaller_or_larger(100, 100) == "1.00x smaller"


@needs_safetensors
def test_a_dense_model_is_not_called_1_00x_larger(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="feather_sparse.export.fsp"):
        info = fs.save_sparse(nn.Linear(256, 256), tmp_path / "dense.fsp")
    assert 1.0 < info.file_bytes / info.dense_bytes < 1.005
    assert "1.0x" not in caplog.text and " B larger than dense" in caplog.text


@needs_safetensors
def test_another_programs_safetensors_file_is_named_as_such(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "other.safetensors"
    save_file({"w": torch.zeros(3)}, str(path))
    with pytest.raises(ValueError) as caught:
        fs.load_sparse(path, nn.Linear(1, 3))
    assert "format None" not in str(caught.value)
    assert "a safetensors file another program wrote" in str(caught.value)


def test_a_path_ending_in_a_separator_is_refused_as_a_folder(tmp_path: Path) -> None:
    folder = f"{tmp_path / 'out'}/"
    with pytest.raises(IsADirectoryError, match=r"names a folder .* e\.g\. .*out/model\.fsp"):
        fs.save_sparse(nn.Linear(2, 2), folder)
    pytest.importorskip("onnx")
    with pytest.raises(IsADirectoryError, match=r"names a folder .* e\.g\. .*out/model\.onnx"):
        fs.export_onnx(nn.Linear(2, 2), folder, torch.randn(1, 2))
    assert not (tmp_path / "out").exists()


@guard(
    "`export -o out/` or `--onnx out/` (a folder)",
    "CLI exit 1 naming the flag and a file name in it; nothing written",
)
@needs_safetensors
def test_the_export_command_refuses_an_output_ending_in_a_separator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "m.fsp"
    fs.save_sparse(nn.Linear(2, 2), source)
    for flag, example in (("-o", "model.fsp"), ("--onnx", "model.onnx")):
        folder = f"{tmp_path / 'out'}/"
        assert cli.main(["export", str(source), flag, folder]) == 1
        err = capsys.readouterr().err
        assert f"{flag} {folder} names a folder" in err
        assert f"e.g. {flag} {tmp_path / 'out' / example}" in err
    assert not (tmp_path / "out").exists()


@needs_safetensors
def test_a_forward_wrapped_on_the_instance_keeps_the_spec(tmp_path: Path) -> None:
    # accelerate wraps model.forward in torch.autocast: the same architecture, run
    # another way; load_sparse(path) must still rebuild it.
    from feather_sparse.models import create_model

    model = create_model("mnist1d_mlp", hidden=[8])
    plain_forward = model.forward
    model.forward = lambda *a, **k: plain_forward(*a, **k)  # type: ignore[method-assign]
    fs.save_sparse(model, tmp_path / "m.fsp")
    rebuilt = fs.load_sparse(tmp_path / "m.fsp")
    x = torch.randn(3, 40)
    assert torch.equal(rebuilt.eval()(x), model.eval()(x))
