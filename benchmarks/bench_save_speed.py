"""Time to write and read a ``.fsp`` against ``torch.save``/``torch.load`` of the same weights.

A stack of square Linear layers (``--layers`` × ``--width``², about 50M
weights by default) is pruned to ``--sparsity`` and finalized. Timed side by
side, interleaved (medians of ``--repeats``): ``save_sparse`` encoding its
tensors in one thread and in ``fsp.SAVE_THREADS`` threads (the default,
capped by ``torch.get_num_threads()``), ``torch.save`` of the state_dict,
``load_sparse`` and ``torch.load``. The files written with one and several
threads are checked to be the same bytes.

Usage::

    PYTHONPATH=src python benchmarks/bench_save_speed.py [--layers 12] [--width 2048] \
        [--sparsity 0.9] [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from torch import nn

import feather_sparse as fs
from _timing import compare, machine
from feather_sparse.export import fsp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(args.layers)])
    fs.Pruner(model, args.sparsity, total_steps=1, schedule="constant").finalize()
    state = model.state_dict()
    threads = min(fsp.SAVE_THREADS, torch.get_num_threads())
    print(machine())
    weights = sum(t.numel() for t in state.values())
    print(
        f"{args.layers} Linear layers of {args.width}², {weights:,} weights, "
        f"sparsity {args.sparsity}; save_sparse threads: 1 and {threads}\n"
    )

    with tempfile.TemporaryDirectory() as tmp:
        one, many, pt = Path(tmp) / "one.fsp", Path(tmp) / "many.fsp", Path(tmp) / "m.pt"

        def save_with(n: int, path: Path) -> None:
            saved = fsp.SAVE_THREADS
            fsp.SAVE_THREADS = n
            try:
                fs.save_sparse(model, path)
            finally:
                fsp.SAVE_THREADS = saved

        saves = compare(
            {
                "save_sparse, 1 thread": lambda: save_with(1, one),
                f"save_sparse, {threads} threads": lambda: save_with(threads, many),
                "torch.save(state_dict)": lambda: torch.save(state, pt),
            },
            repeats=args.repeats,
            warmup=1,
        )
        if one.read_bytes() != many.read_bytes():
            raise SystemExit("the files written with 1 and several threads differ")
        target = nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(args.layers)])
        loads = compare(
            {
                "load_sparse": lambda: fs.load_sparse(many, target),
                "torch.load": lambda: torch.load(pt, weights_only=True),
            },
            repeats=args.repeats,
            warmup=1,
        )
        sizes = {".fsp": many.stat().st_size, ".pt": pt.stat().st_size}

    base_save, base_load = saves["torch.save(state_dict)"], loads["torch.load"]
    print("| operation | median s | × torch.save / torch.load |")
    print("|---|---:|---:|")
    for name, seconds in saves.items():
        print(f"| {name} | {seconds:.2f} | {seconds / base_save:.1f} |")
    for name, seconds in loads.items():
        print(f"| {name} | {seconds:.2f} | {seconds / base_load:.1f} |")
    speedup = saves["save_sparse, 1 thread"] / saves[f"save_sparse, {threads} threads"]
    print(f"\nsave_sparse with {threads} threads: {speedup:.2f}× faster than with 1 (same bytes)")
    print(
        f"file sizes: .fsp {sizes['.fsp']:,} B, .pt {sizes['.pt']:,} B "
        f"({sizes['.pt'] / sizes['.fsp']:.1f}× smaller)"
    )


if __name__ == "__main__":
    main()
