"""Size of a sparse checkpoint against the per-layer entropy bound, at 90/95/98/99 %.

The bound is ``Σ_l H(d_l)·N_l + 32·nnz`` bits (plus the bytes of tensors stored
dense): ``H(d)·N`` bits is the least any lossless coder needs on average for an
i.i.d. pattern of density ``d``, and ``32·nnz`` is the raw float32 values. The
file also entropy-codes the values (byte planes + zlib, lossless), so it can
land below the bound; the columns split the two parts (patterns against
``H(d)·N``, values against raw). For comparison the script prints the issue's
two reference encodings — the bit mask compressed with the standard library's
zlib plus raw values, and plain int64 COO (indices and a value per non-zero) —
and the file size with float16 values. Patterns here come from magnitude
pruning of random (Gaussian, σ = 0.02) weights, so they are i.i.d.: the hardest
case for the pattern coder relative to the bound.

Usage::

    PYTHONPATH=src python benchmarks/bench_export_size.py [--size 2048] \
        [--models mnist1d_cnn resnet20]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch
from torch import nn

from _models import prune_
from _timing import machine
from feather_sparse.export import save_sparse

SPARSITIES = (0.90, 0.95, 0.98, 0.99)


def entropy_bound_bytes(state: dict[str, torch.Tensor]) -> float:
    """``Σ H(d)·N/8 + 4·nnz`` over float tensors with zeros, plus the others' dense bytes."""
    total = 0.0
    for t in state.values():
        n, nnz = t.numel(), int(torch.count_nonzero(t))
        if t.is_floating_point() and nnz < n:
            d = nnz / n
            h = -(d * math.log2(d) + (1 - d) * math.log2(1 - d)) if nnz else 0.0
            total += h * n / 8 + t.element_size() * nnz
        else:
            total += n * t.element_size()
    return total


def reference_sizes(state: dict[str, torch.Tensor]) -> tuple[int, int]:
    """Bytes of (zlib-9 bit mask + fp32 values, int64 COO) for the tensors with zeros."""
    zlib_bytes = coo_bytes = 0
    for t in state.values():
        nnz = int(torch.count_nonzero(t))
        if t.is_floating_point() and nnz < t.numel():
            mask = (t != 0).reshape(-1).numpy()
            zlib_bytes += len(zlib.compress(np.packbits(mask).tobytes(), 9)) + 4 * nnz
            coo_bytes += nnz * (t.dim() * 8 + 4)
        else:
            zlib_bytes += t.numel() * t.element_size()
            coo_bytes += t.numel() * t.element_size()
    return zlib_bytes, coo_bytes


def measure(label: str, model: nn.Module, workdir: Path) -> str:
    state = {k: v.detach() for k, v in model.state_dict().items()}
    dense = sum(t.numel() * t.element_size() for t in state.values())
    start = time.perf_counter()
    info = save_sparse(model, workdir / "m.fsp")
    seconds = time.perf_counter() - start
    half = save_sparse(model, workdir / "h.fsp", values="fp16").file_bytes
    bound = entropy_bound_bytes(state)
    zlib_bytes, coo_bytes = reference_sizes(state)
    sparse = [r for r in info.tensors if r.is_sparse]
    pattern = sum(r.pattern_bytes for r in sparse) / sum(r.pattern_entropy_bytes for r in sparse)
    values = sum(sum(r.value_planes) for r in sparse) / sum(r.raw_value_bytes for r in sparse)
    return (
        f"| {label} | {info.sparsity:.1%} | {dense:,} | {info.file_bytes:,} | {bound:,.0f} "
        f"| **{info.file_bytes / bound:.3f}** | {pattern:.3f} | {values:.3f} "
        f"| {zlib_bytes / bound:.3f} | {coo_bytes / bound:.2f} "
        f"| {dense / info.file_bytes:.1f}x | {half:,} | {seconds:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=2048, help="the random Linear is size x size")
    parser.add_argument(
        "--models",
        nargs="*",
        default=["mnist1d_cnn", "resnet20"],
        help="registered models to measure too (pruned per layer by magnitude)",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"{machine()}\n")
    print(
        "| tensors | sparsity | dense B | .fsp B | bound B | .fsp / bound | patterns / H(d)·N "
        "| values / raw | zlib mask + raw values / bound | int64 COO / bound | dense / .fsp "
        "| .fsp fp16 B | save s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        from feather_sparse.models import create_model, list_models

        models = [name for name in args.models if name in list_models()]
    except ImportError:  # the model zoo is not there
        models = []
    with tempfile.TemporaryDirectory() as tmp:
        for sparsity in SPARSITIES:
            linear = nn.Linear(args.size, args.size, bias=False)
            nn.init.normal_(linear.weight, std=0.02)
            print(measure(f"Linear {args.size}x{args.size}", prune_(linear, sparsity), Path(tmp)))
            for name in models:
                model = prune_(create_model(name), sparsity)
                print(measure(name, model, Path(tmp)))


if __name__ == "__main__":
    main()
