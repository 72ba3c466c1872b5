"""The scripts in ``examples/`` run as written and do what they say."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
from torch import nn

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


@pytest.mark.usefixtures("one_thread")
def test_prune_transformer_prunes_the_blocks_and_keeps_embeddings_and_head_dense() -> None:
    example = load("prune_transformer")
    result = example.run()  # the script's defaults
    model = result.model
    blocks = [m for m in model.blocks.modules() if isinstance(m, nn.Linear)]
    assert blocks and not any(hasattr(m, "parametrizations") for m in model.modules())
    n = sum(m.weight.numel() for m in blocks)
    zeros = sum(int((m.weight == 0).sum()) for m in blocks)
    assert zeros == round(0.8 * n) and result.sparsity == pytest.approx(0.8, abs=1 / n)
    assert [row.name for row in result.report.layers] == [
        name for name, m in model.named_modules() if m in blocks
    ]
    for dense in (model.token.weight, model.position.weight, model.head.weight):
        assert int((dense == 0).sum()) == 0
    # It learned the chain while being pruned: far below the uniform guess.
    assert result.loss_end < 0.5 * math.log(example.Config.vocab) < result.loss_start
    assert result.floor < result.loss_end


@pytest.mark.usefixtures("one_thread")
def test_prune_transformer_script_prints_its_summary(capsys: pytest.CaptureFixture[str]) -> None:
    example = load("prune_transformer")
    assert example.main(["--steps", "20", "--sparsity", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "| **total** |" in out and "sparsity of the pruned Linear layers: 50.00%" in out


@pytest.mark.usefixtures("one_thread")
def test_prune_transformer_to_2_4_keeps_two_of_every_four_and_learns() -> None:
    example = load("prune_transformer")
    result = example.run(pattern="2:4")
    blocks = example.pruned_linears(result.model)
    assert blocks and not any(hasattr(m, "parametrizations") for m in result.model.modules())
    for layer in blocks:  # exactly 2 nonzeros in every group of 4 input weights
        counts = (layer.weight.detach().reshape(-1, 4) != 0).sum(1)
        assert (counts == 2).all(), layer
    assert result.pattern == "2:4" and result.sparsity == pytest.approx(0.5)
    assert int((result.model.head.weight == 0).sum()) == 0
    assert result.loss_end < 0.5 * math.log(example.Config.vocab) < result.loss_start


@pytest.mark.usefixtures("one_thread")
def test_prune_transformer_script_with_a_pattern_checks_and_sizes_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    example = load("prune_transformer")
    assert example.main(["--steps", "20", "--pattern", "1:4"]) == 0
    out = capsys.readouterr().out
    assert "N:M pattern 1:4" in out and "sparsity of the pruned Linear layers: 75.00%" in out
    # 1:4 in fp16: per group one 2-byte value and one 2-bit position, 0.281 of dense
    assert "every group of 4 holds at most 1 nonzeros" in out and "(0.281)" in out


def test_prune_transformer_takes_the_operator_power(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--p 1`` reaches the Pruner (the soft threshold) and trains another model than p = 3."""
    example = load("prune_transformer")
    seen: list[float] = []
    real = example.fs.Pruner

    def spy(*args: object, **kwargs: object) -> object:
        pruner = real(*args, **kwargs)
        seen.append(pruner.config()["operator"]["p"])
        return pruner

    monkeypatch.setattr(example.fs, "Pruner", spy)
    assert example.main(["--steps", "10", "--pattern", "2:4", "--p", "1"]) == 0
    soft = example.run(pattern="2:4", steps=10, p=1.0).loss_end
    feather = example.run(pattern="2:4", steps=10).loss_end
    assert seen == [1.0, 1.0, 3.0] and soft != feather


def test_nm_summary_refuses_a_broken_pattern() -> None:
    example = load("prune_transformer")
    model = example.TinyGPT(example.Config())  # dense: groups of 4 hold 4 nonzeros
    with pytest.raises(AssertionError, match="holds 4 nonzeros, more than 2"):
        example.nm_summary(model, "2:4")
