"""Where the CPU overhead of an N:M training step goes, measured side by side.

``bench_nm_step.py`` gives the ratio of a 2:4 step to the dense one; this
script splits the difference into what the Pruner adds to a step, each part
timed on its own, all interleaved round-robin in one run:

- **N:M forward after an update**: every pruned layer's ``P_T(w)``
  recomputed because its weight changed, as after each optimizer step (the
  weights are negated in place to change their bits; the negation alone is
  timed as well and subtracted);
- **of which the operator's arithmetic**: the threshold selection and
  ``P_T`` on the same weights, without the parametrization around them;
- **of which `log` + `exp`**: one pass of each over that many weights (the
  operator's ``(·)^(1/p)`` is ``exp(log(·)/p)``);
- **reading the weights, nothing changed**: every pruned weight read again
  with no change in between: for the layers of the fused forward
  (``nm.fused``) the parametrization, the validity check and the autograd
  node only; a layer computed alone (the CNN's) computes it all again, as
  with one batch per step (its cache of repeated forwards is off here);
- **`pruner.step()`**.

"rest" is the overhead less the forward after an update and
``pruner.step()``: the backward's extra autograd nodes, and what the
Pruner's memory traffic costs the rest of the step (the activations'
cache), which no part times on its own.

    python benchmarks/bench_nm_breakdown.py [--models mnist1d_cnn mnist1d_mlpmixer] [--repeats 31]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

import feather_sparse as fs
from _timing import compare, machine
from bench_nm_step import EXCLUDE, fresh, make_step
from feather_sparse.nm import NMPattern, fused
from feather_sparse.nm.operator import _nm_forward


def parts(name: str) -> dict[str, Callable[[], object]]:
    """The timed functions: the two steps and the Pruner's parts."""
    dense, nm = fresh(name), fresh(name)
    steps = {
        "dense step": make_step(dense, None, 1),
        "2:4 step": make_step(nm, fs.Pruner(nm, pattern="2:4", exclude=EXCLUDE[name]), 1),
    }
    model = fresh(name)
    # The parts are timed as in training with one batch per step, where a layer
    # computed alone is computed at every forward: its repeat-triggered cache
    # (nm.fused.CACHE_ALONE), which the repeated reads here would switch on, stays off.
    saved, fused.CACHE_ALONE = fused.CACHE_ALONE, False
    try:
        pruner = fs.Pruner(model, pattern="2:4", exclude=EXCLUDE[name])
    finally:
        fused.CACHE_ALONE = saved
    layers = [t.module for t in pruner.targets]
    stored = pruner.weights()
    x = torch.randn(128, 1, 40)
    model(x).sum().backward()
    model(x)  # the second forward registers the fused layers

    def read() -> None:
        for m in layers:
            m.weight  # noqa: B018 - the parametrized read is what is timed

    @torch.no_grad()
    def negate() -> None:
        for w in stored:
            w.neg_()

    def update_and_read() -> None:
        negate()
        read()

    pattern = NMPattern(2, 4)
    ramp = torch.tensor(1.0)
    flat = torch.cat([w.detach().reshape(-1) for w in stored])
    scratch = torch.empty_like(flat)

    def operator() -> None:
        _nm_forward(flat.view(-1, 4), pattern, ramp, 3.0, None, None)

    def log_exp() -> None:
        torch.log(flat.abs(), out=scratch).exp_()

    return {
        **steps,
        "negate (subtracted)": negate,
        "N:M forward after an update": update_and_read,
        "operator arithmetic": operator,
        "log + exp": log_exp,
        "weights, nothing changed": read,
        "pruner.step()": pruner.step,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mnist1d_cnn", "mnist1d_mlpmixer"])
    parser.add_argument("--repeats", type=int, default=31)
    args = parser.parse_args()
    print(machine())
    print()
    print("| model | part | median (ms) | share of the overhead |")
    print("|---|---|---:|---:|")
    for name in args.models:
        t = {k: v * 1e3 for k, v in compare(parts(name), args.repeats, warmup=3).items()}
        overhead = t["2:4 step"] - t["dense step"]
        t["N:M forward after an update"] -= t.pop("negate (subtracted)")
        rest = overhead - t["N:M forward after an update"] - t["pruner.step()"]
        rows = [
            ("dense step", t["dense step"], ""),
            ("2:4 step", t["2:4 step"], ""),
            ("overhead (2:4 − dense)", overhead, "1.00"),
        ]
        for k, label in (
            ("N:M forward after an update", "N:M forward after an update"),
            ("operator arithmetic", "… of which the operator's arithmetic"),
            ("log + exp", "… … of which log + exp"),
            ("weights, nothing changed", "… reading the weights, nothing changed"),
            ("pruner.step()", "pruner.step()"),
        ):
            rows.append((label, t[k], f"{t[k] / overhead:.2f}"))
        rows.append(("rest (backward, cache effects)", rest, f"{rest / overhead:.2f}"))
        for part, ms, share in rows:
            print(f"| {name} | {part} | {ms:.3f} | {share} |")


if __name__ == "__main__":
    main()
