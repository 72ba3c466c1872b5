"""Side-by-side timing for the benchmark scripts, and the training step they time.

The machine is shared and noisy, so absolute times drift; what the scripts
report are ratios of medians measured in one run, with the candidates
interleaved round-robin so that a slow patch hits all of them alike.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import random
import statistics
import time
import timeit
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import feather_sparse


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """``--device``: where the timed tensors live (``cpu`` by default, or ``cuda``)."""
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu (default) or cuda / cuda:N; on a GPU every timing waits for the device",
    )


def resolve_device(name: str) -> torch.device:
    """The ``--device`` argument as a device, or exit with a message saying what is missing."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SystemExit(f"--device {name!r} is not a device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"--device {name}: this torch ({torch.__version__}) sees no CUDA device; "
            "run on a machine with an NVIDIA GPU and a CUDA build of torch, or use --device cpu"
        )
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"--device {name}: only cpu and cuda are timed here")
    return device


def timings(
    fns: dict[str, Callable[[], object]],
    repeats: int = 7,
    warmup: int = 2,
    device: torch.device | None = None,
    seed: int = 0,
) -> dict[str, list[float]]:
    """Seconds of each call of each function, measured interleaved round-robin
    (sample ``i`` of every function comes from the same round). Each round
    runs the functions in an order of its own (a seeded shuffle), so that no
    function always runs in the same place or right after the same one:
    measured on 2026-11-27, the same 2:4 step timed second or third after the
    dense CNN step differed by 0.8 ms (95 % interval 0.35 to 1.39) in a fixed
    order. On a CUDA
    ``device`` each timing starts and ends with the device idle, so that it
    counts the kernels a call queued and not only their launch."""
    if device is not None and device.type == "cuda":

        def sync() -> None:
            torch.cuda.synchronize(device)
    else:

        def sync() -> None:
            pass

    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    shuffle = random.Random(seed).shuffle
    for _ in range(repeats):
        shuffle(order)
        for name, fn in order:
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
    return times


def best_us(fn: Callable[[], object], number: int = 200) -> float:
    """Microseconds per call of ``fn``: the best of 5 runs of ``number`` calls (hot caches)."""
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def compare(
    fns: dict[str, Callable[[], object]],
    repeats: int = 7,
    warmup: int = 2,
    device: torch.device | None = None,
) -> dict[str, float]:
    """Median seconds of each function, measured interleaved (see :func:`timings`)."""
    times = timings(fns, repeats, warmup, device)
    return {name: statistics.median(ts) for name, ts in times.items()}


def paired_median_difference(
    a: list[float], b: list[float], boots: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """The median of the per-round differences ``a[i] − b[i]`` and its 95 %
    percentile-bootstrap interval: a claim that ``a`` is faster needs the
    whole interval below zero. The rounds pair the samples of :func:`timings`,
    so a slow patch of the machine that hits both cancels out."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(
            f"need two equally long series of at least 2 rounds, got {len(a)} and {len(b)}"
        )
    diffs = [x - y for x, y in zip(a, b)]
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(diffs, k=len(diffs))) for _ in range(boots))
    return statistics.median(diffs), medians[int(0.025 * boots)], medians[int(0.975 * boots) - 1]


def paired_median_ratio(
    a: list[float], b: list[float], boots: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """The median of the per-round ratios ``a[i] / b[i]`` and its 95 % percentile-bootstrap
    interval (as :func:`paired_median_difference`): a claim that ``a`` costs at most
    ``r`` times ``b`` needs the whole interval at or below ``r``."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(
            f"need two equally long series of at least 2 rounds, got {len(a)} and {len(b)}"
        )
    ratios = [x / y for x, y in zip(a, b)]
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(boots))
    return statistics.median(ratios), medians[int(0.025 * boots)], medians[int(0.975 * boots) - 1]


def train_step(
    model: nn.Module,
    pruner: feather_sparse.Pruner | None,
    x: torch.Tensor,
    y: torch.Tensor,
    micro: int = 1,
    swap: bool = False,
) -> Callable[[], None]:
    """One timed training step on a fixed batch: forward, cross-entropy, backward, SGD
    (momentum 0.9), then ``pruner.step()`` unless ``pruner`` is None (the dense baseline).
    ``micro`` > 1 splits the batch into that many micro-batches whose gradients are
    accumulated before the optimizer step (one forward and backward each). ``swap``:
    the forwards and backwards inside ``pruner.swapped()``."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    parts = list(zip(x.chunk(micro), y.chunk(micro)))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with pruner.swapped() if swap and pruner is not None else contextlib.nullcontext():
            for xs, ys in parts:
                F.cross_entropy(model(xs), ys).backward()
        opt.step()
        if pruner is not None:
            pruner.step()

    return step


def machine(device: torch.device | None = None) -> str:
    """One line naming the software and hardware the numbers come from (the GPU
    too, with its CUDA version, when ``device`` is one)."""
    threads = torch.get_num_threads()
    cpu = platform.processor() or platform.machine()
    line = (
        f"feather-sparse {feather_sparse.__version__}, torch {torch.__version__}, "
        f"Python {platform.python_version()}, {cpu}, {threads} threads"
    )
    if device is not None and device.type == "cuda":
        line += f", GPU {torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return line
