"""What a fused native 2:4 kernel would buy the CPU step, and what it would cost in bits.

A prototype, not part of the library: a C function, compiled here with the
system's C compiler (``cc -O3 -march=native -ffast-math``, loops vectorised
with glibc's vector ``logf``/``expf``) and called through ``ctypes``, computes
Feather's 2:4 forward (p = 3) in two passes over the weights — each group's
threshold, then ``P_T(w)`` with the library's formula — instead of the
library's ~20 eager kernels. The script

1. compares its output with the library's ``_nm_forward`` on a bundled
   model's 2:4 weights: the same weights pruned (exact zeros), how many kept
   values differ in their bits, and by how many units in the last place;
2. times both (best of 5 × 200 calls, hot caches);
3. times the training step inside ``pruner.swapped()`` as the CLI runs it,
   with the library's fused pass and with the prototype substituted for it,
   beside the dense step, interleaved round-robin (paired differences with
   95 % bootstrap intervals).

``-ffast-math`` lets the compiler reassociate and use approximate vector
functions: the prototype's bits are not the library's, and it does not
handle NaN or infinite weights. It measures the speed a fused kernel could
reach on this CPU, for the decision whether the stored bits may change.

    OMP_NUM_THREADS=1 python benchmarks/bench_nm_native.py [--model mnist1d_mlpmixer] [--rounds 41]
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

import feather_sparse as fs
from _timing import best_us, machine, paired_median_difference, timings, train_step
from bench_nm_step import EXCLUDE, batch, fresh
from feather_sparse.nm import fused, operator

SOURCE = r"""
#include <math.h>
#include <float.h>

/* Feather's 2:4 forward, p = 3, float32: out = P_T(w) with T the group's second
   smallest magnitude times ramp; aux = the thresholds (one per group). */
void feather_2_4(const float *w, float *out, float *aux, float *wide, long groups,
                 float ramp) {
    for (long g = 0; g < groups; ++g) {
        const float *x = w + 4 * g;
        float a0 = fabsf(x[0]), a1 = fabsf(x[1]), a2 = fabsf(x[2]), a3 = fabsf(x[3]);
        float lows = fmaxf(fminf(a0, a1), fminf(a2, a3));
        float highs = fminf(fmaxf(a0, a1), fmaxf(a2, a3));
        float t = fminf(lows, highs) * ramp;
        aux[g] = t;
        wide[4 * g] = t; wide[4 * g + 1] = t; wide[4 * g + 2] = t; wide[4 * g + 3] = t;
    }
    long n = 4 * groups;
    for (long i = 0; i < n; ++i) {
        float x = w[i], t = wide[i];
        float a = fabsf(x);
        float u = a <= t ? 1.0f : 0.0f;       /* pruned */
        float ap = a + u;                      /* never 0/0 */
        float d = (a - t) / ap;                /* 1 - r */
        float r = t / ap;
        float h = 1.0f + (1.0f + r) * r;       /* 1 + r + r^2 */
        float y = fmaxf(d * h, FLT_MIN);       /* 1 - r^3 */
        float v = expf(logf(y) * (1.0f / 3.0f)) * x;
        out[i] = v - v * u;
    }
}
"""


def build(directory: Path) -> ctypes.CDLL | None:
    """Compile the prototype; None where no C compiler is found."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    source = directory / "nm_native.c"
    library = directory / "nm_native.so"
    source.write_text(SOURCE)
    flags = ["-O3", "-march=native", "-ffast-math", "-fPIC", "-shared"]
    subprocess.run([compiler, *flags, "-o", str(library), str(source), "-lmvec", "-lm"], check=True)
    lib = ctypes.CDLL(str(library))
    lib.feather_2_4.restype = None
    lib.feather_2_4.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long, ctypes.c_float]
    return lib


def native_forward(lib: ctypes.CDLL) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A stand-in for ``_nm_forward`` that runs the prototype where it applies."""
    library_forward = operator._nm_forward

    def forward(
        w: torch.Tensor,
        pattern: operator.NMPattern,
        ramp: torch.Tensor,
        p: float,
        mask: torch.Tensor | None,
        scale: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        plain = (pattern.n, pattern.m, p) == (2, 4, 3.0) and mask is None and scale is None
        if not (plain and w.dtype == torch.float32 and w.is_contiguous() and ramp.dim() == 0):
            return library_forward(w, pattern, ramp, p, mask, scale)
        groups = w.numel() // 4
        out = torch.empty_like(w)
        aux = torch.empty(groups, 1)
        wide = torch.empty(groups * 4)
        lib.feather_2_4(
            w.data_ptr(), out.data_ptr(), aux.data_ptr(), wide.data_ptr(), groups, float(ramp)
        )
        return out, aux

    return forward


@contextmanager
def substituted(forward: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> Iterator[None]:
    """The fused pass computes with ``forward`` while the context is open."""
    saved = fused._nm_forward
    fused._nm_forward = forward
    try:
        yield
    finally:
        fused._nm_forward = saved


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Units in the last place between float32 tensors of one sign."""
    return (a.view(torch.int32).long() - b.view(torch.int32).long()).abs()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mnist1d_mlpmixer")
    parser.add_argument("--rounds", type=int, default=41)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(Path(tmp))
        if lib is None:
            print("no C compiler (cc or gcc) found: the prototype cannot be built")
            return
        forward = native_forward(lib)
        print(machine())
        model = fresh(args.model)
        pruner = fs.Pruner(model, pattern="2:4", exclude=EXCLUDE[args.model])
        with torch.no_grad():
            flat = torch.cat([w.reshape(-1) for w in pruner.weights()]).view(-1, 4)
        pattern = operator.NMPattern.parse("2:4")
        one = torch.ones(())
        ours, _ = operator._nm_forward(flat, pattern, one, 3.0, None, None)
        theirs, _ = forward(flat, pattern, one, 3.0, None, None)
        same_zeros = torch.equal(ours == 0, theirs == 0)
        kept = ours != 0
        diff = ulps(ours[kept], theirs[kept])
        print(f"\n{args.model}: {flat.numel():,} weights in its 2:4 layers")
        print(f"- the same weights pruned to exact zeros: {same_zeros}")
        print(
            f"- kept values with other bits: {int((diff > 0).sum()):,} of {int(kept.sum()):,}; "
            f"at most {int(diff.max())} units in the last place"
        )
        us_ours = best_us(lambda: operator._nm_forward(flat, pattern, one, 3.0, None, None))
        us_theirs = best_us(lambda: forward(flat, pattern, one, 3.0, None, None))
        print(
            f"- the forward of all of them: {us_ours:.0f} µs (library) against "
            f"{us_theirs:.0f} µs (prototype)\n"
        )

        x, y = batch()
        steps: dict[str, Callable[[], None]] = {"dense": train_step(fresh(args.model), None, x, y)}
        for label in ("library", "prototype"):
            m = fresh(args.model)
            p = fs.Pruner(m, pattern="2:4", exclude=EXCLUDE[args.model])
            steps[label] = train_step(m, p, x, y, swap=True)
        own_model_step = steps["prototype"]  # its own model, the substitution around it
        steps["prototype"] = lambda: _with(forward, own_model_step)
        seconds = timings(steps, repeats=args.rounds, warmup=3)
        times = {label: [t * 1e3 for t in ts] for label, ts in seconds.items()}
        dense = statistics.median(times["dense"])
        print("| variant | median step (ms) | × dense | minus the library's (ms; 95 % interval) |")
        print("|---|---:|---:|---|")
        for label, text in (
            ("dense", "dense"),
            ("library", "2:4, swapped(), the library's forward"),
            ("prototype", "2:4, swapped(), the native prototype"),
        ):
            median = statistics.median(times[label])
            diff_text = "—"
            if label == "prototype":
                d, lo, hi = paired_median_difference(times[label], times["library"])
                diff_text = f"{d:+.2f} ({lo:+.2f} to {hi:+.2f})"
            print(f"| {text} | {median:.2f} | {median / dense:.3f} | {diff_text} |")


def _with(
    forward: Callable[..., tuple[torch.Tensor, torch.Tensor]], step: Callable[[], None]
) -> None:
    with substituted(forward):
        step()


if __name__ == "__main__":
    main()
