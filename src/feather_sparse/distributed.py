"""DDP and FSDP2 plumbing for the Pruner: local shards, process groups, reducer hooks.

The Pruner's algorithm (:mod:`feather_sparse.pruner`) reads weights, counts
zeros and writes thresholds; this module hides where those weights live.

- **DDP** (replicated weights): every rank computes the identical threshold
  with no communication. The one chore is :func:`reconnect_ddp`: a
  parametrization attached after DDP wrapping re-sets each weight, and DDP's
  gradient hooks must be re-attached to it.
- **FSDP2** (``fully_shard``, DTensor weights): each rank works on its local
  shard (:func:`local_weights`, :func:`on_local_shard`) and counts or maxima
  are all-reduced over the group the weights are sharded on
  (:func:`all_reduce_sum`, :func:`all_reduce_max`), so every rank gets the
  exact global threshold without gathering a weight. A whole tensor loaded
  into a sharded weight (a full state dict) is cut to this rank's part
  (:func:`shard_like`). Where a shard cannot be computed alone (an N:M layer
  whose shards cut through its groups: :func:`shard_cuts` tells where every
  rank's shard begins), the weight is gathered whole (:func:`whole_on_first`).
- **Tensor parallelism** (``parallelize_module``, DTensor weights used as
  DTensors in the forward): the same local shards and groups; the
  parametrization maps the operator over each rank's shard in the forward.
- **Both on a 2-D mesh** (``fully_shard`` on ``"dp"`` over ``parallelize_module``
  on ``"tp"``): a weight sharded on both mesh dimensions is selected over the
  group spanning them (:func:`shard_group`), and each weight, also one sharded
  on ``"dp"`` alone, counts once over it (:func:`local_weights`).

For plain tensors (one process, or DDP) nothing here communicates.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.utils.weak import WeakIdKeyDictionary

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "DDPIndices",
    "all_reduce_max",
    "all_reduce_sum",
    "average_grads_under_ddp",
    "check_same_settings",
    "check_unsharded",
    "common_shard_group",
    "ddp_reducer_indices",
    "dtensor_type",
    "fsdp_managed",
    "is_dtensor",
    "local_weights",
    "on_local_shard",
    "reconnect_ddp",
    "refuse_lowered_param_dtype",
    "refuse_sharded_model",
    "shard_cuts",
    "shard_group",
    "shard_like",
    "to_local",
    "whole_on_first",
]

#: Per ``DistributedDataParallel`` in a model: the wrapper and where each
#: parameter (by ``id``) sits in its reducer.
DDPIndices = list[tuple[Any, dict[int, int]]]


# ----------------------------------------------------------------------- DTensor
def dtensor_type() -> type | None:
    """``torch.distributed.tensor.DTensor``, or None where torch has no distributed support."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - builds without torch.distributed
        return None
    return DTensor


def is_dtensor(value: Any) -> bool:
    """Whether ``value`` is a DTensor (False where torch has no distributed support).

    Args:
        value: anything.
    """
    dtensor = dtensor_type()
    return dtensor is not None and isinstance(value, dtensor)


def to_local(w: Any) -> Tensor:
    """A DTensor's local shard (a plain tensor view, no communication).

    Args:
        w: the DTensor.
    """
    local: Tensor = w.to_local()
    return local


def full_tensor(w: Tensor) -> Tensor:
    """A DTensor gathered whole (a collective: every rank of its mesh calls it); any
    other tensor as it is (FSDP2 leaves buffers plain)."""
    if not is_dtensor(w):
        return w
    whole: Tensor = w.full_tensor()  # type: ignore[attr-defined]
    return whole


def shard_like(value: Any, like: Tensor) -> Any:
    """A whole tensor ``value`` laid out as the DTensor ``like`` (this rank's part).

    For a full state dict that every rank holds (what
    ``torch.distributed.checkpoint``'s ``set_model_state_dict`` with
    ``full_state_dict=True`` expects): each rank cuts its part from its own
    copy, with no communication, so one layer's load can call it alone.
    ``value`` comes back as it is when ``like`` is not a DTensor, or ``value``
    is not a plain tensor of ``like``'s whole shape (a DTensor already, a
    shard, a wrong shape: loading reports it).

    Args:
        value: the whole tensor (every rank's own copy), or anything else.
        like: the weight it is loaded into; its mesh and placements give the layout.
    """
    if (
        not is_dtensor(like)
        or not isinstance(value, Tensor)
        or is_dtensor(value)
        or value.shape != like.shape
    ):
        return value
    from torch.distributed.tensor import distribute_tensor

    d: Any = like
    local = value.detach().to(device=d.to_local().device)
    return distribute_tensor(local, d.device_mesh, d.placements, src_data_rank=None)


def on_local_shard(fn: Callable[[Tensor], Tensor], w: Tensor) -> Tensor:
    """``fn(w)`` for an elementwise ``fn``; a DTensor's shards are mapped where they lie.

    Args:
        fn: an elementwise function of a plain tensor.
        w: a plain tensor or a DTensor (``fn`` then runs on its local shard, no
            communication).
    """
    if not is_dtensor(w):
        return fn(w)
    d: Any = w
    dtensor: Any = dtensor_type()
    local = fn(d.to_local())
    out: Tensor = dtensor.from_local(
        local, d.device_mesh, d.placements, run_check=False, shape=d.shape, stride=d.stride()
    )
    return out


def shard_cuts(w: Any) -> dict[int, list[int]] | None:
    """Where the shards of the DTensor ``w`` cut each sharded dimension, over all ranks.

    ``{dim: [offsets]}``: the indices along ``dim`` at which one rank's part
    ends and the next one's begins (neither 0 nor the whole length), the same
    on every rank, with ``torch.chunk``'s sizes as DTensor's ``Shard`` uses
    (a dimension sharded on several mesh dimensions is chunked in mesh order).
    None for a placement laid out otherwise (FSDP2's ``_StridedShard`` under
    tensor parallelism): the caller must then assume any cut.

    Args:
        w: the DTensor.
    """
    from torch.distributed.tensor import Shard

    spans: dict[int, list[tuple[int, int]]] = {}  # per dimension: (start, length) of each part
    for mesh_dim, placement in enumerate(w.placements):
        if placement.is_replicate() or placement.is_partial():
            continue
        if type(placement) is not Shard:  # a layout of its own, e.g. _StridedShard
            return None
        dim = placement.dim % w.dim()
        parts = w.device_mesh.size(mesh_dim)
        new = []
        for start, length in spans.get(dim, [(0, w.shape[dim])]):
            chunk = -(-length // parts)  # torch.chunk: ceil(length / parts), the last ones shorter
            for k in range(parts):
                lo, hi = min(k * chunk, length), min((k + 1) * chunk, length)
                new.append((start + lo, hi - lo))
        spans[dim] = new
    return {dim: sorted({s for s, _ in got} - {0, w.shape[dim]}) for dim, got in spans.items()}


def whole_on_first(w: Any, group: ProcessGroup | None) -> Tensor:
    """The DTensor ``w`` gathered whole on the first rank of ``group``, an empty part elsewhere.

    For a weight whose shards cannot be computed alone: every rank gathers it
    (``full_tensor``, a collective over its mesh), and only the group's rank 0
    keeps it, so that a sum over the group counts each weight once. The empty
    part keeps the weight's other dimensions (``whole[:0]``).

    Args:
        w: the DTensor (every rank of its mesh calls this).
        group: the group that counts it; None: the whole weight on every rank.
    """
    whole = full_tensor(w.detach())
    if group is None:
        return whole
    import torch.distributed as dist

    return whole if dist.get_rank(group) == 0 else whole[:0]


def _sharded_dims(w: Any) -> list[int]:
    """The mesh dimensions the DTensor ``w`` is sharded on: ``Shard`` and layouts of
    their own such as FSDP2's ``_StridedShard`` under tensor parallelism (whose
    ``is_shard()`` is False), not ``Replicate`` or ``Partial``."""
    return [i for i, p in enumerate(w.placements) if not (p.is_replicate() or p.is_partial())]


#: Per (mesh, mesh dimensions): the group of the mesh flattened over them (see shard_group).
_FLAT_GROUPS: dict[tuple[Any, tuple[int, ...]], ProcessGroup] = {}


def _flat_group(mesh: Any, dims: tuple[int, ...], placements: tuple[Any, ...]) -> ProcessGroup:
    """The group spanning mesh dimensions ``dims`` of ``mesh`` together (this rank's slice).

    Made once per mesh and dimensions with ``DeviceMesh._flatten`` (a collective over
    the whole mesh, as every rank reaches it in the same order), then reused.

    Raises:
        ValueError: for a mesh without dimension names (it cannot be sliced).
    """
    key = (mesh, dims)
    if key not in _FLAT_GROUPS:
        names = mesh.mesh_dim_names
        if names is None:
            raise ValueError(
                f"a prunable weight is sharded on {len(dims)} mesh dimensions {placements} of "
                "a mesh without dimension names: name them (init_device_mesh(..., "
                'mesh_dim_names=("dp", "tp"))) or pass Pruner(process_group=...) with the '
                "group spanning them"
            )
        sub = mesh if len(dims) == mesh.ndim else mesh[tuple(names[d] for d in dims)]
        _FLAT_GROUPS[key] = sub._flatten().get_group()
    return _FLAT_GROUPS[key]


def shard_group(w: Any) -> ProcessGroup | None:
    """The group of the mesh dimensions a DTensor is sharded on (None: replicated).

    One dimension: its group. Several (FSDP2 over tensor parallelism on a 2-D
    mesh: ``fully_shard`` on ``mesh["dp"]`` of a weight ``parallelize_module``
    sharded on ``mesh["tp"]``): the group of the mesh flattened over them,
    whose ranks together hold each weight once.

    Args:
        w: the DTensor.

    Raises:
        ValueError: for several dimensions of a mesh without dimension names.
    """
    dims = _sharded_dims(w)
    if not dims:
        return None
    if len(dims) == 1:
        group: ProcessGroup = w.device_mesh.get_group(dims[0])
        return group
    return _flat_group(w.device_mesh, tuple(dims), tuple(w.placements))


def common_shard_group(weights: Sequence[Any]) -> ProcessGroup | None:
    """The group to select over: the widest one the ``weights`` are sharded over.

    That group holds the ranks of all the others (None: no weight is sharded).
    On a 2-D mesh the weights that tensor parallelism shards are sharded over
    ``dp`` and ``tp`` together, and those it leaves whole over ``dp`` alone:
    the ``dp``×``tp`` group holds both (each weight is then counted once,
    see :func:`local_weights`).

    Args:
        weights: the prunable weights (DTensors).

    Raises:
        ValueError: if no group holds all the others' ranks.
    """
    import torch.distributed as dist

    groups = [g for g in (shard_group(w) for w in weights) if g is not None]
    if not groups:
        return None
    ranks = [frozenset(dist.get_process_group_ranks(g)) for g in groups]
    widest = max(range(len(groups)), key=lambda i: len(ranks[i]))
    if not all(r <= ranks[widest] for r in ranks):
        listed = sorted({tuple(sorted(r)) for r in ranks})
        raise ValueError(
            f"the prunable weights are sharded over different process groups {listed}, none "
            "of which holds the others; pass Pruner(process_group=...) with the one group to "
            "select over"
        )
    return groups[widest]


def _counted_here(w: Any, members: frozenset[int]) -> bool:
    """Whether this rank counts its part of the DTensor ``w`` when selecting over the
    group of global ranks ``members``, so that the group counts each weight once.

    Of the group's ranks that hold this rank's shard (the same coordinates on the
    mesh dimensions ``w`` is sharded on), the lowest counts it. A mesh that holds
    none of the group's lowest rank is one of several slices of a larger mesh that
    hold ``w`` alike (FSDP2's ``dp`` meshes, one per ``tp`` rank, for a layer tensor
    parallelism leaves whole): the slice holding that rank counts for them all.
    """
    import torch.distributed as dist

    return _counted(w.device_mesh, tuple(_sharded_dims(w)), members, dist.get_rank())


@functools.lru_cache(maxsize=1024)
def _counted(mesh: Any, sharded: tuple[int, ...], members: frozenset[int], rank: int) -> bool:
    """:func:`_counted_here` of global rank ``rank`` for a layout (the same at every step)."""
    ranks = mesh.mesh  # the global ranks, laid out as the mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None or not bool((ranks == min(members)).any()):
        return False
    here = tuple(c if i in sharded else slice(None) for i, c in enumerate(coordinate))
    holders = [r for r in ranks[here].flatten().tolist() if r in members]
    return rank == min(holders, default=-1)


def local_weights(
    weights: Sequence[Tensor],
    process_group: ProcessGroup | None,
    gather: Sequence[bool] | None = None,
) -> tuple[list[Tensor], ProcessGroup | None]:
    """This rank's part of each weight (detached) and the group it is sharded over.

    Plain tensors are whole weights (replicated under DDP): group None.
    DTensors (FSDP2, tensor parallelism, both on a 2-D mesh) give their local
    shard and ``process_group`` or the group they are sharded over
    (:func:`common_shard_group`). Each weight counts once over the group: a
    weight replicated on some mesh dimensions (a plain tensor, a DTensor
    replicated among sharded ones, a layer tensor parallelism leaves whole on
    a 2-D mesh) is counted on one rank per shard (:func:`_counted_here`; an
    empty view elsewhere).

    Args:
        weights: the prunable weights: plain tensors or DTensors.
        process_group: the group to select over; None: the one the DTensors are
            sharded over (:func:`common_shard_group`).
        gather: per weight, whether to gather a sharded one whole instead (a
            collective; see :func:`whole_on_first`): the same marks on every
            rank. None: gather none.

    Returns:
        This rank's part of each weight, and the group (None: nothing sharded).
    """
    detached = [w.detach() for w in weights]
    dtensor = dtensor_type()
    if dtensor is None or not any(isinstance(w, dtensor) for w in detached):
        return detached, None
    group = process_group
    if group is None:
        group = common_shard_group([w for w in detached if isinstance(w, dtensor)])
    if group is None:  # DTensors replicated on every mesh dimension
        return [to_local(w) if isinstance(w, dtensor) else w for w in detached], None
    import torch.distributed as dist

    members = frozenset(dist.get_process_group_ranks(group))
    first = dist.get_rank(group) == 0
    local = []
    for i, w in enumerate(detached):
        if isinstance(w, dtensor) and gather is not None and gather[i]:
            local.append(whole_on_first(w, group))
        elif isinstance(w, dtensor):
            part = to_local(w)
            local.append(part if _counted_here(w, members) else part.reshape(-1)[:0])
        else:
            local.append(w if first else w.reshape(-1)[:0])
    return local, group


# ------------------------------------------------------------------ reductions
def all_reduce_sum(values: Tensor, group: ProcessGroup | None) -> Tensor:
    """Elementwise sum over ``group``, in place; ``values`` unchanged when ``group`` is None.

    Args:
        values: this rank's values (summed in place).
        group: the process group to sum over; None: one process, nothing to sum.
    """
    if group is not None:
        import torch.distributed as dist

        dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group)
    return values


def all_reduce_max(maxima: Tensor, group: ProcessGroup) -> Tensor:
    """Elementwise max over the group, keeping NaN (a max reduction may drop it).

    Args:
        maxima: this rank's values.
        group: the process group to reduce over.

    Returns:
        The elementwise maximum over the group, NaN where any rank had a
        non-finite value.
    """
    import torch.distributed as dist

    finite = torch.isfinite(maxima)
    both = torch.stack([torch.where(finite, maxima, 0.0), (~finite).float()])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    return torch.where(both[1] > 0, math.nan, both[0])


def _digest(value: Any) -> int:
    """A 63-bit fingerprint of a JSON-able setting (the same on every rank for equal values)."""
    text = json.dumps(value, sort_keys=True, default=lambda o: f"<{type(o).__qualname__}>")
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def check_same_settings(
    settings: Mapping[str, Any], group: ProcessGroup, device: torch.device
) -> None:
    """Raise, on every rank alike, unless every rank of ``group`` holds the same ``settings``.

    One all-reduce (MIN) of each setting's fingerprint and its negation: a
    setting is the same on every rank iff its least and greatest fingerprint
    are equal. Every rank passes the same keys (the values may differ).

    Args:
        settings: the values that must agree, by name (JSON-able).
        group: the ranks that must agree (a collective over it).
        device: where the all-reduce runs (a CUDA device for NCCL).

    Raises:
        ValueError: naming the settings that differ, with this rank's values.
    """
    import torch.distributed as dist

    names = sorted(settings)
    digests = [_digest(settings[name]) for name in names]
    both = torch.tensor(digests + [-d for d in digests], dtype=torch.long, device=device)
    dist.all_reduce(both, op=dist.ReduceOp.MIN, group=group)
    reduced = both.tolist()  # one read from the device
    least, neg_greatest = reduced[: len(names)], reduced[len(names) :]
    differ = [n for n, lo, neg_hi in zip(names, least, neg_greatest) if lo != -neg_hi]
    if not differ:
        return
    mine = ", ".join(f"{name}={settings[name]!r}" for name in differ)
    step = " and call step() the same number of times on every rank" if "step" in differ else ""
    raise ValueError(
        f"the ranks the weights are sharded over were given different Pruner settings: "
        f"{', '.join(differ)} differ{'s' if len(differ) == 1 else ''} (rank "
        f"{dist.get_rank(group)} of {dist.get_world_size(group)} has {mine}); create the "
        f"Pruner with the same model and arguments on every rank{step}: each rank selects on "
        "its own shard, and the thresholds are only exact, and the collectives only meet, "
        "when every rank asks for the same selection"
    )


# ------------------------------------------------------------------------ FSDP2
def fsdp_managed(model: nn.Module, weights: Sequence[Tensor]) -> bool:
    """Whether FSDP2 (``fully_shard``) has sharded any of ``weights`` (the prunable ones).

    Args:
        model: the model the weights belong to.
        weights: its prunable weights.
    """
    if not any(is_dtensor(w) for w in weights):
        return False
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return False
    return any(isinstance(m, FSDPModule) for m in model.modules())


def refuse_sharded_model(model: nn.Module, weights: Sequence[Tensor]) -> None:
    """Raise if FSDP2 sharded the weights before the Pruner could attach.

    Args:
        model: the model the Pruner attaches to.
        weights: its prunable weights.

    Raises:
        ValueError: naming the order that works (attach, then ``fully_shard``).
    """
    if fsdp_managed(model, weights):
        raise ValueError(
            "the model's prunable weights are already sharded by FSDP2 (fully_shard): attach "
            "the Pruner to the unsharded model first, then call fully_shard (FSDP2 tracks "
            "each parameter where it was registered, and the Pruner's parametrization moves it)"
        )


def _fsdp_params(model: nn.Module) -> list[Any]:
    """FSDP2's per-parameter records (``FSDPParam``: the sharded parameter and its
    ``mp_policy``) of every ``fully_shard``-ed module in ``model``; empty where this
    torch lays them out otherwise (the records are FSDP2's internals)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return []
    found = []
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        state = module._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:  # torch before 2.9: one group per module
            one = getattr(state, "_fsdp_param_group", None)
            groups = [] if one is None else [one]
        for group in groups:
            found += list(getattr(group, "fsdp_params", ()))
    return found


def refuse_lowered_param_dtype(model: nn.Module, weights: Sequence[Tensor]) -> None:
    """Raise if FSDP2 casts a prunable weight to a narrower dtype for the forward.

    ``fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))``
    all-gathers a bf16 copy of each fp32 weight and the forward applies ``P_T``
    to that copy, while the Pruner selects on the fp32 shards: the rounded
    copies of weights just above ``T`` fall to it, so the forward prunes
    other (more) weights than the Pruner selected and reports.

    Args:
        model: the model the Pruner is attached to.
        weights: its prunable weights (the parameters FSDP2 sharded).

    Raises:
        ValueError: naming the layer's dtypes and the fix.
    """
    ids = {id(w) for w in weights}
    for record in _fsdp_params(model):
        param = getattr(record, "sharded_param", None)
        policy = getattr(record, "mp_policy", None)
        cast = getattr(policy, "param_dtype", None)
        if param is None or id(param) not in ids or cast is None:
            continue
        if torch.promote_types(param.dtype, cast) == cast:  # the same or wider: exact
            continue
        raise ValueError(
            f"FSDP2's MixedPrecisionPolicy(param_dtype={cast}) casts the {param.dtype} pruned "
            f"weights to {cast} for the forward, which then prunes the rounded copies while "
            f"the Pruner selects on the {param.dtype} shards, so the masks would differ from "
            "the ones it selects and reports: keep param_dtype None (or "
            f"{param.dtype}) for the modules holding pruned weights (reduce_dtype may be "
            "lower), and use torch.autocast for low-precision compute: the Pruner then "
            "prunes the full-precision weights and autocast casts P_T(w)"
        )


def check_unsharded(model: nn.Module, weights: Sequence[Tensor], what: str) -> None:
    """Raise if ``what`` (``"finalize"``, ``"remove"``) meets FSDP2-sharded weights.

    Args:
        model: the model the Pruner is attached to.
        weights: its prunable weights.
        what: the name of the operation, for the message.

    Raises:
        RuntimeError: naming the way out (``dense_state_dict`` into an unsharded copy).
    """
    if fsdp_managed(model, weights):
        raise RuntimeError(
            f"{what}() needs unsharded weights, but FSDP2 shards them: take "
            "pruner.dense_state_dict(pruned=True, full=True) on every rank (whole tensors) "
            "and load it into an unsharded copy of the model (docs/distributed.md shows how)"
        )


# ------------------------------------------------------------------------- DDP
def _enclosing_modules(model: nn.Module, depth: int = 4) -> list[nn.Module]:
    """The modules that hold ``model`` as a submodule, up to ``depth`` levels up.

    A training framework wraps the user's module (Lightning in its own wrapper,
    then in DDP; the Hugging Face Trainer in DDP) before a callback sees it;
    the wrappers are found through the ``_modules`` dictionaries that refer
    to the module (the garbage collector's referrers, a few hops per level).
    """
    found: list[nn.Module] = []
    level = [model]
    for _ in range(depth):
        parents: list[nn.Module] = []
        for child in level:
            for holder in gc.get_referrers(child):  # the parent's _modules dict
                if not isinstance(holder, dict):
                    continue
                # the parent itself, or its instance __dict__ and then the parent
                near = gc.get_referrers(holder)
                far = [o for d in near if isinstance(d, dict) for o in gc.get_referrers(d)]
                for owner in near + far:
                    if (
                        isinstance(owner, nn.Module)
                        and owner._modules is holder
                        and all(owner is not f for f in found + parents)
                    ):
                        parents.append(owner)
        if not parents:
            break
        found += parents
        level = parents
    return found


def ddp_reducer_indices(model: nn.Module) -> DDPIndices:
    """Where each parameter sits in the reducer of every DDP wrapper in or around ``model``.

    One entry per ``DistributedDataParallel`` inside or around ``model``.
    Needed when the Pruner is attached *after* DDP wrapping (see
    :func:`reconnect_ddp`): to the wrapper, or to the module inside it (what a
    framework's callback is given); taken before attaching, in DDP's own order
    (the trainable, non-ignored parameters, in ``named_parameters`` order).

    Args:
        model: the model, or the DDP wrapper around it.

    Raises:
        ValueError: for DDP options under which the reconnection is not sound.
    """
    from torch.nn.parallel import DistributedDataParallel

    out = []
    import torch.distributed as dist

    candidates = list(model.modules())
    if dist.is_available() and dist.is_initialized():  # DDP needs a group: else nothing to find
        candidates += _enclosing_modules(model)
    for ddp in candidates:
        if not isinstance(ddp, DistributedDataParallel):
            continue
        if (
            ddp.find_unused_parameters
            or ddp.static_graph
            or getattr(ddp, "mixed_precision", None) is not None
            or not hasattr(ddp.reducer, "_autograd_hook")
        ):
            raise ValueError(
                "attach the Pruner before wrapping the model in DistributedDataParallel when DDP "
                "uses find_unused_parameters, static_graph or mixed_precision: "
                "pruner = Pruner(model, ...); model = DistributedDataParallel(model); with a "
                "framework's callback (which attaches after the framework wrapped the model), "
                "turn find_unused_parameters off: Hugging Face "
                "TrainingArguments(ddp_find_unused_parameters=False), Lightning "
                "strategy=DDPStrategy(find_unused_parameters=False)"
            )
        ignore = ddp.parameters_to_ignore
        order = [p for n, p in ddp.module.named_parameters() if p.requires_grad and n not in ignore]
        out.append((ddp, {id(p): i for i, p in enumerate(order)}))
    return out


def _fire_ddp_hook(ddp: Any, index: int, param: Tensor) -> None:
    ddp.reducer._autograd_hook(index)


#: Per weight: the (DDP wrapper's id, reducer index) pairs :func:`reconnect_ddp` hooked.
_HOOKED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def reconnect_ddp(indices: DDPIndices, params: Sequence[Tensor]) -> None:
    """Reconnect DDP's gradient hooks to weights that a parametrization has re-set.

    ``register_parametrization`` keeps each weight's ``Parameter`` object but
    re-sets it in place (``Tensor.set_``), which gives it a fresh gradient
    accumulator. DDP hooked the old one at construction, so its all-reduce
    would never fire for these weights. Hooks registered on the tensor itself
    (``register_post_accumulate_grad_hook``) survive such resets; each tells
    the reducer that the weight's gradient is ready, as DDP does for its own
    mixed-precision parameters. They outlive the Pruner (``remove``,
    ``finalize``), so a weight is hooked once per wrapper and index: a later
    Pruner finds the hook in place (a second one would tell the reducer twice,
    which stops the backward).

    Args:
        indices: what :func:`ddp_reducer_indices` found before the parametrization
            was attached.
        params: the weights the parametrization re-set.
    """
    for ddp, index in indices:
        for p in params:
            i = index.get(id(p))
            if i is not None:
                hooked = _HOOKED.setdefault(p, set())
                if (id(ddp), i) in hooked:  # an earlier Pruner's hook, still on the weight
                    continue
                hooked.add((id(ddp), i))  # the hook holds ddp: its id stays unique
                p.register_post_accumulate_grad_hook(functools.partial(_fire_ddp_hook, ddp, i))


def _find_ddp(model: nn.Module) -> Any:
    """The ``DistributedDataParallel`` in or around ``model`` (the first found), or None."""
    from torch.nn.parallel import DistributedDataParallel

    for module in [*model.modules(), *_enclosing_modules(model)]:
        if isinstance(module, DistributedDataParallel):
            return module
    return None


_UNKNOWN = object()


class _DDPAverager:
    """Averages the gradients of a backbone's trainable tensors over a DDP wrapper's group.

    For a Pruner whose backbone has parameters (ASL+'s ``r_l``), which live
    outside the model and so outside DDP: each tensor gets a post-accumulate
    hook, and the first of them to fire in a backward queues one averaging at
    the end of that backward (as DDP finishes its own there), where all of
    them are all-reduced in one collective. The DDP wrapper is looked up in
    or around the model at the first backward under an initialised process
    group (the Pruner may be attached before wrapping), then kept. Nothing
    happens without a DDP wrapper, or while it skips synchronisation
    (``no_sync``: gradient accumulation); the gradient accumulated over the
    micro-batches is averaged at the backward that synchronises, as DDP does.
    Holds the model and the backbone weakly (the hooks outlive the Pruner),
    and no tensor (a weak reference would stop ``torch.utils.swap_tensors``).
    """

    def __init__(self, model: nn.Module, backbone: Any) -> None:
        self.model = weakref.ref(model)
        self.backbone = weakref.ref(backbone)
        self.ddp: Any = _UNKNOWN
        self.queued_in = -1  # the backward (graph task) that has an averaging queued

    def hook(self, param: Tensor) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return
        task = torch._C._current_graph_task_id()
        if task == self.queued_in:
            return
        if self.ddp is _UNKNOWN:
            model = self.model()
            self.ddp = None if model is None else _find_ddp(model)
        if self.ddp is None or not self.ddp.require_backward_grad_sync:
            return
        self.queued_in = task
        torch.autograd.Variable._execution_engine.queue_callback(self.average)

    def average(self) -> None:
        import torch.distributed as dist

        backbone = self.backbone()
        params: list[Tensor] = [] if backbone is None else list(backbone.parameters())
        if not params:
            return
        group = self.ddp.process_group
        world = dist.get_world_size(group)
        device = params[0].device
        # Each gradient flattened (zeros where a rank has none), then one flag per
        # tensor: whether this rank has a gradient. Any rank's: every rank gets one.
        flat = torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p))
                .detach()
                .reshape(-1)
                .to(device=device, dtype=torch.float32)
                for p in params
            ]
            + [torch.tensor([float(p.grad is not None) for p in params], device=device)]
        )
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        flat.div_(world)
        flags = flat[-len(params) :].tolist()
        offset = 0
        with torch.no_grad():
            for p, flag in zip(params, flags):
                value = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
                if flag == 0.0:
                    continue
                value = value.to(device=p.device, dtype=p.dtype)
                if p.grad is None:
                    p.grad = value.clone()
                else:
                    p.grad.copy_(value)


def average_grads_under_ddp(model: nn.Module, backbone: Any) -> None:
    """Keep the backbone's trainable tensors identical across DDP's ranks.

    DDP averages the gradients of the model's own parameters only; tensors the
    optimizer trains beside them (ASL+'s learned thresholds,
    ``backbone.parameters()``) would get each rank's own gradient and drift
    apart. Their gradients are averaged over the group of the DDP wrapper in
    or around ``model``, once per backward that DDP synchronises (see
    :class:`_DDPAverager`). Without DDP (one process, FSDP2, tensor
    parallelism) the hooks do nothing.

    Args:
        model: the model the Pruner is attached to (DDP may wrap it later).
        backbone: the Pruner's backbone; nothing is done when it has no parameters.
    """
    params = backbone.parameters()
    if not params:
        return
    averager = _DDPAverager(model, backbone)
    for param in params:
        param.register_post_accumulate_grad_hook(averager.hook)
