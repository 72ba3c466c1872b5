"""``save_sparse`` encodes its tensors in threads: the same bytes, the same first error."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import feather_sparse as fs
from _helpers import needs_safetensors
from feather_sparse.export import fsp


def mixed_model() -> nn.Module:
    """Sparse, N:M, dense, tied and integer entries, in an order the file keeps."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64), nn.BatchNorm1d(64)
    )
    with torch.no_grad():
        w = model[0].weight
        w[w.abs() < 0.08] = 0.0  # unstructured
        groups = model[1].weight.view(-1, 4)
        pruned = torch.rand(groups.shape).argsort(dim=1)[:, :2]  # 2:4, positions at random
        groups.scatter_(1, pruned, 0.0)
    model[2].weight = model[0].weight  # tied: an alias record
    return model


@pytest.fixture
def four_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Allow four threads, and record which thread encoded each tensor."""
    monkeypatch.setattr(fsp, "SAVE_THREADS", 4)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    names: list[str] = []
    encode = fsp._encode_tensor

    def recording(name: str, tensor: torch.Tensor, values: str) -> tuple[object, bytes]:
        names.append(threading.current_thread().name)
        return encode(name, tensor, values)

    monkeypatch.setattr(fsp, "_encode_tensor", recording)
    return names


@needs_safetensors
def test_threads_write_the_bytes_one_thread_writes(
    tmp_path: Path, four_threads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = mixed_model()
    for values in ("fp32", "fp16", "bf16"):
        many = tmp_path / f"many-{values}.fsp"
        fs.save_sparse(model, many, values=values)
        assert four_threads and all(n.startswith("save_sparse") for n in four_threads)
        four_threads.clear()
        with monkeypatch.context() as m:
            m.setattr(fsp, "SAVE_THREADS", 1)
            fs.save_sparse(model, tmp_path / f"one-{values}.fsp", values=values)
        assert four_threads and not any(n.startswith("save_sparse") for n in four_threads)
        four_threads.clear()
        assert many.read_bytes() == (tmp_path / f"one-{values}.fsp").read_bytes()
    info = fs.inspect_sparse(tmp_path / "many-fp32.fsp")
    records = {r.name: r for r in info.tensors}
    assert records["2.weight"].alias_of == "0.weight"
    assert records["1.weight"].nm_pattern == "2:4"
    back = fs.load_sparse(tmp_path / "many-fp32.fsp", mixed_model())
    for key, value in model.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key


@needs_safetensors
def test_a_tied_tensor_is_encoded_once(tmp_path: Path, four_threads: list[str]) -> None:
    fs.save_sparse(mixed_model(), tmp_path / "m.fsp")
    state = mixed_model().state_dict()
    assert len(four_threads) == len(state) - 1  # 2.weight is 0.weight


def test_the_error_is_the_first_failing_tensor_in_order(
    tmp_path: Path, four_threads: list[str]
) -> None:
    state = {f"t{i}": torch.zeros(64) for i in range(6)}
    for i in (2, 4):  # both overflow float16; t2 comes first
        state[f"t{i}"][0] = 1e6
    with pytest.raises(ValueError, match=r"tensor 't2': values='fp16' overflows"):
        fs.save_sparse(state, tmp_path / "m.fsp", values="fp16")
    assert not (tmp_path / "m.fsp").exists()


@needs_safetensors
def test_one_torch_thread_encodes_in_the_calling_thread(
    tmp_path: Path, four_threads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # OMP_NUM_THREADS=1 (torch.get_num_threads() == 1) asks for one thread: no pool.
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    fs.save_sparse(mixed_model(), tmp_path / "m.fsp")
    assert four_threads == [threading.current_thread().name] * len(four_threads)


@needs_safetensors
def test_writing_holds_the_data_twice_at_most(tmp_path: Path) -> None:
    # The chunks were joined, then joined again with the container's header, then
    # once more: a 128 MiB model took 4x its size (about 5x with lzma's buffers).
    import os
    import tracemalloc

    torch.manual_seed(0)
    state = {f"t{i}": torch.randn(1 << 22) for i in range(8)}  # 128 MiB, dense
    tracemalloc.start()
    try:
        fs.save_sparse(state, tmp_path / "m.fsp")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    size = os.path.getsize(tmp_path / "m.fsp")
    # its parts and the file, plus the header's lzma encoder (about 94 MiB, once)
    assert peak < 2 * size + (110 << 20), (peak, size)
