"""Tensor parallelism (``parallelize_module``, DTensor weights in the forward) on 2 gloo processes.

The standard Megatron pair — a ``ColwiseParallel`` Linear, a ReLU, a
``RowwiseParallel`` Linear — with the Pruner attached *after*
``parallelize_module``. At every step the tensor-parallel model is compared
with one process holding the same whole weights and the same Pruner state:
the forward and the gradients (θ < 1 scales the pruned weights' gradients),
the thresholds the next ``step()`` selects (exactly), ``report()`` and
``sparsity_achieved()`` (exact counts), and at the end the export of
``dense_state_dict(pruned=True, full=True)`` and ``finalize()``. Unstructured
and 2:4 pruning; a row-wise layer whose shards would split the 2:4 groups is
refused at attach, naming the layer, and so is one-shot N:M (a frozen mask),
with the reason that holds under tensor parallelism. The model compiled with
``torch.compile`` (``fullgraph=True``, ``aot_eager``) trains as the eager one,
without recompiling as the threshold moves.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import feather_sparse as fs
from _dist import launch
from _guards import guard
from _tp import HIDDEN, INPUTS, NEEDS_GLOO, OUTPUTS, megatron, mlp, pruner_kinds, train_against_one

WORLD = 2
STEPS = 4
pytestmark = NEEDS_GLOO

#: What each Pruner is: unstructured with a moving threshold, and 2:4 (θ < 1 in both).
KINDS = pruner_kinds(STEPS)


def _mlp(hidden: int = HIDDEN) -> nn.Sequential:
    return mlp(hidden=hidden)


def _parallelize(model: nn.Sequential) -> nn.Sequential:
    from torch.distributed.device_mesh import init_device_mesh

    megatron(model, init_device_mesh("cpu", (WORLD,)))
    return model


def _batch(step: int) -> tuple[Tensor, Tensor]:
    """The same batch on every rank (tensor parallelism splits the weights, not the data)."""
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(6, INPUTS, generator=gen), torch.randint(0, OUTPUTS, (6,), generator=gen)


def _train(kind: str) -> dict[str, Any]:
    """Tensor-parallel training, checked step by step against one process."""
    model = _parallelize(_mlp())
    pruner = fs.Pruner(model, **KINDS[kind])
    reference = _mlp()
    one = fs.Pruner(reference, **KINDS[kind])
    opt = torch.optim.SGD(model.parameters(), lr=0.2)

    def forward(step: int) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        x, y = _batch(step)
        out, out_one = model(x), reference(x)
        losses = (nn.functional.cross_entropy(out, y), nn.functional.cross_entropy(out_one, y))
        return losses, (out, out_one)

    steps = train_against_one(pruner, one, reference, opt, STEPS, forward)
    exported = pruner.dense_state_dict(pruned=True, full=True)
    exported_one = one.dense_state_dict(pruned=True)
    achieved = pruner.finalize()
    achieved_one = one.finalize()
    return {
        "steps": steps,
        "local_shapes": [tuple(w.to_local().shape) for w in pruner.weights()],  # type: ignore[attr-defined]
        "exported": exported,
        "exported_one": exported_one,
        "still_parallel": all(hasattr(m.weight, "to_local") for m in (model[0], model[2])),
        "finalized": {k: _whole(v) for k, v in model.state_dict().items()},
        "finalized_one": reference.state_dict(),
        "achieved": achieved,
        "achieved_one": achieved_one,
        "after": model(_batch(99)[0]).detach().clone(),
        "after_one": reference(_batch(99)[0]).detach().clone(),
    }


def _whole(value: Tensor) -> Tensor:
    full = getattr(value, "full_tensor", None)
    return (full() if full is not None else value).detach().clone()


def _refusals() -> dict[str, Any]:
    """A row-wise 2:4 layer whose shards split groups; one-shot N:M (a frozen mask);
    attaching before parallelize_module."""
    out: dict[str, Any] = {}
    model = _parallelize(_mlp(hidden=12))  # layer '2' is (8, 12): (8, 6) per rank
    stored = model[2].weight
    try:
        fs.Pruner(model, pattern="2:4")
    except ValueError as err:
        out["split"] = str(err)
    out["left_alone"] = model[2].weight is stored and not hasattr(model[2], "parametrizations")
    oneshot = _parallelize(_mlp())
    try:
        fs.make_pruner(oneshot, "oneshot-nm", pattern="2:4", total_steps=10)
    except ValueError as err:
        out["oneshot"] = str(err)
    out["oneshot_left_alone"] = not any(hasattr(m, "parametrizations") for m in oneshot)
    early = _mlp()
    fs.Pruner(early, sparsity=0.5, total_steps=1)
    try:
        _parallelize(early)
    except Exception as err:  # torch's own refusal (see docs/distributed.md)
        out["before"] = f"{type(err).__name__}: {err}"
    return out


def _compiled() -> dict[str, Any]:
    """The tensor-parallel model compiled (``fullgraph=True``, no recompiles while the
    threshold moves) against the same model run eagerly, step by step."""
    import torch._dynamo

    model = _parallelize(_mlp())
    eager = _parallelize(_mlp())
    pruner = fs.Pruner(model, **KINDS["unstructured"])
    pruner_eager = fs.Pruner(eager, **KINDS["unstructured"])
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    opts = [torch.optim.SGD(m.parameters(), lr=0.2) for m in (model, eager)]
    out: dict[str, Any] = {"out": [], "out_eager": [], "thresholds": [], "thresholds_eager": []}
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step in range(STEPS):
            x, y = _batch(step)
            for net, opt, p, key in (
                (compiled, opts[0], pruner, ""),
                (eager, opts[1], pruner_eager, "_eager"),
            ):
                got = net(x)
                opt.zero_grad()
                nn.functional.cross_entropy(got, y).backward()
                opt.step()
                p.step()
                out["out" + key].append(got.detach().clone())
                out["thresholds" + key].append([float(t) for t in p.thresholds()])
    return out


def _scenario(rank: int, world: int) -> dict[str, Any]:
    torch.manual_seed(1234)
    out: dict[str, Any] = {kind: _train(kind) for kind in KINDS}
    out["refusals"] = _refusals()
    out["compiled"] = _compiled()
    return out


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    return launch(_scenario, WORLD)


@pytest.mark.parametrize("kind", list(KINDS))
def test_forward_and_gradients_equal_one_process(runs: list[dict[str, Any]], kind: str) -> None:
    for run in runs:
        assert run[kind]["local_shapes"] == [(HIDDEN // WORLD, INPUTS), (OUTPUTS, HIDDEN // WORLD)]
        for step in run[kind]["steps"]:
            torch.testing.assert_close(step["out"], step["out_one"])
            for g, g_one in zip(step["grads"], step["grads_one"]):
                torch.testing.assert_close(g, g_one)


@pytest.mark.parametrize("kind", list(KINDS))
def test_thresholds_equal_one_process_at_every_step(runs: list[dict[str, Any]], kind: str) -> None:
    moved = set()
    for run in runs:
        for step in run[kind]["steps"]:
            for t, t_one in zip(step["thresholds"], step["thresholds_one"]):
                assert torch.equal(t, t_one)
                moved.add(float(t))
    assert len(moved) > 1 or kind == "2:4"  # the unstructured threshold moves


@pytest.mark.parametrize("kind", list(KINDS))
def test_report_counts_exactly(runs: list[dict[str, Any]], kind: str) -> None:
    for run in runs:
        for step in run[kind]["steps"]:
            got, want = step["report"], step["report_one"]
            assert got["achieved"] == want["achieved"]
            assert got["sparsity"] == want["sparsity"]
            assert got["layers"] == want["layers"]
            assert got["shown"] == pytest.approx(want["shown"], rel=1e-6)
        if kind == "2:4":
            assert run[kind]["steps"][-1]["report"]["achieved"] == 0.5


@pytest.mark.parametrize("kind", list(KINDS))
def test_export_and_finalize_equal_one_process(runs: list[dict[str, Any]], kind: str) -> None:
    for run in runs:
        out = run[kind]
        assert out["exported"].keys() == out["exported_one"].keys()
        for key, value in out["exported"].items():
            assert not hasattr(value, "to_local"), key  # whole plain tensors
            assert torch.equal(value, out["exported_one"][key]), key
        assert out["achieved"] == out["achieved_one"]
        assert out["still_parallel"]  # finalize baked P_T(w) into the DTensor weights
        for key, value in out["finalized"].items():
            assert torch.equal(value, out["finalized_one"][key]), key
        torch.testing.assert_close(out["after"], out["after_one"])


@guard(
    "an N:M Pruner attached to a row-wise tensor-parallel layer (`RowwiseParallel`) whose "
    "shards split the N:M groups (in_features / world size not a multiple of M)",
    "`ValueError` at attach naming the layer, its shard and the fix; the model is left as it was",
)
def test_rowwise_shards_that_split_groups_are_refused_at_attach(
    runs: list[dict[str, Any]],
) -> None:
    for run in runs:
        message = run["refusals"]["split"]
        assert "layer '2'" in message and "(8, 6)" in message and "(8, 12)" in message
        assert "tensor parallel" in message and "split its 2:4 groups" in message
        assert run["refusals"]["left_alone"]


@guard(
    "one-shot N:M (`oneshot-nm`, `NMBackbone(freeze=True)`) attached to a tensor-parallel model",
    "`ValueError` at attach saying why under tensor parallelism (per-shard masks the Pruner's "
    "state cannot save) and to use N:M without `freeze`; the model is left as it was",
)
def test_one_shot_nm_under_tensor_parallelism_is_refused_with_its_own_reason(
    runs: list[dict[str, Any]],
) -> None:
    for run in runs:
        message = run["refusals"]["oneshot"]
        assert "under tensor parallelism" in message and "one rank's masks" in message
        assert "FSDP2's forward" not in message and "whole weights" not in message
        assert "pattern='2:4'" in message
        assert run["refusals"]["oneshot_left_alone"]


def test_the_documented_order_attach_after_parallelize_module(
    runs: list[dict[str, Any]],
) -> None:
    """parallelize_module re-registers each parameter by name, and a parametrized weight's
    name (``parametrizations.weight.original``) cannot be registered: torch refuses."""
    for run in runs:
        assert 'contain "."' in run["refusals"]["before"]


def test_compiled_model_trains_as_the_eager_one(runs: list[dict[str, Any]]) -> None:
    """torch.compile of the tensor-parallel model with the Pruner attached (fullgraph,
    aot_eager on CPU): the same outputs and thresholds, and no recompile as they move."""
    for run in runs:
        got = run["compiled"]
        for out, out_eager in zip(got["out"], got["out_eager"]):
            torch.testing.assert_close(out, out_eager)
        for t, t_eager in zip(got["thresholds"], got["thresholds_eager"]):
            assert t == pytest.approx(t_eager, rel=1e-6)
        assert len({t[0] for t in got["thresholds"]}) > 1  # the threshold moved
