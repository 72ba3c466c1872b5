"""Feather's N:M forward as one native function, giving torch's bits.

The library's CPU forward of finite ``p`` (:func:`feather_sparse.ops._block`
after the per-group selection) is some twenty torch kernels over the
weights. This module computes the same ``P_T(w)`` and thresholds in one C
function that walks the weights in blocks of 2,048 (the block's temporaries
stay in the L1 cache): per group the ``(m − n)``-th smallest magnitude times
the ramp, then per weight the same IEEE operations in the same order as the
torch kernels — one fused multiply-add where torch's ``addcmul`` kernel
fuses, plain operations elsewhere, no reassociation (``-ffp-contract=off``)
— and for ``log`` and ``exp`` the very functions torch calls on this build
(MKL's ``vmsLn``/``vmsExp`` in high-accuracy mode, taken from
``libtorch_cpu``). The result is torch's bits, not an approximation of them:

* on the first use the function is compiled with the system's C compiler
  (``$CC``, else ``cc``/``gcc``/``clang``) into the user cache
  (:func:`feather_sparse.data.cache_dir`, ``native/``), named by a hash of the
  source, flags and compiler, and reused afterwards;
* before it is used it must reproduce, bit for bit, the torch computation
  on a probe of several thousand weights (ties, zeros, subnormal and large
  magnitudes, partial blocks, ramps 0, 0.5 and 1, ``p`` 2 to 5, the 1:4,
  2:4 and 4:8 patterns); any difference, a missing compiler, a build
  without MKL's functions or a failed build turns it off, with the reason
  in :func:`status`, and the torch kernels compute as before;
* a weight that is not finite sends its whole tensor to the torch kernels
  (NaN and infinities follow torch's rules there).

So whether it runs changes the speed, never a bit: every stored result,
resume and ``.fsp`` file is the same either way. Measured
(``benchmarks/bench_nm_native.py``, docs/benchmarks-nm.md): the mixer's
100,992 2:4 weights in 0.20 ms against 0.74 ms with one thread.

It serves float32 weights on the CPU with an integer ``p`` from 2 to 16
(Feather's default 3), groups of at most 32 and one ramp for the whole
tensor; everything else (half and double weights, ``p = 1``, ``∞`` or
fractional, GPUs, ``torch.compile``/tracing, ``torch.func``) takes the torch
kernels. It runs on one thread: where torch has more than
:data:`MAX_THREADS` threads, tensors over :data:`SERIAL_NUMEL` weights take
torch's parallel kernels instead. ``FEATHER_SPARSE_NATIVE=0`` turns it
off.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["ENV", "MAX_THREADS", "SERIAL_NUMEL", "forward", "status"]

#: Set to ``0`` to compute with the torch kernels only (read at the first use).
ENV = "FEATHER_SPARSE_NATIVE"

#: With more than this many torch threads, tensors over :data:`SERIAL_NUMEL`
#: weights take torch's parallel kernels (the native function runs on one
#: thread; on this 2-core machine it beat torch's kernels on 2 threads by
#: 1.2-1.5x for 2^17 to 2^22 weights, and torch's scale with more threads).
MAX_THREADS = 2

#: Torch's own kernels run on one thread up to this many elements (its grain size).
SERIAL_NUMEL = 1 << 15

#: MKL's VML mode as torch's ``at::vml`` passes it: high accuracy, denormals kept, no errno.
_VML_MODE = 0x2 | 0x140000 | 0x100

SOURCE = r"""
/* Feather's N:M forward (feather_sparse.nm.native): torch's operations, in torch's order. */
#include <float.h>
#include <math.h>

typedef void (*vml_fn)(int n, const float *a, float *r, long long mode);

#define BLOCK 2048
/* min and max of magnitudes that are finite and never -0: plain comparisons */
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) < (b) ? (b) : (a))
#ifdef FEATHER_FMA
#define HORNER(h, r) fmaf((h), (r), 1.0f) /* torch's addcmul kernel, fused */
#else
#define HORNER(h, r) (1.0f + (h) * (r))
#endif

/* The (k)-th smallest magnitude of each group of m, times ramp, into aux and wide. */
static void thresholds(const float *x, float *aux, float *wide, long groups, int m, int k,
                       float ramp) {
    if (m == 4 && k == 1) {
        for (long g = 0; g < groups; ++g) {
            const float a0 = fabsf(x[4 * g]), a1 = fabsf(x[4 * g + 1]);
            const float a2 = fabsf(x[4 * g + 2]), a3 = fabsf(x[4 * g + 3]);
            const float lows = MAX(MIN(a0, a1), MIN(a2, a3));
            const float highs = MIN(MAX(a0, a1), MAX(a2, a3));
            aux[g] = MIN(lows, highs) * ramp;
        }
    } else {
        for (long g = 0; g < groups; ++g) {
            float s[32];
            for (int j = 0; j < m; ++j) s[j] = fabsf(x[g * m + j]);
            for (int i = 1; i < m; ++i) { /* insertion sort: the k-th value is unique */
                const float v = s[i];
                int j = i - 1;
                while (j >= 0 && s[j] > v) {
                    s[j + 1] = s[j];
                    --j;
                }
                s[j + 1] = v;
            }
            aux[g] = s[k] * ramp;
        }
    }
    for (long g = 0; g < groups; ++g)
        for (int j = 0; j < m; ++j) wide[g * m + j] = aux[g];
}

/* clamp_min(1 - r^p, tiny) of one weight x with threshold t, and [|x| <= t] into *pruned */
static inline float one_minus_rp(float x, float t, int p, float *pruned) {
    float a = fabsf(x);                       /* |w| */
    const float u = a <= t ? 1.0f : 0.0f;     /* [|w| <= T] */
    float d = a - t;                          /* |w| - T */
    a = a + u;                                /* never 0/0 */
    d = d / a;                                /* 1 - r */
    const float r = t / a;                    /* r = T/|w| */
    float h = r + 1.0f;
    for (int e = 2; e < p; ++e) h = HORNER(h, r);
    d = d * h;                                /* 1 - r^p */
    *pruned = u;
    return d > FLT_MIN ? d : FLT_MIN;         /* clamp_min(tiny) */
}

/* out = P_T(w), aux = T per group; 1 (and nothing usable) if a weight is not finite. */
int feather_nm_forward(const float *w, float *out, float *aux, long groups, int m, int k,
                       float ramp, int p, float inv_p, void *ln, void *ex, long long mode) {
    vml_fn vml_ln = (vml_fn)ln, vml_exp = (vml_fn)ex;
    float y[BLOCK], u[BLOCK], t[BLOCK];
    const long per = BLOCK / m;
    for (long g0 = 0; g0 < groups; g0 += per) {
        const long gs = groups - g0 < per ? groups - g0 : per;
        const int c = (int)(gs * m);
        const float *x = w + g0 * m;
        int bad = 0;
        for (int i = 0; i < c; ++i) bad |= !(fabsf(x[i]) <= FLT_MAX);
        if (bad) return 1;
        thresholds(x, aux + g0, t, gs, m, k, ramp);
        if (p == 3) { /* Feather's default: its own loop, which the compiler vectorises */
            for (int i = 0; i < c; ++i) y[i] = one_minus_rp(x[i], t[i], 3, &u[i]);
        } else {
            for (int i = 0; i < c; ++i) y[i] = one_minus_rp(x[i], t[i], p, &u[i]);
        }
        vml_ln(c, y, y, mode);
        for (int i = 0; i < c; ++i) y[i] = y[i] * inv_p;
        vml_exp(c, y, y, mode);
        float *o = out + g0 * m;
        for (int i = 0; i < c; ++i) {
            const float v = y[i] * x[i];
            o[i] = v + (-1.0f * v) * u[i];                /* addcmul(v, v, u, value=-1) */
        }
    }
    return 0;
}
"""


@dataclass(frozen=True)
class _Kernel:
    function: ctypes._CFuncPtr  # type: ignore[name-defined]
    ln: int
    exp: int
    fused: bool  # torch's addcmul kernel is one fused multiply-add
    path: Path


_lock = threading.Lock()
_kernel: _Kernel | None = None
_reason: str | None = None  # why there is no kernel; None: not tried yet (or on)


def status() -> str:
    """Whether the native N:M forward is on, and if not, why (builds it if not tried yet)."""
    k = _get()
    if k is not None:
        return f"on ({k.path})"
    return f"off: {_reason}"


def _reset() -> None:
    """Forget the kernel (tests; the next use builds or loads it again)."""
    global _kernel, _reason
    with _lock:
        _kernel, _reason = None, None


def _get() -> _Kernel | None:
    global _kernel, _reason
    if _kernel is not None or _reason is not None:
        return _kernel
    with _lock:
        if _kernel is None and _reason is None:
            try:
                _kernel = _load()
            except _Off as err:
                _reason = str(err)
            except Exception as err:  # never let the accelerator break training
                _reason = f"{type(err).__name__}: {err}"
            if _kernel is None and _reason is None:
                _reason = "unknown"
            if _kernel is not None and not _self_test(_kernel):
                _kernel = None
                _reason = (
                    "its self-test found bits other than torch's kernels give on this "
                    "build; the torch kernels compute instead"
                )
                warnings.warn(f"feather_sparse native N:M forward {_reason}", stacklevel=3)
    return _kernel


class _Off(RuntimeError):
    """A reason the native forward is off (no compiler, no MKL functions, turned off)."""


def _torch_library() -> ctypes.CDLL:
    lib = Path(torch.__file__).parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib"):
        if (lib / name).exists():
            return ctypes.CDLL(str(lib / name))
    raise _Off("no libtorch_cpu library found beside torch")


def _compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name:
            found = shutil.which(name)
            if found:
                return found
    raise _Off("no C compiler found (set CC, or install cc/gcc/clang)")


def _addcmul_fused() -> bool:
    """Whether torch's CPU ``addcmul`` rounds ``1 + h·r`` once (a fused multiply-add)."""
    g = torch.Generator().manual_seed(0)
    h = torch.rand(4096, generator=g) + 1.0
    r = torch.rand(4096, generator=g)
    got = torch.addcmul(torch.ones(()), h, r)
    fused = (1.0 + h.double() * r.double()).float()  # h·r is exact in double
    return bool(torch.equal(got, fused))


def _flags(fused: bool) -> list[str]:
    flags = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math"]
    capability = torch.backends.cpu.get_cpu_capability()
    if platform.machine().lower() in ("x86_64", "amd64") and capability in ("AVX2", "AVX512"):
        flags += ["-mavx2", "-mfma"]  # torch's own kernels need both on this CPU
    if fused:
        flags.append("-DFEATHER_FMA")
    return flags


def _load() -> _Kernel:
    if os.environ.get(ENV, "1").strip() == "0":
        raise _Off(f"turned off by {ENV}=0")
    if not sys.platform.startswith("linux"):
        raise _Off(f"built on Linux only (this is {sys.platform})")
    lib = _torch_library()
    try:
        ln = ctypes.cast(lib.vmsLn, ctypes.c_void_p).value
        exp = ctypes.cast(lib.vmsExp, ctypes.c_void_p).value
    except AttributeError as err:
        raise _Off("this torch build does not carry MKL's vmsLn/vmsExp") from err
    if not ln or not exp:
        raise _Off("this torch build does not carry MKL's vmsLn/vmsExp")
    fused = _addcmul_fused()
    cc = _compiler()
    flags = _flags(fused)
    key = _key(cc, flags)
    path = _build(cc, flags, key)
    try:
        shared = ctypes.CDLL(str(path))
    except OSError:  # a damaged cache file: build it again
        path.unlink(missing_ok=True)
        shared = ctypes.CDLL(str(_build(cc, flags, key)))
    function = shared.feather_nm_forward
    function.restype = ctypes.c_int
    function.argtypes = [
        *(ctypes.c_void_p,) * 3,
        ctypes.c_long,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_float,
        ctypes.c_int,
        ctypes.c_float,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_longlong,
    ]
    return _Kernel(function, ln, exp, fused, path)


def _key(cc: str, flags: list[str]) -> str:
    """The cache name of the library built by ``cc`` with ``flags`` for this torch and machine."""
    text = "\0".join([SOURCE, cc, *flags, platform.machine(), torch.__version__])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _build(cc: str, flags: list[str], key: str) -> Path:
    """The compiled library for ``key``: from the cache, else compiled and put there atomically."""
    from feather_sparse.data.cache import cache_dir

    folder = cache_dir() / "native"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        folder = Path(tempfile.gettempdir()) / "feather-sparse-native"
        folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"nm-{key}.so"
    if path.exists():
        return path
    with tempfile.TemporaryDirectory(dir=folder) as work:
        source = Path(work) / "nm.c"
        source.write_text(SOURCE)
        target = Path(work) / path.name
        done = subprocess.run(
            [cc, *flags, "-o", str(target), str(source), "-lm"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0 or not target.exists():
            raise _Off(f"the C compiler {cc} failed: {done.stderr.strip()[-400:]}")
        os.replace(target, path)  # atomic: a concurrent process sees a whole file or none
    return path


def _call(
    k: _Kernel, x: Tensor, m: int, kth: int, ramp: float, p: int
) -> tuple[Tensor, Tensor] | None:
    groups = x.numel() // m
    out = torch.empty_like(x)
    aux = torch.empty(groups, 1, dtype=x.dtype)
    bad = k.function(
        x.data_ptr(), out.data_ptr(), aux.data_ptr(), groups, m, kth, ramp, p, 1.0 / p,
        k.ln, k.exp, _VML_MODE,
    )  # fmt: skip
    return None if bad else (out, aux)


def forward(x: Tensor, n: int, ramp: Tensor, p: float) -> tuple[Tensor, Tensor] | None:
    """``(P_T(x), T)`` of the float32 ``(G, m)`` groups ``x`` keeping ``n``, or None.

    None when the native function does not apply here (see the module
    docstring) or is off; the caller then computes with torch. ``T`` is
    ``(G, 1)``: the ``(m − n)``-th smallest magnitude of each group times ``ramp``.
    """
    g, m = x.shape
    if not (
        x.dtype == torch.float32
        and 2 <= p <= 16
        and p == int(p)
        and m <= 32
        and g > 0
        and ramp.numel() == 1
        and x.is_cpu
        and ramp.is_cpu
        and type(x) is Tensor
        and x.is_contiguous()
        and not x.requires_grad
        and (x.numel() <= SERIAL_NUMEL or torch.get_num_threads() <= MAX_THREADS)
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and not torch._C._are_functorch_transforms_active()
    ):
        return None
    k = _get()
    if k is None:
        return None
    return _call(k, x, m, m - n - 1, float(ramp.to(torch.float32)), int(p))


def _self_test(k: _Kernel) -> bool:
    """Whether the kernel gives torch's bits on a probe of awkward weights."""
    from feather_sparse.nm.operator import NMPattern, _torch_thresholded

    g = torch.Generator().manual_seed(20261127)
    for n, m in ((2, 4), (1, 4), (4, 8)):
        pattern = NMPattern(n, m)
        for groups in (1, 7, 515, 1029):  # partial blocks and vector tails
            x = torch.randn(groups, m, generator=g)
            scale = torch.logspace(-42, 30, groups * m).reshape(groups, m)  # subnormal to large
            x = x * scale[torch.randperm(groups, generator=g)]
            x[::5, 0] = 0.0
            x[::3, 1] = x[::3, 2]  # ties
            x[::7, 3] = -0.0
            for p in (2, 3, 4, 5):
                for value in (1.0, 0.5, 0.0):
                    ramp = torch.tensor(value)
                    got = _call(k, x, m, m - n - 1, value, p)
                    if got is None:
                        return False
                    want = _torch_thresholded(x, pattern, ramp, float(p))
                    for a, b in zip(got, want):
                        if not torch.equal(a.view(torch.int32), b.view(torch.int32)):
                            return False
    return True
