"""Mutants of the sharding code: src/feather_sparse/distributed.py and the N:M
shard-splitting rule, report and S-STE sums of src/feather_sparse/nm/backbone.py.

A mutant with a ``file`` key mutates that file instead of FILE. Each mutant runs its
own ``tests`` (the multi-process files take 10-60 s each on 2 gloo processes), the
fastest or most specific first: the run stops at the first failure (-x).
"""

FILE = "src/feather_sparse/distributed.py"
TIMEOUT = 420  # per mutant: two or three multi-process files
BACKBONE = "src/feather_sparse/nm/backbone.py"

SPLIT = "tests/test_nm_fsdp_split.py"
TP = "tests/test_tensor_parallel.py"
TP2D = "tests/test_tensor_parallel_2d.py"
TPDCP = "tests/test_tensor_parallel_dcp.py"
EXACT = "tests/test_sharded_exactness.py"
NMDIST = "tests/test_nm_distributed.py"
DIST = "tests/test_distributed.py"
DCP = "tests/test_distributed_checkpoint.py"

#: Every file any mutant runs (the baseline run and the docs' list).
TESTS = [SPLIT, TP, TP2D, TPDCP, EXACT, NMDIST, DIST, DCP]

MUTATIONS = [
    dict(
        id="dist01",
        desc="shard_cuts: chunk = floor(length / parts) instead of ceil (torch.chunk)",
        old="chunk = -(-length // parts)",
        new="chunk = length // parts",
        tests=[SPLIT, TP],
    ),
    dict(
        id="dist02",
        desc="shard_cuts: part ends not clamped to the length (cuts past the end)",
        old="lo, hi = min(k * chunk, length), min((k + 1) * chunk, length)",
        new="lo, hi = k * chunk, (k + 1) * chunk",
        tests=[SPLIT, TP],
    ),
    dict(
        id="dist03",
        desc="shard_cuts: a second mesh dimension re-chunks the whole length (no nesting)",
        old="for start, length in spans.get(dim, [(0, w.shape[dim])]):",
        new="for start, length in [(0, w.shape[dim])]:",
        tests=[SPLIT, TP2D],
    ),
    dict(
        id="dist04",
        desc="whole_on_first: every rank keeps the gathered weight (group's rank-0 condition dropped)",
        old="return whole if dist.get_rank(group) == 0 else whole[:0]",
        new="return whole",
        tests=[SPLIT, EXACT],
    ),
    dict(
        id="dist05",
        desc="whole_on_first: global rank 0 keeps it instead of the group's rank 0",
        old="return whole if dist.get_rank(group) == 0 else whole[:0]",
        new="return whole if dist.get_rank() == 0 else whole[:0]",
        tests=[SPLIT, EXACT, TP2D],
    ),
    dict(
        id="dist06",
        desc="_sharded_dims: only Shard placements (is_shard(): _StridedShard dropped)",
        old="return [i for i, p in enumerate(w.placements) if not (p.is_replicate() or p.is_partial())]",
        new="return [i for i, p in enumerate(w.placements) if p.is_shard()]",
        tests=[TP2D, TPDCP],
    ),
    dict(
        id="dist07",
        desc="shard_group: the first sharded mesh dimension's group for several (not flattened)",
        old="if len(dims) == 1:\n        group: ProcessGroup = w.device_mesh.get_group(dims[0])",
        new="if len(dims) >= 1:\n        group: ProcessGroup = w.device_mesh.get_group(dims[0])",
        tests=[TP2D],
    ),
    dict(
        id="dist08",
        desc="common_shard_group: the narrowest group (min) instead of the widest",
        old="widest = max(range(len(groups)), key=lambda i: len(ranks[i]))",
        new="widest = min(range(len(groups)), key=lambda i: len(ranks[i]))",
        tests=[TP2D],
    ),
    dict(
        id="dist09",
        desc="_counted: the slice holding the group's highest rank counts (max(members))",
        old="not bool((ranks == min(members)).any())",
        new="not bool((ranks == max(members)).any())",
        tests=[TP2D],
    ),
    dict(
        id="dist10",
        desc="_counted: the highest holder of a shard counts it (max of holders)",
        old="return rank == min(holders, default=-1)",
        new="return rank == max(holders, default=-1)",
        tests=[TP2D, DIST],
    ),
    dict(
        id="dist11",
        desc="_counted: every slice of a larger mesh counts (slice condition dropped)",
        old="if coordinate is None or not bool((ranks == min(members)).any()):",
        new="if coordinate is None:",
        tests=[TP2D],
    ),
    dict(
        id="dist12",
        desc="_counted: holders of the shard taken on every mesh dimension (each rank counts its part)",
        old="here = tuple(c if i in sharded else slice(None) for i, c in enumerate(coordinate))",
        new="here = tuple(c for i, c in enumerate(coordinate))",
        tests=[TP2D],
    ),
    dict(
        id="dist13",
        desc="local_weights: every rank counts its DTensor part (_counted_here dropped)",
        old="local.append(part if _counted_here(w, members) else part.reshape(-1)[:0])",
        new="local.append(part)",
        tests=[TP2D, DIST],
    ),
    dict(
        id="dist14",
        desc="local_weights: the gather marks ignored (a split layer's shard used as it is)",
        old="if isinstance(w, dtensor) and gather is not None and gather[i]:",
        new="if False:",
        tests=[SPLIT],
    ),
    dict(
        id="dist15",
        desc="local_weights: a plain tensor counted on every rank of the group",
        old="local.append(w if first else w.reshape(-1)[:0])",
        new="local.append(w)",
        tests=[DIST, TP2D],
    ),
    dict(
        id="dist16",
        desc="shard_like: the whole-shape check dropped (a part is cut again)",
        old="        or value.shape != like.shape\n",
        new="",
        tests=[TPDCP, DCP],
    ),
    dict(
        id="nmsplit01",
        desc="_splits_groups: g == 1 skipped as rows instead of g == 0",
        old="if g == 0 or not offsets:",
        new="if g == 1 or not offsets:",
        file=BACKBONE,
        tests=[SPLIT, TP],
    ),
    dict(
        id="nmsplit02",
        desc="_splits_groups: cut offset % m without the inner size (c % m)",
        old="any(c * inner % m for c in offsets)",
        new="any(c % m for c in offsets)",
        file=BACKBONE,
        tests=[SPLIT, TP],
    ),
    dict(
        id="nmsplit03",
        desc="_splits_groups: block repeat (size_g·inner % m) not checked",
        old=" or (g > 1 and shape[g] * inner % m)",
        new="",
        file=BACKBONE,
        tests=[SPLIT, TP],
    ),
    dict(
        id="nmsplit04",
        desc="_group_dim: transposed order keeps the dimension (dim for 1 - dim)",
        old="return 1 - dim",
        new="return dim",
        file=BACKBONE,
        tests=[SPLIT, TP],
    ),
    dict(
        id="nmsplit05",
        desc="_group_dim: channels order keeps kernel dimensions in place (dim for dim - 1)",
        old="return ndim - 1 if dim == 1 else dim - 1",
        new="return ndim - 1 if dim == 1 else dim",
        file=BACKBONE,
        tests=[SPLIT, TP],
    ),
    dict(
        id="nmrep01",
        desc="report_thresholds: Σ T_g summed in float32 (then widened)",
        old="sums.append(torch.stack([t.double().sum(), count]))",
        new="sums.append(torch.stack([t.sum().double(), count]))",
        file=BACKBONE,
        tests=[TP, TP2D, NMDIST],
    ),
    dict(
        id="nmbeta01",
        desc="_rescale_factors: S-STE sums in float32 instead of float64",
        old="w64, s64 = w.to(here, torch.float64), s.to(here, torch.float64)",
        new="w64, s64 = w.to(here, torch.float32), s.to(here, torch.float32)",
        file=BACKBONE,
        tests=[EXACT, SPLIT],
    ),
    dict(
        id="nmbeta02",
        desc="_rescale_factors: a layer whose shards split groups not gathered",
        old="if self.process_group is not None and self.splits_groups(i, self.targets[i].weight):",
        new="if False:",
        file=BACKBONE,
        tests=[SPLIT, EXACT],
    ),
    dict(
        id="nmbeta03",
        desc="_rescale_factors: the wrong all-reduce (MAX instead of SUM)",
        old="dist.all_reduce(both, group=self.process_group)",
        new="dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.process_group)",
        file=BACKBONE,
        tests=[EXACT, SPLIT],
    ),
]
