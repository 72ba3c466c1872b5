"""BatchNorm after a pruned layer: how large the dense weights grow, with and without clipping.

A small ResNet-like CNN (a 3×3 stem, two depthwise-separable residual blocks,
each convolution followed by BatchNorm) trained for 40 steps of SGD (lr 0.05,
momentum 0.9) on one fixed random batch, three ways: without a Pruner, with a
Pruner to 90 % sparsity, and with the Pruner and gradient clipping at norm 3
(the paper's CIFAR recipe). Prints the last loss and the largest ``|w|`` of
each (``docs/guide/settings.md``, "BatchNorm after a pruned layer").

    python benchmarks/bench_bn_collapse.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse as fs

STEPS = 40


class Block(nn.Module):
    """A depthwise 3×3 and a pointwise convolution, each with BatchNorm, and a residual."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.pw = nn.Conv2d(c, c, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.bn2(self.pw(F.relu(self.bn1(self.dw(x))))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(32)
        self.blocks = nn.Sequential(Block(32), Block(32))
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(F.relu(self.bn(self.stem(x)))).mean((2, 3)))


def run(sparsity: float | None, clip: float | None) -> tuple[float, float]:
    """The last loss and the largest ``|w|`` after STEPS steps."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(64, 3, 16, 16), torch.randint(0, 10, (64,))
    pruner = None if sparsity is None else fs.Pruner(model, sparsity=sparsity, total_steps=STEPS)
    for _ in range(STEPS):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if pruner is not None:
            pruner.step()
    return float(loss), max(float(p.detach().abs().max()) for p in model.parameters())


def main() -> None:
    print("| training | last loss | largest abs(w) |\n|---|---:|---:|")
    for label, sparsity, clip in [
        ("no Pruner", None, None),
        ("Pruner to 90 %", 0.9, None),
        ("Pruner to 90 %, clip_grad_norm_ 3", 0.9, 3.0),
    ]:
        loss, largest = run(sparsity, clip)
        print(f"| {label} | {loss:.3f} | {largest:.1f} |")


if __name__ == "__main__":
    main()
