"""Tied weights in a ``.fsp``: one tensor under two ``state_dict`` keys is stored once.

An LM head tied to its token embedding (GPT-2, BERT, Llama with
``tie_word_embeddings``) is listed by ``model.state_dict()`` under both
names. The file stores its bytes once and the second key as an *alias
record* (format version 3); loading gives the one tensor back under both
keys, and ``inspect`` counts it once, as ``Pruner.finalize()`` does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import feather_sparse as fs
from _guards import guard
from _helpers import needs_safetensors
from feather_sparse.cli import main
from feather_sparse.export import load_sparse_state_dict, reencode_sparse
from feather_sparse.export.header import (
    ALIAS_FORMAT_VERSION,
    BASE_FORMAT_VERSION,
    FORMAT_VERSION,
)
from test_export import _rewrite_header

pytestmark = needs_safetensors


class TiedLM(nn.Module):
    """A token embedding tied to the output layer, with a layer between."""

    def __init__(self, vocab: int = 96, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mid = nn.Linear(dim, dim, bias=False)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight
        nn.init.normal_(self.mid.weight)  # the scale of the embedding: no layer collapses

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.mid(self.embed(tokens))))


def finalized(seed: int = 0) -> tuple[TiedLM, float]:
    torch.manual_seed(seed)
    model = TiedLM()
    pruner = fs.Pruner(model, 0.75, total_steps=1, schedule="constant")
    return model, pruner.finalize()


def untied_copy(model: TiedLM) -> TiedLM:
    """The same values with the head's weight a tensor of its own."""
    other = TiedLM()
    other.head.weight = nn.Parameter(model.head.weight.detach().clone())
    other.embed.weight = nn.Parameter(model.embed.weight.detach().clone())
    other.mid.weight = nn.Parameter(model.mid.weight.detach().clone())
    return other


def bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().numpy().tobytes()


@guard(
    "a model with tied weights (an LM head tied to its token embedding) saved to a `.fsp`",
    "the tensor is stored once (the second key is an alias record, format 3): the file is "
    "smaller by its bytes, `inspect` counts it once and gives the sparsity `finalize()` "
    "reported, and loading keeps the tie; it was stored twice and counted twice",
)
def test_a_tied_weight_is_stored_once_and_counted_once(tmp_path: Path) -> None:
    model, achieved = finalized()
    info = fs.save_sparse(model, tmp_path / "tied.fsp")
    untied = fs.save_sparse(untied_copy(model), tmp_path / "untied.fsp")
    records = {r.name: r for r in info.tensors}
    head, embed = records["head.weight"], records["embed.weight"]
    assert head.alias_of == "embed.weight" and head.stored_bytes == 0
    assert (head.shape, head.dtype, head.nnz, head.crc32) == (
        embed.shape,
        embed.dtype,
        embed.nnz,
        embed.crc32,
    )
    assert info.format_version == ALIAS_FORMAT_VERSION == FORMAT_VERSION
    # the untied copy stores the same values twice: its file is larger by one copy
    assert untied.format_version == BASE_FORMAT_VERSION
    assert untied.file_bytes - info.file_bytes >= embed.stored_bytes - 64
    # counted once: the dense size and the sparsity are those of the distinct tensors
    assert info.dense_bytes == untied.dense_bytes - embed.dense_bytes
    assert info.sparsity == pytest.approx(achieved, abs=1e-12)
    assert untied.sparsity != achieved  # the tied weight counted twice
    assert fs.inspect_sparse(tmp_path / "tied.fsp") == info

    loaded = fs.load_sparse(tmp_path / "tied.fsp", TiedLM())
    assert loaded.head.weight is loaded.embed.weight
    for key, value in model.state_dict().items():
        assert bits(loaded.state_dict()[key]) == bits(value), key
    state, _ = load_sparse_state_dict(tmp_path / "tied.fsp")
    assert state["head.weight"] is state["embed.weight"]  # as model.state_dict() gives it
    # an untied model takes the values under both keys
    other = fs.load_sparse(tmp_path / "tied.fsp", untied_copy(TiedLM()))
    assert other.head.weight is not other.embed.weight
    assert bits(other.head.weight) == bits(model.head.weight)


def test_a_model_saved_with_its_pruner_attached_stores_the_tied_weight_once(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    model = TiedLM()
    pruner = fs.Pruner(model, 0.75, total_steps=1, schedule="constant")
    pruner.step()
    info = fs.save_sparse(model, tmp_path / "attached.fsp")
    head = next(r for r in info.tensors if r.name == "head.weight")
    assert head.alias_of == "embed.weight"
    expected = pruner.dense_state_dict(pruned=True)
    state, _ = load_sparse_state_dict(tmp_path / "attached.fsp")
    assert state["head.weight"] is state["embed.weight"]
    assert bits(state["embed.weight"]) == bits(expected["embed.weight"])
    assert bits(expected["head.weight"]) == bits(expected["embed.weight"])
    assert expected["head.weight"] is expected["embed.weight"]  # one tensor, as state_dict


def test_only_the_same_view_of_the_same_memory_is_an_alias(tmp_path: Path) -> None:
    base = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    base[base % 3 == 0] = 0
    state = {
        "a": base,
        "same": base,  # the same tensor object
        "view": base.view(8, 8),  # another object, the same view
        "half": base[:4],  # a slice: overlaps, another view
        "t": base.t(),  # the same memory transposed
        "copy": base.clone(),  # equal values, other memory
        "empty": torch.empty(0),
        "empty2": torch.empty(0),
    }
    info = fs.save_sparse(state, tmp_path / "views.fsp")
    aliases = {r.name: r.alias_of for r in info.tensors if r.is_alias}
    assert aliases == {"same": "a", "view": "a"}
    loaded, _ = load_sparse_state_dict(tmp_path / "views.fsp")
    for key, value in state.items():
        assert bits(loaded[key]) == bits(value), key
        assert loaded[key].shape == value.shape


def test_the_same_model_saved_twice_and_reencoded_gives_the_same_bytes(tmp_path: Path) -> None:
    model, _ = finalized()
    fs.save_sparse(model, tmp_path / "a.fsp")
    fs.save_sparse(model, tmp_path / "b.fsp")
    assert (tmp_path / "a.fsp").read_bytes() == (tmp_path / "b.fsp").read_bytes()
    reencode_sparse(tmp_path / "a.fsp", tmp_path / "c.fsp")
    assert (tmp_path / "a.fsp").read_bytes() == (tmp_path / "c.fsp").read_bytes()


@pytest.mark.parametrize("values", ["fp16", "bf16"])
def test_a_tied_weight_at_half_precision_loads_as_the_untied_file_does(
    tmp_path: Path, values: str
) -> None:
    model, _ = finalized()
    fs.save_sparse(model, tmp_path / "tied.fsp", values=values)
    fs.save_sparse(untied_copy(model), tmp_path / "untied.fsp", values=values)
    tied, _ = load_sparse_state_dict(tmp_path / "tied.fsp")
    untied, _ = load_sparse_state_dict(tmp_path / "untied.fsp")
    for key, value in untied.items():
        assert bits(tied[key]) == bits(value), key


def test_a_compiled_models_state_dict_with_a_tied_weight_loads_into_the_plain_model(
    tmp_path: Path,
) -> None:
    """Keys with ``_orig_mod.`` (a compiled model's state_dict saved as a mapping)."""
    model, _ = finalized()
    state = {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}
    fs.save_sparse(state, tmp_path / "compiled.fsp")
    loaded = fs.load_sparse(tmp_path / "compiled.fsp", TiedLM())
    assert loaded.head.weight is loaded.embed.weight
    assert bits(loaded.head.weight) == bits(model.head.weight)


def _edit_alias(path: Path, **fields: object) -> None:
    def edit(header: dict) -> None:
        record = next(r for r in header["tensors"] if r["name"] == "head.weight")
        record.update(fields)

    _rewrite_header(path, edit)


@guard(
    "a `.fsp` whose alias record (a tied weight's second key) names no earlier tensor like "
    "it (an edited or damaged header)",
    "`ValueError`: the header is corrupted, naming both tensors; nothing is loaded",
)
@pytest.mark.parametrize(
    "fields",
    [
        {"alias_of": "nope.weight"},
        {"alias_of": "head.weight"},  # itself: not an earlier tensor
        {"shape": [3, 32]},
        {"crc32": 1},
    ],
    ids=["unknown", "itself", "shape", "crc"],
)
def test_a_damaged_alias_record_is_refused(tmp_path: Path, fields: dict) -> None:
    model, _ = finalized()
    path = tmp_path / "tied.fsp"
    fs.save_sparse(model, path)
    _edit_alias(path, **fields)
    with pytest.raises(ValueError, match=r"header is corrupted \(tensor 'head.weight' is an alias"):
        fs.inspect_sparse(path)
    with pytest.raises(ValueError, match="header is corrupted"):
        fs.load_sparse(path, TiedLM())


def test_an_alias_record_with_bytes_of_its_own_is_refused(tmp_path: Path) -> None:
    model, _ = finalized()
    path = tmp_path / "tied.fsp"
    fs.save_sparse(model, path)
    _edit_alias(path, pattern={"codec": "gaps+lzma", "bytes": 3})
    with pytest.raises(ValueError, match=r"bad alias record for tensor 'head\.weight'"):
        fs.inspect_sparse(path)


def test_files_without_a_tie_keep_their_lower_version(tmp_path: Path) -> None:
    """Older readers (formats 1 and 2) still read every file that needs nothing newer."""
    from safetensors import safe_open

    info = fs.save_sparse(untied_copy(finalized()[0]), tmp_path / "plain.fsp")
    assert info.format_version == BASE_FORMAT_VERSION
    with safe_open(str(tmp_path / "plain.fsp"), framework="pt") as f:
        assert f.metadata()["format_version"] == str(BASE_FORMAT_VERSION)
    fs.save_sparse(finalized()[0], tmp_path / "tied.fsp")
    with safe_open(str(tmp_path / "tied.fsp"), framework="pt") as f:
        assert f.metadata()["format_version"] == str(ALIAS_FORMAT_VERSION)


def test_inspect_shows_the_alias_and_counts_the_tie_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, achieved = finalized()
    fs.save_sparse(model, tmp_path / "tied.fsp")
    assert main(["inspect", str(tmp_path / "tied.fsp")]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("head.weight"))
    assert "= embed.weight" in head and head.split()[-1] == "0"
    assert "(format 3," in out
    assert "tensors: 3 (2 sparse, 1 tied: stored once)" in out
    assert f"sparsity of the sparse ones {achieved:.4f}" in out


@guard(
    "a `.fsp` whose header was edited to list one tensor twice, or to a lower format "
    "version than its records need (an alias record in a version-1 file)",
    "`ValueError`: the header is corrupted, naming the tensor or the versions; the later "
    "entry loaded silently before",
)
@pytest.mark.parametrize("edit", ["twice", "version"])
def test_a_header_with_a_repeated_name_or_a_too_low_version_is_refused(
    tmp_path: Path, edit: str
) -> None:
    model, _ = finalized()
    path = tmp_path / "tied.fsp"
    fs.save_sparse(model, path)

    def change(header: dict) -> None:
        if edit == "twice":
            header["tensors"].append(dict(header["tensors"][-1]))
        else:
            header["format_version"] = 1

    _rewrite_header(path, change)
    message = "listed twice" if edit == "twice" else "format version 1, but its records need"
    with pytest.raises(ValueError, match=f"header is corrupted.*{message}"):
        fs.inspect_sparse(path)


class _SharedBuffer(nn.Module):
    """Two layers that share one buffer (a tied table of constants)."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        table = torch.tensor([0.5, 0.0, 0.25])
        self.a = nn.Module()
        self.b = nn.Module()
        self.a.register_buffer("table", table)
        self.b.register_buffer("table", table)
        self.fc = nn.Linear(3, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x * self.a.table + self.b.table)


def test_a_shared_buffer_stays_shared_when_the_model_is_rebuilt_in_the_files_dtype(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``load_sparse(path)`` casts a float64 file's buffers once: one shared buffer
    stays one tensor (it came back as two)."""
    from feather_sparse.models import _registry

    scratch = fs.Registry("model")
    for name in fs.list_models():
        scratch.register(name, _registry._MODELS.get(name))
    monkeypatch.setattr(_registry, "_MODELS", scratch)  # the registration is dropped afterwards
    fs.register_model("test_only_shared_buffer", input_shape=(3,), num_classes=3)(_SharedBuffer)
    model = fs.create_model("test_only_shared_buffer")
    model.fc.double()
    table = model.a.table.double()  # Module.double() would untie it (torch's own _apply)
    model.a.table = model.b.table = table
    assert model.a.table is model.b.table
    fs.save_sparse(model, tmp_path / "shared.fsp")
    loaded = fs.load_sparse(tmp_path / "shared.fsp")
    assert loaded.a.table.dtype == torch.float64 and loaded.a.table is loaded.b.table
    assert torch.equal(loaded.a.table, model.a.table)
