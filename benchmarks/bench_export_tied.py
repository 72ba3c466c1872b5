"""Size of a ``.fsp`` of a language model whose head is tied to its token embedding.

A GPT-2 of Hugging Face ``transformers`` (random initialisation, seeded),
pruned by the Pruner and finalized at each sparsity, is saved twice: as it
is (the tied weight stored once, its second key an alias record) and with
its head untied into a copy of the same values (every key stored, as files
before format version 3 held a tied model). Both files hold the same
values; the script checks that they load to the same tensors, and prints
their sizes and ``inspect``'s sparsity next to the sparsity ``finalize()``
reported.

Usage::

    PYTHONPATH=src python benchmarks/bench_export_tied.py [--vocab 50257] \
        [--width 256] [--layers 4] [--sparsities 0.5 0.9]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from torch import nn

import feather_sparse as fs
from _timing import machine
from feather_sparse.export import load_sparse_state_dict


def gpt2(vocab: int, width: int, layers: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab, n_embd=width, n_layer=layers, n_head=4, n_positions=256)
    return GPT2LMHeadModel(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.5, 0.9])
    args = parser.parse_args()
    print(machine())
    print(f"GPT-2: vocab {args.vocab}, width {args.width}, {args.layers} layers\n")
    print(
        "| sparsity | params | tied .fsp B | untied .fsp B | untied / tied "
        "| finalize() sparsity | inspect tied | inspect untied |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for sparsity in args.sparsities:
        model = gpt2(args.vocab, args.width, args.layers)
        achieved = fs.Pruner(model, sparsity, total_steps=1, schedule="constant").finalize()
        assert model.lm_head.weight is model.transformer.wte.weight
        with tempfile.TemporaryDirectory() as tmp:
            tied = fs.save_sparse(model, Path(tmp) / "tied.fsp")
            model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())
            untied = fs.save_sparse(model, Path(tmp) / "untied.fsp")
            a, _ = load_sparse_state_dict(tied.path)
            b, _ = load_sparse_state_dict(untied.path)
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        params = sum(p.numel() for p in model.parameters()) - model.lm_head.weight.numel()
        print(
            f"| {sparsity:.0%} | {params:,} | {tied.file_bytes:,} | {untied.file_bytes:,} "
            f"| {untied.file_bytes / tied.file_bytes:.2f}x | {achieved:.4f} "
            f"| {tied.sparsity:.4f} | {untied.sparsity:.4f} |"
        )


if __name__ == "__main__":
    main()
