"""Size of N:M weights in the compact encoding (encode_nm) against dense fp32 and fp16.

For each bundled model and pattern: finalize ``Pruner(pattern=...)`` on the
freshly initialised model, encode every pruned weight with
:func:`feather_sparse.nm.encode_nm` (kept values + packed in-group
positions), check that decoding gives the weights back bit for bit, and
print the bytes of the prunable weights in each format. Layers the pattern
cannot take stay dense and are not counted.

    python benchmarks/bench_nm_size.py
"""

from __future__ import annotations

import torch
from torch import nn

import feather_sparse as fs
from _timing import machine
from feather_sparse.nm import decode_nm, encode_nm

EXCLUDE = {"mnist1d_cnn": ["features.0"], "mnist1d_mlpmixer": []}


def main() -> None:
    print(machine())
    print()
    print(
        "| model | pattern | weights | dense fp32 (B) | dense fp16 (B) | N:M fp32 (B) "
        "| N:M fp16 (B) | fp16 N:M / dense |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, exclude in EXCLUDE.items():
        for spec in ("2:4", "4:8", "1:4"):
            torch.manual_seed(0)
            model = fs.create_model(name)
            pruner = fs.Pruner(model, pattern=spec, exclude=exclude)
            modules = [t.module for t in pruner.targets]
            pruner.finalize()
            numel = nm32 = nm16 = 0
            for m in modules:
                w = m.weight.detach()
                assert isinstance(m, nn.Linear | nn.Conv1d)
                numel += w.numel()
                for dtype in (torch.float32, torch.float16):
                    wd = w.to(dtype)
                    values, indices = encode_nm(wd, spec)
                    back = decode_nm(values, indices, wd.shape, spec)
                    assert torch.equal(back.view(torch.uint8), wd.view(torch.uint8))
                    size = values.numel() * values.element_size() + indices.numel()
                    if dtype == torch.float32:
                        nm32 += size
                    else:
                        nm16 += size
            print(
                f"| {name} | {spec} | {numel:,} | {4 * numel:,} | {2 * numel:,} | {nm32:,} "
                f"| {nm16:,} | {nm16 / (2 * numel):.3f} |"
            )


if __name__ == "__main__":
    main()
