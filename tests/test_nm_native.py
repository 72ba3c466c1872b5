"""The native N:M forward (nm.native): torch's bits, or off with a reason, never other results."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

import feather_sparse as fs
from feather_sparse.nm import native
from feather_sparse.nm.operator import NMPattern, _nm_forward, _torch_thresholded

HAS_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang"))


def _has_mkl_functions() -> bool:
    try:
        lib = native._torch_library()
        return bool(lib.vmsLn and lib.vmsExp)
    except (native._Off, AttributeError):
        return False


EXPECT_ON = HAS_CC and _has_mkl_functions() and torch.backends.cpu.get_cpu_capability() != ""


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A clean kernel state and an empty cache folder; the shared state is restored afterwards."""
    monkeypatch.setenv("FEATHER_SPARSE_CACHE", str(tmp_path))
    native._reset()
    yield tmp_path
    native._reset()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def _awkward(groups: int, m: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(groups, m, generator=g) * 10.0 ** torch.randint(
        -44, 4, (groups, 1), generator=g
    )
    x[::4, 0] = 0.0
    x[::3, 1] = x[::3, 0]
    return x


def test_on_where_a_compiler_and_torchs_mkl_functions_are_there() -> None:
    if not EXPECT_ON:
        pytest.skip("no C compiler or no MKL functions in this torch build")
    assert native.status().startswith("on"), native.status()


@pytest.mark.skipif(not EXPECT_ON, reason="the native forward cannot be built here")
@pytest.mark.parametrize("pattern", ["2:4", "1:4", "4:8", "3:16"])
@pytest.mark.parametrize("p", [2.0, 3.0, 4.0, 7.0])
def test_gives_the_torch_kernels_bits(pattern: str, p: float) -> None:
    pat = NMPattern.parse(pattern)
    for groups in (1, 3, 513, 2049):  # partial blocks of 2,048 and vector tails
        x = _awkward(groups, pat.m, groups)
        for ramp in (1.0, 0.75, 0.0):
            r = torch.tensor(ramp)
            got = native.forward(x, pat.n, r, p)
            assert got is not None
            want = _torch_thresholded(x, pat, r, p)
            assert torch.equal(_bits(got[0]), _bits(want[0]))
            assert torch.equal(_bits(got[1]), _bits(want[1]))
            assert got[1].shape == (groups, 1)


@pytest.mark.skipif(not EXPECT_ON, reason="the native forward cannot be built here")
@pytest.mark.parametrize("pattern", ["2:4", "4:8"])
def test_tensors_read_in_place_give_the_bits_of_their_concatenation(pattern: str) -> None:
    pat = NMPattern.parse(pattern)
    parts = [_awkward(g, pat.m, g).reshape(-1, 2 * pat.m) for g in (2, 1030, 6, 4098)]
    weights = [torch.nn.Parameter(w) for w in parts]  # as the fused pass passes them
    flat, out, aux = native.forward_many(weights, pat, torch.tensor(0.75), 3.0)
    whole = torch.cat([w.reshape(-1) for w in parts])
    want = _torch_thresholded(whole.view(-1, pat.m), pat, torch.tensor(0.75), 3.0)
    assert torch.equal(_bits(flat), _bits(whole))  # the bit reference, copied while reading
    assert torch.equal(_bits(out), _bits(want[0].reshape(-1)))
    assert torch.equal(_bits(aux), _bits(want[1]))
    assert all(w.grad_fn is None and w.grad is None for w in weights)


def test_tensors_it_cannot_read_in_place_go_to_torch() -> None:
    pat, r = NMPattern(2, 4), torch.tensor(1.0)
    good = _awkward(8, 4, 9)
    assert native.forward_many([], pat, r, 3.0) is None
    assert native.forward_many([good, good.double()], pat, r, 3.0) is None
    assert native.forward_many([good, good.t()], pat, r, 3.0) is None  # not contiguous
    assert native.forward_many([good, torch.zeros(6)], pat, r, 3.0) is None  # not whole groups
    assert native.forward_many([good, good], pat, r, float("inf")) is None


@pytest.mark.skipif(not EXPECT_ON, reason="the native forward cannot be built here")
def test_a_weight_that_is_not_finite_sends_the_tensor_to_torch() -> None:
    pat = NMPattern(2, 4)
    x = _awkward(600, 4, 1)
    for bad in (float("nan"), float("inf"), -float("inf")):
        y = x.clone()
        y[517, 2] = bad
        assert native.forward(y, 2, torch.tensor(1.0), 3.0) is None
        out, _ = _nm_forward(y, pat, torch.tensor(1.0), 3.0, None, None)
        want = _torch_thresholded(y, pat, torch.tensor(1.0), 3.0)
        assert torch.equal(out.isnan(), want[0].isnan())
        ok = ~want[0].isnan()
        assert torch.equal(_bits(out[ok]), _bits(want[0][ok]))


def test_what_it_does_not_serve_goes_to_torch() -> None:
    x = _awkward(64, 4, 2)
    r = torch.tensor(1.0)
    assert native.forward(x.double(), 2, r, 3.0) is None  # float32 only
    for p in (1.0, 2.5, float("inf"), 17.0):
        assert native.forward(x, 2, r, p) is None
    assert native.forward(x, 2, torch.full((64, 1), 0.5), 3.0) is None  # per-group ramps
    assert native.forward(x.t().contiguous().t(), 2, r, 3.0) is None  # not contiguous
    assert native.forward(torch.zeros(0, 4), 2, r, 3.0) is None
    assert native.forward(_awkward(4, 64, 3), 32, r, 3.0) is None  # groups over 32


@pytest.mark.skipif(not EXPECT_ON, reason="the native forward cannot be built here")
def test_many_threads_leave_large_tensors_to_torchs_parallel_kernels() -> None:
    threads = torch.get_num_threads()
    small = _awkward(native.SERIAL_NUMEL // 4, 4, 4)
    large = _awkward(native.SERIAL_NUMEL // 4 + 1, 4, 5)
    r = torch.tensor(1.0)
    try:
        torch.set_num_threads(native.MAX_THREADS + 1)
        assert native.forward(small, 2, r, 3.0) is not None
        assert native.forward(large, 2, r, 3.0) is None
        torch.set_num_threads(native.MAX_THREADS)
        assert native.forward(large, 2, r, 3.0) is not None
    finally:
        torch.set_num_threads(threads)


def test_turned_off_by_the_environment(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.ENV, "0")
    assert native.status() == f"off: turned off by {native.ENV}=0"
    assert native.forward(_awkward(8, 4, 6), 2, torch.tensor(1.0), 3.0) is None


def test_no_compiler_turns_it_off_with_the_reason(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _has_mkl_functions():
        pytest.skip("no MKL functions in this torch build")
    monkeypatch.setenv("CC", "no-such-compiler-here")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert native.status() == "off: no C compiler found (set CC, or install cc/gcc/clang)"
    x = _awkward(40, 4, 7)
    out, _ = _nm_forward(x, NMPattern(2, 4), torch.tensor(1.0), 3.0, None, None)
    want, _ = _torch_thresholded(x, NMPattern(2, 4), torch.tensor(1.0), 3.0)
    assert torch.equal(_bits(out), _bits(want))


@pytest.mark.skipif(not EXPECT_ON, reason="the native forward cannot be built here")
def test_a_failing_compiler_turns_it_off_with_its_message(
    fresh: Path, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    fake = tmp_path_factory.mktemp("bin") / "fakecc"
    fake.write_text("#!/bin/sh\necho 'fakecc: cannot compile today' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    status = native.status()
    assert status.startswith(f"off: the C compiler {fake} failed"), status
    assert "cannot compile today" in status
    assert not list((fresh / "native").glob("*.so"))  # nothing half-written left behind


@pytest.mark.skipif(not EXPECT_ON, reason="the native forward cannot be built here")
def test_built_once_then_taken_from_the_cache(fresh: Path) -> None:
    assert native.status().startswith("on")
    built = list((fresh / "native").glob("nm-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    native._reset()
    assert native.status() == f"on ({built[0]})"
    assert built[0].stat().st_mtime_ns == stamp


@pytest.mark.skipif(not EXPECT_ON, reason="the native forward cannot be built here")
def test_a_damaged_cache_file_is_built_again(fresh: Path) -> None:
    # damaged before this process loads it (a loaded library is never written over:
    # a build replaces the file, it does not write into it)
    key = native._key(native._compiler(), native._flags(native._addcmul_fused()))
    path = fresh / "native" / f"nm-{key}.so"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a shared library")
    assert native.status() == f"on ({path})"
    assert path.read_bytes()[:4] == b"\x7fELF"


@pytest.mark.skipif(not EXPECT_ON, reason="the native forward cannot be built here")
def test_other_bits_than_torchs_turn_it_off_with_a_warning(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native, "_VML_MODE", 0x140101)  # MKL's low-accuracy mode: other bits
    with pytest.warns(UserWarning, match="self-test found bits other than torch"):
        status = native.status()
    assert status.startswith("off: its self-test"), status
    assert native.forward(_awkward(8, 4, 8), 2, torch.tensor(1.0), 3.0) is None


@pytest.mark.skipif(not EXPECT_ON, reason="the native forward cannot be built here")
def test_training_gives_the_same_bits_with_and_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def train(on: bool) -> dict[str, torch.Tensor]:
        monkeypatch.setattr(native, "_get", native._get if on else lambda: None)
        calls = []
        for name in ("_call", "_call_many"):
            real = getattr(native, name)
            monkeypatch.setattr(native, name, lambda *a, real=real: calls.append(1) or real(*a))
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)
        )
        pruner = fs.Pruner(model, pattern="2:4", total_steps=6, min_params=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        for _ in range(6):
            x = torch.randn(16, 32, generator=g)
            y = torch.randint(0, 8, (16,), generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            pruner.step()
        assert bool(calls) == on
        return {k: v.clone() for k, v in pruner.dense_state_dict(pruned=True).items()}

    with_native, without = train(True), train(False)
    assert with_native.keys() == without.keys()
    for key in with_native:
        assert torch.equal(with_native[key].view(torch.int32), without[key].view(torch.int32)), key


@pytest.mark.skipif(not EXPECT_ON, reason="the native forward cannot be built here")
def test_the_largest_magnitudes_in_one_call_are_torchs_values() -> None:
    """The Pruner's finite check at every step: ``max |w|`` per tensor, exactly, NaN for a
    tensor holding a NaN (wherever it is), infinity for one holding an infinity."""
    from feather_sparse.pruner import _abs_max_each

    assert native.status().startswith("on")  # loaded, as an N:M forward loads it
    g = torch.Generator().manual_seed(3)
    weights = [
        torch.randn(64, 33, generator=g) * 10.0 ** float(e) for e in range(-44, 36, 8)
    ]  # subnormal to large, lengths that leave vector tails
    weights += [torch.tensor([-0.0, 0.0]), torch.tensor([1e-45, -1e-44]), torch.tensor([-3.0])]
    weights += [torch.tensor([1.0, -float("inf")]), torch.tensor([2.0, float("nan"), 1.0])]
    weights += [torch.tensor([-float("nan"), -5.0] * 40)]  # a NaN with its sign bit set
    got = native.abs_max_many(weights)
    assert got is not None and got.dtype == torch.float32
    want = torch.stack([w.abs().max() for w in weights])
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~got.isnan()], want[~want.isnan()])
    assert got[-3].item() == float("inf") and bool(got[-2].isnan()) and bool(got[-1].isnan())
    assert torch.equal(_abs_max_each(weights).isnan(), want.isnan())  # the Pruner's path
    assert native.abs_max_many([]) is None
    assert native.abs_max_many([weights[0], weights[0].double()]) is None
    assert native.abs_max_many([weights[0], torch.zeros(0)]) is None
    assert native.abs_max_many([weights[0].t()]) is None  # not contiguous


def test_a_nan_weight_still_stops_the_pruner_naming_the_layer() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    pruner = fs.Pruner(model, pattern="2:4")
    with torch.no_grad():
        model[2].parametrizations.weight.original[1, 3] = float("nan")
    with pytest.raises(RuntimeError, match=r"non-finite weights .* layer 2 at step"):
        pruner.step()


@pytest.mark.skipif(not EXPECT_ON, reason="the native forward cannot be built here")
def test_an_error_in_the_self_test_turns_it_off_and_never_reaches_training(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(k: object) -> bool:
        raise RuntimeError("a probe that cannot run here")

    monkeypatch.setattr(native, "_self_test", broken)
    with pytest.warns(UserWarning, match="self-test found bits other than torch"):
        assert native.status().startswith("off: its self-test")
    x = _awkward(40, 4, 11)
    out, _ = _nm_forward(x, NMPattern(2, 4), torch.tensor(1.0), 3.0, None, None)
    want, _ = _torch_thresholded(x, NMPattern(2, 4), torch.tensor(1.0), 3.0)
    assert torch.equal(_bits(out), _bits(want))


def test_torchs_addcmul_is_told_fused_or_not_by_its_own_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch, "addcmul", lambda one, h, r: one + h * r)  # rounded twice
    assert not native._addcmul_fused()
    monkeypatch.setattr(
        torch, "addcmul", lambda one, h, r: (one.double() + h.double() * r.double()).float()
    )
    assert native._addcmul_fused()


@pytest.mark.skipif(not EXPECT_ON, reason="the native forward cannot be built here")
def test_the_finite_check_never_builds_the_library_itself(fresh: Path) -> None:
    """A Pruner without an N:M pattern compiles and tests nothing: the finite check uses
    the native library only once an N:M forward has loaded it."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    pruner = fs.Pruner(model, sparsity=0.5, total_steps=4, backbone="uniform")
    pruner.step()
    assert native.abs_max_many(pruner.weights()) is None
    assert not (fresh / "native").exists()
    assert native._kernel is None and native._reason is None  # not even tried
    assert native.status().startswith("on")  # what an N:M forward does first
    assert native.abs_max_many(pruner.weights()) is not None
