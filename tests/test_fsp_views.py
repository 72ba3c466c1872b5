"""A conjugate or negative view is not the tensor it views: a ``.fsp`` stores its values.

``z.conj()`` shares ``z``'s memory, offset, shape and strides, but reads
every imaginary part negated (a *conjugate view*); ``z.conj().imag`` reads
``-z.imag`` from the same memory (a *negative view*). Stored as an alias of
``z`` (a tied weight), such an entry came back with ``z``'s values; saved
alone, ``z.conj()`` stopped the save with a ``RuntimeError`` from ``view``.
"""

from __future__ import annotations

from pathlib import Path

import torch

import feather_sparse as fs
from _guards import guard
from _helpers import needs_safetensors
from feather_sparse.export import load_sparse_state_dict

pytestmark = needs_safetensors


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().resolve_conj().resolve_neg().contiguous().view(torch.uint8).numpy().tobytes()


@guard(
    "a state_dict holding a conjugate view `z.conj()` (or its negative view `z.conj().imag`) "
    "beside `z`, or alone, saved to a `.fsp`",
    "each is stored with its own values (not as an alias of `z`) and loads bit for bit; "
    "it loaded as `z` itself, and `z.conj()` alone stopped the save with a `RuntimeError`",
)
def test_a_conjugate_or_negative_view_is_stored_with_its_own_values(tmp_path: Path) -> None:
    z = torch.tensor([1 + 2j, 0j, 3 - 1j, -0.5j, 0j, 0j, 2 + 0j, 0j], dtype=torch.complex64)
    state = {
        "z": z,
        "conj": z.conj(),  # the same memory, imaginary parts negated
        "conj2": z.conj(),  # another conjugate view of it: the same values as "conj"
        "real": z.real,
        "neg": z.conj().imag,  # a negative view of z's imaginary parts
    }
    expected = {
        "z": [1 + 2j, 0j, 3 - 1j, -0.5j, 0j, 0j, 2 + 0j, 0j],
        "conj": [1 - 2j, 0j, 3 + 1j, 0.5j, 0j, 0j, 2 + 0j, 0j],
        "conj2": [1 - 2j, 0j, 3 + 1j, 0.5j, 0j, 0j, 2 + 0j, 0j],
        "real": [1.0, 0.0, 3.0, 0.0, 0.0, 0.0, 2.0, 0.0],
        "neg": [-2.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.0, 0.0],
    }
    info = fs.save_sparse(state, tmp_path / "views.fsp")
    aliases = {r.name: r.alias_of for r in info.tensors if r.is_alias}
    assert aliases == {"conj2": "conj"}  # only the same view of the same memory
    loaded, _ = load_sparse_state_dict(tmp_path / "views.fsp")
    for key, values in expected.items():
        want = torch.tensor(values, dtype=state[key].dtype)
        assert torch.equal(loaded[key], want), (key, loaded[key])
    for key, value in state.items():  # bit for bit what each view reads (signed zeros too)
        assert _bits(loaded[key]) == _bits(value), key


def test_a_conjugate_view_saved_alone_loads_as_its_values(tmp_path: Path) -> None:
    z = torch.tensor([[1 + 2j, 0j], [0j, -3 + 4j]], dtype=torch.complex128)
    fs.save_sparse({"w": z.conj()}, tmp_path / "conj.fsp")
    loaded, _ = load_sparse_state_dict(tmp_path / "conj.fsp")
    assert torch.equal(loaded["w"], torch.tensor([[1 - 2j, 0j], [0j, -3 - 4j]]))
    assert not loaded["w"].is_conj()
