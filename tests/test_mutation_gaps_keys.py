"""Tests that close the gaps a mutation audit of the state-dict keys and checkpoint files found.

Each test here fails on a hand-made mutant of ``plain_keys.py``,
``integrity.py`` or ``run_files.py`` that the rest of the suite let through
(``docs/mutation-audit.md``, "The state-dict keys and the checkpoint files":
the mutant's id is in each test's docstring). Each checks the documented
contract — the plain model's keys, order and messages (computed on the same
model without a Pruner), the SHA-256 of the bytes (computed here with
``hashlib``), the docstrings' errors and fallbacks — not the code's current
output.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import feather_sparse as fs
from _guards import guard
from _helpers import checkpoint_state
from feather_sparse import integrity, plain_keys
from feather_sparse.integrity import DiskFullError, IntegrityError
from feather_sparse.run_files import (
    load_checkpoint,
    load_latest_checkpoint,
    read_latest_checkpoint,
    save_checkpoint,
)

ORIGINAL = "parametrizations.weight.original"


# ------------------------------------------------------------------ plain_keys.py
class Tagged(nn.Linear):
    """A layer with an ``_extra_state`` entry (``get_extra_state``), saved after its tensors."""

    def __init__(self) -> None:
        super().__init__(4, 3)
        self.tag = {"version": 7}

    def get_extra_state(self) -> Any:
        return dict(self.tag)

    def set_extra_state(self, state: Any) -> None:
        self.tag = dict(state)


class Marker(nn.Module):
    """A child whose ``state_dict`` post-hook adds an entry outside its parent's prefix."""

    def __init__(self) -> None:
        super().__init__()
        self.register_state_dict_post_hook(Marker.mark)

    @staticmethod
    def mark(module: nn.Module, state: dict[str, Any], prefix: str, meta: Any) -> None:
        state["marked"] = torch.ones(1)


class Scale(nn.Module):
    """A user's own parametrization (not the Pruner's): the weight times 1."""

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w * 1.0


class Outer(nn.Linear):
    """A pruned layer with a child ``x0`` whose weight carries the user's own parametrization:
    the child's key ``0.x0.parametrizations.weight.original`` ends in the parent's
    ``0.parametrizations.weight.original``."""

    def __init__(self) -> None:
        super().__init__(4, 4)
        self.x0 = nn.Linear(4, 4)
        parametrize.register_parametrization(self.x0, "weight", Scale())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.x0(super().forward(x))


def test_a_layers_extra_state_keeps_its_place_after_the_weight() -> None:
    """keys03: the plain layer saves ``weight, bias, _extra_state``; so must the attached one."""
    torch.manual_seed(0)
    plain = nn.Sequential(Tagged(), nn.ReLU(), nn.Linear(3, 2))
    torch.manual_seed(0)
    model = nn.Sequential(Tagged(), nn.ReLU(), nn.Linear(3, 2))
    fs.Pruner(model, 0.5, 10)
    assert list(plain.state_dict()) == [
        "0.weight",
        "0.bias",
        "0._extra_state",
        "2.weight",
        "2.bias",
    ]
    assert list(model.state_dict()) == list(plain.state_dict())
    fresh = nn.Sequential(Tagged(), nn.ReLU(), nn.Linear(3, 2))
    fresh[0].tag = {}
    fresh.load_state_dict(model.state_dict())  # strict
    assert fresh[0].tag == {"version": 7}


def test_a_weight_renamed_in_its_place_leaves_no_parametrize_key() -> None:
    """keys02: a child added to the layer after the Pruner attached appends, through its hook,
    an entry after the layer's own, so the weight is renamed where it stands; the state still
    has exactly the plain model's keys, and loads into the plain model."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    fs.Pruner(model, 0.5, 10, include=["0"])
    plain[0].marker = Marker()
    model[0].marker = Marker()
    state = model.state_dict()
    assert not any(ORIGINAL in key for key in state)
    assert sorted(state) == sorted(plain.state_dict())
    assert torch.equal(state["0.weight"], plain[0].weight)
    fresh = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    fresh.load_state_dict({k: v for k, v in state.items() if k != "marked"})  # strict


def test_an_error_about_a_childs_own_parametrize_key_is_not_renamed() -> None:
    """keys13: only the pruned weight's own key is renamed in the load's errors, not a longer
    key that ends in it (``0.x0.parametrizations.weight.original`` for layer ``0``)."""
    torch.manual_seed(0)
    plain = nn.Sequential(Outer(), nn.ReLU())
    torch.manual_seed(0)
    model = nn.Sequential(Outer(), nn.ReLU())
    fs.Pruner(model, 0.5, 10, include=["0"])
    state = plain.state_dict()
    assert f"0.x0.{ORIGINAL}" in state and "0.weight" in state
    state[f"0.x0.{ORIGINAL}"] = torch.zeros(2, 2)
    with pytest.raises(RuntimeError) as expected:
        plain.load_state_dict(state)
    with pytest.raises(RuntimeError) as got:
        model.load_state_dict(state)
    assert f"size mismatch for 0.x0.{ORIGINAL}:" in str(expected.value)
    assert str(got.value).split("\n")[1:] == str(expected.value).split("\n")[1:]


def test_a_view_of_part_of_the_stored_weight_under_the_parametrize_key_is_refused() -> None:
    """keys08: the state holds both keys; under the parametrize key a tensor that starts at the
    stored weight's memory but is only its first rows — a different tensor, so which to load
    is ambiguous and the load is refused (as for any other different tensor)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 2))
    fs.Pruner(model, 0.5, 10)
    stored = model[0].parametrizations.weight.original
    state = model.state_dict()
    state[f"0.{ORIGINAL}"] = stored.detach()[:3]  # same data_ptr and strides, 3 of 6 rows
    before = stored.detach().clone()
    with pytest.raises(RuntimeError, match=r"both '0\.weight' and '0\.parametrizations"):
        model.load_state_dict(state)
    assert torch.equal(stored, before)


def test_install_gives_a_module_listed_twice_one_set_of_hooks() -> None:
    """keys06: ``install``'s docstring: a module listed twice gets its hooks once, and
    removing the handles leaves the module as it was (no ``_fqn_modifiers`` left)."""
    layer = nn.Linear(4, 3)
    names = list(layer._parameters)
    parametrize.register_parametrization(layer, "weight", Scale())
    hooks = (
        layer._state_dict_hooks,
        layer._load_state_dict_pre_hooks,
        layer._load_state_dict_post_hooks,
    )
    handles = plain_keys.install([(layer, names), (layer, names)])
    assert [len(h) for h in hooks] == [1, 1, 1]
    assert list(layer.state_dict()) == ["weight", "bias"]
    for handle in handles:
        handle.remove()
    assert [len(h) for h in hooks] == [0, 0, 0]
    assert plain_keys.FQN_MODIFIERS not in vars(layer)


def test_a_layers_own_fqn_modifiers_are_kept_and_given_back() -> None:
    """keys16, keys17: a layer with ``_fqn_modifiers`` of its own (an instance attribute) keeps
    its answers for the other names while attached, and has its own back afterwards."""

    def own() -> dict[str, str]:
        return {"inner": "wrapped"}

    for end in ("finalize", "remove"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
        setattr(model[0], plain_keys.FQN_MODIFIERS, own)
        pruner = fs.Pruner(model, 0.5, 10)
        answers = getattr(model[0], plain_keys.FQN_MODIFIERS)()
        assert answers.get("weight") == "parametrizations"
        assert answers.get("inner") == "wrapped" and list(answers.values()) == ["wrapped"]
        getattr(pruner, end)()
        assert vars(model[0]).get(plain_keys.FQN_MODIFIERS) is own, end
        assert plain_keys.FQN_MODIFIERS not in vars(model[1]), end


# ------------------------------------------------------------------- integrity.py
#: The sealed archive's comment: ``feather-sparse sha256 `` and 64 hex digits (the module
#: docstring); the 2 bytes before it are the zip record's comment-length field.
SEAL = len(b"feather-sparse sha256 ") + 64


def sealed_checkpoint(path: Path, **entries: Any) -> bytes:
    save_checkpoint(checkpoint_state(**entries), path)
    return path.read_bytes()


def test_a_changed_comment_length_of_a_sealed_checkpoint_is_refused(tmp_path: Path) -> None:
    """keys18: the seal is the SHA-256 of every byte before the comment-length field, so a
    change to that field is caught only by the record check: the file is refused."""
    path = tmp_path / "last.pt"
    data = sealed_checkpoint(path)
    body, length, comment = data[: -SEAL - 2], data[-SEAL - 2 : -SEAL], data[-SEAL:]
    assert length == struct.pack("<H", SEAL)
    assert comment == b"feather-sparse sha256 " + hashlib.sha256(body).hexdigest().encode()
    for wrong in (SEAL - 1, SEAL + 1, 0x8000 | SEAL):
        damaged = body + struct.pack("<H", wrong) + comment
        with pytest.raises(IntegrityError):
            integrity.check_zip_seal(damaged, "last.pt")
        path.write_bytes(damaged)
        with pytest.raises(IntegrityError, match=r"last\.pt"):
            load_checkpoint(path)


def test_an_unsealed_archive_with_a_changed_comment_length_is_refused(tmp_path: Path) -> None:
    """keys19: an archive from before seals ends in an empty comment (length 0); one whose
    comment-length field says otherwise is damaged, not an unverifiable legacy file."""
    path = tmp_path / "legacy.pt"
    torch.save(checkpoint_state(checkpoint_version=1), path)
    data = path.read_bytes()
    assert data[-22:-18] == b"PK\x05\x06" and data[-2:] == b"\0\0"
    damaged = data[:-2] + struct.pack("<H", 5)
    with pytest.raises(IntegrityError, match="does not end in a checksum"):
        integrity.check_zip_seal(damaged, "legacy.pt")
    path.write_bytes(damaged)
    with pytest.raises(IntegrityError, match=r"legacy\.pt"):
        load_checkpoint(path)


def test_a_sealed_json_is_the_sha256_of_its_canonical_form_whatever_its_key_order(
    tmp_path: Path,
) -> None:
    """keys20: the seal is the SHA-256 of the canonical JSON (keys sorted, no spaces), so a
    file rewritten with its keys in another order still reads back."""
    path = tmp_path / "config.json"
    payload = {"zeta": 1, "alpha": {"b": 2, "a": [1, 2]}, "mid": "x"}
    integrity.write_sealed_json(path, payload)
    stored = json.loads(path.read_text())
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    assert stored["sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    reordered = {key: stored[key] for key in reversed(list(stored))}
    reordered["alpha"] = {"a": [1, 2], "b": 2}
    path.write_text(json.dumps(reordered))
    assert integrity.read_sealed_json(path) == payload


def test_a_payload_with_its_own_sha256_field_is_refused(tmp_path: Path) -> None:
    """keys21: ``"sha256"`` is reserved for the checksum; a payload's own is refused, not
    overwritten (its value would be lost)."""
    path = tmp_path / "result.json"
    with pytest.raises(ValueError, match="reserved for the checksum"):
        integrity.write_sealed_json(path, {"sha256": "the user's own", "x": 1})
    assert not path.exists()


def test_an_atomic_write_gives_the_file_the_usual_permissions(tmp_path: Path) -> None:
    """keys22: the file gets ``0o666 & ~umask`` as ``open()`` would give it, not ``mkstemp``'s
    private 0o600 (a checkpoint others in the group can read)."""
    old = os.umask(0o022)
    try:
        integrity.write_atomic(tmp_path / "f.bin", b"data")
    finally:
        os.umask(old)
    assert (tmp_path / "f.bin").stat().st_mode & 0o777 == 0o644


def test_keep_previous_keeps_the_old_content(tmp_path: Path) -> None:
    """keys23: with ``keep_previous`` the file being replaced is kept under that name: the
    old bytes, not the new ones."""
    path, previous = tmp_path / "last.pt", tmp_path / "prev.pt"
    integrity.write_atomic(path, b"first", keep_previous=previous)
    assert not previous.exists()
    integrity.write_atomic(path, b"second", keep_previous=previous)
    assert path.read_bytes() == b"second" and previous.read_bytes() == b"first"
    integrity.write_atomic(path, b"third", keep_previous=previous)
    assert path.read_bytes() == b"third" and previous.read_bytes() == b"second"


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_or_quota_is_a_disk_full_error_and_leaves_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """keys24, keys25: a full disk (ENOSPC) or a full quota (EDQUOT) mid-write is a
    ``DiskFullError`` that says so; the file is unchanged and no temporary file is left."""
    path = tmp_path / "last.pt"
    integrity.write_atomic(path, b"old")

    def full(fd: int, data: bytes) -> None:
        os.close(fd)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(integrity, "_write_file", full)
    with pytest.raises(DiskFullError, match="disk is full"):
        integrity.write_atomic(path, b"new")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_a_killed_writers_temporary_file_of_prev_pt_is_removed(tmp_path: Path) -> None:
    """keys26: the temporary files a killed writer left for ``prev.pt`` (its pid is gone) are
    removed by the next save that keeps a previous checkpoint."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    stale = folder / ".prev.pt.999999999.0a1b2c3d.tmp"  # no such pid
    stale.write_bytes(b"half a copy")
    save_checkpoint(checkpoint_state(epoch=1), folder / "last.pt", keep_previous=True)
    save_checkpoint(checkpoint_state(epoch=2), folder / "last.pt", keep_previous=True)
    assert sorted(p.name for p in folder.iterdir()) == ["last.pt", "prev.pt"]
    assert load_checkpoint(folder / "prev.pt")["epoch"] == 1


# ------------------------------------------------------------------- run_files.py
@guard(
    "`--resume` from a checkpoint without a checksum (format 1) whose `checkpoint_version` "
    "entry is damaged (None, a string, a list)",
    "`IntegrityError` naming the file and the entry; resumes from `prev.pt`",
)
@pytest.mark.parametrize("version", [None, "two", [1], True])
def test_a_damaged_version_entry_of_an_unverified_checkpoint_is_refused_by_name(
    tmp_path: Path, version: Any
) -> None:
    """Found by this audit (not a mutant): ``int(None)`` raised a bare ``TypeError`` (no file,
    no fix) that ``read_latest_checkpoint`` did not take for damage, so a resume crashed
    instead of falling back to ``prev.pt``; a string gave ``int()``'s own message."""
    run = make_run(tmp_path)
    last = run / "checkpoints" / "last.pt"
    torch.save(checkpoint_state(checkpoint_version=version, epoch=2), last)  # unsealed
    with pytest.raises(IntegrityError, match="is damaged") as info:
        load_checkpoint(last)
    assert str(last) in str(info.value) and "'checkpoint_version'" in str(info.value)
    assert "resume from an intact copy" in str(info.value)
    latest = read_latest_checkpoint(run)
    assert latest.path.name == "prev.pt" and latest.state["epoch"] == 1


def test_a_checkpoint_from_before_version_numbers_loads_unverified(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """keys27: a checkpoint without a seal and without ``checkpoint_version`` is version 1
    (written before checksums): read with a warning, not refused."""
    path = tmp_path / "old.pt"
    state = checkpoint_state(epoch=3)
    assert "checkpoint_version" not in state
    torch.save(state, path)
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        assert load_checkpoint(path)["epoch"] == 3
    assert "no checksum" in caplog.text


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (dict(epoch=True), "'epoch' of type bool"),
        (dict(step=False), "'step' of type bool"),
        (dict(rng={"torch": torch.get_rng_state(), "numpy": [], "python": []}), "'cuda'"),
    ],
)
def test_a_retyped_or_incomplete_entry_is_refused_by_name(
    tmp_path: Path, damage: dict[str, Any], named: str
) -> None:
    """keys29, keys31: a bool where an int belongs (``True`` is an ``int`` to Python) and an
    ``rng`` entry without its CUDA state are damage, named, before a resume meets them."""
    path = tmp_path / "last.pt"
    sealed_checkpoint(path, **damage)
    with pytest.raises(IntegrityError, match="is damaged") as info:
        load_checkpoint(path)
    assert named in str(info.value) and str(path) in str(info.value)


def test_a_checkpoint_without_the_optional_entries_and_an_int_sparsity_loads(
    tmp_path: Path,
) -> None:
    """keys30, keys32: ``scaler``, ``metrics`` and ``init`` may be absent, and the checkpoint's
    check of the Pruner state is no stricter than the Pruner's own: ``current_sparsity`` 0 as
    an int, which ``Pruner.load_state_dict`` takes, is not refused as damage."""
    pruner = fs.Pruner(nn.Sequential(nn.Linear(4, 3)), 0.5, 10)
    pruner_state = {**pruner.state_dict(), "current_sparsity": 0}
    pruner.load_state_dict(pruner_state)  # the Pruner's own check takes it
    path = tmp_path / "last.pt"
    sealed_checkpoint(path, pruner=pruner_state)
    state = load_checkpoint(path)
    assert state["pruner"]["current_sparsity"] == 0
    assert not {"scaler", "metrics", "init"} & set(state)


def test_a_damaged_checkpoint_error_says_what_to_do(tmp_path: Path) -> None:
    """keys33: an error names the problem and the fix; ``load_checkpoint``'s for a damaged
    file says to resume from an intact copy or start again."""
    path = tmp_path / "last.pt"
    data = bytearray(sealed_checkpoint(path))
    data[100] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="resume from an intact copy, or start the run again"):
        load_checkpoint(path)
    sealed_checkpoint(path, epoch="one")
    with pytest.raises(IntegrityError, match="resume from an intact copy, or start the run again"):
        load_checkpoint(path)


RAN: list[str] = []


def _ran(what: str) -> str:
    RAN.append(what)
    return what


class Payload:
    """An object whose unpickling runs code (what ``weights_only=True`` refuses)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ran, ("code in a checkpoint",))


def test_a_checkpoint_that_would_run_code_is_refused_without_running_it(tmp_path: Path) -> None:
    """keys34: checkpoints are read with ``weights_only=True``: a file holding a pickled
    callable is refused as unreadable, and the callable never runs."""
    path = tmp_path / "last.pt"
    sealed_checkpoint(path, config={"x": Payload()})
    RAN.clear()
    with pytest.raises(ValueError, match="unreadable"):
        load_checkpoint(path)
    assert RAN == []


def make_run(tmp_path: Path) -> Path:
    """A run folder with ``last.pt`` (epoch 2, step 40) and ``prev.pt`` (epoch 1, step 20)."""
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    save_checkpoint(checkpoint_state(epoch=1, step=20), last)
    save_checkpoint(checkpoint_state(epoch=2, step=40), last, keep_previous=True)
    return tmp_path / "run"


def damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_missing_last_checkpoint_falls_back_to_the_previous_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """keys35: the module docstring: ``load_latest_checkpoint`` falls back to ``prev.pt``
    when ``last.pt`` is damaged *or missing*, with a warning."""
    run = make_run(tmp_path)
    (run / "checkpoints" / "last.pt").unlink()
    latest = read_latest_checkpoint(run)
    assert latest.path.name == "prev.pt" and latest.state["epoch"] == 1
    assert latest.problem is not None and "last.pt is missing" in latest.problem
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        assert load_latest_checkpoint(run)["epoch"] == 1
    assert "falling back to prev.pt" in caplog.text


def test_no_intact_checkpoint_names_both_when_prev_is_no_training_checkpoint(
    tmp_path: Path,
) -> None:
    """keys36: ``last.pt`` damaged and ``prev.pt`` intact but no training checkpoint: one
    ``IntegrityError`` that there is no intact checkpoint left, naming both files."""
    run = make_run(tmp_path)
    damage(run / "checkpoints" / "last.pt")
    save_checkpoint({"format": "something else"}, run / "checkpoints" / "prev.pt")
    with pytest.raises(IntegrityError, match="no intact checkpoint left") as info:
        read_latest_checkpoint(run)
    assert "last.pt" in str(info.value) and "prev.pt" in str(info.value)


def test_load_latest_checkpoint_sets_a_damaged_file_aside_only_when_asked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """keys37, keys38: by default the damaged ``last.pt`` stays where it is (only the process
    that resumes sets it aside); the warning names the epoch resumed from (prev.pt's, 1)."""
    run = make_run(tmp_path)
    last = run / "checkpoints" / "last.pt"
    damage(last)
    damaged = last.read_bytes()
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        assert load_latest_checkpoint(run)["epoch"] == 1
    assert last.read_bytes() == damaged and not last.with_name("last.pt.damaged").exists()
    assert "(epoch 1)" in caplog.text and "after epoch 1 is lost" in caplog.text
    assert load_latest_checkpoint(run, set_aside_damaged=True)["epoch"] == 1
    assert not last.exists() and last.with_name("last.pt.damaged").read_bytes() == damaged
