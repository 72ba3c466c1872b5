"""Dense vs CSR sparse inference at 90/95/98/99 % sparsity, measured in one run.

Times a 4096×4096 ``nn.Linear`` against ``SparseLinear`` (batch 1 and 64), the
bundled model (``mnist1d_cnn`` when ``feather_sparse.models`` has it) against
``to_sparse_inference`` with its default rules and with every eligible layer
forced sparse, and — to show where sparsity does not pay — a 3×3 convolution
computed as unfold + CSR matmul. Dense and sparse calls are interleaved and
the medians of the repeats compared, so slow drift on a shared machine
affects both alike.

Usage::

    PYTHONPATH=src python benchmarks/bench_sparse_inference.py [--threads 1] [--repeats 25]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from _models import prune_
from _timing import machine
from feather_sparse.export import SparseLinear, to_sparse_inference
from feather_sparse.export.inference import _to_csr_int32

SPARSITIES = (0.90, 0.95, 0.98, 0.99)
BATCHES = (1, 64)


def calls_per_sample(fn: Callable[[], object], target_s: float = 0.005) -> int:
    """How many calls make one timing sample last about ``target_s``."""
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    return max(1, min(1000, int(target_s / once)))


def compare(
    dense: Callable[[], object], sparse: Callable[[], object], repeats: int
) -> tuple[float, float]:
    """Median seconds per call of ``dense`` and ``sparse``, samples interleaved."""
    n_dense, n_sparse = calls_per_sample(dense), calls_per_sample(sparse)
    times: dict[str, list[float]] = {"dense": [], "sparse": []}
    for _ in range(repeats):
        for name, fn, n in (("dense", dense, n_dense), ("sparse", sparse, n_sparse)):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - start) / n)
    return statistics.median(times["dense"]), statistics.median(times["sparse"])


def row(label: str, sparsity: float, batch: int, dense_s: float, sparse_s: float) -> str:
    return (
        f"| {label} | {sparsity:.0%} | {batch} | {dense_s * 1e3:.3f} | {sparse_s * 1e3:.3f} "
        f"| {dense_s / sparse_s:.2f}x |"
    )


HEADER = (
    "| layer / model | sparsity | batch | dense ms | sparse ms | speed-up |\n"
    "|---|---|---|---|---|---|"
)


def bench_linear(repeats: int, batches: Sequence[int]) -> None:
    print("\n4096x4096 nn.Linear vs SparseLinear (CSR, int32 indices)\n")
    print(HEADER)
    for sparsity in SPARSITIES:
        linear = prune_(nn.Linear(4096, 4096), sparsity).eval()
        sparse = SparseLinear.from_dense(linear)
        for batch in batches:
            x = torch.randn(batch, 4096)
            torch.testing.assert_close(sparse(x), linear(x), rtol=1e-4, atol=1e-4)
            dense_s, sparse_s = compare(partial(linear, x), partial(sparse, x), repeats)
            print(row("Linear 4096x4096", sparsity, batch, dense_s, sparse_s))


def bench_conv3x3(repeats: int, batches: Sequence[int]) -> None:
    """A 3x3 conv as unfold + CSR matmul: the im2col copy eats the savings on CPU."""
    print("\n3x3 Conv2d 64->64 on 16x16 maps: dense vs unfold + CSR matmul\n")
    print(HEADER)
    for sparsity in SPARSITIES:
        conv = prune_(nn.Conv2d(64, 64, 3, padding=1), sparsity).eval()
        weight_csr = _to_csr_int32(conv.weight.detach().flatten(1))  # (64, 576)
        bias = conv.bias.detach().reshape(-1, 1)

        def sparse_conv(
            x: torch.Tensor, w: torch.Tensor = weight_csr, bias: torch.Tensor = bias
        ) -> torch.Tensor:
            n = x.shape[0]
            cols = F.unfold(x, 3, padding=1)  # (n, 576, 256)
            cols = cols.permute(1, 0, 2).reshape(576, -1)  # (576, n·256)
            out = torch.addmm(bias, w, cols)  # (64, n·256)
            return out.reshape(64, n, 16, 16).transpose(0, 1).contiguous()

        for batch in batches:
            x = torch.randn(batch, 64, 16, 16)
            torch.testing.assert_close(sparse_conv(x), conv(x), rtol=1e-4, atol=1e-4)
            dense_s, sparse_s = compare(partial(conv, x), partial(sparse_conv, x), repeats)
            print(row("Conv2d 3x3 64->64", sparsity, batch, dense_s, sparse_s))


def bench_model(name: str, repeats: int, batches: Sequence[int]) -> None:
    from feather_sparse.models import create_model, model_info

    shape = model_info(name).input_shape
    print(f"\n{name} (input {shape}): dense vs to_sparse_inference\n")
    print(HEADER)
    for sparsity in SPARSITIES:
        model = prune_(create_model(name), sparsity).eval()
        default = to_sparse_inference(model)
        forced = to_sparse_inference(model, min_sparsity=0.0, min_weights=0)
        converted = {
            "default rules": [
                n for n, m in default.named_modules() if "Sparse" in type(m).__name__
            ],
            "all eligible": [n for n, m in forced.named_modules() if "Sparse" in type(m).__name__],
        }
        for batch in batches:
            x = torch.randn(batch, *shape)
            for label, sparse_model in (("default rules", default), ("all eligible", forced)):
                if not converted[label]:
                    print(
                        f"| {name}, {label} | {sparsity:.0%} | {batch} | – | – "
                        "| no layer converted |"
                    )
                    continue
                torch.testing.assert_close(sparse_model(x), model(x), rtol=1e-4, atol=1e-4)
                dense_s, sparse_s = compare(partial(model, x), partial(sparse_model, x), repeats)
                print(row(f"{name}, {label}", sparsity, batch, dense_s, sparse_s))
        print(
            f"|  | {sparsity:.0%} | | | | sparse layers: {len(converted['default rules'])} "
            f"(default rules), {len(converted['all eligible'])} (all eligible) |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for both dense and sparse (default 1: see docs/benchmarks.md)",
    )
    parser.add_argument("--repeats", type=int, default=25, help="timing samples per case")
    parser.add_argument(
        "--batches", type=int, nargs="+", default=list(BATCHES), help="batch sizes (default 1 64)"
    )
    parser.add_argument("--only-linear", action="store_true", help="time the 4096x4096 Linear only")
    parser.add_argument(
        "--models",
        nargs="*",
        default=["mnist1d_cnn", "mobilenet_v1"],
        help="registered models to time (default: the bundled one, and MobileNet-v1, "
        "whose 1x1 convolutions are eligible)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"{machine()}, {os.cpu_count()} CPUs, repeats {args.repeats} (medians)")
    with torch.inference_mode():
        bench_linear(args.repeats, args.batches)
        if args.only_linear:
            return
        try:
            from feather_sparse.models import list_models
        except ImportError:
            print("\n(feather_sparse.models not available: models skipped)")
        else:
            for name in args.models:
                if name in list_models():
                    bench_model(name, args.repeats, args.batches)
                else:
                    print(f"\n(model {name!r} not registered: skipped)")
        bench_conv3x3(args.repeats, args.batches)


if __name__ == "__main__":
    main()
