"""What a run shows while it trains: the progress bar, the epoch line, the per-layer tables."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import torch
from torch import Tensor, nn

from feather_sparse.pruner import DEFAULT_INCLUDE

logger = logging.getLogger(__name__)

#: Without a progress bar, log an in-epoch line at most this often (seconds).
LOG_INTERVAL_S = 30.0

#: Refresh the bar's loss/accuracy (a host sync) this many times per epoch.
BAR_REFRESHES_PER_EPOCH = 20


class _Progress:
    """A per-epoch tqdm bar on a terminal; otherwise an occasional log line."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self.total = total
        self.desc = desc
        self.bar: Any = None
        self.last_log = time.monotonic()
        if enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(
                    total=total, desc=desc, leave=False, dynamic_ncols=True, file=sys.stderr
                )

    def update(self, done: int, stats: dict[str, str] | None) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if stats is not None:
                self.bar.set_postfix(stats, refresh=False)
        elif stats is not None and time.monotonic() - self.last_log >= LOG_INTERVAL_S:
            self.last_log = time.monotonic()
            text = " ".join(f"{k} {v}" for k, v in stats.items())
            logger.info("%s step %d/%d %s", self.desc, done, self.total, text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _use_bar(progress: bool | None) -> bool:
    if progress is not None:
        return progress
    return sys.stderr.isatty()


def _threshold_value(pruner: Any) -> float:
    """One number for the bar: the global threshold (the mean over layers otherwise)."""
    thresholds = pruner.thresholds()
    device = thresholds[0].device
    values = [t.detach().double().reshape(()).to(device) for t in thresholds]
    return float(torch.stack(values).mean())  # one host sync


def _dense_table(model: nn.Module) -> str:
    """A per-layer table of the dense model's prunable-type weights (for ``--dense``)."""
    lines = ["| layer | shape | params | sparsity |", "|---|---|---:|---:|"]
    total = zeros = 0
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, DEFAULT_INCLUDE) or not isinstance(weight, Tensor):
            continue
        n, z = weight.numel(), int((weight == 0).sum())
        total, zeros = total + n, zeros + z
        shape = "×".join(map(str, weight.shape))
        lines.append(f"| {name} | {shape} | {n:,} | {z / n:.2%} |")
    lines.append(f"| **total** | | {total:,} | {zeros / max(1, total):.2%} |")
    return "\n".join(lines)


def _threshold_label(pruner: Any) -> str:
    """``thr`` for a threshold; ``ramp`` for N:M, whose buffer holds the ramp r of ``r·T_g``."""
    return "ramp" if pruner is not None and pruner.pruner_config.pattern is not None else "thr"


def _log_epoch(row: dict[str, Any], epochs: int, threshold_label: str = "thr") -> None:
    test = (
        f"test loss {row['test_loss']:.4f} acc {100 * row['test_acc']:.2f}%"
        if "test_acc" in row
        else "test -"
    )
    logger.info(
        "epoch %d/%d  train loss %.4f acc %.2f%%  %s  sparsity %.4f  %s %.4g  lr %.4g  %.1fs",
        row["epoch"],
        epochs,
        row["train_loss"],
        100 * row["train_acc"],
        test,
        row["sparsity"],
        threshold_label,
        row["threshold"],
        row["lr"],
        row["epoch_time"],
    )
