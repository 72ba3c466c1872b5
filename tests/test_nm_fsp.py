"""N:M weights in ``.fsp`` files: the ``nm+lzma`` records, bit-exact loads, older files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import feather_sparse as fs
from _helpers import needs_safetensors
from feather_sparse.export import codec, inspect_sparse, load_sparse_state_dict, save_sparse
from feather_sparse.export.header import BASE_FORMAT_VERSION, NM_FORMAT_VERSION
from feather_sparse.nm import NMPattern, group_view

pytestmark = [pytest.mark.usefixtures("one_thread"), needs_safetensors]

DATA = Path(__file__).parent / "data"


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(
        {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    )


def assert_bit_exact(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert torch.equal(bits(a[key].contiguous()), bits(b[key].contiguous())), key


def finalized_mixer(spec: str) -> nn.Module:
    torch.manual_seed(0)
    model = fs.create_model("mnist1d_mlpmixer")
    fs.Pruner(model, pattern=spec).finalize()
    return model


@pytest.mark.parametrize("spec", ["2:4", "1:4", "4:8"])
def test_nm_weights_are_stored_as_nm_records_and_load_bit_exactly(
    tmp_path: Path, spec: str
) -> None:
    model = finalized_mixer(spec)
    path = tmp_path / "mixer.fsp"
    info = save_sparse(model, path)
    records = {r.name: r for r in info.tensors}
    channel = records["blocks.0.channel1.weight"]  # 256×64: the largest layers
    if spec == "4:8":
        # 4 positions of 3 bits per group (12 bits) lose to the bit mask (8 bits): the
        # smaller, unstructured encoding is kept.
        assert channel.pattern_codec == "bitmask+lzma" and info.format_version == 1
    else:
        assert channel.encoding == f"nm+lzma {spec}"
        assert info.format_version == NM_FORMAT_VERSION == 2
    state, read = load_sparse_state_dict(path)
    assert read.format_version == info.format_version
    assert_bit_exact(model.state_dict(), state)
    rebuilt = fs.load_sparse(path)  # the model spec rebuilds the architecture
    assert_bit_exact(model.state_dict(), rebuilt.state_dict())


@pytest.mark.parametrize("spec", ["1:4", "2:4", "4:8"])
def test_the_smaller_of_the_nm_and_unstructured_encodings_is_stored(
    tmp_path: Path, spec: str
) -> None:
    nm = NMPattern.parse(spec)
    torch.manual_seed(1)
    groups = group_view(torch.randn(256, 256), nm)
    ranks = torch.rand(groups.shape).argsort(dim=1).argsort(dim=1)
    weight = torch.where(ranks < nm.n, groups, 0.0).reshape(256, 256)  # random N:M, +0.0
    record = save_sparse({"w": weight}, tmp_path / "w.fsp").tensors[0]

    nonzero = codec._bits(weight) != 0
    _, pattern = codec._encode_pattern(nonzero.numpy())
    unstructured = len(pattern) + len(codec._encode_values(weight.reshape(-1)[nonzero])[1])
    candidates = codec._nm_candidates(nonzero, weight.shape)
    assert nm in candidates
    encoded = codec._encode_nm(weight, nm)
    assert encoded is not None
    as_nm = len(encoded[0]) + len(codec._encode_values(encoded[1])[1])
    assert record.stored_bytes == min(
        unstructured,
        as_nm,
        *[
            len(e[0]) + len(codec._encode_values(e[1])[1])
            for e in (codec._encode_nm(weight, c) for c in candidates)
            if e is not None
        ],
    )
    assert (record.nm_pattern is not None) == (record.stored_bytes < unstructured)
    state, _ = load_sparse_state_dict(tmp_path / "w.fsp")
    assert_bit_exact({"w": weight}, state)
    # One group with more than N non-zeros: no longer N:M at this M.
    spoiled = weight.clone()
    spoiled[0, : nm.m] = 1.0
    assert nm not in codec._nm_candidates(codec._bits(spoiled) != 0, spoiled.shape)


def test_signed_zeros_and_nan_in_an_nm_weight_stay_bit_exact(tmp_path: Path) -> None:
    weight = torch.zeros(8, 16)
    weight.reshape(-1, 4)[:, 0] = torch.arange(1, 33, dtype=torch.float32)
    weight[0, 1] = -0.0  # a signed zero among the pruned entries
    weight[1, 4] = float("nan")  # a kept NaN
    weight[2, 2] = -0.0
    weight[2, 0] = 0.0
    path = tmp_path / "w.fsp"
    save_sparse({"w": weight}, path)
    state, _ = load_sparse_state_dict(path)
    assert_bit_exact({"w": weight}, state)


def test_half_precision_values_with_nm_records(tmp_path: Path) -> None:
    model = finalized_mixer("2:4")
    path = tmp_path / "half.fsp"
    info = save_sparse(model, path, values="fp16")
    assert any(r.nm_pattern == "2:4" and r.values_dtype == "float16" for r in info.tensors)
    state, _ = load_sparse_state_dict(path)
    for key, value in model.state_dict().items():
        if value.is_floating_point():
            expected = value.half().to(value.dtype) if value.ndim > 1 else value
            torch.testing.assert_close(state[key], expected, rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("pattern", ["2:4", None])
@pytest.mark.parametrize("values", ["fp16", "bf16"])
def test_kept_values_the_stored_precision_rounds_to_zero_still_load(
    tmp_path: Path, pattern: str | None, values: str
) -> None:
    """A kept weight below the half type's smallest subnormal is stored as +0 (and -0 as
    -0); the file loads the rounded tensor instead of calling itself corrupted."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64))
    kwargs = {"pattern": pattern} if pattern else {"sparsity": 0.5, "total_steps": 1}
    pruner = fs.Pruner(model, **kwargs)  # type: ignore[arg-type]
    pruner.finalize()
    with (
        torch.no_grad()
    ):  # kept positions of two groups get magnitudes below 2**-25 (fp16) and 1e-40
        kept = model[0].weight.reshape(-1).nonzero().reshape(-1)[:4]
        model[0].weight.view(-1)[kept] = torch.tensor([1e-8, -1e-8, 1e-45, 3.0])
    path = tmp_path / "tiny.fsp"
    info = save_sparse(model, path, values=values)
    record = next(r for r in info.tensors if r.name == "0.weight")
    assert record.nm_pattern == pattern
    state, _ = load_sparse_state_dict(path)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[values]
    expected = model[0].weight.detach().to(dtype).float()
    assert torch.equal(bits(state["0.weight"]), bits(expected))
    assert record.nnz == int((bits(expected) != 0).sum())


def test_files_without_nm_records_are_version_1_and_older_files_still_load(
    tmp_path: Path,
) -> None:
    # Written by the export code of before N:M (format version 1, existing codecs).
    state, info = load_sparse_state_dict(DATA / "pre_nm_v1.fsp")
    assert info.format_version == BASE_FORMAT_VERSION == 1
    assert [r.encoding for r in info.tensors] == ["bitmask+lzma", "bitmask+lzma", "dense"]
    w = (torch.arange(64 * 16, dtype=torch.float32).reshape(64, 16) % 29 - 14) / 7
    pairs = torch.tensor([[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]])
    chosen = pairs[(torch.arange(64 * 4) * 2654435761 >> 7) % 6]  # an aperiodic 2:4 mask
    keep = torch.zeros(64 * 4, 4, dtype=torch.bool).scatter_(1, chosen, True)
    w = torch.where(keep.reshape(64, 16), w, 0.0)  # +0.0 where pruned
    u = (torch.arange(32 * 24, dtype=torch.float32).reshape(32, 24) % 31 - 15) / 5
    u[u.abs() < 2] = 0
    expected = {"nm.weight": w, "un.weight": u, "un.bias": torch.linspace(-1, 1, 32)}
    assert_bit_exact(expected, state)
    # Written now, the file is version 2 exactly when it holds an N:M record ...
    now = save_sparse(expected, tmp_path / "now.fsp")
    assert now.format_version == (2 if any(r.nm_pattern for r in now.tensors) else 1)
    assert_bit_exact(expected, load_sparse_state_dict(tmp_path / "now.fsp")[0])
    # ... so a file with no N:M record stays version 1, readable before N:M.
    unstructured = save_sparse({"u": u}, tmp_path / "u.fsp")
    assert unstructured.format_version == 1
    assert inspect_sparse(tmp_path / "u.fsp").tensors[0].nm_pattern is None
