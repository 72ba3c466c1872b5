"""Size of N:M models in ``.fsp`` files: the ``nm+lzma`` records against the unstructured codecs.

For each bundled model and pattern: finalize ``Pruner(pattern=...)`` on the
freshly initialised model (seed 0; layers the pattern cannot take stay
dense), write it with :func:`feather_sparse.save_sparse` and read it back
bit for bit. Then, for the pruned weights only, the bytes of

- the dense fp32 tensors,
- the unstructured encoding (the better of ``gaps+lzma`` / ``bitmask+lzma``
  for the pattern, plus ``planes+zlib`` values), which is what a file held
  before N:M records existed,
- the N:M encoding of the trained pattern (``nm+lzma``: ``N`` values per
  group and their packed in-group positions, plus ``planes+zlib`` values),

and for the whole file: the dense fp32 ``state_dict`` bytes and the ``.fsp``
file (the writer keeps, per tensor, the smallest encoding), in fp32 and fp16
values.

    python benchmarks/bench_nm_fsp.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

import feather_sparse as fs
from _timing import machine
from feather_sparse.export import codec, load_sparse_state_dict, save_sparse
from feather_sparse.nm import NMPattern

EXCLUDE = {"mnist1d_cnn": ["features.0"], "mnist1d_mlpmixer": []}
PATTERNS = ("2:4", "1:4", "4:8")


def weight_bytes(weight: torch.Tensor, pattern: NMPattern) -> tuple[int, int]:
    """(unstructured, N:M) bytes of one pruned weight, both decoded back bit for bit."""
    nonzero = codec._bits(weight) != 0
    _, positions = codec._encode_pattern(nonzero.numpy())
    unstructured = len(positions) + len(codec._encode_values(weight.reshape(-1)[nonzero])[1])
    encoded = codec._encode_nm(weight, pattern)  # checks the bit-exact round trip itself
    assert encoded is not None, "a finalized N:M weight must encode as N:M"
    packed, values = encoded
    return unstructured, len(packed) + len(codec._encode_values(values)[1])


def main() -> None:
    print(machine())
    print()
    print(
        "| model | pattern | pruned weights | dense fp32 (B) | unstructured (B) | N:M (B) "
        "| N:M / unstructured | state_dict fp32 (B) | .fsp fp32 (B) | .fsp fp16 (B) "
        "| records N:M |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, exclude in EXCLUDE.items():
            for spec in PATTERNS:
                torch.manual_seed(0)
                model = fs.create_model(name)
                pruner = fs.Pruner(model, pattern=spec, exclude=exclude)
                modules = [t.module for t in pruner.targets]
                pruner.finalize()
                pattern = NMPattern.parse(spec)
                numel = unstructured = nm = 0
                for module in modules:
                    w = module.weight.detach()
                    numel += w.numel()
                    u, n = weight_bytes(w, pattern)
                    unstructured += u
                    nm += n
                state = model.state_dict()
                dense = sum(t.numel() * t.element_size() for t in state.values())
                sizes = {}
                for values in ("fp32", "fp16"):
                    path = Path(tmp) / f"{name}-{spec.replace(':', '-')}-{values}.fsp"
                    info = save_sparse(model, path, values=values)
                    sizes[values] = info.file_bytes
                    if values == "fp32":
                        back, _ = load_sparse_state_dict(path)
                        for key, t in state.items():
                            assert torch.equal(codec._bits(back[key]), codec._bits(t)), key
                        chosen = sum(r.nm_pattern is not None for r in info.tensors)
                        total = len(modules)
                print(
                    f"| {name} | {spec} | {numel:,} | {4 * numel:,} | {unstructured:,} | {nm:,} "
                    f"| {nm / unstructured:.3f} | {dense:,} | {sizes['fp32']:,} "
                    f"| {sizes['fp16']:,} | {chosen}/{total} |"
                )


if __name__ == "__main__":
    main()
