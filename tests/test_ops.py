"""The Feather operator: golden values, properties, gradients, dtypes, devices."""

from __future__ import annotations

import math

import pytest
import torch

import feather_sparse as fs
from _guards import guard
from _hypothesis import example, given, settings, st
from feather_sparse.ops import OPERATORS, ThresholdOperator, _ThresholdSTE, apply_function

FLOATS = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, width=32)
POWERS = st.sampled_from([1.0, 1.5, 2.0, 3.0, 4.0, 8.0, math.inf])


def vec(values: list[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


# ------------------------------------------------------------------- golden values
def test_golden_w2_t1_p3_is_cube_root_of_7() -> None:
    # (2^3 - 1^3)^(1/3) = 7^(1/3)
    out = fs.threshold(vec([2.0, -2.0]), torch.tensor(1.0), p=3.0)
    assert out.tolist() == pytest.approx([7 ** (1 / 3), -(7 ** (1 / 3))], rel=1e-6)


def test_golden_p2_and_float64() -> None:
    # (5^2 - 3^2)^(1/2) = 4 exactly
    out = fs.threshold(
        vec([5.0, -5.0, 3.0], torch.float64), torch.tensor(3.0, dtype=torch.float64), p=2
    )
    assert out.tolist() == pytest.approx([4.0, -4.0, 0.0], abs=1e-12)


def test_zero_at_and_below_threshold_positive_zero() -> None:
    out = fs.threshold(vec([-1.0, 1.0, 0.5, -0.5, 0.0]), torch.tensor(1.0), p=3.0)
    assert torch.equal(out, torch.zeros(5))
    # pruned entries are +0.0, not -0.0 (bit-exact zeros for sparse formats)
    assert not torch.signbit(out).any()


def test_threshold_zero_is_identity() -> None:
    w = torch.randn(100)
    for p in (1.0, 3.0, math.inf):
        assert torch.equal(fs.threshold(w, torch.tensor(0.0), p=p), w)


def test_python_float_threshold_accepted() -> None:
    assert fs.threshold(vec([2.0]), 1.0).item() == pytest.approx(7 ** (1 / 3), rel=1e-6)


def test_registry_operators() -> None:
    assert OPERATORS.get("feather").p == 3.0
    assert OPERATORS.get("soft").p == 1.0
    assert math.isinf(OPERATORS.get("hard").p)
    with pytest.raises(ValueError, match="choose one of: feather, hard, soft"):
        OPERATORS.get("medium")


# ------------------------------------------------------------------- properties
@settings(max_examples=200, deadline=None)
@given(st.lists(FLOATS, min_size=1, max_size=50), st.floats(0, 1e3, width=32), POWERS)
def test_properties(values: list[float], t: float, p: float) -> None:
    w = vec(values)
    out = fs.threshold(w, torch.tensor(t), p=p)
    pruned = w.abs() <= t
    assert torch.all(out[pruned] == 0)  # zero exactly where |w| <= T
    kept = ~pruned & (out != 0)
    assert torch.equal(torch.sign(out[kept]), torch.sign(w[kept]))  # sign kept
    assert torch.all(out.abs() <= w.abs())  # |P(w)| <= |w|
    assert torch.all(torch.isfinite(out))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(FLOATS, min_size=1, max_size=50),
    st.floats(0, 1e3, width=32),
    st.floats(0, 1e3, width=32),
    POWERS,
)
@example([430.75], 1.0, 0.99999, 3.0)  # one ulp the other way: rounding, not a bug
def test_monotone_in_threshold(values: list[float], t1: float, t2: float, p: float) -> None:
    """A higher threshold never gives a larger magnitude, up to the operator's rounding
    (a few units in the last place: |w|^p − T^p and its p-th root are each rounded)."""
    lo, hi = sorted((t1, t2))
    w = vec(values)
    a = fs.threshold(w, torch.tensor(lo), p=p).abs()
    b = fs.threshold(w, torch.tensor(hi), p=p).abs()
    assert torch.all(b <= a * (1 + 4 * torch.finfo(a.dtype).eps))


@settings(max_examples=100, deadline=None)
@given(st.lists(FLOATS, min_size=1, max_size=50), st.floats(0, 1e3, width=32))
def test_p1_is_soft_and_pinf_is_hard_exactly(values: list[float], t: float) -> None:
    w = vec(values)
    tt = torch.tensor(t)
    soft = torch.sign(w) * (w.abs() - tt).clamp_min(0)
    hard = torch.where(w.abs() > tt, w, torch.zeros_like(w))
    assert torch.equal(fs.threshold(w, tt, p=1.0), soft)
    assert torch.equal(fs.threshold(w, tt, p=math.inf), hard)


def test_large_p_approaches_hard_and_matches_float64_reference() -> None:
    w = torch.randn(1000, dtype=torch.float64) * 3
    t = torch.tensor(1.0, dtype=torch.float64)
    for p in (2.0, 3.0, 7.0):
        ref = torch.where(
            w.abs() > t, torch.sign(w) * (w.abs() ** p - t**p).clamp_min(0) ** (1 / p), 0.0
        )
        assert torch.allclose(fs.threshold(w, t, p=p), ref, rtol=1e-12, atol=1e-12)
    big = fs.threshold(w, t, p=200.0)
    hard = fs.threshold(w, t, p=math.inf)
    keep = w.abs() > 1.1
    assert torch.allclose(big[keep], hard[keep], rtol=1e-3)


# ------------------------------------------------------------------- overflow / dtypes
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("p", [1.0, 3.0, math.inf])
def test_dtypes_match_float64_reference(dtype: torch.dtype, p: float) -> None:
    w = (torch.randn(4096) * 2).to(dtype)
    t = torch.tensor(0.7)
    out = fs.threshold(w, t, p=p)
    assert out.dtype == dtype
    w64 = w.double()
    ref = fs.threshold(w64, t.double(), p=p)
    assert torch.allclose(out.double(), ref, rtol=torch.finfo(dtype).eps * 8, atol=0)
    assert torch.equal(out == 0, w64.abs() <= 0.7)


def test_no_overflow_in_float16_with_large_weights() -> None:
    # |w|^3 overflows float16 (max 65504) for |w| > 40.3; the operator must not.
    w = torch.tensor([1000.0, -60000.0, 50.0], dtype=torch.float16)
    out = fs.threshold(w, torch.tensor(10.0), p=3.0)
    assert torch.all(torch.isfinite(out))
    ref = torch.sign(w.double()) * (w.double().abs() ** 3 - 1000.0) ** (1 / 3)
    assert torch.allclose(out.double(), ref, rtol=1e-3)


def test_huge_p_is_stable() -> None:
    w = torch.tensor([3.0, 1.5, -1.0001])
    out = fs.threshold(w, torch.tensor(1.0), p=1e6)
    assert torch.all(torch.isfinite(out))
    assert out.tolist() == pytest.approx([3.0, 1.5, -1.0001], rel=1e-3)


# ------------------------------------------------------------------- subnormal weights
# Magnitudes below the smallest normal float (1.2e-38 in float32 and bfloat16).
# Each path of the forward: "single" (one block: CPU tensors of at most BLOCK
# entries, and any tensor on a GPU or under torch.compile), "blockwise" (larger
# CPU tensors; BLOCK shrunk to 7 here), and the GPU.
PATHS = ["single", "blockwise", pytest.param("cuda", marks=pytest.mark.gpu)]


def _on_path(path: str, w: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> torch.Tensor:
    import feather_sparse.ops as ops

    if path == "blockwise":
        monkeypatch.setattr(ops, "BLOCK", 7)
    return w.cuda() if path == "cuda" else w


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in units in the last place between two float32 tensors of one sign pattern."""
    return (a.view(torch.int32).long() - b.view(torch.int32).long()).abs()


@guard(
    "weights below the smallest normal float (subnormal), on any path of the operator",
    "`P_T` as for other weights: `T = 0` gives `w` bit for bit, a magnitude at or below `T` "
    "gives +0.0, the others are within a few ulps",
)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("p", [1.0, 2.0, 2.5, 3.0, math.inf])
def test_zero_threshold_is_the_identity_on_subnormal_weights(
    monkeypatch: pytest.MonkeyPatch, path: str, dtype: torch.dtype, p: float
) -> None:
    """``P_0(w) = w`` bit for bit, subnormal weights included (1e-40 came out as 2.04e-41)."""
    tiny = torch.finfo(dtype).tiny
    w = torch.tensor([1e-40, -3e-39, 0.0, -0.0, 0.5, -2.0], dtype=dtype)
    w = torch.cat([w, torch.tensor([tiny / 2, -tiny / 1000, tiny, 1e-320], dtype=dtype)])
    w = _on_path(path, w, monkeypatch)
    out = fs.threshold(w, 0.0, p=p)
    assert torch.equal(out[w != 0], w[w != 0])
    assert torch.equal(out[w == 0], torch.zeros_like(out[w == 0]))
    assert not torch.signbit(out[w == 0]).any()  # -0.0 comes out +0.0 on every path


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("p", [2.0, 2.5, 3.0, 7.0])
def test_subnormal_weights_above_a_subnormal_threshold_match_float64(
    monkeypatch: pytest.MonkeyPatch, path: str, p: float
) -> None:
    """Within a few ulps of ``sign(w)(|w|^p − T^p)^(1/p)`` computed in float64, where every
    float32 subnormal is a normal number; exactly +0.0 where ``|w| <= T``."""
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(1, 1 << 23, (200,), generator=g, dtype=torch.int32)  # subnormal patterns
    w = bits.view(torch.float32) * torch.where(torch.rand(200, generator=g) < 0.5, -1.0, 1.0)
    t = torch.tensor(float(w.abs().median()))  # subnormal too: half the weights are pruned
    ref = torch.where(
        w.double().abs() > t.double(),
        torch.sign(w.double()) * (w.double().abs() ** p - t.double() ** p) ** (1 / p),
        0.0,
    ).float()
    out = fs.threshold(_on_path(path, w, monkeypatch), _on_path(path, t, monkeypatch), p=p).cpu()
    assert torch.equal(out == 0, w.abs() <= t)
    assert int(_ulps(out, ref).max()) <= 4
    assert not torch.signbit(out[out == 0]).any()


# ------------------------------------------------------------------- gradients
@pytest.mark.parametrize("theta", [0.0, 0.25, 0.5, 1.0])
@pytest.mark.parametrize("p", [1.0, 3.0, math.inf])
def test_ste_gradient_scaling(theta: float, p: float) -> None:
    w = torch.tensor([2.0, -0.5, 1.0, -3.0, 0.0], requires_grad=True)
    g = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    out = fs.threshold(w, torch.tensor(1.0), p=p, theta=theta)
    out.backward(g)
    keep = torch.tensor([True, False, False, True, False])
    expected = torch.where(keep, g, theta * g)
    assert torch.equal(w.grad, expected)  # the derivative of P_T itself is never used


def test_no_gradient_to_threshold() -> None:
    w = torch.randn(10, requires_grad=True)
    t = torch.tensor(0.5, requires_grad=True)
    fs.threshold(w, t).sum().backward()
    assert t.grad is None


def test_saves_no_float_mask() -> None:
    w = torch.randn(64, 64, requires_grad=True)
    t = torch.tensor(0.3)
    for theta, expect in ((1.0, 0), (0.5, 2)):
        saved: list[torch.Tensor] = []

        def pack(x: torch.Tensor, saved: list[torch.Tensor] = saved) -> torch.Tensor:
            saved.append(x)
            return x

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            fs.threshold(w, t, theta=theta)
        assert len(saved) == expect
        # whatever is saved is the caller's own weight and the 0-d threshold: no new storage
        for x in saved:
            assert x.data_ptr() in (w.data_ptr(), t.data_ptr())


def test_autograd_function_gradcheck_like_identity_on_kept() -> None:
    w = torch.randn(20, dtype=torch.float64, requires_grad=True)
    out = _ThresholdSTE.apply(w, torch.tensor(0.1, dtype=torch.float64), 3.0, 0.3)
    (out * torch.arange(20.0, dtype=torch.float64)).sum().backward()
    keep = w.detach().abs() > 0.1
    expected = torch.where(
        keep, torch.arange(20.0, dtype=torch.float64), 0.3 * torch.arange(20.0, dtype=torch.float64)
    )
    assert torch.allclose(w.grad, expected)


# ------------------------------------------------------------------- validation
@guard("`p < 1` or NaN for the operator", "`ValueError`: p must be >= 1")
@pytest.mark.parametrize("p", [0.0, 0.5, 0.999, -1.0, float("nan")])
def test_bad_p(p: float) -> None:
    with pytest.raises(ValueError, match="p must be >= 1"):
        fs.threshold(torch.ones(3), 0.5, p=p)
    with pytest.raises(ValueError, match="p must be >= 1"):
        ThresholdOperator(p=p)


@pytest.mark.parametrize("theta", [-0.1, 1.5])
def test_bad_theta(theta: float) -> None:
    with pytest.raises(ValueError, match=r"theta must be in \[0, 1\]"):
        fs.threshold(torch.ones(3), 0.5, theta=theta)


def test_threshold_must_be_0d() -> None:
    with pytest.raises(ValueError, match="0-d tensor"):
        fs.threshold(torch.ones(3), torch.ones(3))


@guard("`fs.threshold(w, T)` with a negative T", "`ValueError`: a negative T enlarges weights")
@pytest.mark.parametrize("t", [-0.5, torch.tensor(-0.5)])
def test_negative_threshold_is_refused(t: float | torch.Tensor) -> None:
    # Unchecked, T = -0.5 turns 0.1 into (0.1^3 + 0.5^3)^(1/3) = 0.501: weights grow.
    with pytest.raises(ValueError, match=r"T must be >= 0, got -0\.5: a negative T enlarges"):
        fs.threshold(torch.tensor([0.1, -2.0]), t)


@guard("`fs.threshold(w, T)` with T NaN or inf", "`ValueError`: T must be a finite number >= 0")
@pytest.mark.parametrize("t", [math.nan, math.inf, torch.tensor(math.nan)])
def test_non_finite_threshold_is_refused(t: float | torch.Tensor) -> None:
    with pytest.raises(ValueError, match="T must be a finite number >= 0"):
        fs.threshold(torch.tensor([0.1, -2.0]), t)


@guard(
    "`fs.threshold` on an integer or bool tensor", "`TypeError` naming the dtype and `w.float()`"
)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_weights_are_refused(dtype: torch.dtype) -> None:
    # Unchecked, an integer tensor came back truncated to whole numbers.
    with pytest.raises(TypeError, match=r"floating-point tensor, got torch\.\w+.*w\.float\(\)"):
        fs.threshold(torch.tensor([2, 0, 3]).to(dtype), 1.0)


def test_the_pruner_path_skips_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    # The operator a Pruner holds was checked once; its forward runs no checks.
    import feather_sparse.ops as ops

    def refuse(*args: object) -> float:
        raise AssertionError("a check ran on the forward pass")

    op = ThresholdOperator(p=3.0)
    for name in ("check_p", "check_theta", "check_threshold"):
        monkeypatch.setattr(ops, name, refuse)
    out = op(torch.tensor([2.0, 0.5]), torch.tensor(1.0), 0.5)
    assert out[1] == 0 and math.isclose(float(out[0]), 7 ** (1 / 3), rel_tol=1e-6)


# ------------------------------------------------------------------- devices
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_cuda_matches_cpu(dtype: torch.dtype) -> None:
    w = torch.randn(10_000).to(dtype)
    t = torch.tensor(0.5)
    cpu = fs.threshold(w, t, theta=0.5)
    w_cuda = w.cuda().requires_grad_()
    gpu = fs.threshold(w_cuda, t.cuda(), theta=0.5)
    assert gpu.device.type == "cuda"
    assert torch.allclose(gpu.cpu().double(), cpu.double(), rtol=torch.finfo(dtype).eps * 4)
    gpu.sum().backward()
    assert torch.equal(w_cuda.grad.cpu() == 1, w.abs() > 0.5)


# ------------------------------------------------------------------- blockwise path
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("p", [1.0, 2.0, 2.5, 3.0, math.inf])
@pytest.mark.parametrize("theta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("t_value", [0.0, 0.8])
def test_blockwise_equals_single_block(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, p: float, theta: float, t_value: float
) -> None:
    import feather_sparse.ops as ops

    w = (torch.randn(3, 1000) * 2).to(dtype)
    w[0, :10] = 0.0  # exact zeros
    w[1, :10] = -0.0
    g = torch.randn(3, 1000).to(dtype)
    t = torch.tensor(t_value)

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        x = w.clone().requires_grad_()
        out = fs.threshold(x, t, p=p, theta=theta)
        out.backward(g)
        return out.detach(), x.grad

    single = run()  # 3000 elements: one block
    monkeypatch.setattr(ops, "BLOCK", 97)  # 31 blocks, the last one partial
    blocked = run()
    assert torch.equal(single[0], blocked[0])
    assert torch.equal(single[1], blocked[1])
    assert not torch.signbit(blocked[0][blocked[0] == 0]).any()
    assert blocked[0].shape == w.shape and blocked[1].shape == w.shape


# ------------------------------------------------------------------- output cache
def _cached_forward(w: torch.Tensor, cache: fs.ops.OutputCache, t: float = 0.5) -> torch.Tensor:
    return fs.threshold(w, torch.tensor(t), cache=cache)


def test_output_cache_reuses_memory_only_when_nothing_holds_it() -> None:
    w = torch.randn(300, 300, requires_grad=True)  # above one block: the CPU blockwise path
    cache = fs.ops.OutputCache()
    first = _cached_forward(w, cache)
    ptr = first.data_ptr()
    kept = first.detach().clone()
    # `first` is still referenced: the next call must not write into it.
    second = _cached_forward(w, cache, t=1.0)
    assert second.data_ptr() != ptr
    assert torch.equal(first, kept)
    del first, second
    # Nothing holds the cached output any more: its memory is reused.
    third = _cached_forward(w, cache)
    fourth_ptr = third.data_ptr()
    assert torch.equal(third, kept)
    del third
    assert _cached_forward(w, cache).data_ptr() == fourth_ptr


def test_output_cache_training_gradients_match_uncached() -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(300, 300)
    x = torch.randn(8, 300)
    t = torch.tensor(0.02)

    def grads(cache: fs.ops.OutputCache | None) -> list[torch.Tensor]:
        out = []
        for _ in range(3):  # later steps run on the reused memory
            layer.weight.grad = None
            w = fs.threshold(layer.weight, t, theta=0.5, cache=cache)
            # The same effective weight used twice in one graph (weight sharing).
            y = torch.nn.functional.linear(torch.nn.functional.linear(x, w), w)
            y.square().sum().backward()
            out.append(layer.weight.grad.clone())
        return out

    cache = fs.ops.OutputCache()
    for a, b in zip(grads(None), grads(cache)):
        assert torch.equal(a, b)


def test_output_cache_weight_used_twice_gets_fresh_memory() -> None:
    # The second call while the first output is saved by the graph must not
    # overwrite it (autograd would raise on backward if it did).
    w = torch.randn(300, 300, requires_grad=True)
    cache = fs.ops.OutputCache()
    x = torch.randn(4, 300)
    a = torch.nn.functional.linear(x, _cached_forward(w, cache))
    b = torch.nn.functional.linear(x, _cached_forward(w, cache, t=0.7))
    (a.sum() + b.sum()).backward()
    assert w.grad is not None


def test_output_cache_not_used_without_grad() -> None:
    w = torch.randn(300, 300, requires_grad=True)
    cache = fs.ops.OutputCache()
    _cached_forward(w, cache)
    assert cache._out is not None
    with torch.no_grad():
        out = _cached_forward(w, cache)
    assert cache._out is None  # evaluation gives the memory back
    assert torch.equal(out, fs.threshold(w.detach(), torch.tensor(0.5)))


def test_apply_function_matches_function_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    """The direct C++ call gives ``.apply``'s values and gradients; compiling or
    functorch takes ``.apply`` itself."""
    w = torch.randn(64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    t = torch.tensor(0.5)
    direct = apply_function(_ThresholdSTE, w, t, 3.0, 0.5, None)
    (g_direct,) = torch.autograd.grad(direct.sum(), w)
    reference = _ThresholdSTE.apply(w, t, 3.0, 0.5, None)
    (g_reference,) = torch.autograd.grad(reference.sum(), w)
    assert torch.equal(direct, reference) and torch.equal(g_direct, g_reference)

    calls = []

    class Recorded(_ThresholdSTE):
        @classmethod
        def apply(cls, *args):  # type: ignore[no-untyped-def, override]
            calls.append(args)
            return "via .apply"

    assert torch.equal(apply_function(Recorded, w, t, 3.0, 0.5, None), reference)
    assert not calls  # eager: the signature binding is skipped
    monkeypatch.setattr(torch._C, "_are_functorch_transforms_active", lambda: True)
    assert apply_function(Recorded, w, t, 3.0, 0.5, None) == "via .apply"
    monkeypatch.undo()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert apply_function(Recorded, w, t, 3.0, 0.5, None) == "via .apply"
    assert len(calls) == 2
