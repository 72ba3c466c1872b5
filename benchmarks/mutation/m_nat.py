"""Mutants of the native N:M forward: src/feather_sparse/nm/native.py (its C source, the
build, the self-test, what it serves), the fused pass's use of it and its per-layer
entries (nm/fused.py), and swapped()'s one call for the fused layers (swap.py,
nm/backbone.py) (docs/mutation-audit.md, "The native N:M forward").

A mutant with a ``file`` key mutates that file instead of FILE.
"""

FILE = "src/feather_sparse/nm/native.py"
FUSED = "src/feather_sparse/nm/fused.py"
SWAP = "src/feather_sparse/swap.py"
BACKBONE = "src/feather_sparse/nm/backbone.py"
TIMEOUT = 600
TESTS = ["tests/test_nm_native.py"]
WIDE = ["tests/test_nm_native.py", "tests/test_nm_fused.py", "tests/test_swap.py"]

MUTATIONS = [
    # --- the C source: each step torch's, in torch's order
    dict(
        id="nat01",
        desc="the Horner step rounded twice where torch's addcmul fuses",
        old="#define HORNER(h, r) fmaf((h), (r), 1.0f) /* torch's addcmul kernel, fused */",
        new="#define HORNER(h, r) (1.0f + (h) * (r))",
    ),
    dict(
        id="nat02",
        desc="the bracket not clamped to the smallest normal before the log",
        old="            y[i] = d > FLT_MIN ? d : FLT_MIN;             /* clamp_min(tiny) */",
        new="            y[i] = d;                                     /* clamp_min(tiny) */",
    ),
    dict(
        id="nat03",
        desc="2:4 thresholds at the second largest magnitude instead of the second smallest",
        old="            aux[g] = MIN(lows, highs) * ramp;",
        new="            aux[g] = MAX(lows, highs) * ramp;",
    ),
    dict(
        id="nat04",
        desc="a weight that is not finite computed natively (min/max order NaN otherwise)",
        old="    if (bad) return 1;\n    if (m == 4 && k == 1)",
        new="    if (m == 4 && k == 1)",
    ),
    dict(
        id="nat05",
        desc="the weights read in place not copied into the bit reference",
        old="        if (ref) memcpy(ref + g0 * m, x, (size_t)c * sizeof(float));\n",
        new="",
    ),
    dict(
        id="nat06",
        desc="torch's addcmul taken as not fused (the plain Horner step built)",
        old="    return int((got != once).sum()) < int((got != twice).sum())",
        new="    return False",
    ),
    # --- the self-test and the build
    dict(
        id="nat07",
        desc="the kernel used without its self-test",
        old="            if _kernel is not None and not _passes(_kernel):",
        new="            if False:",
    ),
    dict(
        id="nat08",
        desc="FEATHER_SPARSE_NATIVE=0 ignored",
        old='    if os.environ.get(ENV, "1").strip() == "0":',
        new="    if False:",
    ),
    dict(
        id="nat09",
        desc="a damaged cache file loaded again instead of rebuilt",
        old="        path.unlink(missing_ok=True)\n",
        new="",
    ),
    # --- what it serves
    dict(
        id="nat10",
        desc="large tensors taken on one thread where torch has many",
        old="        (numel <= SERIAL_NUMEL or torch.get_num_threads() <= MAX_THREADS)\n",
        new="        True\n",
    ),
    dict(
        id="nat11",
        desc="a non-contiguous tensor read as if contiguous",
        old="        and x.is_contiguous()\n        and not x.requires_grad",
        new="        and not x.requires_grad",
    ),
    dict(
        id="nat12",
        desc="per-group ramps taken as one",
        old="        and ramp.numel() == 1",
        new="        and True",
    ),
    dict(
        id="nat13",
        desc="a tensor read in place that does not hold whole groups",
        old="    if not all(_readable(w) and w.numel() % m == 0 for w in parts):  # whole groups each",
        new="    if not all(_readable(w) for w in parts):  # whole groups each",
    ),
    # --- the fused pass's entries and swapped()'s one call
    dict(
        id="nat14",
        desc="a fused layer's bits compared at the pass's start, not at its own offset",
        old="        pointers = a.data_ptr(), b.data_ptr() + offset * a.element_size()",
        new="        pointers = a.data_ptr(), b.data_ptr()",
        file=FUSED,
        tests=WIDE,
    ),
    dict(
        id="nat15",
        desc="swapped()'s one call reuses cached forwards without checking their bits",
        old="            if entry is None or not self._valid(entry, weights[i], self._ramps[i], p):",
        new="            if entry is None:",
        file=FUSED,
        tests=WIDE,
    ),
    dict(
        id="nat16",
        desc="swapped() asks every layer through its own call",
        old="        done = _fused_forwards(pruner, layers)",
        new="        done: dict[int, Tensor] = {}",
        file=SWAP,
        tests=WIDE,
    ),
    dict(
        id="nat17",
        desc="S-STE's rescaled layers handed the plain fused forward inside swapped()",
        old="self._masks is not None or self._beta is not None or self.decay != 0.0:",
        new="self._masks is not None or self.decay != 0.0:",
        file=BACKBONE,
        tests=WIDE,
    ),
    dict(
        id="nat18",
        desc="swapped()'s one call does not register the layers' ramps (its first pass computes none)",
        old="            if self.eligible[i]:\n                self._ramps[i] = r",
        new="            if self.eligible[i]:\n                pass",
        file=FUSED,
        tests=WIDE,
    ),
    dict(
        id="nat19",
        desc="the native forward called without the ramp (every threshold at its full value)",
        old="    return _call(k, x, m, m - n - 1, float(ramp.to(torch.float32)), int(p))",
        new="    return _call(k, x, m, m - n - 1, 1.0, int(p))",
    ),
    dict(
        id="nat20",
        desc="a layer's own copy compared in storage order when its strides are not contiguous",
        old="        and a.is_contiguous()\n        and b.is_contiguous()\n",
        new="        and a.is_contiguous()\n",
        file=FUSED,
        tests=WIDE,
    ),
    dict(
        id="nat21",
        desc="the finite check's magnitudes taken with their sign bit (a negative weight wins)",
        old="            const unsigned int b = bits[j] & 0x7fffffffu; /* |w| */",
        new="            const unsigned int b = bits[j]; /* |w| */",
    ),
    dict(
        id="nat22",
        desc="a native call reads a non-contiguous tensor as if contiguous (the finite check too)",
        old="        and w.is_contiguous()\n        and w.numel() > 0\n    )",
        new="        and w.numel() > 0\n    )",
    ),
    dict(
        id="nat23",
        desc="the finite check builds and self-tests the library (every Pruner's first step)",
        old="    k = _kernel  # loaded (and self-tested) by an N:M forward, or None",
        new="    k = _get()  # loaded (and self-tested) by an N:M forward, or None",
    ),
]
