"""``Pruner.swapped()``: a step's forwards and backwards on ``P_T(w)`` written into the
stored weights give the usual step's bits, and misuse is refused with the weights intact."""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tests._helpers import tiny_config, tiny_run
from torch import nn

import feather_sparse as fs
from feather_sparse import swap
from feather_sparse.train import train


def net(seed: int = 0) -> nn.Module:
    """Conv, Linear and a tied pair: every layer kind the Pruner swaps."""
    torch.manual_seed(seed)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(4, 8, 4)
            self.fc = nn.Linear(80, 16)
            self.head = nn.Linear(16, 16, bias=False)
            self.tail = nn.Linear(16, 16, bias=False)
            self.tail.weight = self.head.weight  # tied

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = F.relu(self.fc(F.relu(self.conv(x)).flatten(1)))
            return self.tail(F.relu(self.head(h)))

    return Net()


PRUNERS: dict[str, Callable[[nn.Module], fs.Pruner]] = {
    "feather 90 %": lambda m: fs.Pruner(m, sparsity=0.9, total_steps=6),
    "hard 80 %, ramped": lambda m: fs.make_pruner(m, "hard", sparsity=0.8, total_steps=6),
    "soft, uniform": lambda m: fs.Pruner(
        m, sparsity=0.7, total_steps=6, operator="soft", backbone="uniform"
    ),
    "2:4": lambda m: fs.Pruner(m, pattern="2:4"),
    "4:8": lambda m: fs.Pruner(m, pattern="4:8"),
    "2:4 hard": lambda m: fs.Pruner(m, pattern="2:4", p=math.inf),
    "s-ste": lambda m: fs.make_pruner(m, "s-ste", pattern="2:4"),
}

#: Settings whose backward is not the identity: the block runs the usual step.
USUAL: dict[str, Callable[[nn.Module], fs.Pruner]] = {
    "feather θ=0.5": lambda m: fs.Pruner(m, sparsity=0.9, total_steps=6, theta=0.5),
    "2:4 θ=0.5": lambda m: fs.Pruner(m, pattern="2:4", theta=0.5),
    "sr-ste": lambda m: fs.make_pruner(m, "sr-ste", pattern="2:4"),
    "nonste": lambda m: fs.make_pruner(m, "nonste", sparsity=0.9, total_steps=6),
    "st3": lambda m: fs.make_pruner(m, "st3", sparsity=0.9, total_steps=6),
    "spartan": lambda m: fs.make_pruner(m, "spartan", sparsity=0.9, total_steps=6),
    "asl+": lambda m: fs.Pruner(m, sparsity=0.9, total_steps=6, backbone="asl+"),
    "one-shot 2:4 (θ = 0)": lambda m: fs.make_pruner(m, "oneshot-nm", pattern="2:4", total_steps=6),
}


def run(make: Callable[[nn.Module], fs.Pruner], swapped: bool) -> tuple[dict, list[bool]]:
    """Six steps of SGD with momentum, two micro-batches each; the dense state and what
    each block yielded."""
    model = net()
    pruner = make(model)
    opt = torch.optim.SGD([*model.parameters(), *pruner.parameters()], lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    yielded = []
    for _ in range(6):
        opt.zero_grad()
        x, y = torch.randn(8, 4, 13, generator=gen), torch.randn(8, 16, generator=gen)
        with pruner.swapped() if swapped else contextlib.nullcontext(False) as on:
            yielded.append(on)
            for xs, ys in zip(x.chunk(2), y.chunk(2)):
                loss = F.mse_loss(model(xs), ys) + pruner.regularizer()
                loss.backward()
        opt.step()
        pruner.step()
    return pruner.dense_state_dict(), yielded


def snapshot(pruner: fs.Pruner, **kwargs: Any) -> dict[str, torch.Tensor]:
    """``dense_state_dict`` copied: its tensors share the live weights' memory."""
    return {k: v.clone() for k, v in pruner.dense_state_dict(**kwargs).items()}


def assert_same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


@pytest.mark.parametrize(
    ("name", "swaps"), [*((name, True) for name in PRUNERS), *((name, False) for name in USUAL)]
)
def test_blocks_train_the_usual_bits_and_swap_where_the_backward_is_the_identity(
    name: str, swaps: bool
) -> None:
    make = {**PRUNERS, **USUAL}[name]
    usual, _ = run(make, swapped=False)
    swapped, yielded = run(make, swapped=True)
    assert yielded == [swaps] * 6  # elsewhere the block runs the usual step
    assert_same_bits(swapped, usual)
    assert (swap.swap_refusal(make(net())) is None) == swaps


def test_inside_the_block_the_stored_weights_are_the_forward_weights() -> None:
    model = net()
    pruner = fs.Pruner(model, pattern="2:4")
    dense = snapshot(pruner)
    pruned = snapshot(pruner, pruned=True)
    x = torch.randn(2, 4, 13)
    with torch.no_grad():
        expected = model(x)
    stored = pruner.weights()
    memory = [w.data_ptr() for w in stored]
    with pruner.swapped() as on:
        assert on
        for t, w in zip(pruner.targets, pruner.weights()):
            assert torch.equal(w, pruned[f"{t.name}.weight"])
        # the same Parameters, holding P_T(w) in memory of its own: the dense values untouched
        assert all(a is b for a, b in zip(pruner.weights(), stored))
        assert not any(w.data_ptr() == m for w, m in zip(stored, memory))
        with torch.no_grad():
            assert torch.equal(model(x), expected)  # the layers meet the same weights
    for t, w in zip(pruner.targets, pruner.weights()):
        assert torch.equal(w, dense[f"{t.name}.weight"])  # the dense weights, bit for bit
    assert [w.data_ptr() for w in pruner.weights()] == memory  # their own memory, not a copy
    with torch.no_grad():
        assert torch.equal(model(x), expected)  # and the usual forward again


def test_inside_the_block_layers_read_their_stored_weight_directly() -> None:
    """The block lets each swapped layer read ``weight`` from its own dictionary instead of
    through parametrize's property; the model's names, a copy sharing the layers' classes
    and everything after the block are as before."""
    model = net()
    pruner = fs.Pruner(model, pattern="2:4")
    teacher = copy.deepcopy(model)  # shares the parametrized classes of model's layers
    x = torch.randn(2, 4, 13)
    with torch.no_grad():
        expected_teacher = teacher(x)
    keys = list(model.state_dict())
    names = [n for n, _ in model.named_parameters()]
    with pruner.swapped():
        for layer, stored in zip((model.conv, model.fc, model.head, model.tail), (0, 1, 2, 2)):
            assert "weight" in vars(layer)
            assert layer.weight is pruner.weights()[stored]  # the tied layer too
        assert list(model.state_dict()) == keys
        assert [n for n, _ in model.named_parameters()] == names
        with torch.no_grad():
            assert torch.equal(teacher(x), expected_teacher)  # its usual forward
    for layer in (model.conv, model.fc, model.head, model.tail):
        assert "weight" not in vars(layer)
        assert isinstance(type(layer).__dict__["weight"], property)
    with torch.no_grad():
        assert torch.equal(teacher(x), expected_teacher)


def test_a_layer_with_another_parametrization_reads_through_the_pass_through() -> None:
    """A layer whose weight carries a parametrization after the Pruner's keeps reading
    through parametrize inside the block: the Pruner's passes the stored weight on."""

    class Doubled(nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return 2 * w

    model = net()
    pruner = fs.Pruner(model, sparsity=0.5, total_steps=1, schedule="constant")
    torch.nn.utils.parametrize.register_parametrization(model.fc, "weight", Doubled())
    x = torch.randn(2, 4, 13)
    with torch.no_grad():
        expected = model(x)
    with pruner.swapped() as on:
        assert on and "weight" not in vars(model.fc) and "weight" in vars(model.conv)
        with torch.no_grad():
            assert torch.equal(model(x), expected)


def test_an_optimizer_step_inside_the_block_is_refused_and_the_weights_kept() -> None:
    model = net()
    pruner = fs.Pruner(model, sparsity=0.9, total_steps=6)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = snapshot(pruner)
    refused = pytest.raises(RuntimeError, match=r"'fc'.*written inside the block.*optimizer\.step")
    with refused, pruner.swapped():
        model(torch.randn(2, 4, 13)).sum().backward()
        opt.step()
    after = pruner.dense_state_dict()
    for key in ("conv.weight", "fc.weight", "head.weight"):
        assert torch.equal(after[key], before[key])
    pruner.step()  # usable again


@pytest.mark.parametrize("make", [PRUNERS["2:4"], PRUNERS["feather 90 %"]], ids=["2:4", "feather"])
@pytest.mark.parametrize("fails", [False, True], ids=["refused", "error after the write"])
def test_a_write_inside_the_block_leaves_no_stale_forward_behind(
    make: Callable[[nn.Module], fs.Pruner], fails: bool
) -> None:
    """The block's P_T(w) may be memory a cache hands out again (the N:M fused pass):
    a write into it inside the block must not reach a later forward."""
    model = net()
    pruner = make(model)
    x = torch.randn(2, 4, 13)
    with torch.no_grad():
        model(x)  # the first forward registers the layers with the fused pass
        expected = model(x)
    error = "boom" if fails else "written inside the block"
    with pytest.raises(RuntimeError, match=error), pruner.swapped():
        with torch.no_grad():
            for w in pruner.weights():
                w.add_(1.0)
        if fails:
            raise RuntimeError("boom")
    with torch.no_grad():
        assert torch.equal(model(x), expected)


def test_an_error_inside_the_block_propagates_with_the_dense_weights_back() -> None:
    model = net()
    pruner = fs.Pruner(model, pattern="2:4")
    before = [w.clone() for w in pruner.weights()]
    with pytest.raises(ValueError, match="boom"), pruner.swapped():
        model(torch.randn(2, 4, 13)).sum().backward()
        raise ValueError("boom")
    assert all(torch.equal(a, b) for a, b in zip(pruner.weights(), before))
    assert not any(pruner._parametrization(t).passthrough for t in pruner.targets)
    pruner.step()


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.step(),
        lambda p: p.update(),
        lambda p: p.finalize(),
        lambda p: p.remove(),
        lambda p: p.state_dict(),
        lambda p: p.dense_state_dict(),
        lambda p: p.load_state_dict({}),
        lambda p: p.report(),
        lambda p: p.sparsity_achieved(),
    ],
    ids=[
        "step",
        "update",
        "finalize",
        "remove",
        "state_dict",
        "dense_state_dict",
        "load",
        "report",
        "sparsity_achieved",
    ],
)
def test_the_pruners_own_calls_wait_for_the_block_to_end(call: Callable[[Any], Any]) -> None:
    model = net()
    pruner = fs.Pruner(model, pattern="2:4")
    waits = pytest.raises(RuntimeError, match=r"inside pruner\.swapped\(\).*after the block")
    with pruner.swapped(), waits:
        call(pruner)
    pruner.step()  # and are taken after it


def test_nested_blocks_and_an_ended_pruner_are_refused() -> None:
    model = net()
    pruner = fs.Pruner(model, pattern="2:4")
    nested = pytest.raises(RuntimeError, match=r"inside another pruner\.swapped")
    with pruner.swapped(), nested, pruner.swapped():
        pass
    pruner.finalize()
    ended = pytest.raises(RuntimeError, match=r"swapped\(\) is refused: this Pruner was finalized")
    with ended, pruner.swapped():
        pass


def test_weights_not_written_whole_take_the_usual_step() -> None:
    model = net()
    model.conv.weight = nn.Parameter(
        torch.randn(8, 4, 4).transpose(0, 2).contiguous().transpose(0, 2)
    )
    pruner = fs.Pruner(model, sparsity=0.9, total_steps=6)
    assert "not in the contiguous layout" in (swap.swap_refusal(pruner) or "")
    with pruner.swapped() as on:
        assert not on
    other = fs.Pruner(net(), pattern="2:4")
    with torch.inference_mode():
        assert swap.swap_refusal(other) == "in inference mode"


def test_a_copy_made_inside_the_block_is_not_inside_it() -> None:
    model = net()
    pruner = fs.Pruner(model, pattern="2:4")
    with pruner.swapped():
        other_model, other = copy.deepcopy((model, pruner))
        alone = copy.deepcopy(model)
    assert other._swap is None
    for copied in (other_model, alone):  # its layers compute their forward again
        assert not copied.fc.parametrizations.weight[0].passthrough
    other.step()


def test_the_training_loop_swaps_and_trains_the_usual_bits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``feather-sparse train`` runs each step's forward and backward in the block."""
    settings = tiny_run(train_size=256, test_size=64, eval_batch_size=64)
    entered: list[bool] = []
    real = swap.swapped

    def counting(pruner: fs.Pruner) -> Any:
        entered.append(swap.swap_refusal(pruner) is None)
        return real(pruner)

    monkeypatch.setattr(swap, "swapped", counting)
    swapped = train(tiny_config(settings, epochs=2), tmp_path / "swapped")
    assert entered and all(entered)
    monkeypatch.setattr(swap, "swap_refusal", lambda pruner: "off for the comparison")
    usual = train(tiny_config(settings, epochs=2), tmp_path / "usual")
    assert_same_bits(swapped.model.state_dict(), usual.model.state_dict())


@pytest.mark.gpu
@pytest.mark.parametrize("settings", [{"sparsity": 0.9, "total_steps": 6}, {"pattern": "2:4"}])
def test_swapped_blocks_on_cuda_train_the_usual_bits_and_never_wait(
    settings: dict[str, Any],
) -> None:
    def trained(swapped: bool) -> dict[str, torch.Tensor]:
        # Linear layers only: a convolution's CUDA backward may add in another order
        # from one run to the next, which no comparison of bits survives
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(52, 64), nn.ReLU(), nn.Linear(64, 16)).cuda()
        pruner = fs.Pruner(model, **settings)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        gen = torch.Generator(device="cuda").manual_seed(1)
        for i in range(4):
            opt.zero_grad()
            x = torch.randn(4, 52, device="cuda", generator=gen)
            if swapped and i == 3:  # the warm-up steps initialised the libraries
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
            try:
                with pruner.swapped() if swapped else contextlib.nullcontext(False):
                    model(x).square().mean().backward()
            finally:
                torch.cuda.set_sync_debug_mode("default")
            opt.step()
            pruner.step()
        return {k: v.cpu() for k, v in pruner.dense_state_dict().items()}

    assert_same_bits(trained(True), trained(False))


def test_a_compiled_model_swaps_to_the_usual_bits() -> None:
    """torch.compile traces the pass-through as a second graph (the flag is guarded):
    training in the block gives the eager bits, and the usual forward after it too."""
    import torch._dynamo

    def trained(swapped: bool) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
        pruner = fs.Pruner(model, pattern="2:4")
        forward = torch.compile(model, backend="aot_eager")
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        gen = torch.Generator().manual_seed(1)
        for _ in range(4):
            x = torch.randn(8, 16, generator=gen)
            opt.zero_grad()
            with pruner.swapped() if swapped else contextlib.nullcontext(False):
                forward(x).square().mean().backward()
            opt.step()
            pruner.step()
        with torch.no_grad():
            out = forward(torch.ones(2, 16))
        torch._dynamo.reset()
        return pruner.dense_state_dict(), out

    (usual, usual_out), (swapped, swapped_out) = trained(False), trained(True)
    assert_same_bits(swapped, usual)
    assert torch.equal(swapped_out, usual_out)


def test_layers_over_the_line_keep_the_usual_forward_inside_the_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Swapping a large layer costs more than it saves: above ``SWAP_MAX_NUMEL`` a layer
    keeps its dense stored weight and its usual forward, the small ones are swapped,
    and the training is the usual one either way."""
    monkeypatch.setattr(swap, "SWAP_MAX_NUMEL", 300)  # conv (128) and head (256) only
    model = net()
    pruner = fs.Pruner(model, pattern="2:4")
    dense = snapshot(pruner)
    pruned = snapshot(pruner, pruned=True)
    with pruner.swapped() as on:
        assert on
        assert torch.equal(model.conv.parametrizations.weight.original, pruned["conv.weight"])
        assert torch.equal(model.head.parametrizations.weight.original, pruned["head.weight"])
        assert torch.equal(model.fc.parametrizations.weight.original, dense["fc.weight"])
        assert not pruner._parametrization(pruner.targets[1]).passthrough  # fc
    usual, _ = run(PRUNERS["2:4"], swapped=False)
    mixed, yielded = run(PRUNERS["2:4"], swapped=True)
    assert yielded == [True] * 6
    assert_same_bits(mixed, usual)
    other = net()  # a large layer in another layout does not stop the small ones
    other.fc.weight = nn.Parameter(torch.randn(80, 16).t())
    assert swap.swap_refusal(fs.Pruner(other, pattern="2:4")) is None
    monkeypatch.setattr(swap, "SWAP_MAX_NUMEL", 100)  # no layer is that small
    assert "no layer has at most 100 weights" in (swap.swap_refusal(pruner) or "")
    with pruner.swapped() as on:
        assert not on


@pytest.mark.parametrize("new_tensors", [False, True], ids=["same tensors", "new tensors"])
def test_a_model_converted_inside_the_block_gets_its_dense_weights_back(
    new_tensors: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``model.double()`` in the block converts the weights, into new Parameter objects
    where torch is set to: the dense weights go back into what the layers hold at the
    end, converted."""
    monkeypatch.setattr(
        torch.__future__, "get_overwrite_module_params_on_conversion", lambda: new_tensors
    )
    model = net()
    pruner = fs.Pruner(model, pattern="2:4")
    dense = snapshot(pruner)
    with pruner.swapped():
        model.double()
    assert (pruner.targets[1].weight is not None) and pruner._swap is None
    for name in ("conv", "fc", "head"):
        weight = model.get_submodule(name).parametrizations.weight.original
        assert weight.dtype == torch.float64
        assert torch.equal(weight, dense[f"{name}.weight"].double()), name


@pytest.mark.parametrize("pattern", ["2:4", "4:8"])
def test_the_fused_layers_are_swapped_in_with_one_call(
    pattern: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One call per layer costs ~15 µs on a CPU: the N:M backbone hands every fused
    layer's forward at once, the same values the layer's own forward gives, also in
    the first block after the cache was dropped."""
    model = net()
    pruner = fs.Pruner(model, pattern=pattern)
    want = snapshot(pruner, pruned=True)
    calls: list[int] = []
    cls = type(pruner._parametrization(pruner.targets[0]))
    layer_forward = cls.forward
    monkeypatch.setattr(
        cls, "forward", lambda self, w: calls.append(self.index) or layer_forward(self, w)
    )
    for _ in range(2):  # a fresh pass, then the valid cache
        with pruner.swapped() as on:
            assert on and calls == []
            for t in pruner.targets:
                assert torch.equal(t.weight, want[f"{t.name}.weight"]), t.name
    with torch.no_grad():
        model.fc.parametrizations.weight.original.mul_(2.0)  # a weight changed: computed again
    want = snapshot(pruner, pruned=True)
    calls.clear()
    with pruner.swapped():
        assert torch.equal(model.fc.parametrizations.weight.original, want["fc.weight"])
    assert calls == []
    pruner.backbone.release()  # as after a write inside a block: no cache, no ramps known
    with pruner.swapped():
        assert torch.equal(model.fc.parametrizations.weight.original, want["fc.weight"])
    assert calls == []
