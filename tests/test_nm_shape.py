"""N:M groups never cross a row: a shape whose rows are not whole groups is refused.

A group is ``m`` consecutive weights of one row (``weight.reshape(out, -1)``).
A shape whose total size alone is a multiple of ``m`` (``(6, 2)`` for 2:4)
used to decode with groups running across rows: other weights, no error.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import feather_sparse as fs
from _guards import guard
from _helpers import needs_safetensors
from feather_sparse.export import load_sparse_state_dict
from feather_sparse.nm import decode_nm, encode_nm
from test_export import _rewrite_header


@guard(
    "`decode_nm` with a shape whose rows are not whole groups of M (`(6, 2)` for 2:4; "
    "its size alone a multiple of M)",
    "`ValueError` naming the shape, its row length and M; no tensor returned",
)
@pytest.mark.parametrize(
    ("shape", "rows"),
    [
        ((6, 2), "its rows hold 2 weights"),
        ((2, 6), "its rows hold 6 weights"),
        ((2, 3, 2), "its rows hold 6 weights"),
        ((4, 3, 1, 1), "its rows hold 3 weights"),
        ((12,), "it has no rows"),
    ],
)
def test_decode_nm_refuses_rows_that_are_not_whole_groups(
    shape: tuple[int, ...], rows: str
) -> None:
    w = torch.tensor([[1.0, 0.0, 2.0, 0.0], [0.0, 3.0, 0.0, 4.0], [5.0, 0.0, 0.0, 6.0]])
    values, indices = encode_nm(w, "2:4")  # 12 weights: every shape above has 12
    assert torch.equal(decode_nm(values, indices, (3, 4), "2:4"), w)
    assert torch.equal(decode_nm(values, indices, (3, 2, 2), "2:4"), w.reshape(3, 2, 2))
    expected = rf"shape \({', '.join(map(str, shape))},?\) .*groups of 4 \(2:4\): {rows}"
    with pytest.raises(ValueError, match=expected):
        decode_nm(values, indices, shape, "2:4")


def test_decode_nm_takes_the_shapes_encode_nm_takes() -> None:
    """Empty weights and rows of several groups decode as before."""
    empty = torch.zeros(0, 8)
    values, indices = encode_nm(empty, "2:4")
    assert decode_nm(values, indices, (0, 8), "2:4").shape == (0, 8)
    w = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0]] * 2)
    values, indices = encode_nm(w, "1:4")
    assert torch.equal(decode_nm(values, indices, (2, 2, 4), "1:4"), w.reshape(2, 2, 4))


@guard(
    "a `.fsp` N:M record whose shape's rows are not whole groups (its size a multiple of M) "
    "under a valid CRC",
    "`ValueError` naming the tensor, the shape and M; no state_dict returned",
)
@needs_safetensors
def test_load_refuses_an_nm_record_whose_rows_are_not_whole_groups(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    groups = torch.randn(256, 16, 4, generator=g)
    keep = torch.zeros_like(groups, dtype=torch.bool)
    keep.scatter_(2, groups.abs().argmax(dim=2, keepdim=True), True)
    w = torch.where(keep, groups, 0.0).reshape(256, 64)  # 1:4
    path = tmp_path / "nm.fsp"
    info = fs.save_sparse({"w": w}, path)
    assert info.tensors[0].nm_pattern == "1:4"
    assert torch.equal(load_sparse_state_dict(path)[0]["w"], w)

    def edit(header: dict) -> None:
        header["tensors"][0]["shape"] = [8192, 2]  # the same size, rows of 2 < 4

    _rewrite_header(path, edit)
    with pytest.raises(ValueError, match=r"tensor 'w'.*shape \(8192, 2\).*groups of 4"):
        load_sparse_state_dict(path)
