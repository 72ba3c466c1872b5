"""Mutants of the analysis tools: src/feather_sparse/analysis/flops.py (dense and
sparse multiply-accumulates per sample), layers.py (the per-layer sparsity table),
stability.py (mask Pearson r, the flips between recorded masks, the recorder) and
summary.py (mean ± std over seeds, plot curves).

A mutant with a ``file`` key mutates that file instead of FILE. Every mutant runs
TESTS, the most specific first: the run stops at the first failure (-x).
"""

FILE = "src/feather_sparse/analysis/flops.py"
LAYERS = "src/feather_sparse/analysis/layers.py"
STABILITY = "src/feather_sparse/analysis/stability.py"
SUMMARY = "src/feather_sparse/analysis/summary.py"
TIMEOUT = 420  # per mutant: a survivor takes about 60-120 s on a shared 2-core machine

TESTS = [
    "tests/test_analysis.py",
    "tests/test_train_modes.py",
    "tests/test_experiments.py",
    "tests/test_bench_claims.py",
]

MUTATIONS = [
    # --- flops.py: a layer's and the model's counts
    dict(
        id="anl01",
        desc="layer's sparse MACs from its params, not its non-zeros",
        old="return self.uses * self.nonzeros",
        new="return self.uses * self.params",
    ),
    dict(
        id="anl02",
        desc="layer density: the fraction of zeros (1 − nonzeros/params)",
        old="return self.nonzeros / self.params if self.params else 0.0",
        new="return 1.0 - self.nonzeros / self.params if self.params else 0.0",
    ),
    dict(
        id="anl03",
        desc="torch_flops from the sparse MACs (2 × sparse instead of 2 × dense)",
        old="return 2 * self.dense_macs",
        new="return 2 * self.sparse_macs",
    ),
    dict(
        id="anl04",
        desc="model density: weight density (nonzeros/params) instead of sparse/dense MACs",
        old="return self.sparse_macs / self.dense_macs if self.dense_macs else 0.0",
        new="return self.nonzeros / self.params if self.params else 0.0",
    ),
    dict(
        id="anl05",
        desc="table: a layer's sparse MFLOPs column shows its dense MACs",
        old="| {r.macs / 1e6:.4g} | {r.sparse_macs / 1e6:.4g} |",
        new="| {r.macs / 1e6:.4g} | {r.macs / 1e6:.4g} |",
    ),
    dict(
        id="anl06",
        desc="table: a layer's density rounded to whole percents (.0% instead of .2%)",
        old="| {r.kind} | {shape} | {r.density:.2%} ",
        new="| {r.kind} | {shape} | {r.density:.0%} ",
    ),
    dict(
        id="anl07",
        desc="table: the total's MFLOPs to 2 significant digits (.2g instead of .4g)",
        old='f"| {self.dense_macs / 1e6:.4g} | {self.sparse_macs / 1e6:.4g} |"',
        new='f"| {self.dense_macs / 1e6:.2g} | {self.sparse_macs / 1e6:.2g} |"',
    ),
    # --- flops.py: how often each weight is used per sample
    dict(
        id="anl08",
        desc="linear layer: rows of the whole batch (not divided by the batch size)",
        old="positions = output.numel() // (batch * output.shape[-1])",
        new="positions = output.numel() // output.shape[-1]",
    ),
    dict(
        id="anl09",
        desc="linear layer: rows from in_features instead of out_features",
        old="positions = output.numel() // (batch * output.shape[-1])",
        new="positions = output.numel() // (batch * module.in_features)",
    ),
    dict(
        id="anl10",
        desc="a layer called twice counted once (the last call's uses kept)",
        old="uses[module] = uses.get(module, 0) + positions",
        new="uses[module] = positions",
    ),
    dict(
        id="anl11",
        desc="a layer defined but not called: not skipped (KeyError)",
        old="            if module not in uses:  # defined but not called in this forward\n",
        new="            if False:  # defined but not called in this forward\n",
    ),
    dict(
        id="anl12",
        desc="bias counted in the layer's params (and MACs)",
        old="params=weight.numel(),",
        new="params=sum(p.numel() for p in module.parameters()),",
    ),
    dict(
        id="anl13",
        desc="non-zeros of the stored (dense) weight, not of P_T(w) the forward uses",
        old="nonzeros=int(torch.count_nonzero(weight)),",
        new=(
            "nonzeros=int(torch.count_nonzero(module.parametrizations.weight.original"
            ' if hasattr(module, "parametrizations") else weight)),'
        ),
    ),
    dict(
        id="anl14",
        desc="the forward run in the model's own mode (not eval: batch-norm statistics updated)",
        old="        with evaluating(model), torch.no_grad():\n            model(x)\n    finally:",
        new="        with torch.no_grad():\n            model(x)\n    finally:",
    ),
    dict(
        id="anl15",
        desc="the forward hooks left on the model",
        old="        for h in handles:\n            h.remove()",
        new="        for h in handles:\n            pass",
    ),
    dict(
        id="anl16",
        desc="example input always float32 (a float64 model's forward fails)",
        old="dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32",
        new="dtype = torch.float32",
    ),
    dict(
        id="anl17",
        desc="input_shape with a zero size accepted (s < 0 instead of s <= 0)",
        old="if not shape or any(s <= 0 for s in shape):",
        new="if not shape or any(s < 0 for s in shape):",
    ),
    dict(
        id="anl18",
        desc="an example batch's report shape keeps the batch dimension",
        old="return example, tuple(example.shape[1:])",
        new="return example, tuple(example.shape)",
    ),
    dict(
        id="anl19",
        desc="reference_flops of an example batch: not divided by the batch size",
        old="return counter.get_total_flops() // x.shape[0]",
        new="return counter.get_total_flops()",
    ),
    # --- layers.py
    dict(
        id="anl20",
        desc="overall sparsity: the unweighted mean of the layers' sparsities",
        file=LAYERS,
        old="        return 1.0 - self.nonzeros / self.params if self.params else 0.0\n\n    def table",
        new=(
            "        return sum(r.sparsity for r in self.layers) / len(self.layers)"
            " if self.layers else 0.0\n\n    def table"
        ),
    ),
    dict(
        id="anl21",
        desc="table: a layer's sparsity rounded to whole percents (.0% instead of .2%)",
        file=LAYERS,
        old="| {r.params:,} | {r.sparsity:.2%} |",
        new="| {r.params:,} | {r.sparsity:.0%} |",
    ),
    dict(
        id="anl22",
        desc="the pruner's targets ignored (every conv and linear listed)",
        file=LAYERS,
        old="    if targets:\n",
        new="    if False:\n",
    ),
    dict(
        id="anl23",
        desc="effective weight not detached",
        file=LAYERS,
        old="out.append((names.get(m, type(m).__name__), weight.detach()))",
        new="out.append((names.get(m, type(m).__name__), weight))",
    ),
    # --- stability.py: the masks and their counts
    dict(
        id="anl24",
        desc="unpack without count: the padding bits of the last byte returned",
        file=STABILITY,
        old="return np.unpackbits(self.array(), count=self.numel).astype(bool)",
        new="return np.unpackbits(self.array()).astype(bool)",
    ),
    dict(
        id="anl25",
        desc="Pearson r of a constant mask 0 instead of NaN",
        file=STABILITY,
        old="        if den == 0:  # a mask with no variance (all kept, or all pruned)\n            return math.nan",
        new="        if den == 0:  # a mask with no variance (all kept, or all pruned)\n            return 0.0",
    ),
    dict(
        id="anl26",
        desc="Pearson denominator: b(n − a) instead of b(n − b)",
        file=STABILITY,
        old="den = self.a * (self.n - self.a) * self.b * (self.n - self.b)",
        new="den = self.a * (self.n - self.a) * self.b * (self.n - self.a)",
    ),
    dict(
        id="anl27",
        desc="changed: a + b − both (entries set in either) instead of a + b − 2·both",
        file=STABILITY,
        old="return (self.a + self.b - 2 * self.both) / self.n if self.n else 0.0",
        new="return (self.a + self.b - self.both) / self.n if self.n else 0.0",
    ),
    dict(
        id="anl28",
        desc="masks of different sizes not refused",
        file=STABILITY,
        old="    if x.numel != y.numel:\n",
        new="    if False:\n",
    ),
    dict(
        id="anl29",
        desc="current mask: kept where w > 0 (negative weights counted as pruned)",
        file=STABILITY,
        old="PackedMask.from_tensor(w != 0)",
        new="PackedMask.from_tensor(w > 0)",
    ),
    # --- stability.py: the recorder's curves
    dict(
        id="anl30",
        desc="flips counted against the first recorded mask (cumulative), not the previous one",
        file=STABILITY,
        old="            prev = current\n",
        new="            prev = current if prev is None else prev\n",
    ),
    dict(
        id="anl31",
        desc="flips of the first recorded epoch 0 instead of NaN",
        file=STABILITY,
        old="                changed.append(math.nan)",
        new="                changed.append(0.0)",
    ),
    dict(
        id="anl32",
        desc="per-layer r: the whole model's r in every layer's row",
        file=STABILITY,
        old="per_layer[i].append(c.pearson)",
        new="per_layer[i].append(_sum_counts(counts).pearson)",
    ),
    dict(
        id="anl33",
        desc="every: epochs 1, 1 + every, ... recorded ((epoch − 1) % every)",
        file=STABILITY,
        old="if epoch % self.every == 0:",
        new="if (epoch - 1) % self.every == 0:",
    ),
    dict(
        id="anl34",
        desc="a pending (skipped) epoch not cleared when a later epoch is recorded",
        file=STABILITY,
        old="            self.masks.append(masks)\n            self._pending = None\n",
        new="            self.masks.append(masks)\n",
    ),
    dict(
        id="anl35",
        desc="first_epoch_above: the first epoch at the level, even if r drops later",
        file=STABILITY,
        old="            if math.isnan(r) or r < level:\n                found = None",
        new="            if math.isnan(r) or r < level:\n                continue",
    ),
    dict(
        id="anl36",
        desc="sparsity curve: the fraction kept (ones/n) instead of the fraction pruned",
        file=STABILITY,
        old="sparsity.append(1.0 - sum(m.ones for m in current) / n)",
        new="sparsity.append(sum(m.ones for m in current) / n)",
    ),
    # --- summary.py
    dict(
        id="anl37",
        desc="population standard deviation (pstdev) instead of the sample one",
        file=SUMMARY,
        old="return statistics.fmean(vals), statistics.stdev(vals)",
        new="return statistics.fmean(vals), statistics.pstdev(vals)",
    ),
    dict(
        id="anl38",
        desc="Curve: std's length not checked",
        file=SUMMARY,
        old="if not len(self.x) == len(self.mean) == len(self.std):",
        new="if not len(self.x) == len(self.mean):",
    ),
]
