"""The N:M forward of many small layers at once, computed once per weight update.

Each N:M forward is a few dozen small kernels (the per-group selection,
the operator's arithmetic). On a model of many small layers — the bundled
MLP-Mixer has 14 Linear weights of at most 16,384 entries, the bundled CNN
four 2:4 layers of 2,560 to 98,304 — their fixed cost weighs as much as the
arithmetic, and with gradient accumulation every micro-batch would
recompute the same pruned weights.
:class:`FusedNMForward` computes every small layer's ``P_T(w)`` in one pass
over the concatenated weights instead, the first time one of them is needed
after the weights changed, and hands each layer its slice. Measured
(``benchmarks/bench_nm_step.py``, docs/benchmarks-nm.md): on the mixer
1.12–1.15× the dense step against 1.19–1.22× layer by layer with one batch
per step, 1.18–1.21× against 1.54–1.56× with 4 micro-batches; the cache of
layers computed alone (below) took the CNN with 4 micro-batches from
1.37–1.38× to 1.15–1.20×. Fusing the CNN's four layers too (the limit
raised from 16,384 to 131,072 weights) took 0.41 ms (95 % interval 0.30 to
0.50) off its forward with one batch per step (``bench_nm_phases.py``).
A layer of at most :data:`JOIN_MAX_NUMEL` weights takes its cached forward
with θ = 1 through two built-in autograd nodes instead of a Python Function
(see ``nm.backbone._straight_through``); a larger one through the Function,
whose fixed cost is less than the join's two passes over its weight.

Exactness. A layer's slice is used only while the layer's weight is, bit
for bit, the weight the slice was computed from (compared at each use, one
kernel), its ramp buffer is the same tensor at the same version, ``p`` is
the same and no forward handed out has been edited in place (the cached
``P_T(w)`` reaches the caller as a view, whose in-place edits move the
cache's version counter: writing into ``module.weight``, or fine-tuning a
tensor from ``dense_state_dict(pruned=True)``, must not change the next
forward); anything else recomputes. So an in-place edit through ``.data``,
a ``load_state_dict``, an optimizer step or a moved buffer never yields a
stale weight. Groups never straddle two layers (a layer holds whole groups),
and the arithmetic is elementwise per group, so the fused result equals the
layer-by-layer one; the only possible difference is the last bit of the
``log``/``exp`` of ``p = 3`` for an element that one computation handles in
its vectorised loop and the other in its scalar tail (none, when every
layer's size is a multiple of 64).

Layers computed alone. Weights over :data:`FUSE_MAX_NUMEL` are not fused
(their kernels are long enough that a launch costs little, and the cache
would keep a copy of each between steps), and with one forward per
optimizer step they are computed at every forward with nothing kept. When a
layer's forward comes again before its weight changed — gradient
accumulation, several evaluation batches — its ``P_T(w)`` is cached alone,
under the same validity rules, for as long as that pays: an entry that was
never used again before the weight changed is dropped, and the layer goes
back to computing at each forward (:data:`CACHE_ALONE`). A repeat is
recognised by the weight's version counter, which an optimizer step or any
in-place write under autograd moves; that only decides *whether* to cache,
never whether a cached result is valid (the bits decide that).

Where it is off (layer by layer, nothing kept): weights off the CPU (the
bit comparison would wait for the device at every layer), frozen masks
(one-shot), sharded weights (FSDP2), ``torch.compile``/``torch.export``/JIT
tracing (the compiler fuses on its own, and a cached tensor must not be
traced as a constant), ``torch.func`` transforms (their weights are
wrappers, and a cached plain tensor would escape the transform) and
inference mode (its tensors cannot be saved for a later backward).

Memory. The cache keeps, between steps, a copy of the small layers' weights
(the bit reference) and their ``P_T(w)`` — twice the small layers'
weights — and, only while forwards repeat between updates, the same for a
large layer; :meth:`clear` drops it (the Pruner does on ``finalize``/``remove``).
"""

from __future__ import annotations

import ctypes
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from feather_sparse.nm import native
from feather_sparse.nm.operator import NMPattern, _nm_forward

__all__ = ["CACHE_ALONE", "FUSE_MAX_NUMEL", "JOIN_MAX_NUMEL", "FusedNMForward"]

#: Weights with more entries than this are computed layer by layer (their
#: kernels are long enough that a launch costs little). Read when a Pruner
#: attaches: set it to 0 beforehand to compute every layer alone.
FUSE_MAX_NUMEL = 1 << 17

#: Layers of at most this many weights take a cached forward through two
#: built-in autograd nodes (``nm.backbone._straight_through``); a larger one
#: through the operator's Function node, whose fixed cost is less than the
#: join's two passes over the weight.
JOIN_MAX_NUMEL = 1 << 14

#: Cache the forward of a layer computed alone while its forwards repeat
#: between weight updates (see the module docstring). Read when a Pruner
#: attaches; with it False and :data:`FUSE_MAX_NUMEL` 0 nothing is cached.
CACHE_ALONE = True

#: Tensor types whose memory is their own elements (no subclass with its own storage).
_PLAIN = (Tensor, nn.Parameter)

#: Integer views for the bit-for-bit comparison of a weight with its reference.
_BITS = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def _libc_memcmp() -> Callable[[int, int, int], int] | None:
    """The C library's ``memcmp`` through :mod:`ctypes`, or None where it cannot be loaded."""
    try:
        libc = ctypes.CDLL(None) if sys.platform != "win32" else ctypes.cdll.msvcrt
        fn = libc.memcmp
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return fn


#: ``memcmp`` compares two contiguous CPU tensors' bytes several times faster
#: than ``torch.equal`` (which compares element by element): 1.6 against 7.1 µs
#: for 16,384 float32 weights (docs/benchmarks-nm.md), and the check runs for
#: every cached layer at every forward. None: ``torch.equal`` throughout.
_MEMCMP = _libc_memcmp()


def same_bits(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` hold the same bits (NaNs and ``±0`` told apart).

    Two contiguous CPU tensors of one dtype and shape are compared byte for
    byte (``memcmp``); anything else with ``torch.equal`` on integer views of
    the same width (the same answer, more slowly).
    """
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    same = _bytes_equal(a, b)
    if same is not None:
        return same
    bits = _BITS.get(a.dtype)
    if bits is None:
        return bool(torch.equal(a, b))
    return torch.equal(a.view(bits), b.view(bits))


def _bytes_equal(a: Tensor, b: Tensor, offset: int = 0) -> bool | None:
    """Whether ``a``'s bytes equal ``b``'s from its element ``offset`` on, by ``memcmp``
    (``b`` of ``a``'s dtype, holding at least ``offset + a.numel()`` elements); None
    where ``memcmp`` cannot read them (not two contiguous plain CPU tensors)."""
    if not (
        _MEMCMP is not None
        and a.is_cpu
        and b.is_cpu
        and a.is_contiguous()
        and b.is_contiguous()
        and type(a) in _PLAIN
        and type(b) in _PLAIN
    ):
        return None
    n = a.numel() * a.element_size()
    if n == 0:
        return True
    try:
        pointers = a.data_ptr(), b.data_ptr() + offset * a.element_size()
    except RuntimeError:  # a wrapper without storage of its own (torch.func, fake tensors)
        return None
    return _MEMCMP(*pointers, n) == 0


@dataclass
class _Entry:
    """One layer's cached forward and what it was computed from.

    A fused layer's bit reference and thresholds stay in the pass's whole
    tensors (``source``, ``thresholds``) at ``offset`` and ``first``: making a
    tensor per layer costs microseconds, and the comparison reads the memory
    directly (:func:`_same_as_reference`).
    """

    source: Tensor  # the weights' bits when computed: the layer's own copy, or the pass's
    offset: int  # the layer's first element in source
    out: Tensor  # P_T(w), the weight's shape and dtype
    thresholds: Tensor  # what the backward needs (see operator._nm_forward), possibly the pass's
    first: int  # the layer's first row in thresholds
    rows: int  # its number of rows there
    ramp: Tensor  # the ramp buffer it used (identity and version are checked)
    ramp_version: int
    p: float
    out_version: int  # out's version counter when computed: an in-place edit of a view moves it
    hits: int = 0  # uses after the computation (layers computed alone)

    @property
    def aux(self) -> Tensor:
        """The layer's thresholds (or kept positions): what ``_nm_forward`` returned for it."""
        t = self.thresholds
        return t if self.rows == t.shape[0] else t[self.first : self.first + self.rows]

    def reference(self) -> Tensor:
        """The layer's bit reference as a tensor of the weight's shape."""
        n = self.out.numel()
        return self.source.reshape(-1)[self.offset : self.offset + n].view(self.out.shape)


def _same_as_reference(weight: Tensor, entry: _Entry) -> bool:
    """Whether ``weight`` holds, bit for bit, the weights ``entry`` was computed from.

    Compared in place at the layer's offset in the pass's copy, with no tensor
    made (:func:`_bytes_equal`; a layer's own copy with its weight's strides,
    not contiguous, is not read that way); anything else through :func:`same_bits`.
    """
    if weight.dtype == entry.source.dtype and weight.shape == entry.out.shape:
        same = _bytes_equal(weight, entry.source, entry.offset)
        if same is not None:
            return same
    return same_bits(weight, entry.reference())


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _traced() -> bool:
    return bool(torch.compiler.is_compiling() or torch.jit.is_tracing())


class FusedNMForward:
    """Per-layer N:M forwards computed together (see the module docstring).

    Args:
        pattern: the N:M pattern of every layer.
        eligible: for each layer (the backbone's target order), whether it
            may be computed with the others (small enough, no frozen mask).
        alone: whether the other layers are cached alone while their
            forwards repeat between updates.
    """

    def __init__(self, pattern: NMPattern, eligible: Sequence[bool], alone: bool = True) -> None:
        self.pattern = pattern
        self.eligible = list(eligible)
        self.alone = alone
        self._ramps: dict[int, Tensor] = {}
        self._entries: dict[int, _Entry] = {}
        self._seen: dict[int, tuple[int, int]] = {}  # layer → (id, version) at its last forward

    def usable(self, index: int, weight: Tensor) -> bool:
        """Whether tensor ``index`` may take the cached path in this call.

        Args:
            index: the tensor's position among the backbone's targets.
            weight: its stored weight.
        """
        return (  # tracing first: the compiler cannot trace the inference-mode query
            (self.eligible[index] or self.alone)
            and not _traced()
            and not torch._C._are_functorch_transforms_active()  # torch.func: wrapped tensors
            and type(weight) in _PLAIN
            and weight.is_cpu
            and not torch.is_inference_mode_enabled()
        )

    def get(
        self,
        index: int,
        weight: Tensor,
        ramp: Tensor,
        p: float,
        weights: Callable[[], Sequence[Tensor]],
        scales: Sequence[Tensor | None] | None,
    ) -> tuple[Tensor, Tensor] | None:
        """``(P_T(w), aux)`` of tensor ``index``, from the cache or a fresh fused pass.

        Args:
            index: the tensor asked for.
            weight: its stored weight.
            ramp: its 0-d ramp factor (the N:M backbone's threshold).
            p: the operator's power.
            weights: returns every tensor's current stored weight (the
                backbone's order); called only when a pass is needed.
            scales: every tensor's forward scale (S-STE's β), or None.

        Returns:
            None when fewer than two layers would share the pass, or a layer
            computed alone is not (or no longer) cached: the caller then
            computes the layer itself.
        """
        if not self.eligible[index]:
            scale = None if scales is None else scales[index]
            return self._alone(index, weight, ramp, p, scale)
        first = index not in self._ramps
        self._ramps[index] = ramp
        if first:  # the first forward runs layer by layer and registers every ramp
            return None
        entry = self._entries.get(index)
        if entry is not None and self._valid(entry, weight, ramp, p):
            return entry.out, entry.aux
        stored = weights()
        group = self._group(weight.dtype, stored)
        if len(group) < 2:
            return None
        self._compute(group, p, stored, scales)
        entry = self._entries[index]
        if weight is not stored[index] and not self._valid(entry, weight, ramp, p):
            return None  # asked for another tensor than the stored weight (a direct call)
        return entry.out, entry.aux

    def forwards(
        self,
        indices: Sequence[int],
        ramps: Sequence[Tensor],
        p: float,
        weights: Sequence[Tensor],
    ) -> dict[int, Tensor]:
        """The fused layers' ``P_T(w)`` among ``indices``, all at once (``Pruner.swapped()``).

        The layers' cached forwards where every one is valid, else one fresh
        pass; the same values as :meth:`get` gives layer by layer, without a
        call per layer. Layers it does not compute (too large, another dtype)
        are left out of the answer: the caller computes those itself.

        Args:
            indices: the layers asked for (their positions among the targets).
            ramps: their 0-d ramp factors.
            p: the operator's power.
            weights: every target's stored weight (the backbone's order).
        """
        wanted = [i for i in indices if self.eligible[i]]
        if len(wanted) < 2:
            return {}
        dtype = weights[wanted[0]].dtype
        if any(
            weights[i].dtype != dtype or not weights[i].is_cpu or type(weights[i]) not in _PLAIN
            for i in wanted
        ):
            return {}
        for i, r in zip(indices, ramps):
            if self.eligible[i]:
                self._ramps[i] = r
        valid = True
        for i in wanted:
            entry = self._entries.get(i)
            if entry is None or not self._valid(entry, weights[i], self._ramps[i], p):
                valid = False
                break
        if not valid:
            group = self._group(dtype, weights)
            if len(group) < 2:
                return {}
            self._compute(group, p, weights, None)
            computed = set(group)
            wanted = [i for i in wanted if i in computed]  # the others: layer by layer
        return {i: self._entries[i].out for i in wanted}

    def _group(self, dtype: torch.dtype, stored: Sequence[Tensor]) -> list[int]:
        """The layers one pass computes, in order: every registered eligible layer whose
        stored weight has ``dtype`` and, like its ramp, lies on the CPU as a plain tensor
        (as :meth:`usable` requires of the weight asking)."""
        return sorted(
            i
            for i, r in self._ramps.items()
            if self.eligible[i]
            and stored[i].dtype == dtype
            and stored[i].is_cpu
            and r.is_cpu
            and type(stored[i]) in _PLAIN
        )

    def _alone(
        self, index: int, weight: Tensor, ramp: Tensor, p: float, scale: Tensor | None
    ) -> tuple[Tensor, Tensor] | None:
        """A layer outside the fused pass: cached while its forwards repeat."""
        entry = self._entries.get(index)
        if entry is not None:
            if self._valid(entry, weight, ramp, p):
                entry.hits += 1
                return entry.out, entry.aux
            if entry.hits == 0:  # never used again before the weight changed: stop caching
                del self._entries[index]
                entry = None
        mark = (id(weight), weight._version)
        repeated, self._seen[index] = self._seen.get(index) == mark, mark
        if entry is None and not repeated:
            return None
        with torch.no_grad():
            reference = weight.detach().clone()
            out, aux = _nm_forward(reference, self.pattern, ramp, p, None, scale)
        self._entries[index] = _Entry(
            reference, 0, out, aux, 0, aux.shape[0], ramp, ramp._version, p, out._version
        )
        return out, aux

    @staticmethod
    def _valid(entry: _Entry, weight: Tensor, ramp: Tensor, p: float) -> bool:
        return (
            entry.p == p
            and entry.ramp is ramp
            and entry.ramp_version == ramp._version
            and entry.out._version == entry.out_version  # no edit of a forward handed out
            and _same_as_reference(weight, entry)  # reads bits only: no detach needed
        )

    @torch.no_grad()
    def _compute(
        self,
        group: list[int],
        p: float,
        weights: Sequence[Tensor],
        scales: Sequence[Tensor | None] | None,
    ) -> None:
        m = self.pattern.m
        parts = [weights[i] for i in group]  # under no_grad: no detach needed
        groups = [w.numel() // m for w in parts]
        ramps = [self._ramps[i] for i in group]
        values = torch.stack(ramps).tolist()
        if all(
            v == values[0] and math.copysign(1.0, v) == math.copysign(1.0, values[0])
            for v in values
        ):  # the usual case: one ramp for all (the same bits; ±0 apart)
            ramp = ramps[0]
        else:
            ramp = torch.cat([r.reshape(1).expand(g) for r, g in zip(ramps, groups)]).unsqueeze(1)
        scale = None
        if scales is not None and any(scales[i] is not None for i in group):
            ones = torch.ones((), dtype=torch.float32)
            scale = torch.cat(
                [
                    (ones if scales[i] is None else scales[i]).reshape(1).expand(g)  # type: ignore[union-attr]
                    for i, g in zip(group, groups)
                ]
            ).unsqueeze(1)
        # the native forward reads the weights in place and copies them as it goes (the
        # bit reference); else a concatenated copy and the forward of it, the same bits
        done = native.forward_many(parts, self.pattern, ramp, p) if scale is None else None
        if done is not None:
            flat, out, aux = done
        else:
            flat = torch.cat([w.reshape(-1) for w in parts])  # a copy: the bit reference too
            out, aux = _nm_forward(flat.view(-1, m), self.pattern, ramp, p, None, scale)
        out = out.reshape(-1)
        version = out._version  # the slices share the whole pass's counter
        offset = first = 0
        base = out.storage_offset()
        for i, w, g, r in zip(group, parts, groups, ramps):
            n = g * m
            # one tensor per layer (its forward); the rest stays in the pass's tensors
            forward = out.as_strided(w.shape, _contiguous_strides(w.shape), base + offset)
            self._entries[i] = _Entry(
                flat, offset, forward, aux, first, g, r, r._version, p, version
            )
            offset += n
            first += g

    def clear(self) -> None:
        """Drop every cached forward and ramp reference."""
        self._entries.clear()
        self._ramps.clear()
        self._seen.clear()

    def __getstate__(self) -> dict[str, object]:
        """Pickled (``torch.save(model)``, ``copy.deepcopy``) without the cache: it is rebuilt."""
        return {**self.__dict__, "_entries": {}, "_ramps": {}, "_seen": {}}

    def __setstate__(self, state: dict[str, object]) -> None:
        """Unpickled, also from a version without the cache of layers computed alone."""
        self.__dict__.update({"alone": False, "_seen": {}, **state})
