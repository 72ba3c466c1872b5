"""``load_init`` reads the ``.fsp`` once: the SHA-256 it records is of the bytes it loaded.

It used to hash ``path.read_bytes()`` and then load the file a second time: a
file replaced in between (a run re-exporting its ``model.fsp``) was recorded
with the hash of one file and the weights of the other.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from _guards import guard
from _helpers import needs_safetensors
from feather_sparse.export import load_sparse, save_sparse
from feather_sparse.train.init_from import load_init

pytestmark = needs_safetensors


def _pair(tmp_path: Path) -> tuple[Path, nn.Module, Path, nn.Module]:
    """Two ``.fsp`` files of one architecture with different weights."""
    torch.manual_seed(0)
    first, second = nn.Linear(8, 4), nn.Linear(8, 4)
    save_sparse(first, tmp_path / "start.fsp")
    save_sparse(second, tmp_path / "other.fsp")
    return tmp_path / "start.fsp", first, tmp_path / "other.fsp", second


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@guard(
    "an `init_from` `.fsp` replaced by another file while the run loads it",
    "the SHA-256 in `config.json` is of the very bytes whose weights were loaded (read once)",
)
def test_the_recorded_hash_is_of_the_bytes_that_were_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, first, other, second = _pair(tmp_path)
    first_bytes = path.read_bytes()
    real_read_bytes = Path.read_bytes

    def read_then_replace(self: Path) -> bytes:
        out = real_read_bytes(self)
        if self == path and other.exists():  # another file takes its place once it was read
            os.replace(other, path)
        return out

    monkeypatch.setattr(Path, "read_bytes", read_then_replace)
    model = nn.Linear(8, 4)
    record = load_init(model, path)
    assert not other.exists()  # the file was replaced after the read
    assert record == {
        "path": str(path.resolve()),
        "sha256": hashlib.sha256(first_bytes).hexdigest(),
    }
    assert _same_weights(model, first) and not _same_weights(model, second)


def _truncated(data: bytes) -> bytes:
    return data[:-7]


def _data_byte_flipped(data: bytes) -> bytes:
    start = 8 + int.from_bytes(data[:8], "little")  # "feather.data" comes first (name order)
    return data[:start] + bytes([data[start] ^ 0x55]) + data[start + 1 :]


def _not_a_checkpoint(data: bytes) -> bytes:
    return b"\x00" * len(data)


DAMAGES = {
    "truncated": (_truncated, "truncated or corrupted"),
    "data byte flipped": (_data_byte_flipped, "checksum mismatch"),
    "not a checkpoint": (_not_a_checkpoint, "truncated or corrupted"),
}


@guard(
    "an `init_from` `.fsp` damaged after the run checked its header (truncated, a flipped "
    "data byte, another kind of file)",
    "`ValueError` starting `init_from:` naming the problem; the model is left as built",
)
@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_the_single_read_keeps_every_check(tmp_path: Path, damage: str) -> None:
    path, _, _, _ = _pair(tmp_path)
    edit, message = DAMAGES[damage]
    path.write_bytes(edit(path.read_bytes()))
    model = nn.Linear(8, 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=rf"^init_from: .*{message}"):
        load_init(model, path)
    with pytest.raises(ValueError, match=message):  # what load_sparse says of it too
        load_sparse(path, nn.Linear(8, 4))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_container_metadata_that_differs_from_the_header_is_refused(tmp_path: Path) -> None:
    """The metadata check (it has no checksum of its own) holds for the bytes read once."""
    path, _, _, _ = _pair(tmp_path)
    data = path.read_bytes()
    start = data.index(b'"library_version":"') + len(b'"library_version":"')
    edited = data[:start] + b"9" + data[start + 1 :]  # 0.1.0 -> 9.1.0: the same length
    assert len(edited) == len(data) and edited != data
    path.write_bytes(edited)
    with pytest.raises(ValueError, match=r"^init_from: .*safetensors metadata .* does not match"):
        load_init(nn.Linear(8, 4), path)
