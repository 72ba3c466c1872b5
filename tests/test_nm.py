"""N:M Feather: the pattern, the group layout, ties, the operator and its gradient."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from _hypothesis import given, settings, st
from feather_sparse.nm import (
    NMPattern,
    check_layout,
    group_view,
    nm_keep_mask,
    nm_threshold,
    nm_thresholds,
)
from feather_sparse.nm.operator import _kth_smallest, _threshold_blocks, group_thresholds
from feather_sparse.ops import _POOL, BLOCK, _block, pooled_scratch

PATTERNS = [NMPattern(2, 4), NMPattern(1, 4), NMPattern(4, 8), NMPattern(1, 2), NMPattern(3, 16)]


# ------------------------------------------------------------------- the pattern
@pytest.mark.parametrize(("spec", "n", "m"), [("2:4", 2, 4), ("1:4", 1, 4), (" 4 : 8 ", 4, 8)])
def test_parse(spec: str, n: int, m: int) -> None:
    pattern = NMPattern.parse(spec)
    assert (pattern.n, pattern.m) == (n, m)
    assert str(pattern) == f"{n}:{m}"
    assert NMPattern.parse(pattern) is pattern


@pytest.mark.parametrize("spec", ["4:4", "0:4", "5:4", "2/4", "2:4:8", "", "a:b", "-1:4"])
def test_parse_rejects(spec: str) -> None:
    with pytest.raises(ValueError, match=r"N:M|0 < N < M"):
        NMPattern.parse(spec)


def test_sparsity_and_index_bits() -> None:
    assert NMPattern(2, 4).sparsity == 0.5
    assert NMPattern(1, 4).sparsity == 0.75
    assert NMPattern(2, 4).index_bits == 2
    assert NMPattern(4, 8).index_bits == 3
    assert NMPattern(1, 2).index_bits == 1
    assert NMPattern(3, 5).index_bits == 3


# ------------------------------------------------------------------- the layout
def test_groups_run_along_the_reduction_dimension() -> None:
    w = torch.arange(2 * 8, dtype=torch.float32).reshape(2, 8)  # Linear(8 -> 2)
    g = group_view(w, NMPattern(2, 4))
    assert g.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    conv = torch.arange(3 * 2 * 2 * 2, dtype=torch.float32).reshape(3, 2, 2, 2)  # (out, in, kh, kw)
    g = group_view(conv, NMPattern(2, 4))
    assert g.shape == (6, 4)
    # a group never crosses an output channel: rows of 8 split into two groups
    assert torch.equal(g.reshape(3, 8), conv.reshape(3, 8))


def test_layout_errors_name_the_layer() -> None:
    with pytest.raises(ValueError, match=r"'fc'.*reduction dimension of 6.*exclude"):
        check_layout("fc", nn.Linear(6, 4), torch.zeros(4, 6), NMPattern(2, 4))
    with pytest.raises(ValueError, match=r"'up'.*transposed"):
        m = nn.ConvTranspose2d(4, 4, 3)
        check_layout("up", m, m.weight, NMPattern(2, 4))
    check_layout("conv", nn.Conv2d(2, 3, 2), torch.zeros(3, 2, 2, 2), NMPattern(2, 4))
    # grouped conv: the reduction is in_channels/groups × k (2/2 × 2 × 2 = 4)
    grouped = nn.Conv2d(2, 4, 2, groups=2)
    check_layout("g", grouped, grouped.weight, NMPattern(2, 4))
    with pytest.raises(ValueError, match="groups of 4"):
        group_view(torch.zeros(4, 6), NMPattern(2, 4))


# ------------------------------------------------------------------- mask and ties
def test_golden_mask_and_threshold() -> None:
    w = torch.tensor([[4.0, -1.0, 2.0, -3.0, 0.5, 0.25, -0.75, 1.5]])
    keep, t = nm_keep_mask(w, NMPattern(2, 4))
    assert keep.tolist() == [[True, False, False, True], [False, False, True, True]]
    assert t.squeeze(1).tolist() == [2.0, 0.5]


def test_ties_lower_position_wins() -> None:
    w = torch.tensor(
        [
            [1.0, 1.0, 1.0, 1.0],  # all tied: the first two
            [0.5, -1.0, 1.0, -0.5],  # tie at the top across signs: both kept
            [2.0, 1.0, -1.0, 1.0],  # tie at the boundary: position 1 wins
            [0.0, -0.0, 0.0, -0.0],  # ±0: positions 0 and 1
            [0.0, 0.0, 3.0, -0.0],  # one nonzero: it and the first zero
        ]
    )
    keep, t = nm_keep_mask(w, NMPattern(2, 4))
    assert keep.tolist() == [
        [True, True, False, False],
        [False, True, True, False],
        [True, True, False, False],
        [True, True, False, False],
        [True, False, True, False],
    ]
    assert t.squeeze(1).tolist() == [1.0, 0.5, 1.0, 0.0, 0.0]
    hard = nm_threshold(w, "2:4", p=math.inf).reshape(-1, 4)
    assert hard.tolist() == [
        [1.0, 1.0, 0.0, 0.0],
        [0.0, -1.0, 1.0, 0.0],
        [2.0, 1.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 3.0, 0.0],
    ]
    assert not torch.signbit(hard[hard == 0]).any()  # pruned and zero entries are +0.0
    # finite p: a kept weight equal to T maps to 0, so a tie only lowers the count
    soft = nm_threshold(w, "2:4", p=3.0).reshape(-1, 4)
    assert (soft != 0).sum(1).tolist() == [0, 2, 1, 0, 1]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(PATTERNS),
    st.integers(1, 6),
    st.integers(1, 4),
    st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]),
    st.integers(0, 2**31 - 1),
    st.booleans(),
)
def test_mask_properties(
    pattern: NMPattern, rows: int, groups: int, dtype: torch.dtype, seed: int, coarse: bool
) -> None:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, groups * pattern.m, generator=gen)
    if coarse:  # many ties and zeros
        w = (w * 2).round() / 2
    w = w.to(dtype)
    keep, t = nm_keep_mask(w, pattern)
    a = group_view(w, pattern).abs().to(t.dtype)
    assert (keep.sum(1) == pattern.n).all()
    # every kept magnitude >= every pruned one; T is the largest pruned
    kept_min = torch.where(keep, a, math.inf).amin(1)
    pruned_max = torch.where(keep, -math.inf, a).amax(1)
    assert (kept_min >= pruned_max).all()
    assert torch.equal(t.squeeze(1), pruned_max)
    for p in (1.0, 3.0, math.inf):
        out = group_view(nm_threshold(w, pattern, p=p), pattern)
        assert out.dtype == w.dtype
        assert ((out != 0).sum(1) <= pattern.n).all()
        assert (out[~keep] == 0).all()
        assert (out.abs() <= group_view(w, pattern).abs()).all()
        assert ((out == 0) | (torch.sign(out) == torch.sign(group_view(w, pattern)))).all()


def test_exactly_n_nonzeros_for_distinct_magnitudes() -> None:
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    for pattern in PATTERNS:
        for p in (1.0, 3.0, math.inf):
            out = group_view(nm_threshold(w, pattern, p=p), pattern)
            assert ((out != 0).sum(1) == pattern.n).all()


def test_agrees_with_a_sort() -> None:
    w = torch.randn(16, 48, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for pattern in [NMPattern(2, 4), NMPattern(4, 8), NMPattern(5, 16)]:
        g = group_view(w, pattern).abs()
        ref = g.sort(dim=1).values[:, pattern.m - pattern.n - 1]
        assert torch.equal(nm_thresholds(w, pattern), ref)


@pytest.mark.parametrize("m", [4, 8])
def test_selection_equals_a_sort_on_every_tie_pattern(m: int) -> None:
    """The selection network of four (and the sorting network of eight) vs ``sort``.

    Every group of four over the values 0–3 (all orders and ties), and random
    ties for eight, for every rank ``k``.
    """
    if m == 4:
        vals = torch.tensor(list(itertools.product(range(4), repeat=4)), dtype=torch.float32)
    else:
        vals = torch.randint(0, 4, (512, 8), generator=torch.Generator().manual_seed(2)).float()
    ref = vals.sort(dim=1).values
    for k in range(m):
        assert torch.equal(_kth_smallest(vals.unbind(1), k), ref[:, k])


# ------------------------------------------------------------------- the operator
def test_golden_values_p3() -> None:
    w = torch.tensor([[2.0, -1.0, 0.5, -3.0]])
    out = nm_threshold(w, "2:4", p=3.0)  # T = 1: 7^(1/3), 26^(1/3)
    assert out.tolist()[0] == pytest.approx([7 ** (1 / 3), 0.0, 0.0, -(26 ** (1 / 3))], rel=1e-6)
    soft = nm_threshold(w, "2:4", p=1.0)
    assert soft.tolist() == [[1.0, 0.0, 0.0, -2.0]]
    hard = nm_threshold(w, "2:4", p=math.inf)
    assert hard.tolist() == [[2.0, 0.0, 0.0, -3.0]]


def test_gradient_scaled_by_theta_on_pruned() -> None:
    w = torch.tensor([[2.0, -1.0, 0.5, -3.0], [0.1, 0.2, 0.3, 0.4]], requires_grad=True)
    g = torch.arange(1.0, 9.0).reshape(2, 4)
    nm_threshold(w, "2:4", theta=0.25).backward(g)
    assert w.grad is not None
    assert w.grad.tolist() == [[1.0, 0.5, 0.75, 4.0], [1.25, 1.5, 7.0, 8.0]]
    w.grad = None
    nm_threshold(w, "2:4", theta=1.0).backward(g)
    assert torch.equal(w.grad, g)


def test_float64_magnitudes_a_few_ulps_apart_keep_exactly_n() -> None:
    """float64 ranks on its top bits, so 1 and 1 + ulp tie and the lower position wins;
    the hard forward keeps exactly those n, not also the weight just above T_g."""
    one_up = math.nextafter(1.0, 2.0)
    w = torch.tensor([[1.0, one_up, 5.0, 0.1], [one_up, 1.0, 0.1, 5.0]], dtype=torch.float64)
    out = nm_threshold(w, "2:4", p=math.inf)
    assert out.tolist() == [[1.0, 0.0, 5.0, 0.0], [one_up, 0.0, 0.0, 5.0]]
    lowered = nm_threshold(w, "2:4", p=math.inf, ramp=0.5)  # T = 0.5: every weight above kept
    assert torch.equal(lowered, torch.where(w.abs() > 0.5, w, torch.zeros_like(w)))


def test_ramp_scales_the_threshold() -> None:
    w = torch.tensor([[4.0, -1.0, 2.0, 3.0]])
    assert torch.equal(nm_threshold(w, "2:4", ramp=0.0, p=math.inf), w)
    assert torch.equal(nm_threshold(w, "2:4", ramp=0.0, p=3.0), w)
    half = nm_threshold(w, "2:4", ramp=0.5, p=math.inf)  # T = 2 -> 1: keeps 4, 2, 3
    assert half.tolist() == [[4.0, 0.0, 2.0, 3.0]]


def test_argument_errors() -> None:
    w = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="p must be > 0"):
        nm_threshold(w, "2:4", p=0.0)
    with pytest.raises(ValueError, match="theta"):
        nm_threshold(w, "2:4", theta=2.0)
    with pytest.raises(ValueError, match="N:M"):
        nm_threshold(w, "4:2")


def test_blockwise_forward_equals_the_whole_tensor_computation() -> None:
    """A weight over one block (76,800 > 65,536 entries) gives the bits of one whole pass."""

    w = torch.randn(300, 256, generator=torch.Generator().manual_seed(4))
    pattern = NMPattern(2, 4)
    assert w.numel() > BLOCK
    x = group_view(w, pattern)
    t = group_thresholds(w, pattern)
    for p in (1.0, 2.0, 3.0):
        whole = torch.empty_like(x)
        _block(x, t.expand_as(x).contiguous(), p, whole, [torch.empty_like(x) for _ in range(4)])
        blocks = torch.empty_like(x)
        _threshold_blocks(x, t, p, blocks)
        assert torch.equal(whole.view(torch.int32), blocks.view(torch.int32))
        assert torch.equal(blocks.reshape(w.shape), nm_threshold(w, pattern, p=p))


def test_pooled_scratch_reuses_per_size_and_stays_bounded() -> None:
    a = pooled_scratch(64, torch.float32, torch.device("cpu"), 5)
    b = pooled_scratch(64, torch.float32, torch.device("cpu"), 5)
    assert len(a) == 5 and all(x is y for x, y in zip(a, b))  # the same buffers again
    c = pooled_scratch(64, torch.float64, torch.device("cpu"), 5)
    assert c[0].dtype == torch.float64 and c[0] is not a[0]
    for n in range(100, 120):  # many sizes: the pool is cleared, not grown
        pooled_scratch(n, torch.float32, torch.device("cpu"), 1)
    assert len(_POOL.buffers) <= 8
    d = pooled_scratch(64, torch.float32, torch.device("meta"), 2)  # off the CPU: fresh
    assert d[0].device.type == "meta"


def test_when_compiling_the_forward_is_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torch.compile (and on GPUs) one whole-tensor pass, no CPU pool, the same bits."""
    import feather_sparse.nm.operator as operator

    w = torch.randn(300, 256, generator=torch.Generator().manual_seed(5))
    pattern = NMPattern(2, 4)
    x, t = group_view(w, pattern), group_thresholds(w, pattern)
    blocked = torch.empty_like(x)
    _threshold_blocks(x, t, 3.0, blocked)

    def refuse(*args: object) -> None:
        raise AssertionError("the CPU pool was used")

    monkeypatch.setattr(operator, "pooled_scratch", refuse)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    whole = torch.empty_like(x)
    _threshold_blocks(x, t, 3.0, whole)
    assert torch.equal(whole.view(torch.int32), blocked.view(torch.int32))
