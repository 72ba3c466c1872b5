"""Tests for the mutants of the ``.fsp`` container the suite missed (docs/mutation-audit.md).

Each test states the format's contract (the docstrings of
``feather_sparse.export.fsp`` and ``feather_sparse.export.header``) and checks
it against values computed here: the tensors handed to ``save_sparse``, a
header or container edited by hand, the formulas of the records' properties.
"""

from __future__ import annotations

import json
import lzma
import math
from pathlib import Path

import pytest
import torch
from torch import nn

import feather_sparse as fs
from _helpers import needs_safetensors
from feather_sparse.export import load_sparse_state_dict
from feather_sparse.export.header import (
    ALIAS_FORMAT_VERSION,
    TensorRecord,
)
from test_export import _rewrite_header

pytestmark = pytest.mark.usefixtures("one_thread")


def _entries(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as f:
        metadata = dict(f.metadata())
    return load_file(str(path)), metadata


def _rewrite_container(path: Path, *, data_tail: bytes = b"", **metadata: str) -> None:
    """Write the file again with ``data_tail`` after its data and ``metadata`` changed."""
    from safetensors.torch import save_file

    entries, outer = _entries(path)
    data = entries["feather.data"].numpy().tobytes() + data_tail
    entries["feather.data"] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    save_file(entries, str(path), metadata={**outer, **metadata})


def _header(path: Path) -> dict:
    entries, _ = _entries(path)
    return json.loads(lzma.decompress(entries["feather.header"].numpy().tobytes()))


def _sparse(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g)
    return torch.where(torch.rand(rows, cols, generator=g) < 0.2, w, 0.0)


def _one_of_four(rows: int = 256, cols: int = 64) -> torch.Tensor:
    """A 1:4 weight: the largest magnitude of each group of 4 consecutive entries kept."""
    g = torch.Generator().manual_seed(1)
    groups = torch.randn(rows, cols // 4, 4, generator=g)
    keep = torch.zeros_like(groups, dtype=torch.bool)
    keep.scatter_(2, groups.abs().argmax(dim=2, keepdim=True), True)
    return torch.where(keep, groups, 0.0).reshape(rows, cols)  # +0.0: -0.0 is a value


@needs_safetensors
def test_views_of_one_memory_at_other_offsets_or_as_another_dtype_keep_their_values(
    tmp_path: Path,
) -> None:
    """Only the same view (storage, offset, shape, strides, dtype) is one tensor (fsp01, fsp03)."""
    base = torch.arange(1, 65, dtype=torch.float32).reshape(8, 8)
    base[base % 3 == 0] = 0
    state = {
        "top": base[:4],  # rows 0-3
        "bottom": base[4:],  # rows 4-7: the same shape and strides, another offset
        "bits": base.view(torch.int32),  # the same memory read as integers
        "w": base,
    }
    expected = {key: value.clone() for key, value in state.items()}
    info = fs.save_sparse(state, tmp_path / "views.fsp")
    assert [r.alias_of for r in info.tensors] == [None] * 4
    loaded, _ = load_sparse_state_dict(tmp_path / "views.fsp")
    for key, value in expected.items():
        assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key


@needs_safetensors
def test_an_nm_record_whose_non_zero_count_was_edited_is_refused(tmp_path: Path) -> None:
    """The header's count of non-zeros is checked against the decoded N:M values (fsp08)."""
    w = _one_of_four()
    path = tmp_path / "nm.fsp"
    info = fs.save_sparse({"w": w}, path)
    assert info.tensors[0].nm_pattern == "1:4"
    assert info.tensors[0].nnz == int(torch.count_nonzero(w))

    def edit(header: dict) -> None:
        header["tensors"][0]["nnz"] -= 1

    _rewrite_header(path, edit)
    with pytest.raises(ValueError, match=r"tensor 'w'.*non-zeros"):
        load_sparse_state_dict(path)


@pytest.mark.parametrize("field", ["library_version", "format_version"])
@needs_safetensors
def test_container_metadata_that_differs_from_the_header_is_refused(
    tmp_path: Path, field: str
) -> None:
    """The safetensors metadata has no checksum: it must repeat the header exactly (fsp10)."""
    path = tmp_path / "m.fsp"
    fs.save_sparse({"w": _sparse(16, 16)}, path)
    _rewrite_container(path, **{field: {"library_version": "0.0.1", "format_version": "2"}[field]})
    with pytest.raises(ValueError, match=r"safetensors metadata .* does not match its header"):
        fs.inspect_sparse(path)
    with pytest.raises(ValueError, match="does not match its header"):
        load_sparse_state_dict(path)


@needs_safetensors
def test_data_longer_than_the_records_is_refused(tmp_path: Path) -> None:
    """Every byte of the data belongs to a record: extra bytes mean a damaged file (fsp11)."""
    path = tmp_path / "m.fsp"
    fs.save_sparse({"w": _sparse(16, 16), "b": torch.ones(16)}, path)
    _rewrite_container(path, data_tail=b"\x00")
    with pytest.raises(ValueError, match=r"corrupted \(data size does not match the header\)"):
        load_sparse_state_dict(path)


class _Holder(nn.Module):
    """A model with a submodule that happens to be called ``_orig_mod``."""

    def __init__(self) -> None:
        super().__init__()
        self._orig_mod = nn.Linear(4, 4)
        self.other = nn.Linear(4, 2)


@needs_safetensors
def test_a_model_with_one_orig_mod_submodule_keeps_its_keys(tmp_path: Path) -> None:
    """The compile prefix is dropped only when *every* key has it (fsp16)."""
    torch.manual_seed(0)
    model = _Holder()
    fs.save_sparse(model, tmp_path / "h.fsp")
    loaded = fs.load_sparse(tmp_path / "h.fsp", _Holder())
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def _tied_file(path: Path) -> None:
    w = _sparse(16, 16)
    fs.save_sparse({"a": w, "b": w, "c": w}, path)
    assert [r.alias_of for r in fs.inspect_sparse(path).tensors] == [None, "a", "a"]


@needs_safetensors
def test_an_alias_of_a_later_record_is_refused(tmp_path: Path) -> None:
    """An alias names an *earlier* stored record (fsp21): "a" made an alias of "b"."""
    path = tmp_path / "t.fsp"
    _tied_file(path)

    def edit(header: dict) -> None:
        a, b, _ = header["tensors"]
        stored = dict(a, name="b")
        header["tensors"][:2] = [dict(b, name="a", alias_of="b"), stored]

    _rewrite_header(path, edit)
    with pytest.raises(ValueError, match=r"tensor 'a' is an alias of 'b', which is not an earlier"):
        fs.inspect_sparse(path)


@needs_safetensors
def test_an_alias_of_an_alias_is_refused(tmp_path: Path) -> None:
    """An alias names an earlier *stored* record, not another alias (fsp22)."""
    path = tmp_path / "t.fsp"
    _tied_file(path)
    _rewrite_header(path, lambda header: header["tensors"][2].update(alias_of="b"))
    with pytest.raises(ValueError, match=r"tensor 'c' is an alias of 'b', which is not an earlier"):
        fs.inspect_sparse(path)


def test_an_alias_record_holds_no_bytes_and_adds_nothing_to_the_bound() -> None:
    """An alias stores nothing: 0 bytes, 0 towards the entropy bound (fsp28)."""
    alias = TensorRecord("head.weight", (96, 32), "float32", 100, 7, alias_of="embed.weight")
    assert alias.stored_bytes == 0
    assert alias.entropy_bound_bytes == 0.0
    assert alias.dense_bytes == 96 * 32 * 4  # its own dense size, which the file's total skips


@needs_safetensors
def test_a_tied_nm_weight_is_written_at_the_alias_version(tmp_path: Path) -> None:
    """The lowest version that holds an alias *and* an N:M record is 3 (fsp30)."""
    w = _one_of_four()
    info = fs.save_sparse({"w": w, "tied": w}, tmp_path / "nm.fsp")
    assert info.tensors[0].nm_pattern == "1:4" and info.tensors[1].alias_of == "w"
    assert info.format_version == ALIAS_FORMAT_VERSION == 3
    assert _header(tmp_path / "nm.fsp")["format_version"] == 3


def test_entropy_bound_of_an_unstructured_and_an_nm_record() -> None:
    """``H(d)·N/8 + raw value bytes``; N:M: ``log2 C(M, N)`` bits a group, N values a group."""
    d = 30 / 100
    h = -(d * math.log2(d) + (1 - d) * math.log2(1 - d))
    flat = TensorRecord("w", (10, 10), "float32", 30, 0, "gaps+lzma", 5, "float32", (120,))
    assert flat.entropy_bound_bytes == pytest.approx(h * 100 / 8 + 30 * 4, rel=1e-12)
    # 2:4 over 64 entries: 16 groups of log2(6) bits, 32 values (zeros included) of 2 bytes
    nm = TensorRecord(
        "w", (4, 16), "float32", 30, 0, "nm+lzma", 5, "float16", (64,), nm_pattern="2:4"
    )
    assert nm.entropy_bound_bytes == pytest.approx(16 * math.log2(6) / 8 + 32 * 2, rel=1e-12)


@needs_safetensors
def test_a_pattern_with_another_count_than_its_record_is_refused_by_name(tmp_path: Path) -> None:
    """A bit mask does not store its count: the decoded mask must hold the record's ``nnz``.

    An edited record (twice the non-zeros, stored as twice as many float16
    values: the same bytes) decodes values of the right total size; the
    pattern then has half the non-zeros the record names (fsp07).
    """
    g = torch.Generator().manual_seed(2)
    bits = torch.randint(-(2**31), 2**31 - 1, (64, 64), generator=g, dtype=torch.int32)
    w = torch.where(bits == 0, 1, bits).view(torch.float32)  # no zero bit pattern
    w = torch.where(torch.rand(64, 64, generator=g) < 0.4, w, 0.0)  # random bits: raw planes
    path = tmp_path / "m.fsp"
    record = fs.save_sparse({"w": w}, path).tensors[0]
    n = record.nnz
    assert record.pattern_codec == "bitmask+lzma" and record.value_planes == (n, n, n, n)

    def edit(header: dict) -> None:
        header["tensors"][0].update(nnz=2 * n)
        header["tensors"][0]["values"].update(dtype="float16", planes=[2 * n, 2 * n])

    _rewrite_header(path, edit)
    with pytest.raises(ValueError, match=rf"tensor 'w': pattern does not have {2 * n} non-zeros"):
        load_sparse_state_dict(path)


class _Scaled(nn.Module):
    """A registered model with tensors of its own at the top (no submodule prefix)."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([1.0, 0.0, 1.0 / 3.0]))
        self.register_buffer("shift", torch.tensor([0.1, 0.0, 0.7]))
        self.fc = nn.Linear(3, num_classes)


@needs_safetensors
def test_a_model_rebuilt_from_its_spec_gets_the_files_dtype_for_its_own_top_level_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``load_sparse(path)`` builds in float32, then gives *every* tensor its file dtype (fsp18)."""
    from feather_sparse.models import _registry

    scratch = fs.Registry("model")
    for name in fs.list_models():
        scratch.register(name, _registry._MODELS.get(name))
    monkeypatch.setattr(_registry, "_MODELS", scratch)  # the registration is dropped afterwards
    fs.register_model("test_only_scaled", input_shape=(3,), num_classes=3)(_Scaled)

    model = fs.create_model("test_only_scaled").double()
    path = tmp_path / "scaled.fsp"
    fs.save_sparse(model, path)
    loaded = fs.load_sparse(path)
    for key, value in model.state_dict().items():
        got = loaded.state_dict()[key]
        assert got.dtype == torch.float64 and torch.equal(got, value), key


@needs_safetensors
def test_sparsity_counts_the_tensors_stored_sparse_only(tmp_path: Path) -> None:
    """The file's sparsity is over its sparse tensors; dense ones are left out (fsp32)."""
    w = torch.zeros(10, 10)
    w.view(-1)[::4] = torch.arange(1.0, 26.0)  # 25 non-zeros of 100
    state = {"w": w, "b": torch.arange(1.0, 11.0), "steps": torch.tensor(3)}  # b, steps: dense
    info = fs.save_sparse(state, tmp_path / "m.fsp")
    assert [r.is_sparse for r in info.tensors] == [True, False, False]
    assert info.sparsity == 0.75
    assert fs.inspect_sparse(tmp_path / "m.fsp").sparsity == 0.75
    assert _header(tmp_path / "m.fsp")["sparsity"] == 0.75
