"""Tensor parallelism with FSDP2 on a 2-D ``("dp", "tp")`` mesh, on 2 and 4 gloo processes.

The usual LLM setup: ``parallelize_module`` on ``mesh["tp"]`` (a
``ColwiseParallel`` Linear, a ReLU, a ``RowwiseParallel`` Linear), then the
Pruner, then ``fully_shard`` on ``mesh["dp"]``; a last Linear that tensor
parallelism leaves whole is sharded by FSDP2 alone. Run on a (1, 2) and a
(2, 1) mesh, which between them exercise both mesh dimensions with two
processes, and on a (2, 2) mesh on four: the column- and row-wise weights are
sharded on both mesh dimensions (column-wise: FSDP2's ``_StridedShard(0)`` over
tensor parallelism's ``Shard(0)``; row-wise: ``Shard(0)`` over ``Shard(1)``),
the last weight on ``dp`` only, and the Pruner selects over the two dimensions
together, counting each weight once.

At every step the 2-D model is compared with one process holding the same
whole weights and Pruner state, given the whole batch (the ``dp`` ranks' batches
together; FSDP2 averages their gradients): the forward and the gradients,
the thresholds the next ``step()`` selects (exactly), ``report()`` and
``sparsity_achieved()`` (exact counts), and at the end the export of
``dense_state_dict(pruned=True, full=True)`` (``finalize()`` is refused, as under
FSDP2).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import feather_sparse as fs
from _dist import launch
from _guards import guard
from _tp import INPUTS, NEEDS_GLOO, OUTPUTS, megatron, mlp, pruner_kinds, train_against_one

#: Per number of processes, the (dp, tp) meshes run on them.
MESHES = {2: [(1, 2), (2, 1)], 4: [(2, 2)]}
WORLD_HSDP = 2  # HSDP's replicas, checked on the 2-process launch
STEPS = 4
BATCH = 4  # per dp rank
pytestmark = NEEDS_GLOO

#: What each Pruner is: unstructured with a moving threshold, and 2:4 (θ < 1 in both).
KINDS = pruner_kinds(STEPS)


def _mlp() -> nn.Sequential:
    return mlp(whole_tail=True)


def _mesh(shape: tuple[int, int]) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))


def _tensor_parallel(model: nn.Sequential, mesh: Any) -> None:
    megatron(model, mesh["tp"])


def _fully_shard(model: nn.Sequential, mesh: Any) -> None:
    from torch.distributed.fsdp import fully_shard

    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])


def _batch(step: int, dp_rank: int, dp: int) -> tuple[Tensor, Tensor]:
    """The whole batch of one step (every dp rank's part) and this dp rank's part."""
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(BATCH * dp, INPUTS, generator=gen)
    y = torch.randint(0, OUTPUTS, (BATCH * dp,), generator=gen)
    part = slice(dp_rank * BATCH, (dp_rank + 1) * BATCH)
    return (x, y), (x[part], y[part])  # type: ignore[return-value]


def _train(shape: tuple[int, int], kind: str) -> dict[str, Any]:
    """2-D training, checked step by step against one process."""
    mesh = _mesh(shape)
    dp_rank = mesh["dp"].get_local_rank()
    model = _mlp()
    _tensor_parallel(model, mesh)  # 1. tensor parallelism
    pruner = fs.Pruner(model, **KINDS[kind])  # 2. the Pruner
    _fully_shard(model, mesh)  # 3. FSDP2
    reference = _mlp()
    one = fs.Pruner(reference, **KINDS[kind])
    opt = torch.optim.SGD(model.parameters(), lr=0.2)

    def forward(step: int) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        (x_all, y_all), (x, y) = _batch(step, dp_rank, shape[0])
        out, out_all = model(x), reference(x_all)
        # FSDP2 averages the gradients over dp: the mean over the whole batch
        losses = (nn.functional.cross_entropy(out, y), nn.functional.cross_entropy(out_all, y_all))
        part = slice(dp_rank * BATCH, (dp_rank + 1) * BATCH)
        return losses, (out, out_all[part])

    steps = train_against_one(pruner, one, reference, opt, STEPS, forward)
    out = {
        "steps": steps,
        "placements": [tuple(map(repr, w.placements)) for w in pruner.weights()],  # type: ignore[attr-defined]
        "gathers": [pruner._gathers(i, w) for i, w in enumerate(pruner.weights())],
        "exported": pruner.dense_state_dict(pruned=True, full=True),
        "exported_one": one.dense_state_dict(pruned=True),
        "finalize": "",
    }
    try:
        pruner.finalize()
    except RuntimeError as err:  # as under FSDP2: export through dense_state_dict
        out["finalize"] = str(err)
    return out


def _refusal(shape: tuple[int, int]) -> str:
    """fully_shard before the Pruner (after parallelize_module): refused at attach."""
    mesh = _mesh(shape)
    model = _mlp()
    _tensor_parallel(model, mesh)
    _fully_shard(model, mesh)
    try:
        fs.Pruner(model, sparsity=0.5, total_steps=1)
    except ValueError as err:
        return str(err)
    return ""


def _hybrid() -> dict[str, Any]:
    """HSDP (``fully_shard`` on a 2-D mesh: replicated on its first dimension, sharded
    on its second, here of size 1): every replica selects over its own shard group."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (WORLD_HSDP, 1), mesh_dim_names=("replicate", "shard"))
    model = _mlp()
    pruner = fs.Pruner(model, **KINDS["unstructured"])
    _fully_shard(model, {"dp": mesh})
    one = fs.Pruner(_mlp(), **KINDS["unstructured"])
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    out: dict[str, Any] = {"thresholds": [], "thresholds_one": []}
    for step in range(STEPS):
        _, (x, y) = _batch(step, mesh.get_coordinate()[0], WORLD_HSDP)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        before = pruner.state_dict()
        pruner.step()
        one.model.load_state_dict(pruner.dense_state_dict(full=True))
        one.load_state_dict(before)
        one.step()
        out["thresholds"].append([float(t) for t in pruner.thresholds()])
        out["thresholds_one"].append([float(t) for t in one.thresholds()])
    return out


def _scenario(rank: int, world: int) -> dict[str, Any]:
    torch.manual_seed(1234)
    out: dict[str, Any] = {}
    for shape in MESHES[world]:
        for kind in KINDS:
            out[f"{shape}-{kind}"] = _train(shape, kind)
    out["refusal"] = _refusal(MESHES[world][0])
    if world == WORLD_HSDP:
        out["hybrid"] = _hybrid()
    return out


@pytest.fixture(scope="module")
def launches() -> dict[int, list[dict[str, Any]]]:
    """Each number of processes launched once (4 processes: one (2, 2) mesh, ~15 s)."""
    return {world: launch(_scenario, world) for world in MESHES}


@pytest.fixture
def runs(launches: dict[int, list[dict[str, Any]]], case: str) -> list[dict[str, Any]]:
    """Every rank's results of the launch that ran ``case``."""
    return next(got for got in launches.values() if case in got[0])


CASES = [f"{shape}-{kind}" for meshes in MESHES.values() for shape in meshes for kind in KINDS]


@pytest.mark.parametrize("case", CASES)
def test_weights_are_sharded_on_both_mesh_dimensions(runs: list[dict[str, Any]], case: str) -> None:
    for run in runs:
        column, row, last = run[case]["placements"]
        assert len(column) == len(row) == 2 and len(last) == 1
        assert "Shard(dim=1)" in row[1]  # row-wise over tp, FSDP2 over dp


@pytest.mark.parametrize("case", [c for c in CASES if c.endswith("2:4")])
def test_a_column_wise_nm_layer_is_computed_on_its_shards(
    runs: list[dict[str, Any]], case: str
) -> None:
    """FSDP2's ``_StridedShard`` over tensor parallelism's ``Shard(0)`` cuts rows only:
    the groups stay whole, so the collectives need not gather the layer (they did)."""
    strided = not case.startswith("(2, 1)")  # tp = 1: FSDP2 alone shards dim 0
    for run in runs:
        column = run[case]["placements"][0]
        assert ("_StridedShard(dim=0" in column[0]) is strided, column
        assert run[case]["gathers"] == [False, False, False]


@pytest.mark.parametrize("case", CASES)
def test_forward_and_gradients_equal_one_process(runs: list[dict[str, Any]], case: str) -> None:
    for run in runs:
        for step in run[case]["steps"]:
            torch.testing.assert_close(step["out"], step["out_one"])
            for g, g_one in zip(step["grads"], step["grads_one"]):
                torch.testing.assert_close(g, g_one)


@guard(
    "a Pruner on weights sharded on two mesh dimensions (FSDP2 over tensor parallelism on a "
    "2-D mesh), without `process_group=`",
    "selects over the two dimensions together, counting each weight once: the exact "
    "single-process thresholds",
)
@pytest.mark.parametrize("case", CASES)
def test_thresholds_equal_one_process_at_every_step(runs: list[dict[str, Any]], case: str) -> None:
    moved = set()
    for run in runs:
        for step in run[case]["steps"]:
            for t, t_one in zip(step["thresholds"], step["thresholds_one"]):
                assert torch.equal(t, t_one)
                moved.add(float(t))
    assert len(moved) > 1 or case.endswith("2:4")  # the unstructured threshold moves


@pytest.mark.parametrize("case", CASES)
def test_report_counts_exactly(runs: list[dict[str, Any]], case: str) -> None:
    for run in runs:
        for step in run[case]["steps"]:
            got, want = step["report"], step["report_one"]
            assert got["achieved"] == want["achieved"]
            assert got["sparsity"] == want["sparsity"]
            assert got["layers"] == want["layers"]
            assert got["shown"] == pytest.approx(want["shown"], rel=1e-6)


@pytest.mark.parametrize("case", CASES)
def test_export_equals_one_process(runs: list[dict[str, Any]], case: str) -> None:
    for run in runs:
        out = run[case]
        assert out["exported"].keys() == out["exported_one"].keys()
        for key, value in out["exported"].items():
            assert not hasattr(value, "to_local"), key  # whole plain tensors
            assert torch.equal(value, out["exported_one"][key]), key
        assert "dense_state_dict(pruned=True, full=True)" in out["finalize"]


def test_fully_shard_before_the_pruner_is_refused(
    launches: dict[int, list[dict[str, Any]]],
) -> None:
    for run in launches[2]:
        assert "attach the Pruner to the unsharded model first" in run["refusal"]


def test_hsdp_replicas_keep_their_own_exact_thresholds(
    launches: dict[int, list[dict[str, Any]]],
) -> None:
    """A mesh dimension a weight is replicated on, outside the group selected over
    (HSDP's replicas), does not take the weight from any replica's count."""
    for run in launches[WORLD_HSDP]:
        got = run["hybrid"]
        assert got["thresholds"] == got["thresholds_one"]
        assert len({t[0] for t in got["thresholds"]}) > 1  # the threshold moved
