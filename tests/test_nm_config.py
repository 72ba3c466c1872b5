"""N:M in the config path: PrunerConfig.pattern, Pruner.from_config, the method registry."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs
from feather_sparse.nm import NMBackbone, group_view
from feather_sparse.pruner_config import PrunerConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 4))


def test_pattern_field_implies_sparsity_backbone_schedule() -> None:
    config = PrunerConfig(pattern="4:8")
    assert config.pattern == "4:8"
    assert config.sparsity == 0.5
    assert config.backbone == {"name": "nm", "pattern": "4:8"}
    assert isinstance(config.make_schedule(), fs.ConstantSchedule)
    assert not config.needs_total_steps
    assert config.to_dict()["pattern"] == "4:8"
    assert PrunerConfig(pattern="1:4").sparsity == 0.75
    # An N:M backbone alone sets the pattern (states saved before the field existed).
    assert PrunerConfig(0.5, backbone={"name": "nm", "pattern": "2:4"}).pattern == "2:4"
    assert PrunerConfig(0.9).pattern is None  # unstructured stays unstructured
    assert PrunerConfig(pattern="2:4", schedule="cubic").needs_total_steps


def test_pattern_conflicts_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"pattern='2:4' prunes 0\.5 .* sparsity=0\.9"):
        PrunerConfig(0.9, pattern="2:4")
    with pytest.raises(ValueError, match="backbone='uniform' cannot be combined"):
        PrunerConfig(pattern="2:4", backbone="uniform")
    with pytest.raises(ValueError, match="another pattern"):
        PrunerConfig(pattern="2:4", backbone={"name": "nm", "pattern": "4:8"})
    with pytest.raises(ValueError, match="'N:M'"):
        PrunerConfig(pattern="2-4")
    with pytest.raises(ValueError, match="0 < N < M"):
        PrunerConfig(pattern="4:4")
    with pytest.raises(ValueError, match="sparsity is required"):
        PrunerConfig()
    with pytest.raises(ValueError, match=r"prunes 0\.5 .* sparsity=0\.75"):
        PrunerConfig(0.75, backbone="nm")  # the nm backbone's default pattern is 2:4


def test_from_config_equals_the_constructor() -> None:
    a, b = mlp(), mlp()
    pa = fs.Pruner(a, pattern="2:4")
    pb = fs.Pruner.from_config(b, PrunerConfig(pattern="2:4"))
    assert pa.config() == pb.config()
    assert isinstance(pb.backbone, NMBackbone) and pb.backbone is not pa.backbone
    x = torch.randn(3, 16)
    assert torch.equal(a(x), b(x))
    for w in (a[0].weight, a[2].weight):
        assert int((group_view(w.detach(), pb.backbone.pattern) != 0).sum(1).max()) <= 2
    with pytest.raises(ValueError, match="total_steps is needed"):
        fs.Pruner.from_config(mlp(), PrunerConfig(pattern="2:4", schedule="cubic"))
    with pytest.raises(ValueError, match="total_steps is required"):
        fs.Pruner.from_config(mlp(), PrunerConfig(0.9))


def test_state_round_trip_through_from_config_is_bit_exact() -> None:
    gen = torch.Generator().manual_seed(3)
    data = [(torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen))] * 6
    config = PrunerConfig(pattern="2:4", schedule={"name": "cubic", "end": 0.5})

    def run(model: nn.Module, pruner: fs.Pruner, opt: torch.optim.Optimizer, part: list) -> None:
        for x, y in part:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            pruner.step()

    ref = mlp()
    pr = fs.Pruner.from_config(ref, config, total_steps=6)
    oref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    run(ref, pr, oref, data)

    a = mlp()
    pa = fs.Pruner.from_config(a, config, total_steps=6)
    oa = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    run(a, pa, oa, data[:3])
    state = copy.deepcopy(pa.state_dict())
    assert state["config"]["pattern"] == "2:4"
    b = mlp(seed=5)
    b.load_state_dict(copy.deepcopy(pa.dense_state_dict()))
    pb = fs.Pruner.from_config(b, config, total_steps=6)
    pb.load_state_dict(state)
    ob = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
    ob.load_state_dict(copy.deepcopy(oa.state_dict()))
    run(b, pb, ob, data[3:])
    for (k, v), (k2, v2) in zip(pr.dense_state_dict().items(), pb.dense_state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    assert pb.current_step == 6
    # A state saved with another pattern is refused, naming the field.
    other = fs.Pruner.from_config(mlp(), PrunerConfig(pattern="4:8", schedule=config.schedule), 6)
    with pytest.raises(ValueError, match=r"saved with backbone=.*'2:4'"):
        other.load_state_dict(state)


def test_a_fresh_interpreter_importing_methods_alone_sees_the_nm_methods() -> None:
    code = "import feather_sparse.methods as m; print(' '.join(m.METHODS.names()))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    assert {"feather-nm", "hard-nm", "oneshot-nm", "s-ste", "sr-ste"} <= set(out)


def test_make_pruner_nm_method_goes_through_the_config() -> None:
    pruner = fs.make_pruner(mlp(), "sr-ste", pattern="4:8")
    assert pruner.pruner_config.pattern == "4:8"
    assert pruner.backbone.config() == {"name": "nm", "pattern": "4:8", "decay": 2e-4}
    config = fs.METHODS.get("s-ste").config(None, pattern="1:4")
    assert config.sparsity == 0.75 and config.backbone == {
        "name": "nm",
        "rescale": True,
        "pattern": "1:4",
    }
