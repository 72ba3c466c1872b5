"""S-STE's β under FSDP2 and tensor parallelism equals the one-process β bit for bit.

β = ⟨w, S(w)⟩ / ⟨S(w), S(w)⟩ (``rescale=True``) of a layer whose shards keep
its N:M groups whole is summed from each rank's partial sums, all-reduced.
Taken in float32, those sums round differently from the one-process sums, and
about half of the βs below differed from the one-process β in their last bits;
taken in float64 (the float32 products are exact there) and rounded once, they
are the same. Checked on 2 gloo processes, for a few layer shapes and seeds,
with the weights sharded by ``fully_shard`` (dim 0) and by ``ColwiseParallel``.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn

import feather_sparse as fs
from _dist import launch
from _guards import guard

WORLD = 2
#: (out, in) of the first Linear; the second is (in, out). Every shard holds whole rows.
SHAPES = [(16, 64), (64, 256), (96, 96), (256, 512)]
SEEDS = range(4)
#: β is taken when the pattern is reached, after a dense warm-up: from the sharded weights.
KWARGS: dict[str, Any] = {
    "pattern": "2:4",
    "backbone": {"name": "nm", "rescale": True},
    "schedule": {"name": "constant", "start": 0.5},
    "total_steps": 4,
}

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed + gloo"
)


def _model(shape: tuple[int, int], seed: int) -> nn.Sequential:
    torch.manual_seed(seed)  # the same weights on every rank
    out, inputs = shape
    return nn.Sequential(nn.Linear(inputs, out), nn.Linear(out, inputs))


def _betas(pruner: fs.Pruner) -> list[Tensor]:
    backbone: Any = pruner.backbone
    return [b.clone() for b in backbone._beta]


def _sharded_and_one(rank: int, world: int, sharding: str) -> list[dict[str, Any]]:
    """Per shape and seed: the sharded Pruner's β and one process's, on the same weights."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    out = []
    for shape in SHAPES:
        for seed in SEEDS:
            model = _model(shape, seed)
            if sharding == "tensor-parallel":
                parallelize_module(model, mesh, {"0": ColwiseParallel(), "1": ColwiseParallel()})
            pruner = fs.Pruner(model, **KWARGS)
            if sharding == "fsdp":
                for layer in model:
                    fully_shard(layer, mesh=mesh)
                fully_shard(model, mesh=mesh)
            one = fs.Pruner(_model(shape, seed), **KWARGS)
            for _ in range(3):  # no training: the weights stay those of _model
                pruner.step()
                one.step()
            local = [tuple(w.to_local().shape) for w in pruner.weights()]  # type: ignore[attr-defined]
            out.append(
                {
                    "case": (shape, seed),
                    "local": local,
                    "sharded": _betas(pruner),
                    "one": _betas(one),
                }
            )
    return out


@pytest.fixture(scope="module")
def runs() -> dict[str, list[list[dict[str, Any]]]]:
    return {
        sharding: launch(functools.partial(_sharded_and_one, sharding=sharding), WORLD)
        for sharding in ("fsdp", "tensor-parallel")
    }


@guard(
    "S-STE (`rescale=True`) under FSDP2 or tensor parallelism on N:M layers whose shards keep "
    "their groups whole",
    "β is summed in float64 over the shards and rounded once: the one-process β, bit for bit "
    "in every case tested (it differed in its last bits before)",
)
@pytest.mark.parametrize("sharding", ["fsdp", "tensor-parallel"])
def test_sharded_beta_is_the_one_process_beta_bit_for_bit(
    runs: dict[str, list[list[dict[str, Any]]]], sharding: str
) -> None:
    for rank_cases in runs[sharding]:
        assert len(rank_cases) == len(SHAPES) * len(SEEDS)
        for case in rank_cases:
            (out, inputs), _ = case["case"]
            assert case["local"] == [(out // WORLD, inputs), (inputs // WORLD, out)]  # sharded
            assert len(case["sharded"]) == 2
            for got, want in zip(case["sharded"], case["one"]):
                assert got.dtype == want.dtype == torch.float32
                assert torch.equal(got, want), (case["case"], got.item(), want.item())
