"""Prune the Linear layers of a small GPT-style transformer with Feather-Global.

A tiny decoder-only transformer (randomly initialised, plain PyTorch) learns
next-token prediction on sequences drawn from a fixed random Markov chain, so
there is something to learn and the loss has a known floor (the chain's
entropy). The Pruner prunes every ``nn.Linear`` in the blocks — attention
projections and MLPs — to 80 % sparsity with one global threshold, while the
token/position embeddings (``nn.Embedding``, not in ``include``) and the
language-model head (named in ``exclude``) stay dense. Runs in a few seconds
on a CPU::

    python examples/prune_transformer.py
    python examples/prune_transformer.py --sparsity 0.9 --steps 400
    python examples/prune_transformer.py --pattern 2:4

With ``--pattern 2:4`` (or ``4:8``, ``1:4``) the blocks are trained to an
N:M pattern instead — Feather's operator within each group of M consecutive
input weights, the layout NVIDIA's sparse tensor cores run — and the script
checks every group after ``finalize()`` and prints the compact N:M size of
the pruned weights (``fs.encode_nm``: kept values plus in-group positions)
against dense fp16. On a GPU, ``fs.to_semi_structured(model.half().cuda())``
would turn 2:4 layers into PyTorch's semi-structured sparse tensors — but
only layers of at least 32 × 64 whose sides are multiples of that in fp16,
which this toy model's 48-wide layers are not (it stays dense).

Why keep the head dense: its rows are the output logits of every token, it is
small next to the blocks, and in models that tie it to the input embedding
(GPT-2, BERT's MLM head) it is one tensor with the embedding, which pruning
the head prunes too.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import feather_sparse as fs


@dataclass(frozen=True)
class Config:
    vocab: int = 32
    context: int = 16
    width: int = 48
    heads: int = 4
    layers: int = 2


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(cfg.width)
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.norm2 = nn.LayerNorm(cfg.width)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.width, 4 * cfg.width), nn.GELU(), nn.Linear(4 * cfg.width, cfg.width)
        )

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape  # (batch, time, width)
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        # (batch, heads, time, width / heads)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.token = nn.Embedding(cfg.vocab, cfg.width)
        self.position = nn.Embedding(cfg.context, cfg.width)
        self.blocks = nn.Sequential(*(Block(cfg) for _ in range(cfg.layers)))
        self.norm = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.token(idx) + self.position(pos)
        return self.head(self.norm(self.blocks(x)))  # (batch, time, vocab) logits


class MarkovData:
    """Token sequences from a fixed random Markov chain with a few likely successors per token."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        logits = 4.0 * torch.randn(vocab, vocab, generator=g)
        self.transition = logits.softmax(dim=1)  # (vocab, vocab), rows sum to 1
        self.generator = g

    def loss_floor(self, tokens: Tensor) -> float:
        """The true chain's cross-entropy on ``tokens``: no model can do better on average."""
        p = self.transition[tokens[:, :-1], tokens[:, 1:]]
        return float(-p.log().mean())

    def batch(self, size: int, length: int) -> Tensor:
        tokens = torch.empty(size, length + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, self.transition.shape[0], (size,), generator=self.generator)
        for i in range(length):
            tokens[:, i + 1] = torch.multinomial(
                self.transition[tokens[:, i]], 1, generator=self.generator
            ).squeeze(1)
        return tokens


@dataclass(frozen=True)
class Result:
    sparsity: float  # achieved by finalize over the pruned Linear weights
    pattern: str | None  # the N:M pattern trained to, or None (unstructured)
    loss_start: float
    loss_end: float
    floor: float  # the true chain's loss on the held-out tokens
    report: fs.PrunerReport
    model: TinyGPT


def evaluate(model: nn.Module, tokens: Tensor) -> float:
    with torch.no_grad():
        logits = model(tokens[:, :-1])
        return float(F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()))


def run(
    sparsity: float = 0.8,
    steps: int = 200,
    batch: int = 32,
    seed: int = 0,
    pattern: str | None = None,
    p: float | None = None,
) -> Result:
    """Train and prune (to ``sparsity`` or an N:M ``pattern``); returns what the script prints.

    ``p`` is the operator's power (None: the default, 3; 1 is the soft threshold).
    """
    torch.manual_seed(seed)
    cfg = Config()
    model = TinyGPT(cfg)
    data = MarkovData(cfg.vocab, seed=seed)
    held_out = data.batch(256, cfg.context)
    loss_start = evaluate(model, held_out)

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    # An N:M pattern implies its sparsity (2:4 prunes half): pass one or the other.
    target: dict[str, Any] = {"pattern": pattern} if pattern else {"sparsity": sparsity}
    if p is not None:
        target["p"] = p
    pruner = fs.Pruner(
        model,
        **target,
        total_steps=steps,
        include=(nn.Linear,),  # the default also has Conv1d/2d/3d; Embedding is never included
        exclude=["head"],  # keep the language-model head dense ("re:<regex>" also works)
    )
    for _ in range(steps):
        tokens = data.batch(batch, cfg.context)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        pruner.step()  # after optimizer.step(), like an LR scheduler
    report = pruner.report()
    achieved = pruner.finalize()  # plain nn.Linear weights with exact zeros
    loss_end = evaluate(model, held_out)
    floor = data.loss_floor(held_out)
    return Result(achieved, pattern, loss_start, loss_end, floor, report, model)


def pruned_linears(model: TinyGPT) -> list[nn.Linear]:
    return [m for m in model.blocks.modules() if isinstance(m, nn.Linear)]


def nm_summary(model: TinyGPT, pattern: str) -> str:
    """Check the pattern in every group of the pruned layers and size its compact encoding."""
    n, m = (int(v) for v in pattern.split(":"))
    weights = [layer.weight.detach() for layer in pruned_linears(model)]
    worst = max(int((w.reshape(-1, m) != 0).sum(1).max()) for w in weights)
    if worst > n:
        raise AssertionError(f"a group of {m} holds {worst} nonzeros, more than {n}")
    compact = 0
    for w in weights:
        values, positions = fs.encode_nm(w.half(), pattern)
        compact += values.numel() * values.element_size() + positions.numel()
    dense = sum(w.numel() for w in weights) * 2
    return (
        f"every group of {m} holds at most {n} nonzeros; N:M encoding of the pruned "
        f"weights: {compact:,} bytes in fp16 against {dense:,} dense ({compact / dense:.3f})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sparsity", type=float, default=0.8, help="target sparsity (0.8)")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps (200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--p", type=float, default=None, help="operator power (default 3; 1 is the soft threshold)"
    )
    parser.add_argument(
        "--pattern", default=None, help="train to an N:M pattern instead, e.g. 2:4 (implies 0.5)"
    )
    args = parser.parse_args(argv)
    result = run(args.sparsity, args.steps, seed=args.seed, pattern=args.pattern, p=args.p)
    print(result.report.table())
    target = args.pattern or f"{args.sparsity:.0%}"
    print(
        f"\nsparsity of the pruned Linear layers: {result.sparsity:.2%} (target {target})\n"
        f"held-out loss: {result.loss_start:.3f} at init -> {result.loss_end:.3f} "
        f"(uniform guess {math.log(Config.vocab):.3f}, true chain {result.floor:.3f})"
    )
    if args.pattern:
        print(nm_summary(result.model, args.pattern))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
