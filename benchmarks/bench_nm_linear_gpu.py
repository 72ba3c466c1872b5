"""A 2:4 semi-structured sparse Linear against the dense one on a CUDA GPU.

Times ``F.linear`` with the weight as ``torch.sparse.to_sparse_semi_structured``
(NVIDIA's sparse tensor cores, Ampere or newer) against the dense fp16/bf16
weight, forward and forward+backward (gradient of the input; the sparse
weight is frozen, as at inference or in a frozen-mask fine-tune), at the
Linear shapes of real models. The forward is timed under ``torch.no_grad()``
(inference), the forward+backward with the input requiring its gradient.
One table per number of tokens (rows of the input). Prints the device name
and the ratios measured in one run, with CUDA events; without CUDA it says
so and exits.

    python benchmarks/bench_nm_linear_gpu.py [--tokens 4096 32768] [--dtype float16] \
        [--repeats 50]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

import feather_sparse as fs
from feather_sparse.nm import nm_threshold
from feather_sparse.nm.export import _semi_structured_backend

#: (model, layer, out_features, in_features)
SHAPES = [
    ("BERT-base", "FFN up", 3072, 768),
    ("BERT-base", "FFN down", 768, 3072),
    ("ViT-L/16", "FFN up", 4096, 1024),
    ("LLaMA-2-7B", "attention q/k/v/o", 4096, 4096),
    ("LLaMA-2-7B", "MLP gate/up", 11008, 4096),
    ("LLaMA-2-7B", "MLP down", 4096, 11008),
]


def cuda_time(fn: Callable[[], object], repeats: int, warmup: int = 10) -> float:
    """Median milliseconds of ``fn`` on the current CUDA stream."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens", type=int, nargs="+", default=[4096], help="rows of the input (a table each)"
    )
    parser.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this benchmark needs an NVIDIA GPU (compute capability >= 8.0)")
        return 0
    # cuSPARSELt, or CUTLASS where torch lacks it (8.x GPUs only): fs.to_semi_structured's
    # choice. Where neither runs, say why before any kernel fails halfway through the table.
    try:
        backend = _semi_structured_backend()
    except RuntimeError as err:
        print(f"bench_nm_linear_gpu: {err}", file=sys.stderr)
        return 1
    dtype = getattr(torch, args.dtype)
    print(f"feather-sparse {fs.__version__}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    for tokens in args.tokens:
        _table(backend, dtype, args.dtype, tokens, args.repeats)
    return 0


def _table(backend: type, dtype: torch.dtype, dtype_name: str, tokens: int, repeats: int) -> None:
    """One table: every shape at ``tokens`` rows of input."""
    print(
        f"device: {torch.cuda.get_device_name()}, {dtype_name}, {tokens} tokens, "
        f"{backend.BACKEND} kernels\n"
    )
    print(
        "| model | layer | out × in | fwd dense (ms) | fwd 2:4 (ms) | fwd speed-up "
        "| fwd+bwd dense (ms) | fwd+bwd 2:4 (ms) | fwd+bwd speed-up |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    torch.manual_seed(0)
    for model, layer, out_f, in_f in SHAPES:
        w = nm_threshold(torch.randn(out_f, in_f, device="cuda"), "2:4", p=float("inf"))
        w = w.to(dtype)
        sparse = backend.from_dense(w)
        x = torch.randn(tokens, in_f, device="cuda", dtype=dtype, requires_grad=True)
        g = torch.randn(tokens, out_f, device="cuda", dtype=dtype)

        def fwd(weight: torch.Tensor) -> Callable[[], object]:
            def run() -> object:
                with torch.no_grad():  # inference: no graph recorded for the input
                    return F.linear(x, weight)

            return run

        def fwd_bwd(weight: torch.Tensor) -> Callable[[], object]:
            def step() -> None:
                x.grad = None
                F.linear(x, weight).backward(g)

            return step

        row = [cuda_time(fwd(w), repeats), cuda_time(fwd(sparse), repeats)]
        dense_bwd = cuda_time(fwd_bwd(w), repeats)
        try:
            sparse_bwd = cuda_time(fwd_bwd(sparse), repeats)
            bwd = f"{dense_bwd:.3f} | {sparse_bwd:.3f} | {dense_bwd / sparse_bwd:.2f}×"
        except (RuntimeError, NotImplementedError) as err:  # no transposed copy of the weight
            bwd = f"{dense_bwd:.3f} | unsupported ({type(err).__name__}) | –"
        print(
            f"| {model} | {layer} | {out_f} × {in_f} | {row[0]:.3f} | {row[1]:.3f} "
            f"| {row[0] / row[1]:.2f}× | {bwd} |"
        )
    print()


if __name__ == "__main__":
    sys.exit(main())
