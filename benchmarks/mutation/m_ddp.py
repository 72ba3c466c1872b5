"""Mutants of the distributed helpers beyond sharding: src/feather_sparse/distributed.py's
DTensor helpers, reductions, FSDP2 checks and the DDP reducer reconnection, and the two
places in src/feather_sparse/pruner.py where a refusal must come before any change.

The sharding layout (shard_cuts, shard_group, _counted, local_weights, whole_on_first,
shard_like's whole-shape check) is m_dist.py's; none of its mutants is repeated here.
A mutant with a ``file`` key mutates that file instead of FILE. Each mutant runs its own
``tests`` (the multi-process files take 15-40 s each on 2 or 4 gloo processes), the most
specific first: the run stops at the first failure (-x).
"""

FILE = "src/feather_sparse/distributed.py"
TIMEOUT = 420  # per mutant: one to three multi-process files
PRUNER = "src/feather_sparse/pruner.py"

DIST = "tests/test_distributed.py"
DCP = "tests/test_distributed_checkpoint.py"
TP = "tests/test_tensor_parallel.py"
TP2D = "tests/test_tensor_parallel_2d.py"
TPDCP = "tests/test_tensor_parallel_dcp.py"
KEYS = "tests/test_plain_keys.py"

#: Every file any mutant runs (the baseline run and the docs' list).
TESTS = [DIST, DCP, TP, TP2D, TPDCP, KEYS]

_FINALIZE_CHECK = '        distributed.check_unsharded(self.model, self.weights(), "finalize")\n'
_FINALIZE_UPDATE = (
    "        target = self.sparsity if sparsity is None else check_sparsity(sparsity)\n"
    '        if _overrides(self.backbone, "check_final"):  # what will be baked, while undoable\n'
    "            before = self.state_dict()\n"
    "            try:\n"
    "                self.update(target)\n"
    "                for i, t in enumerate(self.targets):\n"
    "                    self.backbone.check_final(i, self._parametrization(t)(t.weight))\n"
    "            except Exception:\n"
    "                self.load_state_dict(before)  # refused: the Pruner goes on as it was\n"
    "                raise\n"
    "        else:\n"
    "            self.update(target)\n"
)
_REMOVE_CHECK = '        distributed.check_unsharded(self.model, self.weights(), "remove")\n'
_REMOVE_RECORD = (
    "        thresholds = tuple(t.detach().clone() for t in self._buffers())\n"
    "        shown: tuple[float, ...] | None = None\n"
    "        zeros: tuple[int, ...] | None = None\n"
    "        try:  # a record for the queries; never in the way of giving the weights back\n"
    "            shown, zeros = tuple(self._shown_thresholds()), tuple(self._layer_zeros())\n"
    "        except Exception:  # e.g. a backbone left half-loaded by a refused state\n"
    '            logger.debug("remove: the pruned state could not be measured", exc_info=True)\n'
    "        self._release_keys()\n"
)

MUTATIONS = [
    # ------------------------------------------------------------ DTensor helpers
    dict(
        id="ddp01",
        desc="dtensor_type: None although torch has DTensor (every DTensor taken for a plain tensor)",
        old="    return DTensor\n",
        new="    return None\n",
        tests=[DIST],
    ),
    dict(
        id="ddp02",
        desc="to_local: the DTensor gathered whole instead of its local shard",
        old="local: Tensor = w.to_local()",
        new="local: Tensor = w.full_tensor()",
        tests=[DIST, TP],
    ),
    dict(
        id="ddp03",
        desc="full_tensor: the local shard instead of the whole tensor",
        old="whole: Tensor = w.full_tensor()  # type: ignore[attr-defined]",
        new="whole: Tensor = w.to_local()  # type: ignore[attr-defined]",
        tests=[DIST, DCP],
    ),
    dict(
        id="ddp04",
        desc="full_tensor: a plain tensor (a buffer FSDP2 leaves plain) gathered too",
        old="    if not is_dtensor(w):\n        return w\n    whole",
        new="    whole",
        tests=[DIST, DCP],
    ),
    dict(
        id="ddp05",
        desc="shard_like: a plain `like` (no DTensor) laid out too",
        old="        not is_dtensor(like)\n        or not isinstance(value, Tensor)",
        new="        not isinstance(value, Tensor)",
        tests=[KEYS, DCP],
    ),
    dict(
        id="ddp06",
        desc="shard_like: a DTensor value of the whole shape distributed again",
        old="        or is_dtensor(value)\n",
        new="",
        tests=[DCP, TPDCP],
    ),
    dict(
        id="ddp07",
        desc="shard_like: rank 0's copy scattered (a collective) instead of each rank cutting its own",
        old="src_data_rank=None",
        new="src_data_rank=0",
        tests=[DCP, TPDCP],
    ),
    dict(
        id="ddp08",
        desc="shard_like: a value that is not a tensor not passed through (its .shape read)",
        old="        or not isinstance(value, Tensor)\n",
        new="",
        tests=[DCP, TPDCP, KEYS],
    ),
    dict(
        id="ddp09",
        desc="on_local_shard: global shape and stride not given (inferred as if evenly sharded)",
        old="run_check=False, shape=d.shape, stride=d.stride()",
        new="run_check=False",
        tests=[TP, DIST, DCP],
    ),
    dict(
        id="ddp10",
        desc="on_local_shard: the shard's result returned plain (not rewrapped as a DTensor)",
        old="    )\n    return out\n\n\ndef shard_cuts",
        new="    )\n    return local\n\n\ndef shard_cuts",
        tests=[TP, DIST],
    ),
    # ----------------------------------------------------------------- reductions
    dict(
        id="ddp11",
        desc="all_reduce_sum: MAX instead of SUM",
        old="dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group)",
        new="dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group)",
        tests=[DIST, TP],
    ),
    dict(
        id="ddp12",
        desc="all_reduce_sum: over the default (world) group instead of `group`",
        old="dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group)",
        new="dist.all_reduce(values, op=dist.ReduceOp.SUM)",
        tests=[TP2D, DIST],
    ),
    dict(
        id="ddp13",
        desc="all_reduce_sum: a copy summed (the caller's tensor not summed in place)",
        old="dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group)",
        new="dist.all_reduce(values.clone(), op=dist.ReduceOp.SUM, group=group)",
        tests=[DIST, TP],
    ),
    dict(
        id="ddp14",
        desc="all_reduce_max: SUM instead of MAX",
        old="dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)",
        new="dist.all_reduce(both, op=dist.ReduceOp.SUM, group=group)",
        tests=[DIST, TP],
    ),
    dict(
        id="ddp15",
        desc="all_reduce_max: the non-finite flag must exceed 1 (NaN lost after the reduction)",
        old="torch.where(both[1] > 0, math.nan, both[0])",
        new="torch.where(both[1] > 1, math.nan, both[0])",
        tests=[DIST, TP],
    ),
    dict(
        id="ddp16",
        desc="all_reduce_max: only NaN flagged (an infinite maximum reduced as it is)",
        old="finite = torch.isfinite(maxima)",
        new="finite = ~torch.isnan(maxima)",
        tests=[DIST, TP],
    ),
    dict(
        id="ddp17",
        desc="all_reduce_max: non-finite values reduced as they are (not zeroed first)",
        old="torch.where(finite, maxima, 0.0)",
        new="maxima",
        tests=[DIST, TP],
    ),
    # ---------------------------------------------------------------------- FSDP2
    dict(
        id="ddp18",
        desc="fsdp_managed: only the root module checked (layers sharded alone missed)",
        old="return any(isinstance(m, FSDPModule) for m in model.modules())",
        new="return isinstance(model, FSDPModule)",
        tests=[DIST, TP],
    ),
    dict(
        id="ddp19",
        desc="fsdp_managed: every prunable weight must be a DTensor (a partly sharded model missed)",
        old="if not any(is_dtensor(w) for w in weights):",
        new="if not all(is_dtensor(w) for w in weights):",
        tests=[DIST, TP],
    ),
    dict(
        id="ddp20",
        desc="refuse_sharded_model: any DTensor weight refused (tensor parallelism too)",
        old="    if fsdp_managed(model, weights):\n        raise ValueError(",
        new="    if any(is_dtensor(w) for w in weights):\n        raise ValueError(",
        tests=[TP, DIST],
    ),
    dict(
        id="ddp21",
        desc="check_unsharded: nothing refused (finalize and remove go on under FSDP2)",
        old="    if fsdp_managed(model, weights):\n        raise RuntimeError(",
        new="    if False:\n        raise RuntimeError(",
        tests=[DIST, TP],
    ),
    dict(
        id="ddp22",
        desc="finalize: the FSDP2 check after the final update (a refused finalize moved the thresholds)",
        old=_FINALIZE_CHECK + _FINALIZE_UPDATE,
        new=_FINALIZE_UPDATE + _FINALIZE_CHECK,
        file=PRUNER,
        tests=[DIST, TP],
    ),
    dict(
        id="ddp23",
        desc="remove: the FSDP2 check after the state-dict keys are released",
        old=_REMOVE_CHECK + _REMOVE_RECORD,
        new=_REMOVE_RECORD + _REMOVE_CHECK,
        file=PRUNER,
        tests=[DIST, TP],
    ),
    # ------------------------------------------------------------------------ DDP
    dict(
        id="ddp24",
        desc="_enclosing_modules: one level up only (a framework's wrapper inside DDP hides it)",
        old="def _enclosing_modules(model: nn.Module, depth: int = 4)",
        new="def _enclosing_modules(model: nn.Module, depth: int = 1)",
        tests=[DIST],
    ),
    dict(
        id="ddp25",
        desc="_enclosing_modules: direct referrers of `_modules` only (the instance-dict hop dropped)",
        old="for owner in near + far:",
        new="for owner in near:",
        tests=[DIST],
    ),
    dict(
        id="ddp26",
        desc="ddp_reducer_indices: a DDP inside the model not looked for (the model itself only)",
        old="candidates = list(model.modules())",
        new="candidates = [model]",
        tests=[DIST, DCP],
    ),
    dict(
        id="ddp27",
        desc="ddp_reducer_indices: static_graph not refused",
        old="            or ddp.static_graph\n",
        new="",
        tests=[DIST],
    ),
    dict(
        id="ddp28",
        desc="ddp_reducer_indices: mixed_precision not refused",
        old='            or getattr(ddp, "mixed_precision", None) is not None\n',
        new="",
        tests=[DIST],
    ),
    dict(
        id="ddp29",
        desc="ddp_reducer_indices: frozen parameters counted (the indices after one shifted)",
        old="if p.requires_grad and n not in ignore]",
        new="if n not in ignore]",
        tests=[DIST, DCP],
    ),
    dict(
        id="ddp30",
        desc="ddp_reducer_indices: parameters DDP ignores counted (the indices after one shifted)",
        old="if p.requires_grad and n not in ignore]",
        new="if p.requires_grad]",
        tests=[DIST, DCP],
    ),
    dict(
        id="ddp31",
        desc="ddp_reducer_indices: indices in reverse (the buckets' order, not the reducer's)",
        old="{id(p): i for i, p in enumerate(order)}",
        new="{id(p): i for i, p in enumerate(reversed(order))}",
        tests=[DIST],
    ),
    dict(
        id="ddp32",
        desc="reconnect_ddp: the weight at index 0 skipped (`if i:` for `if i is not None:`)",
        old="            if i is not None:",
        new="            if i:",
        tests=[DIST],
    ),
    dict(
        id="ddp33",
        desc="reconnect_ddp: a gradient hook (before accumulation) instead of a post-accumulate one",
        old="p.register_post_accumulate_grad_hook(",
        new="p.register_hook(",
        tests=[DIST],
    ),
    dict(
        id="ddp34",
        desc="reconnect_ddp: a closure binds the loop's last index (every hook reports one weight)",
        old="functools.partial(_fire_ddp_hook, ddp, i)",
        new="lambda param: _fire_ddp_hook(ddp, i, param)",
        tests=[DIST],
    ),
]
