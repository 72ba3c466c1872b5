"""Tests of feather_sparse.export: sparse checkpoints, sparse inference, CLI, ONNX."""

from __future__ import annotations

import json
import math
import struct
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from _guards import guard
from _helpers import needs_safetensors
from _hypothesis import given, settings, st
from feather_sparse import Pruner, __version__, cli, export
from feather_sparse.export import (
    BASE_FORMAT_VERSION,
    FORMAT_VERSION,
    PATTERN_CODECS,
    SparseLinear,
    SparsePointwiseConv,
    export_onnx,
    inspect_sparse,
    load_sparse,
    load_sparse_state_dict,
    save_sparse,
    to_sparse_inference,
    verify_onnx,
)

try:
    from feather_sparse.models import create_model, list_models, model_info

    REGISTERED_MODELS = list_models()
except ImportError:  # the model zoo is not there yet
    REGISTERED_MODELS = []

# Models above this many parameters take many seconds to encode: slow tests only.
_FAST_MODEL_PARAMS = 5_000_000
# ... and above this many, the forward comparison is skipped in the fast suite
# (the bit-exact state_dict already proves the model identical).
_FORWARD_CHECK_PARAMS = 1_500_000


def _num_params(name: str) -> int:
    with torch.device("meta"):  # no memory, no init: just the shapes
        return sum(p.numel() for p in create_model(name).parameters())


_MODEL_PARAMS = {name: _num_params(name) for name in REGISTERED_MODELS}


pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def prune_(model: nn.Module, sparsity: float) -> nn.Module:
    """Zero the smallest-magnitude fraction of every conv/linear weight, in place."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear | nn.Conv1d | nn.Conv2d | nn.Conv3d):
                w = module.weight
                k = int(sparsity * w.numel())
                if k:
                    threshold = w.abs().flatten().kthvalue(k).values
                    w[w.abs() <= threshold] = 0
    return model


def assert_bit_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    # key order may differ: Pruner.finalize re-registers the weights last
    assert sorted(a) == sorted(b)
    for name in a:
        x, y = a[name], b[name]
        assert x.dtype == y.dtype and x.shape == y.shape, name
        x, y = x.detach().cpu().contiguous(), y.detach().cpu().contiguous()
        if x.is_floating_point():
            x, y = x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)
        assert torch.equal(x, y), f"{name} differs"


class MixedNet(nn.Module):
    """Conv + BN + 1x1 conv + linear, plus buffers of several dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 16, 5)
        self.bn = nn.BatchNorm1d(16)
        self.point = nn.Conv1d(16, 32, 1)
        self.fc = nn.Linear(32 * 36, 64)
        self.head = nn.Linear(64, 10)
        self.register_buffer("half_buf", torch.tensor([0.0, 1.5, 0.0, -2.0], dtype=torch.float16))
        self.register_buffer("bf16_buf", torch.zeros(50, dtype=torch.bfloat16))
        self.register_buffer("f64_buf", torch.tensor([0.0] * 30 + [math.pi], dtype=torch.float64))
        self.register_buffer("ints", torch.arange(7))
        self.register_buffer("flags", torch.tensor([True, False, True]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.relu(self.point(x)).flatten(1)
        return self.head(torch.relu(self.fc(x)))


@pytest.fixture
def sparse_net() -> MixedNet:
    net = prune_(MixedNet(), 0.9)
    with torch.no_grad():
        net.fc.weight[0, :3] = torch.tensor([-0.0, float("nan"), float("inf")])
        net.bn.running_mean.uniform_()  # a buffer without zeros stays dense
    return net


def entropy_bound_bytes(tensor: torch.Tensor) -> float:
    """The issue's bound: H(d)·N + 32·nnz bits, in bytes."""
    n = tensor.numel()
    nnz = int(torch.count_nonzero(tensor))
    d = nnz / n
    h = -(d * math.log2(d) + (1 - d) * math.log2(1 - d))
    return (h * n + 32 * nnz) / 8


def data_offset(path: Path) -> int:
    """Where the tensor data begin in a safetensors file."""
    (header_len,) = struct.unpack("<Q", path.read_bytes()[:8])
    return 8 + header_len


# ---------------------------------------------------------------------------
# round trips
# ---------------------------------------------------------------------------


@needs_safetensors
def test_round_trip_is_bit_exact(sparse_net: MixedNet, tmp_path: Path) -> None:
    path = tmp_path / "net.fsp"
    info = save_sparse(sparse_net, path)
    fresh = MixedNet()
    assert load_sparse(path, fresh) is fresh
    assert_bit_equal(sparse_net.state_dict(), fresh.state_dict())
    assert torch.signbit(fresh.fc.weight[0, 0]) and fresh.fc.weight[0, 0] == 0
    # What is stored sparse: the pruned weights and the zero-heavy buffers,
    # never the integer/bool buffers or tensors without zeros.
    encoding = {r.name: r.is_sparse for r in info.tensors}
    assert encoding["fc.weight"] and encoding["point.weight"] and encoding["bf16_buf"]
    assert encoding["f64_buf"]
    for dense in ("ints", "flags", "bn.running_mean", "bn.num_batches_tracked", "fc.bias"):
        assert not encoding[dense], dense
    assert info.file_bytes < info.dense_bytes / 4


@needs_safetensors
def test_metadata_round_trip(sparse_net: MixedNet, tmp_path: Path) -> None:
    sparse_net.feather_model_spec = {"name": "mixed", "kwargs": {"width": 2}}
    path = tmp_path / "net.fsp"
    save_sparse(sparse_net, path, metadata={"epoch": 3, "note": "hi"})
    info = inspect_sparse(path)
    assert info.format_version == BASE_FORMAT_VERSION  # no N:M record: the version-1 layout
    assert info.library_version == __version__
    assert info.model_spec == {"name": "mixed", "kwargs": {"width": 2}}
    assert info.metadata == {"epoch": 3, "note": "hi"}
    assert info.values == "fp32"
    records = {r.name: r for r in info.tensors}
    assert [r.name for r in info.tensors] == list(sparse_net.state_dict())
    assert records["fc.weight"].shape == (64, 32 * 36) and records["fc.weight"].dtype == "float32"
    assert records["half_buf"].dtype == "float16" and records["ints"].dtype == "int64"
    fc = sparse_net.fc.weight
    assert records["fc.weight"].nnz == int((fc.view(torch.int32) != 0).sum())
    # 90 % of each pruned weight is zero (fc.weight: -0.0 counts as a value).
    assert 0.89 < info.sparsity < 0.95


@needs_safetensors
def test_state_dict_input_and_order(tmp_path: Path) -> None:
    state = {"b": torch.zeros(10), "a": torch.tensor([0.0, 0.0, 3.0] * 100)}
    save_sparse(state, tmp_path / "s.fsp")
    loaded, info = load_sparse_state_dict(tmp_path / "s.fsp")
    assert_bit_equal(state, loaded)
    assert info.model_spec is None


@pytest.mark.parametrize("values,dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
@needs_safetensors
def test_reduced_precision_values(values: str, dtype: torch.dtype, tmp_path: Path) -> None:
    net = prune_(nn.Linear(256, 256), 0.9)
    exact, half = tmp_path / "exact.fsp", tmp_path / "half.fsp"
    save_sparse(net, exact)
    info = save_sparse(net, half, values=values)
    assert info.values == values
    assert {r.values_dtype for r in info.tensors if r.is_sparse} == {str(dtype)[6:]}
    loaded = load_sparse(half, nn.Linear(256, 256))
    # Lossy only in the non-zeros; the bias (dense) is exact.
    assert torch.equal(loaded.weight, net.weight.to(dtype).float())
    assert torch.equal(loaded.bias, net.bias)
    values_bytes = 4 * int(torch.count_nonzero(net.weight))
    assert half.stat().st_size < exact.stat().st_size - values_bytes // 3


@guard("`save_sparse` at fp16 of weights beyond fp16's range", "`ValueError`: overflows")
def test_fp16_overflow_is_an_error(tmp_path: Path) -> None:
    net = prune_(nn.Linear(32, 32), 0.9)
    with torch.no_grad():
        net.weight[net.weight != 0] = 1e6
    with pytest.raises(ValueError, match="overflows"):
        save_sparse(net, tmp_path / "x.fsp", values="fp16")


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.slow if _MODEL_PARAMS[n] > _FAST_MODEL_PARAMS else ())
        for n in REGISTERED_MODELS
    ]
    or [pytest.param("none", marks=pytest.mark.skip(reason="feather_sparse.models not present"))],
)
@needs_safetensors
def test_every_registered_model_round_trips(name: str, tmp_path: Path) -> None:
    model = prune_(create_model(name), 0.9)
    path = tmp_path / f"{name}.fsp"
    info = save_sparse(model, path)
    assert info.model_spec is not None and info.model_spec["name"] == name
    assert info.sparsity > 0.85
    rebuilt = load_sparse(path)  # built from the stored spec
    assert_bit_equal(model.state_dict(), rebuilt.state_dict())
    if _MODEL_PARAMS[name] <= _FORWARD_CHECK_PARAMS:
        x = torch.randn(2, *model_info(name).input_shape)
        model.eval(), rebuilt.eval()
        with torch.no_grad():
            assert torch.equal(model(x), rebuilt(x))


# ---------------------------------------------------------------------------
# size
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("sparsity", [0.90, 0.95, 0.98, 0.99])
@needs_safetensors
def test_file_within_five_percent_of_entropy_bound(sparsity: float, tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(1024, 1024, generator=generator)
    # random pattern (i.i.d., the hardest for the coder), random values
    weight[torch.rand(weight.shape, generator=generator) < sparsity] = 0
    path = tmp_path / "w.fsp"
    (record,) = save_sparse({"weight": weight}, path).tensors
    size = path.stat().st_size  # the whole file, header included
    bound = entropy_bound_bytes(weight)
    assert size <= 1.05 * bound, f"{size / bound:.4f}x the entropy bound"
    # the pattern coder on its own is near H(d)·N (values are coded separately)
    nnz = int(torch.count_nonzero(weight))
    pattern_entropy = entropy_bound_bytes(weight) - 4 * nnz
    assert record.pattern_bytes <= 1.05 * pattern_entropy
    assert sum(record.value_planes) <= 4 * nnz  # never more than raw float32
    # and far below plain int64 COO (two indices + a value per non-zero)
    assert size < 0.5 * nnz * (2 * 8 + 4)


def test_values_of_pruned_weights_compress() -> None:
    # Magnitude pruning keeps the large weights: their sign/exponent byte has
    # little entropy, which the byte-plane coder exploits (losslessly).
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(512, 512, generator=generator) * 0.05
    linear = nn.Linear(512, 512, bias=False)
    with torch.no_grad():
        linear.weight.copy_(weight)
    prune_(linear, 0.9)
    record = export.fsp._encode_tensor("w", linear.weight, "fp32")[0]
    raw = 4 * record.nnz
    assert sum(record.value_planes) < 0.9 * raw
    # the exponent plane (byte 3, little-endian) is the one that shrinks most
    assert record.value_planes[3] < 0.5 * record.nnz


def _mask_strategy() -> st.SearchStrategy[np.ndarray]:
    return st.lists(st.integers(0, 600), max_size=40).map(_mask_from_gaps)


def _mask_from_gaps(runs: list[int]) -> np.ndarray:
    # alternating runs of zeros and ones, so long gaps (>= 255) appear
    bits = [i % 2 == 1 for i, run in enumerate(runs) for _ in range(run)]
    return np.array(bits, dtype=bool)


@settings(max_examples=60, deadline=None)
@given(mask=_mask_strategy())
def test_pattern_codecs_are_lossless(mask: np.ndarray) -> None:
    for name in PATTERN_CODECS.names():
        codec = PATTERN_CODECS.get(name)
        decoded = codec.decode(codec.encode(mask), mask.size, int(mask.sum()))
        assert np.array_equal(decoded, mask), name


@pytest.mark.parametrize("gap", [0, 1, 254, 255, 256, 509, 510, 511, 100_000])
def test_gap_codec_golden_gaps(gap: int) -> None:
    # one non-zero after `gap` zeros, then a trailing zero run
    mask = np.zeros(gap + 1 + 7, dtype=bool)
    mask[gap] = True
    codec = PATTERN_CODECS.get("gaps+lzma")
    assert np.array_equal(codec.decode(codec.encode(mask), mask.size, 1), mask)


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------


@guard("`load_sparse` of a missing file", "`FileNotFoundError`: does not exist")
@needs_safetensors
def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_sparse(tmp_path / "nope.fsp", nn.Linear(2, 2))


@guard("a truncated `.fsp`", "`ValueError` naming the file")
@needs_safetensors
def test_truncated_file(sparse_net: MixedNet, tmp_path: Path) -> None:
    path = tmp_path / "net.fsp"
    save_sparse(sparse_net, path)
    data = path.read_bytes()
    for cut in (len(data) - 1, len(data) // 2, 20, 4):
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="truncated or corrupted"):
            load_sparse(path, MixedNet())


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@needs_safetensors
def test_corrupted_data_is_detected(where: str, sparse_net: MixedNet, tmp_path: Path) -> None:
    path = tmp_path / "net.fsp"
    save_sparse(sparse_net, path)
    data = bytearray(path.read_bytes())
    start = data_offset(path)
    index = {"first": start, "middle": (start + len(data)) // 2, "last": len(data) - 1}[where]
    data[index] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupted"):
        load_sparse(path, MixedNet())


def _rewrite_metadata(path: Path, edit: dict[str, str]) -> None:
    """Rewrite the safetensors ``__metadata__`` of a file, keeping its entries."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(path), framework="pt") as f:
        metadata = dict(f.metadata())
    save_file(load_file(str(path)), str(path), metadata={**metadata, **edit})


@needs_safetensors
def test_other_format_version(tmp_path: Path) -> None:
    path = tmp_path / "lin.fsp"
    save_sparse(prune_(nn.Linear(8, 8), 0.5), path)
    _rewrite_metadata(path, {"format_version": str(FORMAT_VERSION + 1), "library_version": "9.0"})
    with pytest.raises(ValueError, match=rf"format version {FORMAT_VERSION + 1}.*9\.0"):
        load_sparse(path, nn.Linear(8, 8))


@guard("a plain safetensors file read as a `.fsp`", "`ValueError`: not a feather-sparse checkpoint")
@needs_safetensors
def test_plain_safetensors_file_is_rejected(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"weight": torch.zeros(3)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(ValueError, match="not a feather-sparse checkpoint"):
        inspect_sparse(tmp_path / "plain.safetensors")


@guard("a file of no known kind read as a `.fsp`", "`ValueError`: truncated or corrupted")
@needs_safetensors
def test_not_a_file_of_any_kind(tmp_path: Path) -> None:
    (tmp_path / "junk.fsp").write_bytes(b"certainly not safetensors" * 10)
    with pytest.raises(ValueError, match="truncated or corrupted"):
        inspect_sparse(tmp_path / "junk.fsp")


@needs_safetensors
def test_wrong_architecture_names_the_mismatch(sparse_net: MixedNet, tmp_path: Path) -> None:
    path = tmp_path / "net.fsp"
    save_sparse(sparse_net, path)
    other = MixedNet()
    other.head = nn.Linear(64, 100)
    with pytest.raises(ValueError, match=r"head\.weight: file \(10, 64\) vs model \(100, 64\)"):
        load_sparse(path, other)
    with pytest.raises(ValueError, match=r"missing from the file: 0\.weight.*not in the model"):
        load_sparse(path, nn.Sequential(nn.Linear(3, 3)))
    # nothing was loaded into the model on failure
    assert not torch.equal(other.fc.weight, sparse_net.fc.weight)


@needs_safetensors
def test_load_without_model_needs_a_spec(sparse_net: MixedNet, tmp_path: Path) -> None:
    save_sparse(sparse_net, tmp_path / "net.fsp")
    with pytest.raises(ValueError, match="no model spec"):
        load_sparse(tmp_path / "net.fsp")


@guard(
    "`save_sparse` with an unknown `values` or non-JSON metadata",
    "`ValueError` naming the argument",
)
def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="values must be one of"):
        save_sparse(nn.Linear(2, 2), tmp_path / "x.fsp", values="fp8")
    with pytest.raises(ValueError, match="JSON-serializable"):
        save_sparse(nn.Linear(2, 2), tmp_path / "x.fsp", metadata={"f": object()})
    assert not (tmp_path / "x.fsp").exists()


@guard(
    "`save_sparse` of a non-model, non-mapping metadata, a uint16 or sparse tensor; "
    "`load_sparse(path, 'name')`; `export_onnx` with a list; `to_sparse_inference(m, '0.9')`",
    "`TypeError` naming the argument and what it accepts; nothing written",
)
@needs_safetensors
def test_wrong_types_name_the_argument(tmp_path: Path) -> None:
    out = tmp_path / "x.fsp"
    model = nn.Linear(2, 2)
    for bad in (None, torch.zeros(2), Pruner(nn.Linear(4, 4), 0.5, 10)):
        with pytest.raises(TypeError, match=r"model must be an nn\.Module or a state_dict"):
            save_sparse(bad, out)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"pruner\.finalize\(\) and save pruner\.model"):
        save_sparse(Pruner(nn.Linear(4, 4), 0.5, 10), out)  # type: ignore[arg-type]
    for metadata in (["x"], "note"):
        with pytest.raises(TypeError, match="metadata must be a mapping"):
            save_sparse(model, out, metadata=metadata)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"entry 'w' has dtype uint16.*int8 to int64"):
        save_sparse({"w": torch.zeros(8, dtype=torch.uint16)}, out)
    with pytest.raises(TypeError, match=r"entry 'w' is a sparse_coo tensor.*to_dense\(\)"):
        save_sparse({"w": torch.eye(4).to_sparse()}, out)
    assert not out.exists()
    save_sparse(model, out)
    with pytest.raises(TypeError, match=r"model must be the nn.Module.*create_model\('mlp'\)"):
        load_sparse(out, "mlp")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"example_input must be one tensor.*got list"):
        export_onnx(model, tmp_path / "x.onnx", [torch.randn(2, 2)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"min_sparsity must be a number in \[0, 1\]"):
        to_sparse_inference(model, "0.9")  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.fsp"]


@guard(
    "`save_sparse` or `export_onnx` to a path holding another kind of file "
    "(a training checkpoint, a `.fsp`)",
    "`FileExistsError` naming the file; the file unchanged",
)
@needs_safetensors
def test_a_file_of_another_kind_is_never_replaced(tmp_path: Path) -> None:
    checkpoint = tmp_path / "last.pt"
    torch.save({"model": {"w": torch.zeros(2)}}, checkpoint)
    before = checkpoint.read_bytes()
    with pytest.raises(FileExistsError, match=r"last\.pt already holds a PyTorch checkpoint"):
        save_sparse(nn.Linear(2, 2), checkpoint)
    fsp = tmp_path / "m.fsp"
    save_sparse(nn.Linear(2, 2), fsp)
    save_sparse(nn.Linear(3, 3), fsp)  # a .fsp over a .fsp: replaced, as always
    good = fsp.read_bytes()
    with pytest.raises(FileExistsError, match=r"m\.fsp already holds a sparse checkpoint"):
        export_onnx(nn.Linear(3, 3), fsp, torch.randn(2, 3))
    assert checkpoint.read_bytes() == before and fsp.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "m.fsp"]


def _rewrite_header(path: Path, edit: Callable[[dict], None]) -> None:
    """Edit the decoded ``feather.header`` JSON and write it back validly (new CRC-64)."""
    import lzma

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(path), framework="pt") as f:
        metadata = dict(f.metadata())
    entries = load_file(str(path))
    header = json.loads(lzma.decompress(entries["feather.header"].numpy().tobytes()))
    edit(header)
    packed = lzma.compress(json.dumps(header).encode(), format=lzma.FORMAT_XZ)
    entries["feather.header"] = torch.frombuffer(bytearray(packed), dtype=torch.uint8)
    save_file(entries, str(path), metadata=metadata)


@guard("a `.fsp` whose model spec was edited", "`ValueError` before any model is allocated")
@pytest.mark.skipif("mnist1d_cnn" not in REGISTERED_MODELS, reason="needs the model zoo")
@needs_safetensors
def test_edited_model_spec_fails_before_the_model_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import feather_sparse.models as zoo

    path = tmp_path / "net.fsp"
    save_sparse(prune_(create_model("mnist1d_cnn"), 0.9), path)
    _rewrite_header(path, lambda h: h["model_spec"]["kwargs"].update(width=24))
    built_on: list[str] = []  # the device of every model load_sparse builds

    def create(name: str, **kwargs: object) -> nn.Module:
        model = create_model(name, **kwargs)
        built_on.append(next(model.parameters()).device.type)
        return model

    monkeypatch.setattr(zoo, "create_model", create)
    with pytest.raises(ValueError, match=r"width=24.*shape mismatch.*does not fit its own tensors"):
        load_sparse(path)
    assert built_on == ["meta"]  # checked on a shapes-only model: no ~400 MB allocated


@pytest.mark.parametrize("name", REGISTERED_MODELS)
def test_every_registered_model_builds_on_meta(name: str) -> None:
    """load_sparse checks a file's spec on the meta device first; every model must allow it."""
    with torch.device("meta"):
        model = create_model(name)
    assert all(p.device.type == "meta" for p in model.parameters())


@guard(
    "`save_sparse` to a folder, or below a file",
    "`IsADirectoryError` / `NotADirectoryError` suggesting a file name",
)
def test_save_sparse_to_a_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError, match=r"is a directory; .*model\.fsp"):
        save_sparse(nn.Linear(2, 2), tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file, not a folder"):
        save_sparse(nn.Linear(2, 2), tmp_path / "file" / "sub" / "m.fsp")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no temporary left


@guard(
    "`inspect_sparse` / `load_sparse` of a folder or a `.pt`",
    "`IsADirectoryError`; `ValueError` pointing to `feather-sparse export`",
)
@needs_safetensors
def test_reading_a_folder_or_a_torch_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError, match=r"is a folder, not a sparse checkpoint"):
        inspect_sparse(tmp_path)
    torch.save({"a": torch.zeros(2)}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match=r"is a PyTorch checkpoint.*feather-sparse export"):
        load_sparse(tmp_path / "x.pt", nn.Linear(2, 2))


@guard(
    "the disk fills up while a `.fsp` is written", "`DiskFullError`; the previous file unchanged"
)
@needs_safetensors
def test_full_disk_keeps_the_previous_file(
    sparse_net: MixedNet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    path = tmp_path / "net.fsp"
    save_sparse(sparse_net, path)
    good = path.read_bytes()

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError, match=r"disk is full.*unchanged") as caught:
        save_sparse(prune_(MixedNet(), 0.5), path)
    assert caught.value.errno == errno.ENOSPC
    assert path.read_bytes() == good and [p.name for p in tmp_path.iterdir()] == ["net.fsp"]


@needs_safetensors
def test_temporaries_of_killed_writers_are_removed(tmp_path: Path) -> None:
    import os

    dead = tmp_path / ".m.fsp.999999999.0a1b2c3d.tmp"  # no such pid
    alive = tmp_path / f".m.fsp.{os.getppid()}.0a1b2c3d.tmp"  # a writer still running
    other = tmp_path / ".n.fsp.999999999.0a1b2c3d.tmp"  # another target's
    for leftover in (dead, alive, other):
        leftover.write_bytes(b"partial")
    save_sparse(nn.Linear(2, 2), tmp_path / "m.fsp")
    assert not dead.exists() and alive.exists() and other.exists()


@guard(
    "`export` / `inspect` of a folder, a missing, garbage or cut file",
    "CLI exit 1, one line, no torch advice",
)
@needs_safetensors
def test_cli_bad_files_are_one_line(
    fake_zoo: ZooFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def one_line_error(argv: list[str], *expected: str) -> None:
        assert cli.main(argv) == 1
        printed = capsys.readouterr()
        lines = printed.err.strip().splitlines()
        assert len(lines) == 1, printed.err
        assert all(text in lines[0] for text in expected), lines[0]
        assert "weights_only" not in lines[0] and "Traceback" not in printed.err

    out = tmp_path / "out.fsp"
    one_line_error(["inspect", str(tmp_path)], "is a folder")
    one_line_error(["export", str(tmp_path / "missing.fsp"), "-o", str(out)], "does not exist")
    (tmp_path / "garbage.fsp").write_bytes(b"\x00garbage" * 100)
    one_line_error(
        ["export", str(tmp_path / "garbage.fsp"), "-o", str(out)], "not a feather-sparse"
    )
    one_line_error(["inspect", str(tmp_path / "garbage.fsp")], "truncated or corrupted")
    torch.save({"a": torch.zeros(2)}, tmp_path / "x.pt")
    one_line_error(["inspect", str(tmp_path / "x.pt")], "PyTorch checkpoint")
    data = (tmp_path / "x.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    one_line_error(["export", str(tmp_path / "cut.pt"), "-o", str(out)], "damaged")
    save_sparse(prune_(fake_zoo("mixed"), 0.5), tmp_path / "good.fsp")
    one_line_error(["export", str(tmp_path / "good.fsp"), "-o", str(tmp_path)], "is a directory")
    assert not out.exists()


# ---------------------------------------------------------------------------
# sparse inference
# ---------------------------------------------------------------------------


def test_sparse_linear_matches_dense() -> None:
    linear = prune_(nn.Linear(300, 200), 0.95)
    sparse = SparseLinear.from_dense(linear)
    assert sparse.weight_csr.crow_indices().dtype == torch.int32
    assert sparse.weight_csr.col_indices().dtype == torch.int32
    x = torch.randn(4, 7, 300)  # extra leading dims, like nn.Linear
    with torch.no_grad():
        out = sparse(x)
        torch.testing.assert_close(out, linear(x), rtol=1e-5, atol=1e-5)
    assert out.is_contiguous() and out.shape == (4, 7, 200)
    no_bias = nn.Linear(50, 20, bias=False)
    torch.testing.assert_close(SparseLinear.from_dense(no_bias)(x[..., :50]), no_bias(x[..., :50]))


@pytest.mark.parametrize(
    "conv,shape",
    [
        (nn.Conv1d(24, 40, 1), (3, 24, 17)),
        (nn.Conv2d(24, 40, 1, stride=2, bias=False), (3, 24, 9, 10)),
        (nn.Conv2d(24, 40, (1, 1)), (24, 5, 6)),  # unbatched input
        (nn.Conv3d(24, 8, 1, stride=(1, 2, 2)), (2, 24, 3, 5, 5)),
    ],
)
def test_sparse_pointwise_conv_matches_dense(conv: nn.Module, shape: tuple[int, ...]) -> None:
    prune_(conv, 0.9)
    sparse = SparsePointwiseConv.from_dense(conv)
    x = torch.randn(shape)
    with torch.no_grad():
        torch.testing.assert_close(sparse(x), conv(x), rtol=1e-5, atol=1e-5)


def test_to_sparse_inference_converts_only_eligible_layers() -> None:
    net = nn.Sequential(
        nn.Conv2d(8, 64, 3, padding=1),  # 3x3: never converted
        nn.Conv2d(64, 512, 1),  # 1x1, sparse enough
        nn.Conv2d(512, 128, 1, padding=1),  # padded 1x1: not a plain matmul
        nn.Flatten(),
        nn.Linear(128 * 6 * 6, 256),  # sparse enough
        nn.Linear(256, 10),  # too dense after pruning at 50 %
    ).eval()
    prune_(net, 0.95)
    with torch.no_grad():
        net[5].weight.normal_()
        net[5].weight[:, :128] = 0
    converted = to_sparse_inference(net, min_sparsity=0.9, min_weights=1000)
    kinds = [type(m).__name__ for m in converted]
    assert kinds == ["Conv2d", "SparsePointwiseConv", "Conv2d", "Flatten", "SparseLinear", "Linear"]
    assert type(net[1]) is nn.Conv2d  # the original is untouched (inplace=False)
    x = torch.randn(2, 8, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(converted(x), net(x), rtol=1e-4, atol=1e-5)
    # a size floor keeps small layers dense
    small = to_sparse_inference(net, min_sparsity=0.9, min_weights=10**7)
    assert not any(isinstance(m, SparseLinear | SparsePointwiseConv) for m in small.modules())


def test_to_sparse_inference_with_example_input_times_layers() -> None:
    net = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 16)).eval()
    prune_(net, 0.99)
    x = torch.randn(8, 2048)
    converted = to_sparse_inference(net, min_weights=0, example_input=x, repeats=3)
    # whatever the timings decided, outputs agree and only eligible types appear
    assert {type(m) for m in converted} <= {nn.Linear, SparseLinear, nn.ReLU}
    with torch.no_grad():
        torch.testing.assert_close(converted(x), net(x), rtol=1e-4, atol=1e-5)
    inplace = to_sparse_inference(net, min_weights=0, inplace=True)
    assert inplace is net and isinstance(net[0], SparseLinear)


@pytest.mark.gpu
def test_sparse_layers_on_cuda() -> None:
    linear = prune_(nn.Linear(300, 200), 0.95).cuda()
    conv = prune_(nn.Conv2d(24, 40, 1), 0.9).cuda()
    x, images = torch.randn(5, 300, device="cuda"), torch.randn(2, 24, 6, 6, device="cuda")
    # cuDNN convolves float32 in TF32 by default (10-bit mantissas: 5.6e-4 off on an H200,
    # 2026-11-26); the sparse product is float32. Compare with a float32 dense reference.
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        torch.testing.assert_close(SparseLinear.from_dense(linear)(x), linear(x))
        torch.testing.assert_close(SparsePointwiseConv.from_dense(conv)(images), conv(images))


def test_to_sparse_inference_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="min_sparsity"):
        to_sparse_inference(nn.Linear(2, 2), min_sparsity=1.5)


# ---------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------


@needs_safetensors
def test_cli_inspect(
    sparse_net: MixedNet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "net.fsp"
    save_sparse(sparse_net, path)
    assert cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "density" in out and "bytes" in out
    assert "fc.weight" in out and "64x1152" in out and "gaps+lzma" in out
    assert "x the bound H(d)*N + raw values" in out and "patterns" in out


@guard("`export DIR` that holds no run, `inspect` of a missing file", "CLI exit 1, one line")
@needs_safetensors
def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inspect", str(tmp_path / "missing.fsp")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert cli.main(["export", str(tmp_path), "-o", str(tmp_path / "m.fsp")]) == 1
    assert "checkpoints/last.pt" in capsys.readouterr().err
    assert cli.main(["export", str(tmp_path)]) == 1
    assert "nothing to write" in capsys.readouterr().err


ZooFactory = Callable[..., nn.Module]


@pytest.fixture
def fake_zoo(monkeypatch: pytest.MonkeyPatch) -> ZooFactory:
    """A stand-in ``feather_sparse.models`` holding one model, ``mixed`` (MixedNet).

    The CLI rebuilds models through the zoo; this keeps its tests fast and
    independent of the real model families.
    """

    def create_model(name: str, num_classes: int | None = None, **kwargs: object) -> nn.Module:
        if name != "mixed":
            raise ValueError(f"unknown model {name!r}; choose one of: mixed")
        model = MixedNet()
        model.feather_model_spec = {"name": "mixed", "kwargs": {}}
        return model

    import feather_sparse.models as zoo

    monkeypatch.setattr(zoo, "create_model", create_model)
    monkeypatch.setattr(zoo, "list_models", lambda: ["mixed"])
    monkeypatch.setattr(zoo, "model_info", lambda name: types.SimpleNamespace(input_shape=(1, 40)))
    return create_model


def _checkpoint(model: nn.Module, state: dict[str, torch.Tensor], pruner: object) -> dict:
    """A training checkpoint of format 1 (no checksum), with every entry a resume reads."""
    return {
        "format": "feather-sparse-checkpoint",
        "version": 1,
        "epoch": 2,
        "step": 20,
        "config": {"model": model.feather_model_spec, "seed": 0},
        "model": state,
        "pruner": pruner,
        "optimizer": {},
        "lr_scheduler": {},
        "rng": {"torch": torch.get_rng_state(), "numpy": [], "python": [], "cuda": []},
    }


def _write_run(tmp_path: Path, create: ZooFactory) -> tuple[Path, nn.Module]:
    """A run folder as the training loop leaves it, for a dense-pruned model."""
    model = prune_(create("mixed"), 0.9)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    ckpt = _checkpoint(model, model.state_dict(), None)
    (run / "config.json").write_text(json.dumps(ckpt["config"]))
    torch.save(ckpt, run / "checkpoints" / "last.pt")
    return run, model


@needs_safetensors
def test_cli_export_from_run_dir(
    fake_zoo: ZooFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, model = _write_run(tmp_path, fake_zoo)
    out = tmp_path / "model.fsp"
    assert cli.main(["export", str(run), "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    info = inspect_sparse(out)
    assert info.metadata["epoch"] == 2 and info.metadata["step"] == 20
    assert info.model_spec == {"name": "mixed", "kwargs": {}}
    assert_bit_equal(model.state_dict(), load_sparse(out).state_dict())
    # re-export of the .fsp at half precision
    half = tmp_path / "half.fsp"
    assert cli.main(["export", str(out), "-o", str(half), "--values", "fp16"]) == 0
    assert inspect_sparse(half).values == "fp16" and half.stat().st_size < out.stat().st_size


def _mid_training(create: ZooFactory, tmp_path: Path, epoch: int, epochs: int) -> tuple[Path, dict]:
    """A training checkpoint after 4 of 20 steps: the cubic schedule (0 to 0.9 over
    steps 0-10) asks for 0.9 * (1 - (1 - 4/10)^3) = 0.7056 there, not 0.9."""
    model = create("mixed")
    pruner = Pruner(model, sparsity=0.9, total_steps=20)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(4):
        loss = model(torch.randn(8, 1, 40)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        pruner.step()
    assert pruner.scheduled_sparsity() == pytest.approx(0.7056)
    ckpt = _checkpoint(model, pruner.dense_state_dict(), pruner.state_dict())
    ckpt["epoch"], ckpt["config"]["epochs"] = epoch, epochs
    path = tmp_path / "last.pt"
    torch.save(ckpt, path)
    return path, ckpt


def _pruned_sparsity(path: Path, pruner_state: dict) -> float:
    targets = {f"{name}.weight" for name in pruner_state["config"]["targets"]}
    pruned = [r for r in inspect_sparse(path).tensors if r.name in targets]
    assert {r.name for r in pruned} == {"conv.weight", "point.weight", "fc.weight", "head.weight"}
    return 1 - sum(r.nnz for r in pruned) / sum(r.numel for r in pruned)


@needs_safetensors
def test_cli_export_of_an_unfinished_run_keeps_its_thresholds(
    fake_zoo: ZooFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, ckpt = _mid_training(fake_zoo, tmp_path, epoch=1, epochs=5)
    reference = fake_zoo("mixed")  # the model as its forward is at the checkpoint
    reference.load_state_dict(ckpt["model"])
    expected = Pruner.from_state_dict(reference, ckpt["pruner"]).dense_state_dict(pruned=True)

    out = tmp_path / "model.fsp"
    assert cli.main(["export", str(source), "-o", str(out)]) == 0
    printed = capsys.readouterr()
    note = [line for line in printed.out.splitlines() if "not finished" in line]
    assert len(note) == 1 and "epoch 1 of 5" in note[0] and "sparsity 0.70" in note[0]
    assert "--sparsity 0.9" in note[0] and printed.err == ""
    assert_bit_equal(expected, load_sparse(out).state_dict())
    assert _pruned_sparsity(out, ckpt["pruner"]) == pytest.approx(0.7056, abs=2e-3)
    meta = inspect_sparse(out).metadata
    assert meta["finished"] is False and meta["baked"] == "current"
    assert meta["sparsity"] == pytest.approx(0.7056, abs=2e-3)


@needs_safetensors
def test_cli_export_at_an_explicit_sparsity_warns(
    fake_zoo: ZooFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, ckpt = _mid_training(fake_zoo, tmp_path, epoch=1, epochs=5)
    reference = fake_zoo("mixed")  # what --sparsity 0.9 must do, done by hand
    reference.load_state_dict(ckpt["model"])
    Pruner.from_state_dict(reference, ckpt["pruner"]).finalize(0.9)

    out = tmp_path / "model.fsp"
    assert cli.main(["export", str(source), "-o", str(out), "--sparsity", "0.9"]) == 0
    printed = capsys.readouterr()
    warning = printed.err.strip().splitlines()
    assert len(warning) == 1 and "warning" in warning[0]
    assert "not trained for it" in warning[0] and "epoch 1 of 5" in warning[0]
    assert "not finished" not in printed.out
    assert_bit_equal(reference.state_dict(), load_sparse(out).state_dict())
    assert _pruned_sparsity(out, ckpt["pruner"]) == pytest.approx(0.9, abs=1e-3)


@needs_safetensors
def test_cli_export_of_a_finished_run_bakes_the_target(
    fake_zoo: ZooFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # epoch 5 of 5: the run is done, whatever the Pruner's step count says
    source, ckpt = _mid_training(fake_zoo, tmp_path, epoch=5, epochs=5)
    reference = fake_zoo("mixed")
    reference.load_state_dict(ckpt["model"])
    Pruner.from_state_dict(reference, ckpt["pruner"]).finalize()

    out = tmp_path / "model.fsp"
    assert cli.main(["export", str(source), "-o", str(out)]) == 0
    printed = capsys.readouterr()
    assert "not finished" not in printed.out and printed.err == ""
    assert_bit_equal(reference.state_dict(), load_sparse(out).state_dict())
    assert _pruned_sparsity(out, ckpt["pruner"]) == pytest.approx(0.9, abs=1e-3)
    # --sparsity at the target of a finished run: what it was trained for, no warning
    assert cli.main(["export", str(source), "-o", str(out), "--sparsity", "0.9"]) == 0
    assert capsys.readouterr().err == ""


def test_export_source_without_epochs_uses_the_pruner_steps(
    fake_zoo: ZooFactory, tmp_path: Path
) -> None:
    source, ckpt = _mid_training(fake_zoo, tmp_path, epoch=1, epochs=5)
    del ckpt["config"]["epochs"]
    torch.save(ckpt, source)
    loaded = export.load_export_source(source)
    assert not loaded.finished and loaded.progress == "step 4 of 20"
    assert loaded.baked == "current" and loaded.sparsity == pytest.approx(0.7056, abs=2e-3)
    assert loaded.target == 0.9 and loaded.warning is None


@guard("`export --sparsity` outside [0, 1)", "CLI exit 1: must be in [0, 1)")
@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--sparsity", "1.5"], "must be in [0, 1)"), (["--sparsity", "-0.1"], "must be in [0, 1)")],
)
def test_cli_export_rejects_a_bad_sparsity(
    fake_zoo: ZooFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    source, _ = _mid_training(fake_zoo, tmp_path, epoch=1, epochs=5)
    out = tmp_path / "model.fsp"
    assert cli.main(["export", str(source), "-o", str(out), *extra]) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@needs_safetensors
def test_cli_export_sparsity_needs_a_sparse_training_checkpoint(
    fake_zoo: ZooFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, _ = _write_run(tmp_path, fake_zoo)  # a dense run: no Pruner state
    out = tmp_path / "model.fsp"
    assert cli.main(["export", str(run), "-o", str(out), "--sparsity", "0.5"]) == 1
    assert "dense run" in capsys.readouterr().err
    assert cli.main(["export", str(run), "-o", str(out)]) == 0
    assert cli.main(["export", str(out), "-o", str(tmp_path / "b.fsp"), "--sparsity", "0.5"]) == 1
    assert "finalized sparse checkpoint" in capsys.readouterr().err


@guard("a training checkpoint whose weights do not fit its model spec", "CLI exit 1, one line")
def test_cli_export_of_a_checkpoint_that_does_not_fit_its_spec(
    fake_zoo: ZooFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = fake_zoo("mixed")
    torch.save(_checkpoint(model, {"fc.weight": torch.zeros(2)}, None), tmp_path / "x.pt")
    assert cli.main(["export", str(tmp_path / "x.pt"), "-o", str(tmp_path / "x.fsp")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "do not fit its model spec" in err[0]


@guard("`export` of a `.pt` another program wrote", "CLI exit 1 naming its format")
def test_cli_export_rejects_other_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.save({"format": "something-else", "model": {}, "config": {}}, tmp_path / "x.pt")
    assert cli.main(["export", str(tmp_path / "x.pt"), "-o", str(tmp_path / "x.fsp")]) == 1
    assert "something-else" in capsys.readouterr().err


@guard(
    "`export` to the file it reads, into the run's `checkpoints/`, or over a file of "
    "another kind (a training checkpoint; a `.fsp` for `--onnx`)",
    "CLI exit 1, one line naming the file; nothing written; a `.fsp` over a `.fsp` still replaced",
)
@needs_safetensors
def test_cli_export_never_writes_over_what_it_reads_or_another_kind(
    fake_zoo: ZooFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnx")  # the --onnx targets are checked once onnx is there
    run, _ = _write_run(tmp_path, fake_zoo)
    last = run / "checkpoints" / "last.pt"
    fsp = tmp_path / "model.fsp"
    assert cli.main(["export", str(run), "-o", str(fsp)]) == 0
    other = tmp_path / "other.pt"  # a training checkpoint of another run
    other.write_bytes(last.read_bytes())
    capsys.readouterr()
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    def refused(argv: list[str], *expected: str) -> None:
        assert cli.main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and all(text in err[0] for text in expected), err

    checkpoints = run / "checkpoints"
    refused(["export", str(run), "-o", str(last)], f"cannot write {last}", "--resume")
    refused(["export", str(run), "-o", str(checkpoints / "new.fsp")], f"inside {checkpoints}")
    refused(["export", str(last), "-o", str(checkpoints / "prev.pt")], f"inside {checkpoints}")
    refused(["export", str(fsp), "-o", str(fsp)], f"cannot write {fsp}", "the file being read")
    refused(["export", str(fsp), "-o", str(other)], f"{other} already holds a PyTorch checkpoint")
    refused(["export", str(run), "--onnx", str(fsp)], f"{fsp} already holds a sparse checkpoint")
    both = tmp_path / "both.fsp"
    refused(["export", str(run), "-o", str(both), "--onnx", str(both)], "both name")
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before
    # Replacing a file of the same kind works as it always did.
    assert cli.main(["export", str(run), "-o", str(fsp), "--values", "fp16"]) == 0
    assert inspect_sparse(fsp).values == "fp16"


# ---------------------------------------------------------------------------
# ONNX
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("exporter", ["default", "legacy"])
def test_onnx_export_matches_pytorch(
    exporter: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    if exporter == "legacy":  # what runs where onnxscript is not installed
        monkeypatch.setattr(export.onnx, "_onnx_exporter", lambda: ("legacy", 20))
    net = prune_(MixedNet(), 0.9).eval()
    path = tmp_path / "net.onnx"
    opset = export_onnx(net, path, torch.randn(2, 1, 40))
    assert opset >= 17
    import onnx

    onnx.checker.check_model(onnx.load(str(path)))
    # a batch size other than the example's: the batch dimension is dynamic
    assert verify_onnx(net, path, torch.randn(5, 1, 40)) < 1e-4


@pytest.fixture
def onnx_run(fake_zoo: ZooFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run folder to export with ``--onnx``, by the quicker legacy exporter (the
    default one is covered above; these test the CLI path)."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    monkeypatch.setattr(export.onnx, "_onnx_exporter", lambda: ("legacy", 20))
    run, _ = _write_run(tmp_path, fake_zoo)
    return run


@guard(
    "`feather-sparse export RUN --onnx FILE` whose file onnxruntime runs to other outputs "
    "than the model's",
    "exit 1: the largest difference and the tolerance named, the file left for inspection; "
    "it printed 'onnxruntime matches PyTorch to D' whatever D was",
)
@pytest.mark.parametrize("diff", [0.5, float("nan")])
def test_cli_export_onnx_refuses_a_file_that_does_not_match(
    diff: float,
    onnx_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from feather_sparse.cli import export as cli_export

    monkeypatch.setattr(cli_export, "_verify_onnx", lambda *args: (diff, torch.zeros(2, 10)))
    assert cli.main(["export", str(onnx_run), "--onnx", str(tmp_path / "m.onnx")]) == 1
    out, err = capsys.readouterr()
    assert "matches" not in out
    assert f"differs from PyTorch's by up to {diff:.3g}, above the tolerance" in err
    assert (tmp_path / "m.onnx").stat().st_size > 0


def test_cli_export_onnx(
    onnx_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["export", str(onnx_run), "--onnx", str(tmp_path / "m.onnx")]) == 0
    assert "onnxruntime matches PyTorch" in capsys.readouterr().out
    assert (tmp_path / "m.onnx").stat().st_size > 0


@guard("`--onnx` with an opset older than torch exports", "`ValueError` naming the opset")
def test_onnx_export_rejects_what_it_cannot_write(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    net = prune_(MixedNet(), 0.9).eval()
    with pytest.raises(ValueError, match="opset 5 is older than this setup exports"):
        export_onnx(net, tmp_path / "net.onnx", torch.randn(2, 1, 40), opset=5)
    with pytest.raises(ValueError, match=r"does not run on an input of shape \(2, 1, 7\)"):
        export_onnx(net, tmp_path / "net.onnx", torch.randn(2, 1, 7))
    assert not (tmp_path / "net.onnx").exists()


@guard("`inspect /dev/null` (not a regular file)", "`ValueError`: not a regular file")
@pytest.mark.skipif(not Path("/dev/null").exists(), reason="needs /dev/null")
@needs_safetensors
def test_inspect_of_a_device_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a regular file"):
        inspect_sparse("/dev/null")


@needs_safetensors
def test_the_same_model_writes_the_same_bytes(tmp_path: Path) -> None:
    """Saving one model again gives a byte-identical file (checksums, caches and
    `cmp` can compare runs); safetensors' own writer ordered the metadata by hash."""
    model = prune_(nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)), 0.5)
    files = []
    for i in range(6):
        save_sparse(model, tmp_path / f"m{i}.fsp", metadata={"epoch": 3, "note": "hi"})
        files.append((tmp_path / f"m{i}.fsp").read_bytes())
    assert all(f == files[0] for f in files)


@needs_safetensors
def test_container_is_what_safetensors_writes_up_to_the_metadata_order(tmp_path: Path) -> None:
    """The container writer lays the file out as safetensors does: same header
    (as JSON), same length, same tensor bytes; and safetensors reads it back."""
    from safetensors import safe_open
    from safetensors.torch import save

    from feather_sparse.export.fsp import _container

    blobs = {"feather.header": b"\x01\x02\x03", "feather.data": bytes(range(200)) * 3}
    metadata = {"format": "feather-sparse", "format_version": "2", "library_version": "9.9"}
    ours = _container(blobs, metadata)
    theirs = save(
        {k: torch.frombuffer(bytearray(v), dtype=torch.uint8) for k, v in blobs.items()},
        metadata=metadata,
    )
    (n,) = struct.unpack("<Q", ours[:8])
    assert ours[:8] == theirs[:8] and n % 8 == 0
    assert json.loads(ours[8 : 8 + n]) == json.loads(theirs[8 : 8 + n])
    assert ours[8 + n :] == theirs[8 + n :]
    path = tmp_path / "f.safetensors"
    path.write_bytes(ours)
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == metadata
        for name, blob in blobs.items():
            assert f.get_tensor(name).numpy().tobytes() == blob
