"""Global threshold selection vs a full sort-based quantile (what the released code does).

Weights are laid out as many tensors of a real model's sizes. Two scenarios:
*cold* (no previous threshold) and *warm* (the previous threshold as a hint,
after every weight moved by a small SGD-like step, as between two training
iterations). The reference concatenates every |w|, sorts, and reads the
linearly interpolated quantile; ``kthvalue`` on the concatenation is shown too.

``--ties F`` adds a table for weights of which a fraction ``F`` share one
magnitude (0.5), the k-th inside that tie: the same selections, timed against
those on the weights without the tie in the same run, with the passes each
took. A tie larger than a pass may gather (4 M magnitudes) is the hard case.

    python benchmarks/bench_selection.py [--sizes 1.1 4.2 25.6] [--sparsity 0.9] [--device cuda]
    python benchmarks/bench_selection.py --sizes 25.6 --ties 0.9
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

from _timing import add_device_argument, compare, machine, resolve_device
from feather_sparse import selection
from feather_sparse.selection import count_at_most, select_threshold


def layer_sizes(total: int, n_layers: int = 50) -> list[int]:
    """Tensor sizes summing to ``total``, growing with depth like a CNN's."""
    raw = torch.linspace(1.0, 8.0, n_layers) ** 2
    sizes = (raw / raw.sum() * total).round().long().tolist()
    sizes[-1] += total - sum(sizes)
    return sizes


def sort_quantile(weights: list[torch.Tensor], s: float) -> torch.Tensor:
    mags = torch.cat([w.reshape(-1).abs() for w in weights])
    values = torch.sort(mags).values
    pos = s * (values.numel() - 1)
    lo = int(pos)
    hi = min(lo + 1, values.numel() - 1)
    return values[lo] + (pos - lo) * (values[hi] - values[lo])


def concat_kthvalue(weights: list[torch.Tensor], s: float) -> torch.Tensor:
    mags = torch.cat([w.reshape(-1).abs() for w in weights])
    return torch.kthvalue(mags, round(s * mags.numel())).values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=float, nargs="+", default=[1.1, 4.2, 25.6], help="millions")
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--ties", type=float, default=None, help="fraction of tied weights")
    add_device_argument(parser)
    args = parser.parse_args()
    device = resolve_device(args.device)
    s = args.sparsity
    if args.ties is not None:
        ties(args.sizes, args.ties, s, args.repeats, device)
        return
    # Where ours selects from one buffer (one process on a GPU), bucket narrowing,
    # which it replaced there, and a sort of the whole buffer (its first version,
    # before the window) are timed beside it.
    by_sort = device.type in selection.SORT_DEVICES
    print(f"# threshold selection at sparsity {s}; {machine(device)}\n")
    print(
        "| weights | sort quantile (ms) | cat+kthvalue (ms) | ours cold (ms) | ours warm (ms) "
        "| sort / cold | sort / warm | pruned count ours / sort-k |"
        + (
            " bucket narrowing warm (ms) | bucket / ours warm "
            "| whole-buffer sort warm (ms) | whole / ours warm |"
            if by_sort
            else ""
        )
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---|" + ("---:|---:|---:|---:|" if by_sort else ""))
    g = torch.Generator().manual_seed(0)
    for millions in args.sizes:
        n = round(millions * 1e6)
        weights = [
            torch.randn(k, generator=g) * (0.5 + i / 50) for i, k in enumerate(layer_sizes(n))
        ]
        t_prev = select_threshold(weights, s)
        # a training step moves every weight a little
        moved = [(w + 1e-3 * torch.randn(w.shape, generator=g)).to(device) for w in weights]
        t_prev = t_prev.to(device)
        times = compare(
            {
                "sort": lambda: sort_quantile(moved, s),
                "kth": lambda: concat_kthvalue(moved, s),
                "cold": lambda: select_threshold(moved, s),
                "warm": lambda: select_threshold(moved, s, hint=t_prev),
                **(
                    {
                        "bucket": patched(
                            lambda: select_threshold(moved, s, hint=t_prev),
                            SORT_DEVICES=frozenset(),
                        ),
                        "whole": patched(
                            lambda: select_threshold(moved, s, hint=t_prev),
                            WINDOW_MIN=float("inf"),
                        ),
                    }
                    if by_sort
                    else {}
                ),
            },
            repeats=args.repeats,
            device=device,
        )
        ours = select_threshold(moved, s, hint=t_prev)
        exact = concat_kthvalue(moved, s)
        assert torch.equal(ours, exact), (ours, exact)
        c_ours = count_at_most(moved, ours)
        c_sort = count_at_most(moved, exact)
        ms = {k: v * 1e3 for k, v in times.items()}
        print(
            f"| {millions}M | {ms['sort']:.1f} | {ms['kth']:.1f} "
            f"| {ms['cold']:.1f} | {ms['warm']:.1f} "
            f"| {times['sort'] / times['cold']:.1f}× | {times['sort'] / times['warm']:.1f}× "
            f"| {c_ours:,} / {c_sort:,} |"
            + (
                f" {ms['bucket']:.1f} | {times['bucket'] / times['warm']:.1f}× "
                f"| {ms['whole']:.1f} | {times['whole'] / times['warm']:.1f}× |"
                if by_sort
                else ""
            )
        )


def patched(fn: Callable[[], torch.Tensor], **settings: object) -> Callable[[], torch.Tensor]:
    """``fn`` run with these module settings of ``selection`` (``SORT_DEVICES=frozenset()``:
    bucket narrowing on every device; ``WINDOW_MIN=inf``: the sort path sorts everything)."""

    def run() -> torch.Tensor:
        saved = {name: getattr(selection, name) for name in settings}
        for name, value in settings.items():
            setattr(selection, name, value)
        try:
            return fn()
        finally:
            for name, value in saved.items():
                setattr(selection, name, value)

    return run


def passes(fn: Callable[[], torch.Tensor]) -> int:
    """How many passes over the weights one call of ``fn`` makes."""
    count = 0
    original = selection._window_pass

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal count
        count += 1
        return original(*args, **kwargs)

    selection._window_pass = counting
    try:
        fn()
    finally:
        selection._window_pass = original
    return count


def ties(sizes: list[float], fraction: float, s: float, repeats: int, device: torch.device) -> None:
    """Selections whose rank falls inside a tie of ``fraction`` of the weights, vs none."""
    print(f"# threshold inside a tie of {fraction:.0%} of the weights; {machine(device)}\n")
    print(
        "| weights | tied | no tie cold (ms) | tie cold (ms) | tie / no tie cold "
        "| no tie warm (ms) | tie warm (ms) | tie / no tie warm | passes tie cold / warm |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    g = torch.Generator().manual_seed(0)
    for millions in sizes:
        n = round(millions * 1e6)
        plain = [
            (torch.randn(k, generator=g) * (0.5 + i / 50)).to(device)
            for i, k in enumerate(layer_sizes(n))
        ]
        tied = []
        for w in plain:
            w = w.clone()
            w[torch.rand(w.shape, generator=g).to(device) < fraction] = 0.5
            tied.append(w)
        below = sum(int((w.abs() < 0.5).sum()) for w in tied)
        count = sum(int((w.abs() == 0.5).sum()) for w in tied)
        q = (below + count // 2) / n  # the middle of the tie
        hint_plain = select_threshold(plain, q)
        times = compare(
            {
                "plain cold": lambda: select_threshold(plain, q),
                "tie cold": lambda: select_threshold(tied, q),
                "plain warm": lambda: select_threshold(plain, q, hint=hint_plain),
                "tie warm": lambda: select_threshold(tied, q, hint=0.5),
            },
            repeats=repeats,
            device=device,
        )
        assert float(select_threshold(tied, q)) == 0.5
        cold = passes(lambda: select_threshold(tied, q))
        warm = passes(lambda: select_threshold(tied, q, hint=0.5))
        ms = {k: v * 1e3 for k, v in times.items()}
        print(
            f"| {millions}M | {count:,} | {ms['plain cold']:.1f} | {ms['tie cold']:.1f} "
            f"| {times['tie cold'] / times['plain cold']:.2f}× "
            f"| {ms['plain warm']:.1f} | {ms['tie warm']:.1f} "
            f"| {times['tie warm'] / times['plain warm']:.2f}× | {cold} / {warm} |"
        )


if __name__ == "__main__":
    main()
