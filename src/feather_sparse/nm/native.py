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
  magnitudes, partial blocks, ramps 0, 0.5 and 1, ``p`` 2, 3 and 5, the 1:4,
  2:4 and 4:8 patterns); any difference, a missing compiler, a build
  without MKL's functions or a failed build turns it off, with the reason
  in :func:`status`, and the torch kernels compute as before;
* a weight that is not finite sends its whole tensor to the torch kernels
  (NaN and infinities follow torch's rules there).

So whether it runs changes the speed, never a bit: every stored result,
resume and ``.fsp`` file is the same either way. Measured
(``benchmarks/bench_nm_native.py``, docs/benchmarks-nm.md): the mixer's
100,992 2:4 weights in 223 µs against 720 µs with the torch kernels, one
thread, and the mixer's 2:4 step 0.81 ms shorter (0.68 to 1.09).

:func:`forward` serves a ``(G, m)`` tensor (``nm.operator._nm_forward``);
:func:`forward_many` the fused pass's layers, read in place as if
concatenated, writing their bit reference (the concatenation) as it goes;
:func:`abs_max_many` the Pruner's finite check at every step (exact
maxima, no bits of torch's to match), once an N:M forward loaded the library.

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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from feather_sparse.nm.operator import NMPattern

__all__ = [
    "ENV",
    "MAX_THREADS",
    "SERIAL_NUMEL",
    "abs_max_many",
    "forward",
    "forward_many",
    "status",
]

#: Set to ``0`` to compute with the torch kernels only (read at the first use).
ENV = "FEATHER_SPARSE_NATIVE"

#: With more than this many torch threads, tensors over :data:`SERIAL_NUMEL`
#: weights take torch's parallel kernels: the native function runs on one
#: thread, and torch's kernels gain with each thread (a scratch measurement on a
#: 2-core machine found the native function still ahead on 2 threads; beyond 2
#: cores the limit is a cautious guess).
MAX_THREADS = 2

#: Torch's own kernels run on one thread up to this many elements (its grain size).
SERIAL_NUMEL = 1 << 15

#: MKL's VML mode as torch's ``at::vml`` passes it: high accuracy, denormals kept, no errno.
_VML_MODE = 0x2 | 0x140000 | 0x100

SOURCE = r"""
/* Feather's N:M forward (feather_sparse.nm.native): torch's operations, in torch's order. */
#include <float.h>
#include <math.h>
#include <string.h>

typedef void (*vml_fn)(int n, const float *a, float *r, long long mode);

#define BLOCK 2048 /* weights per block: its temporaries stay in the L1 cache */
/* min and max of magnitudes that are finite and never -0: plain comparisons */
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) < (b) ? (b) : (a))
#ifdef FEATHER_FMA
#define HORNER(h, r) fmaf((h), (r), 1.0f) /* torch's addcmul kernel, fused */
#else
#define HORNER(h, r) (1.0f + (h) * (r))
#endif

/* 1 where the float32 bits are an infinity or a NaN (exponent all ones), else 0 */
static inline int not_finite(const float *x) {
    unsigned int bits;
    memcpy(&bits, x, sizeof bits);
    return (bits & 0x7f800000u) == 0x7f800000u;
}

/* The k-th smallest magnitude of each group of m, times ramp, into aux (one per group)
   and wide (one per weight); 1 if a weight is not finite (aux and wide then unusable). */
static int thresholds(const float *restrict x, float *restrict aux, float *restrict wide,
                      int groups, int m, int k, float ramp) {
    int bad = 0;
    for (int i = 0; i < groups * m; ++i) bad |= not_finite(x + i);
    if (bad) return 1;
    if (m == 4 && k == 1) { /* 2:4: a selection network over the group */
        for (int g = 0; g < groups; ++g) {
            const float a0 = fabsf(x[4 * g]), a1 = fabsf(x[4 * g + 1]);
            const float a2 = fabsf(x[4 * g + 2]), a3 = fabsf(x[4 * g + 3]);
            const float lows = MAX(MIN(a0, a1), MIN(a2, a3));
            const float highs = MIN(MAX(a0, a1), MAX(a2, a3));
            aux[g] = MIN(lows, highs) * ramp;
        }
    } else {
        for (int g = 0; g < groups; ++g) {
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
    for (int g = 0; g < groups; ++g)
        for (int j = 0; j < m; ++j) wide[g * m + j] = aux[g];
    return 0;
}

/* y = clamp_min(1 - r^p, tiny) and u = [|w| <= T] of the c weights x, thresholds t; one
   function per power loop, so that each loop is free of branches and vectorised */
#define BRACKET(NAME, POWER)                                                                \
    static void NAME(const float *restrict x, const float *restrict t, float *restrict y, \
                     float *restrict u, int c, int p) {                                   \
        (void)p;                                                                          \
        for (int i = 0; i < c; ++i) {                                                     \
            float a = fabsf(x[i]);                        /* |w| */                       \
            const float pruned = a <= t[i] ? 1.0f : 0.0f; /* [|w| <= T] */                \
            float d = a - t[i];                           /* |w| - T */                   \
            a = a + pruned;                               /* never 0/0 */                 \
            d = d / a;                                    /* 1 - r */                     \
            const float r = t[i] / a;                     /* r = T/|w| */                 \
            float h = r + 1.0f;                           /* Horner: 1 + r + ... */       \
            POWER                                                                         \
            d = d * h;                                    /* 1 - r^p */                   \
            y[i] = d > FLT_MIN ? d : FLT_MIN;             /* clamp_min(tiny) */           \
            u[i] = pruned;                                                                \
        }                                                                                 \
    }
BRACKET(bracket_3, h = HORNER(h, r);)
BRACKET(bracket_p, for (int e = 2; e < p; ++e) h = HORNER(h, r);)

/* One tensor's groups, block by block; each block also copied into ref unless it is NULL. */
static int run(const float *w, float *ref, float *out, float *aux, long groups, int m, int k,
               float ramp, int p, float inv_p, vml_fn vml_ln, vml_fn vml_exp, long long mode) {
    float y[BLOCK], u[BLOCK], t[BLOCK];
    const long per = BLOCK / m;
    for (long g0 = 0; g0 < groups; g0 += per) {
        const int gs = (int)(groups - g0 < per ? groups - g0 : per);
        const int c = gs * m;
        const float *x = w + g0 * m;
        if (ref) memcpy(ref + g0 * m, x, (size_t)c * sizeof(float));
        if (thresholds(x, aux + g0, t, gs, m, k, ramp)) return 1;
        (p == 3 ? bracket_3 : bracket_p)(x, t, y, u, c, p);
        vml_ln(c, y, y, mode);
        for (int i = 0; i < c; ++i) y[i] = y[i] * inv_p;
        vml_exp(c, y, y, mode);
        float *o = out + g0 * m;
        for (int i = 0; i < c; ++i) {
            const float v = y[i] * x[i];
            o[i] = v + (-1.0f * v) * u[i]; /* addcmul(v, v, u, value=-1) */
        }
    }
    return 0;
}

/* out = P_T(w), aux = T per group; 1 (and nothing usable) if a weight is not finite. */
int feather_nm_forward(const float *w, float *out, float *aux, long groups, int m, int k,
                       float ramp, int p, float inv_p, void *ln, void *ex, long long mode) {
    return run(w, NULL, out, aux, groups, m, k, ramp, p, inv_p, (vml_fn)ln, (vml_fn)ex, mode);
}

/* max |w| of each of count float32 tensors, exactly; a NaN for a tensor holding one. The
   magnitudes are compared as integers (the bits of a non-negative float order like its
   value, and every NaN's above infinity's), a loop the compiler vectorises. */
void feather_abs_max_many(const float *const *ws, const long *numels, int count, float *out) {
    for (int i = 0; i < count; ++i) {
        const unsigned int *bits = (const unsigned int *)ws[i];
        unsigned int top = 0;
        for (long j = 0; j < numels[i]; ++j) {
            const unsigned int b = bits[j] & 0x7fffffffu; /* |w| */
            top = b > top ? b : top;
        }
        memcpy(out + i, &top, sizeof top);
    }
}

/* The same for count tensors read in place, as if concatenated: ref receives their
   concatenation, out and aux the concatenation's forward and thresholds. */
int feather_nm_forward_many(const float *const *ws, const long *groups, int count, float *ref,
                            float *out, float *aux, int m, int k, float ramp, int p,
                            float inv_p, void *ln, void *ex, long long mode) {
    long done = 0;
    for (int i = 0; i < count; ++i) {
        if (run(ws[i], ref + done * m, out + done * m, aux + done, groups[i], m, k, ramp, p,
                inv_p, (vml_fn)ln, (vml_fn)ex, mode))
            return 1;
        done += groups[i];
    }
    return 0;
}
"""


@dataclass(frozen=True)
class _Kernel:
    function: ctypes._CFuncPtr  # type: ignore[name-defined]
    many: ctypes._CFuncPtr  # type: ignore[name-defined]
    abs_max: ctypes._CFuncPtr  # type: ignore[name-defined]
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
            if _kernel is not None and not _passes(_kernel):
                _kernel = None
                _reason = (
                    "its self-test found bits other than torch's kernels give on this "
                    "build; the torch kernels compute instead"
                )
                warnings.warn(
                    f"feather_sparse's native N:M forward is off: {_reason} (the results "
                    f"are the same, the step slower; {ENV}=0 skips the test)",
                    stacklevel=3,
                )
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
    """Whether torch's CPU ``addcmul`` rounds ``1 + h·r`` once (a fused multiply-add).

    Its results are compared with both roundings: once (computed in double,
    where ``h·r`` is exact; the double's own rounding can differ in a rare
    element, hence a count) and twice (``h·r`` rounded to float32 first).
    """
    g = torch.Generator().manual_seed(0)
    h = torch.rand(4096, generator=g) + 1.0
    r = torch.rand(4096, generator=g)
    got = torch.addcmul(torch.ones(()), h, r)
    once = (1.0 + h.double() * r.double()).float()
    twice = torch.ones(()) + h * r  # two kernels: the product rounded, then the sum
    return int((got != once).sum()) < int((got != twice).sum())


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
    tail: list[Any] = [ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_int, ctypes.c_float]
    tail += [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong]
    function = shared.feather_nm_forward
    function.restype = ctypes.c_int
    function.argtypes = [*(ctypes.c_void_p,) * 3, ctypes.c_long, *tail]
    many = shared.feather_nm_forward_many
    many.restype = ctypes.c_int
    many.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, *(ctypes.c_void_p,) * 3]
    many.argtypes += tail
    abs_max = shared.feather_abs_max_many
    abs_max.restype = None
    abs_max.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    return _Kernel(function, many, abs_max, ln, exp, fused, path)


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


def _call_many(
    k: _Kernel, parts: Sequence[Tensor], m: int, kth: int, ramp: float, p: int
) -> tuple[Tensor, Tensor, Tensor] | None:
    count = len(parts)
    groups = [w.numel() // m for w in parts]
    total = sum(groups) * m
    flat = torch.empty(total, dtype=torch.float32)
    out = torch.empty(total, dtype=torch.float32)
    aux = torch.empty(total // m, 1, dtype=torch.float32)
    pointers, _ = _pointers(parts)
    sizes = (ctypes.c_long * count)(*groups)
    bad = k.many(
        pointers, sizes, count, flat.data_ptr(), out.data_ptr(), aux.data_ptr(), m, kth, ramp,
        p, 1.0 / p, k.ln, k.exp, _VML_MODE,
    )  # fmt: skip
    return None if bad else (flat, out, aux)


def _serves(numel: int, m: int, ramp: Tensor, p: float) -> bool:
    """Whether the native forward takes this call (the checks common to both entries)."""
    return (
        2 <= p <= 16
        and p == int(p)
        and m <= 32
        and numel > 0
        and ramp.numel() == 1
        and ramp.is_cpu
        and _free(numel)
    )


def _free(numel: int) -> bool:
    """Whether a native call may read ``numel`` weights here: not where torch's parallel
    kernels would be faster (see :data:`MAX_THREADS`), nor inside a compiled, traced or
    ``torch.func`` call."""
    return (
        (numel <= SERIAL_NUMEL or torch.get_num_threads() <= MAX_THREADS)
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and not torch._C._are_functorch_transforms_active()
    )


def _readable(w: Tensor) -> bool:
    """Whether ``w`` is a non-empty contiguous float32 CPU tensor a native call reads in place."""
    return (
        w.dtype == torch.float32
        and w.is_cpu
        and type(w) in (Tensor, torch.nn.Parameter)
        and w.is_contiguous()
        and w.numel() > 0
    )


def _pointers(tensors: Sequence[Tensor]) -> tuple[ctypes.Array, ctypes.Array]:
    """The tensors' data pointers and sizes as C arrays."""
    count = len(tensors)
    pointers = (ctypes.c_void_p * count)(*(t.data_ptr() for t in tensors))
    sizes = (ctypes.c_long * count)(*(t.numel() for t in tensors))
    return pointers, sizes


def forward(x: Tensor, n: int, ramp: Tensor, p: float) -> tuple[Tensor, Tensor] | None:
    """``(P_T(x), T)`` of the float32 ``(G, m)`` groups ``x`` keeping ``n``, or None.

    None when the native function does not apply here (see the module
    docstring) or is off; the caller then computes with torch. ``T`` is
    ``(G, 1)``: the ``(m − n)``-th smallest magnitude of each group times ``ramp``.

    Args:
        x: the groups, ``(G, m)``, a contiguous float32 CPU tensor.
        n: the weights each group keeps.
        ramp: the 0-d factor of every threshold.
        p: the operator's power (an integer from 2 to 16 is served).
    """
    m = x.shape[1]
    if not (
        x.dtype == torch.float32
        and x.is_cpu
        and type(x) is Tensor
        and x.is_contiguous()
        and not x.requires_grad
        and _serves(x.numel(), m, ramp, p)
    ):
        return None
    k = _get()
    if k is None:
        return None
    return _call(k, x, m, m - n - 1, float(ramp.to(torch.float32)), int(p))


def forward_many(
    parts: Sequence[Tensor], pattern: NMPattern, ramp: Tensor, p: float
) -> tuple[Tensor, Tensor, Tensor] | None:
    """The forward of ``parts`` as if concatenated, read in place, or None.

    ``(flat, out, aux)``: the concatenation of the flattened ``parts`` (a
    copy, made while reading them), ``P_T`` of it and its ``(G, 1)``
    thresholds, with the bits of :func:`forward` on ``flat.view(-1, m)``
    (groups never cross two parts). None where :func:`forward` would not
    apply, or a part is not a contiguous float32 CPU tensor of whole groups.

    Args:
        parts: the weights, each read in place (not changed).
        pattern: the N:M pattern.
        ramp: the 0-d factor of every threshold.
        p: the operator's power (an integer from 2 to 16 is served).
    """
    m = pattern.m
    if not all(_readable(w) and w.numel() % m == 0 for w in parts):  # whole groups each
        return None
    numel = sum(w.numel() for w in parts)
    if not (parts and _serves(numel, m, ramp, p)):
        return None
    k = _get()
    if k is None:
        return None
    return _call_many(k, parts, m, m - pattern.n - 1, float(ramp.to(torch.float32)), int(p))


def abs_max_many(weights: Sequence[Tensor]) -> Tensor | None:
    """``max |w|`` of each of ``weights`` as one float32 vector, NaN where one holds a NaN.

    Read in place, one pass each, in one call: the Pruner's finite check at
    every step (``Pruner._abs_maxima``). It uses the library once an N:M
    forward has loaded it and never builds it itself: a Pruner without an N:M
    pattern neither compiles nor tests anything. None where the library is not
    loaded or a tensor is not a non-empty contiguous float32 CPU tensor; the
    caller then asks torch. Every value is exact, as a maximum is.

    Args:
        weights: the tensors (not changed).
    """
    k = _kernel  # loaded (and self-tested) by an N:M forward, or None
    if k is None or not (weights and all(_readable(w) for w in weights)):
        return None
    if not _free(max(w.numel() for w in weights)):
        return None
    out = torch.empty(len(weights), dtype=torch.float32)
    k.abs_max(*_pointers(weights), len(weights), out.data_ptr())
    return out


def _passes(k: _Kernel) -> bool:
    """:func:`_self_test`, an error in it counting as a failure (never one of training's)."""
    try:
        return _self_test(k)
    except Exception:  # the torch kernels compute instead
        return False


def _self_test(k: _Kernel) -> bool:
    """Whether the kernel gives torch's bits on a probe of awkward weights."""
    from feather_sparse.nm.operator import NMPattern, _torch_thresholded

    g = torch.Generator().manual_seed(20261127)
    for n, m in ((2, 4), (1, 4), (4, 8)):
        pattern = NMPattern(n, m)
        for groups in (7, 1029):  # a vector tail; full blocks and a partial one
            x = torch.randn(groups, m, generator=g)
            scale = torch.logspace(-42, 30, groups * m).reshape(groups, m)  # subnormal to large
            x = x * scale[torch.randperm(groups, generator=g)]
            x[::5, 0] = 0.0
            x[::3, 1] = x[::3, 2]  # ties
            x[::7, 3] = -0.0
            cut = (groups // 3) * m  # two parts read in place, as the fused pass gives them
            parts = [x.reshape(-1)[:cut], x.reshape(-1)[cut:]] if cut else [x.reshape(-1)]
            for p in (2, 3, 5):  # no Horner step, one (Feather's default), three
                for value in (1.0, 0.5, 0.0):
                    want = _torch_thresholded(x, pattern, torch.tensor(value), float(p))
                    got = _call(k, x, m, m - n - 1, value, p)
                    many = _call_many(k, parts, m, m - n - 1, value, p)
                    if got is None or many is None:
                        return False
                    if not torch.equal(many[0], x.reshape(-1)):
                        return False
                    for a, b, c in zip(got, many[1:], want):
                        bits = c.view(torch.int32)
                        if not (
                            torch.equal(a.view(torch.int32), bits)
                            and torch.equal(b.reshape(c.shape).view(torch.int32), bits)
                        ):
                            return False
    return True
