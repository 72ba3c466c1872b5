"""The fused N:M forward of small layers: same bits, never stale, off where it must be."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs
from feather_sparse.nm import fused, nm_threshold
from feather_sparse.nm.fused import FusedNMForward, same_bits

DEFAULT_MAX = fused.FUSE_MAX_NUMEL  # as shipped, read before any test patches it


def mlp(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Small Linear layers whose sizes are multiples of 64 (no scalar tails)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(16, 32),
        nn.ReLU(),
        nn.Linear(32, 32),
        nn.ReLU(),
        nn.Linear(32, 8),
    ).to(dtype)


def data(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(4, 16, generator=gen), torch.randint(0, 8, (4,), generator=gen))
        for _ in range(n)
    ]


def pruner(model: nn.Module, fuse: bool, monkeypatch: pytest.MonkeyPatch, **kwargs) -> fs.Pruner:
    """A Pruner with the fused path and the cache of layers computed alone on, or neither."""
    monkeypatch.setattr(fused, "FUSE_MAX_NUMEL", DEFAULT_MAX if fuse else 0)
    monkeypatch.setattr(fused, "CACHE_ALONE", fuse)
    pr = fs.Pruner(model, **{"pattern": "2:4", **kwargs})
    assert (pr.backbone._fused is not None) == fuse
    return pr


def count_passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    original = FusedNMForward._compute

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FusedNMForward, "_compute", counted)
    return calls


def fit(
    model: nn.Module, pr: fs.Pruner, opt: torch.optim.Optimizer, batches: list, accumulate: int = 1
) -> None:
    for x, y in batches:
        opt.zero_grad()
        for part in range(accumulate):  # gradient accumulation: several forwards per step
            F.cross_entropy(model(x[part::accumulate]), y[part::accumulate]).backward()
        opt.step()
        pr.step()


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train(model: nn.Module, pr: fs.Pruner, steps: int, accumulate: int = 1) -> list[torch.Tensor]:
    fit(model, pr, sgd(model), data(steps), accumulate)
    return [t.weight.detach().clone() for t in pr.targets]


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"theta": 0.5},
        {"operator": "soft"},
        {"operator": "hard"},
        {"pattern": "1:4", "theta": 0.0},
        {"schedule": "cubic", "total_steps": 8},  # ramp < 1: thresholds scaled per layer
    ],
    ids=["feather", "theta", "soft", "hard", "1:4", "ramp"],
)
def test_fused_training_equals_layer_by_layer_bit_for_bit(
    kwargs: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = []
    for fuse in (False, True):
        model = mlp()
        pr = pruner(model, fuse, monkeypatch, **kwargs)
        runs.append(train(model, pr, 6))
    for a, b in zip(*runs):
        assert same_bits(a, b)


@pytest.mark.parametrize("method", ["sr-ste", "s-ste"])
def test_fused_methods_equal_layer_by_layer(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """SR-STE's decay in the backward and S-STE's fixed β in the forward, fused or not."""
    runs = []
    for fuse in (False, True):
        model = mlp()
        monkeypatch.setattr(fused, "FUSE_MAX_NUMEL", DEFAULT_MAX if fuse else 0)
        monkeypatch.setattr(fused, "CACHE_ALONE", fuse)
        pr = fs.make_pruner(model, method, total_steps=6)
        assert (pr.backbone._fused is not None) == fuse
        runs.append(train(model, pr, 6))
    for a, b in zip(*runs):
        assert same_bits(a, b)


@pytest.mark.parametrize("theta", [0.5, 1.0])
def test_gradient_accumulation_reuses_one_pass(
    theta: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = mlp()
    pr = pruner(model, True, monkeypatch, theta=theta)
    model(torch.randn(2, 16))  # one pass for the current weights
    calls = count_passes(monkeypatch)
    fused_weights = train(model, pr, 3, accumulate=2)
    # the first step's forwards reuse that pass; each later step makes one for
    # its new weights, shared by both micro-batches
    assert calls[0] == 2
    reference = mlp()
    ref_pr = pruner(reference, False, monkeypatch, theta=theta)
    reference(torch.randn(2, 16))
    for a, b in zip(fused_weights, train(reference, ref_pr, 3, accumulate=2)):
        assert same_bits(a, b)


def test_plain_straight_through_takes_no_python_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """θ = 1 without decay or rescale: the cached forward is joined to the weight's
    gradient by built-in autograd nodes (no Python Function), with the same values and
    gradients as the layer-by-layer Function; θ < 1 keeps the Function."""
    x, y = torch.randn(4, 16), torch.tensor([0, 1, 2, 3])
    grads, outs = [], []
    for fuse in (False, True):
        model = mlp()
        pruner(model, fuse, monkeypatch)
        model(x)  # the first forward registers the ramps; the next ones use the pass
        out = model[2].weight
        assert (type(out.grad_fn).__name__ == "AddBackward0") == fuse
        F.cross_entropy(model(x), y).backward()
        outs.append(out.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
    assert same_bits(outs[0], outs[1])
    for a, b in zip(*grads):
        assert same_bits(a, b)
    model = mlp()
    pruner(model, True, monkeypatch, theta=0.5)
    model(x)
    assert type(model[2].weight.grad_fn).__name__ != "AddBackward0"


def test_large_layer_cached_alone_keeps_the_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer outside the fused pass, served from its own cache (repeated forwards),
    gets a view of the cache through the Function: no weight-sized join per forward."""
    monkeypatch.setattr(fused, "FUSE_MAX_NUMEL", 600)  # the 32×32 layer is "large" now
    monkeypatch.setattr(fused, "CACHE_ALONE", True)
    model = mlp()
    pr = fs.Pruner(model, pattern="2:4")
    x = torch.randn(2, 16)
    model(x)
    model(x)  # a repeat: the large layer is cached alone from now on
    weight = model[2].weight
    entry = pr.backbone._fused._entries[1]
    assert pr.backbone._fused.eligible[1] is False
    assert type(weight.grad_fn).__name__ != "AddBackward0"
    assert weight.data_ptr() == entry.out.data_ptr()  # a view of the cached forward
    assert type(model[0].weight.grad_fn).__name__ == "AddBackward0"  # a small, fused layer


def test_torch_func_grad_matches_autograd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torch.func transforms the layers take the plain path (wrapped weights have no
    storage to compare or cache), and the gradients are autograd's, bit for bit."""
    model = mlp()
    pruner(model, True, monkeypatch)
    x, y = torch.randn(4, 16), torch.tensor([0, 1, 2, 3])
    model(x)
    model(x)  # the cache holds every layer's forward now
    params = dict(model.named_parameters())

    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(torch.func.functional_call(model, p, (x,)), y)

    grads = torch.func.grad(loss)(params)
    F.cross_entropy(model(x), y).backward()
    for name, param in params.items():
        assert same_bits(grads[name], param.grad), name


def test_same_bits_of_tensors_without_storage() -> None:
    """A wrapper without storage (a torch.func tensor) is compared by torch.equal, not memcmp."""
    seen: list[bool] = []

    def f(w: torch.Tensor) -> torch.Tensor:
        with pytest.raises(RuntimeError, match="storage"):
            w.data_ptr()
        seen.extend([same_bits(w, w), same_bits(w, w * 2)])
        return w.sum()

    torch.func.grad(f)(torch.randn(4, 4))
    assert seen == [True, False]


def test_cached_forward_without_grad_is_a_fresh_view(monkeypatch: pytest.MonkeyPatch) -> None:
    model = mlp()
    pr = pruner(model, True, monkeypatch)
    model(torch.randn(2, 16))
    with torch.no_grad():
        a, b = model[2].weight, model[2].weight
    entry = pr.backbone._fused._entries[1]
    assert a is not entry.out and b is not a
    assert a.data_ptr() == entry.out.data_ptr() and a.grad_fn is None
    assert same_bits(a, nm_threshold(pr.targets[1].weight.detach(), "2:4"))


@pytest.mark.parametrize(
    "ramps", [(1.0, 0.5, 0.25), (0.75, 0.75, 0.75), (0.0, -0.0, 0.0)], ids=["apart", "one", "zeros"]
)
def test_fused_pass_with_a_ramp_per_layer(ramps: tuple[float, ...]) -> None:
    """Layers whose ramps differ (or only in the sign of zero) get their own ramp's bits."""
    gen = torch.Generator().manual_seed(3)
    weights = [torch.randn(8, 16, generator=gen) for _ in ramps]
    buffers = [torch.tensor(r) for r in ramps]
    cache = FusedNMForward(fs.NMPattern(2, 4), [True] * len(ramps))
    for i, (w, r) in enumerate(zip(weights, buffers)):
        assert cache.get(i, w, r, 3.0, lambda: weights, None) is None  # registers the ramps
    for i, (w, r) in enumerate(zip(weights, buffers)):
        got = cache.get(i, w, r, 3.0, lambda: weights, None)
        assert got is not None
        assert same_bits(got[0], nm_threshold(w, "2:4", r))


def test_edit_through_data_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """``.data`` edits bypass the version counter: the bit comparison still catches them."""
    model = mlp()
    pr = pruner(model, True, monkeypatch)
    x = torch.randn(3, 16)
    model(x)
    before = model(x)
    w = pr.targets[1].weight
    version = w._version
    w.data.mul_(-2.0)
    assert w._version == version  # invisible to the version counter
    expected = nm_threshold(w.detach(), "2:4")
    assert torch.equal(model[2].weight, expected)
    assert not torch.equal(model(x), before)


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("how", ["module.weight", "dense_state_dict", "fine-tuned copy"])
def test_editing_a_forward_handed_out_does_not_change_the_next(
    monkeypatch: pytest.MonkeyPatch, how: str, fuse: bool
) -> None:
    """The cached ``P_T(w)`` reaches callers as views: an in-place edit of one is not reused."""
    model = mlp()
    pr = pruner(model, fuse, monkeypatch)
    x = torch.randn(3, 16)
    model(x)
    model(x)  # a layer computed alone is cached from its second forward on
    expected = model(x).detach().clone()
    with torch.no_grad():
        if how == "module.weight":
            model[2].weight.mul_(0.0)
        elif how == "dense_state_dict":
            pr.dense_state_dict(pruned=True)["2.weight"].add_(1.0)
        else:
            copy_ = mlp()
            copy_.load_state_dict(pr.dense_state_dict(pruned=True), assign=True)
            for name, param in copy_.named_parameters():
                if name.endswith("weight"):  # (biases are the model's own, as in any state_dict)
                    param.add_(1.0)  # what an optimizer step on the copy does
    assert torch.equal(model(x), expected)


def test_load_state_dict_and_ramp_writes_recompute(monkeypatch: pytest.MonkeyPatch) -> None:
    model = mlp()
    pr = pruner(model, True, monkeypatch, schedule="cubic", total_steps=10)
    model(torch.randn(2, 16))
    other = mlp(seed=5)
    with torch.no_grad():
        for t, o in zip(pr.targets, [other[0], other[2], other[4]]):
            t.weight.copy_(o.weight)
    for _ in range(3):
        pr.step()  # the ramp buffers are written in place
    ramp = pr.thresholds()[0]
    for t, layer in zip(pr.targets, [model[0], model[2], model[4]]):
        assert same_bits(layer.weight, nm_threshold(t.weight.detach(), "2:4", ramp))


def test_large_layers_inference_mode_and_compile_take_the_plain_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = mlp()
    pr = pruner(model, True, monkeypatch)
    model(torch.randn(2, 16))
    calls = count_passes(monkeypatch)
    with torch.no_grad():
        for t in pr.targets:
            t.weight.add_(0.01)
    with torch.inference_mode():
        out = model(torch.randn(2, 16))
    assert calls[0] == 0 and out.is_inference()
    # training right after an inference-mode forward: no inference tensor is reused
    F.cross_entropy(model(torch.randn(2, 16)), torch.tensor([0, 1])).backward()
    assert calls[0] == 1
    monkeypatch.setattr(fused, "FUSE_MAX_NUMEL", 600)  # the 32×32 layer is "large" now
    monkeypatch.setattr(fused, "CACHE_ALONE", False)
    other = mlp()
    big = fs.Pruner(other, pattern="2:4")
    assert big.backbone._fused is not None
    assert big.backbone._fused.eligible == [True, False, True]
    other(torch.randn(2, 16))
    other(torch.randn(2, 16))
    assert sorted(big.backbone._fused._entries) == [0, 2]
    for t, layer in zip(big.targets, [other[0], other[2], other[4]]):
        assert same_bits(layer.weight, nm_threshold(t.weight.detach(), "2:4"))


def test_mixed_dtypes_are_fused_separately(monkeypatch: pytest.MonkeyPatch) -> None:
    model = mlp()
    model[2].to(torch.float64)
    model[4].to(torch.float64)

    class Cast(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.inner[0](x)).double()
            return self.inner[4](torch.relu(self.inner[2](h)))

    wrapped = Cast(model)
    pr = pruner(wrapped, True, monkeypatch)
    wrapped(torch.randn(2, 16))
    out = wrapped(torch.randn(2, 16))
    assert out.dtype == torch.float64
    for t, layer in zip(pr.targets, [model[0], model[2], model[4]]):
        assert same_bits(layer.weight, nm_threshold(t.weight.detach(), "2:4"))


def test_finalize_releases_the_cache_and_keeps_the_pattern(monkeypatch: pytest.MonkeyPatch) -> None:
    model = mlp()
    pr = pruner(model, True, monkeypatch)
    train(model, pr, 2)
    cache = pr.backbone._fused
    assert cache is not None and cache._entries
    model(torch.randn(2, 16))  # the fused pass: the pruned weights are views of one buffer
    pruned = {k: v.clone() for k, v in pr.dense_state_dict(pruned=True).items()}
    pr.finalize()
    assert not cache._entries
    for i, layer in enumerate((model[0], model[2], model[4])):
        counts = (layer.weight.reshape(-1, 4) != 0).sum(1)
        assert int(counts.max()) <= 2
        # a storage of its own (torch.save of one layer writes that layer), same values
        weight = layer.weight
        assert weight.untyped_storage().nbytes() == weight.numel() * weight.element_size()
        assert same_bits(weight, pruned[f"{2 * i}.weight"])
    ptrs = {layer.weight.untyped_storage().data_ptr() for layer in (model[0], model[2], model[4])}
    assert len(ptrs) == 3


def test_same_bits_tells_nan_and_signed_zero_apart() -> None:
    a = torch.tensor([0.0, 1.0, math.nan])
    assert same_bits(a, a.clone())
    assert not same_bits(a, torch.tensor([-0.0, 1.0, math.nan]))
    assert not same_bits(a, torch.tensor([0.0, 1.0, 2.0]))
    assert same_bits(a.half(), a.half().clone())


def _reference_same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality element by element, independent of ``same_bits``'s two paths."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    width = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[a.element_size()]
    x, y = a.contiguous().view(width).reshape(-1), b.contiguous().view(width).reshape(-1)
    return all(int(u) == int(v) for u, v in zip(x, y))


def _bit_pairs() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    base = torch.tensor([[0.0, 1.5, math.nan, -2.0], [3.0, -0.0, math.inf, 7.0]])
    other_nan = base.clone()
    other_nan.view(torch.int32)[0, 2] += 1  # another NaN payload: a different bit pattern
    big = torch.randn(4, 256)
    shifted = torch.randn(2, 512)
    return [
        ("equal", base, base.clone()),
        ("signed zero", base, torch.where(base == 0, -base, base)),
        ("nan payload", base, other_nan),
        ("last value", base, base + torch.tensor([[0.0] * 4, [0.0, 0.0, 0.0, 1.0]])),
        ("transposed equal", big.t(), big.clone().t()),
        ("transposed vs contiguous", big.t(), big.t().contiguous()),
        ("offset views", shifted[1], shifted[1].clone()),
        ("offset views differ", shifted[0], shifted[1]),
        ("dtypes", base, base.double()),
        ("shapes", base, base.reshape(4, 2)),
        ("empty", torch.empty(0, 4), torch.empty(0, 4)),
        ("half", base.half(), base.half().clone()),
        ("bfloat16 differs", base.bfloat16(), (base * 2).bfloat16()),
        ("int", torch.arange(6), torch.arange(6)),
        ("bool", torch.tensor([True, False]), torch.tensor([True, True])),
    ]


@pytest.mark.parametrize("memcmp", [True, False], ids=["memcmp", "torch.equal"])
@pytest.mark.parametrize("case", _bit_pairs(), ids=lambda c: c[0])
def test_same_bits_agrees_with_an_element_by_element_comparison(
    case: tuple[str, torch.Tensor, torch.Tensor], memcmp: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both paths (bytes through memcmp; integer views through torch.equal) give
    the answer of a plain element-by-element comparison of the bits."""
    if memcmp and fused._MEMCMP is None:
        pytest.skip("no C library memcmp on this platform")
    if not memcmp:
        monkeypatch.setattr(fused, "_MEMCMP", None)
    _, a, b = case
    assert same_bits(a, b) == _reference_same_bits(a, b)
    assert same_bits(b, a) == _reference_same_bits(b, a)


def test_same_bits_compares_bytes_where_it_can() -> None:
    """Contiguous CPU tensors take the memcmp path (the fast one the cache relies on)."""
    if fused._MEMCMP is None:
        pytest.skip("no C library memcmp on this platform")
    calls = []
    real = fused._MEMCMP

    def spy(x: int, y: int, n: int) -> int:
        calls.append(n)
        return real(x, y, n)

    a = torch.randn(8, 4)
    saved, fused._MEMCMP = fused._MEMCMP, spy
    try:
        assert same_bits(a, a.clone())
        assert same_bits(a.t(), a.t().contiguous())  # not contiguous: torch.equal
    finally:
        fused._MEMCMP = saved
    assert calls == [a.numel() * 4]


def test_resume_from_state_dict_with_fusion(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bit-exact resume still holds when the forwards are fused."""
    model = mlp()
    pr = pruner(model, True, monkeypatch, theta=0.5)
    opt = sgd(model)
    batches = data(6)
    fit(model, pr, opt, batches[:3])
    saved = copy.deepcopy((model.state_dict(), pr.state_dict(), opt.state_dict()))
    fit(model, pr, opt, batches[3:])
    resumed = mlp(seed=9)
    pr2 = pruner(resumed, True, monkeypatch, theta=0.5)
    opt2 = sgd(resumed)
    resumed.load_state_dict(saved[0])
    pr2.load_state_dict(saved[1])
    opt2.load_state_dict(saved[2])
    fit(resumed, pr2, opt2, batches[3:])
    for a, b in zip(pr.targets, pr2.targets):
        assert same_bits(a.weight.detach(), b.weight.detach())


def test_a_copied_model_leaves_the_cache_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pickling and ``copy.deepcopy`` drop the cache; the copy builds its own."""
    model = mlp()
    pr = pruner(model, True, monkeypatch)
    x = torch.randn(3, 16)
    expected = model(x)
    cache = pr.backbone._fused
    assert cache is not None and cache._entries
    assert not pickle.loads(pickle.dumps(cache))._entries
    twin = copy.deepcopy(model)
    twin_cache = twin[0].parametrizations.weight[0].backbone._fused
    assert twin_cache is not None and twin_cache is not cache
    assert torch.equal(twin(x), expected)  # layer by layer: registers the copy's layers
    assert torch.equal(twin(x), expected)  # fused, from the copy's own weights
    ours = {e.out.untyped_storage().data_ptr() for e in cache._entries.values()}
    theirs = {e.out.untyped_storage().data_ptr() for e in twin_cache._entries.values()}
    assert theirs and not ours & theirs


def test_bfloat16_weights_and_autocast_fused_equal_layer_by_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Half weights are computed in float32 and rounded once, fused or not; autocast too."""
    runs = []
    for fuse in (False, True):
        model = mlp(dtype=torch.bfloat16)
        pr = pruner(model, fuse, monkeypatch, theta=0.5)
        opt = sgd(model)
        for x, y in data(4):
            opt.zero_grad()
            F.cross_entropy(model(x.bfloat16()).float(), y).backward()
            opt.step()
            pr.step()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(torch.randn(2, 16, generator=torch.Generator().manual_seed(3)).bfloat16())
        runs.append(([t.weight.detach().clone() for t in pr.targets], out))
        pr.finalize()
        for layer in (model[0], model[2], model[4]):
            assert layer.weight.dtype == torch.bfloat16
            assert int((layer.weight.reshape(-1, 4) != 0).sum(1).max()) <= 2
    (a, out_a), (b, out_b) = runs
    assert all(same_bits(x, y) for x, y in zip(a, b))
    assert same_bits(out_a, out_b)


def test_autocast_training_fused_equals_layer_by_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 weights under bfloat16 autocast (AMP on CPU): same bits either way."""
    runs = []
    for fuse in (False, True):
        model = mlp()
        pr = pruner(model, fuse, monkeypatch)
        opt = sgd(model)
        for x, y in data(4):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            pr.step()
        runs.append([t.weight.detach().clone() for t in pr.targets])
    assert all(same_bits(x, y) for x, y in zip(*runs))


# ------------------------------------------------------- layers computed alone
def alone_pruner(
    model: nn.Module, monkeypatch: pytest.MonkeyPatch, method: str | None = None, **kwargs
) -> fs.Pruner:
    """Every layer computed alone (nothing fused), with the repeat-triggered cache on."""
    monkeypatch.setattr(fused, "FUSE_MAX_NUMEL", 0)
    monkeypatch.setattr(fused, "CACHE_ALONE", True)
    if method is not None:
        return fs.make_pruner(model, method, total_steps=6)
    return fs.Pruner(model, **{"pattern": "2:4", **kwargs})


def count_computations(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Calls of the N:M forward: ``plain`` (layer by layer) and ``cached`` (stored alone)."""
    from feather_sparse.nm import operator

    calls = {"plain": 0, "cached": 0}

    def counted(key: str, original):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls[key] += 1
            return original(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(operator, "_nm_forward", counted("plain", operator._nm_forward))
    monkeypatch.setattr(fused, "_nm_forward", counted("cached", fused._nm_forward))
    return calls


@pytest.mark.parametrize(
    ("method", "kwargs"),
    [(None, {}), (None, {"theta": 0.5}), ("sr-ste", {}), ("s-ste", {})],
    ids=["feather", "theta", "sr-ste", "s-ste"],
)
def test_accumulation_caches_layers_computed_alone_bit_for_bit(
    method: str | None, kwargs: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 4 micro-batches a step, a layer computed alone is computed once a step
    and its other forwards are served from the cache; training gives the uncached
    run's bits."""
    model = mlp()
    pr = alone_pruner(model, monkeypatch, method, **kwargs)
    assert pr.backbone._fused is not None and not any(pr.backbone._fused.eligible)
    calls = count_computations(monkeypatch)
    cached = train(model, pr, 3, accumulate=4)
    layers = len(pr.targets)
    # one computation per layer and step (uncached: one per micro-batch, 12);
    # the Pruner's attach already read the weights, so the first forward repeats
    assert calls == {"plain": 0, "cached": 3 * layers}
    reference = mlp()
    monkeypatch.setattr(fused, "CACHE_ALONE", False)
    ref_pr = (
        fs.make_pruner(reference, method, total_steps=6)
        if method
        else pruner(reference, False, monkeypatch, **kwargs)
    )
    assert ref_pr.backbone._fused is None
    for a, b in zip(cached, train(reference, ref_pr, 3, accumulate=4)):
        assert same_bits(a, b)


def test_one_forward_per_update_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    model = mlp()
    pr = alone_pruner(model, monkeypatch)
    calls = count_computations(monkeypatch)
    train(model, pr, 4)
    # the first forward repeats the read made when the Pruner attached and is
    # cached; unused before the update, that entry is dropped, and every later
    # forward computes its layer without keeping it
    assert calls == {"plain": 3 * 3, "cached": 3}
    assert pr.backbone._fused._entries == {}


def test_evaluation_batches_cache_then_training_drops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Evaluation forwards between updates are served from the cache; once the
    forwards are one per update again, the entry goes (never used again before the
    weight changed) and with it the memory it held."""
    model = mlp()
    pr = alone_pruner(model, monkeypatch)
    batches = data(3)
    opt = sgd(model)
    fit(model, pr, opt, batches[:1])
    calls = count_computations(monkeypatch)
    with torch.no_grad():
        outs = [model(torch.randn(4, 16)) for _ in range(3)]  # plain, cached, hit
    assert calls == {"plain": 3, "cached": 3} and all(o.shape == (4, 8) for o in outs)
    fit(model, pr, opt, batches[1:2])  # its forward is a hit: nothing changed since
    assert calls == {"plain": 3, "cached": 3}
    fit(model, pr, opt, batches[2:3])  # new weights, entry used before: recomputed, kept
    assert calls == {"plain": 3, "cached": 6} and len(pr.backbone._fused._entries) == 3
    fit(model, pr, opt, batches[:1])  # new weights, entry unused since: dropped, plain
    assert calls == {"plain": 6, "cached": 6} and pr.backbone._fused._entries == {}
    for t, layer in zip(pr.targets, [model[0], model[2], model[4]]):
        assert same_bits(layer.weight, nm_threshold(t.weight.detach(), "2:4"))


def test_cached_alone_sees_an_edit_through_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """A repeat is recognised by the version counter, which ``.data`` edits do not
    move; validity is still decided by the bits."""
    model = mlp()
    pr = alone_pruner(model, monkeypatch)
    x = torch.randn(3, 16)
    model(x)
    before = model(x)  # repeated: cached
    assert len(pr.backbone._fused._entries) == 3
    w = pr.targets[1].weight
    version = w._version
    w.data.mul_(-2.0)
    assert w._version == version
    assert same_bits(model[2].weight, nm_threshold(w.detach(), "2:4"))
    assert not torch.equal(model(x), before)


def test_pickled_cache_from_before_layers_were_cached_alone() -> None:
    """A FusedNMForward pickled without the fields this cache added still loads."""
    state = {"pattern": fs.NMPattern(2, 4), "eligible": [True, True], "_ramps": {}, "_entries": {}}
    restored = FusedNMForward.__new__(FusedNMForward)
    restored.__setstate__(state)
    assert restored.alone is False and restored._seen == {}


def test_a_parametrization_called_on_another_tensor_computes_that_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fused pass computes the stored weights; a direct call with another tensor
    (a candidate weight, say) gets that tensor's ``P_T``, not the stored weight's."""
    model = mlp()
    pr = pruner(model, True, monkeypatch)
    x = torch.randn(2, 16)
    model(x)
    model(x)  # the second forward takes the fused pass
    param = pr._parametrization(pr.targets[0])
    other = torch.randn_like(model[0].parametrizations.weight.original)
    with torch.no_grad():
        assert torch.equal(param(other), nm_threshold(other, "2:4"))
        stored = model[0].parametrizations.weight.original
        assert torch.equal(param(stored), nm_threshold(stored, "2:4"))


def test_a_layer_computed_alone_compares_its_weight_in_logical_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A layer computed alone keeps a copy of its weight with the weight's own strides; a
    contiguous weight later put in its place is compared value by value, never against
    the copy's memory in storage order (which would take a transposed weight for the same)."""
    monkeypatch.setattr(fused, "FUSE_MAX_NUMEL", 0)  # every layer alone
    torch.manual_seed(0)
    layer = nn.Linear(16, 16, bias=False)
    layer.weight = nn.Parameter(torch.randn(16, 16).t())  # stored (in, out): not contiguous
    fs.Pruner(layer, pattern="2:4")
    x = torch.randn(3, 16)
    with torch.no_grad():
        layer(x)
        layer(x)  # a repeat before the weight changed: the forward is cached alone
        w = layer.parametrizations.weight.original
        copy = w.detach().clone()
        assert not copy.is_contiguous()
        # the copy's memory read in row-major order: the same bytes, other values
        same_bytes = torch.as_strided(copy, copy.shape, (copy.shape[1], 1)).clone()
        assert not torch.equal(same_bytes, copy)
        w.data = same_bytes
        assert torch.equal(layer.weight, nm_threshold(same_bytes, "2:4"))
