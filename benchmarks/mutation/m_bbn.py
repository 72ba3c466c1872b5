"""Mutants of the sparse-training backbones beyond the training-formulas audit:
src/feather_sparse/backbones.py (the stored weight a PruneTarget reads, the default
pruned mask, the global backbone's group, the per-layer state that follows a moved
model, ``allocate``'s checks and water-filling, GMP's first conv kept dense, the
FLOPs-biased per-layer thresholds, ASL+'s options, initial value, clamps, θ,
exact count, cached sizes, state and config, ASL's learning-rate scale, the
layer-collapse cap under sharding). The lines the training-formulas audit mutated
(m_train.py: bb01-bb16, the formulas of the four backbones) are left out.

Every mutant runs its own list of tests (``tests``), the most specific first: the
run stops at the first failure (-x). ``TESTS`` is the union (the baseline run).
"""

FILE = "src/feather_sparse/backbones.py"
TIMEOUT = 420  # per mutant: a survivor ran its whole list in 21-41 s on a shared 2-core machine

#: What reads the backbones through the Pruner (the uniform and global ones, allocate).
BB = [
    "tests/test_backbones.py",
    "tests/test_pruner.py",
    "tests/test_pruner_usage.py",
    "tests/test_pruner_guards.py",
    "tests/test_pruner_audit.py",
    "tests/test_methods.py",
    "tests/test_baselines.py",
    "tests/test_mutation_gaps_train.py",
]
#: ASL+ and the state a backbone keeps per layer (devices, inference mode, vmap, AMP).
ASL = [
    "tests/test_backbones.py",
    "tests/test_backbone_state.py",
    "tests/test_higher_order.py",
    "tests/test_device_operands.py",
    "tests/test_amp.py",
    "tests/test_pruner_usage.py",
    "tests/test_pruner.py",
    "tests/test_pruner_guards.py",
    "tests/test_baselines.py",
    "tests/test_methods.py",
]
#: The sharded paths: two processes (gloo), one fixture that runs every scenario once.
DIST = [
    "tests/test_distributed.py::test_layers_split_over_ranks_share_one_global_threshold",
    "tests/test_distributed.py::test_fsdp2_uniform_backbone_equals_single_process",
    "tests/test_distributed.py::test_sharded_layer_caps",
    "tests/test_backbones.py",
]

#: Every file any mutant runs (the baseline run and the docs' list).
TESTS = list(dict.fromkeys([*BB, *ASL, "tests/test_distributed.py"]))

MUTATIONS = [
    # ----------------------------------------------------------- PruneTarget, Backbone
    dict(
        id="bbn01",
        desc="PruneTarget.weight: the parametrized (thresholded) weight read, not the stored one",
        old="        if plist is not None:\n            # ``original``",
        new="        if False:\n            # ``original``",
        tests=BB,
    ),
    dict(
        id="bbn02",
        desc="PruneTarget.weight: a weight kept as a buffer ('original' not a Parameter) read as None",
        old="return plist.original if original is None else original",
        new="return original",
        tests=BB,
    ),
    dict(
        id="bbn03",
        desc="Backbone.pruned_mask: |w| < T counted as pruned (the k-th weight, |w| = T, kept)",
        old="        return weight.abs() <= threshold",
        new="        return weight.abs() < threshold",
        tests=BB,
    ),
    dict(
        id="bbn04",
        desc="global: the weights' group not passed to the selection (layers split over ranks)",
        old="            process_group=self.process_group,",
        new="            process_group=None,",
        tests=DIST,
    ),
    # ----------------------------------------------------------- devices, inference mode
    dict(
        id="bbn05",
        desc="on_device: the moved copy returned but not kept (the state stays on the old device)",
        old="            value = kept[index] = value.to(device)",
        new="            value = value.to(device)",
        tests=ASL,
    ),
    dict(
        id="bbn06",
        desc="outside_inference_mode: inference mode left on (state moved there is an inference tensor)",
        old="        return torch.inference_mode(False)\n",
        new="        return contextlib.nullcontext()\n",
        tests=ASL,
    ),
    dict(
        id="bbn07",
        desc="move_in_place: the accumulated gradient dropped by the move",
        old="        grad = None if param.grad is None else param.grad.to(device)",
        new="        grad = None",
        tests=ASL,
    ),
    dict(
        id="bbn08",
        desc="move_in_place: a frozen threshold (requires_grad False) made trainable by the move",
        old="nn.Parameter(moved, param.requires_grad)",
        new="nn.Parameter(moved)",
        tests=ASL,
    ),
    # ----------------------------------------------------------------------- allocate
    dict(
        id="bbn09",
        desc="allocate: shares and sizes of different lengths not refused",
        old='    if len(shares) != len(sizes):\n        raise ValueError(f"got {len(shares)} shares for {len(sizes)} tensors")\n',
        new="",
        tests=BB,
    ),
    dict(
        id="bbn10",
        desc="allocate: an infinite share accepted (only negative and NaN refused)",
        old="    if any(not (x >= 0 and math.isfinite(x)) for x in shares):",
        new="    if any(not x >= 0 for x in shares):",
        tests=BB,
    ),
    dict(
        id="bbn11",
        desc="allocate: zero shares filled equally once the others are full, not by size",
        old="weights = [float(sizes[i]) if i not in full else 0.0 for i in range(len(sizes))]",
        new="weights = [1.0 if i not in full else 0.0 for i in range(len(sizes))]",
        tests=BB,
    ),
    dict(
        id="bbn12",
        desc="allocate: a capped tensor's count not taken from what is left to share",
        old="            left -= sizes[i]\n",
        new="",
        tests=BB,
    ),
    # ------------------------------------------------------------------ uniform (GMP)
    dict(
        id="bbn13",
        desc="uniform keep_first_dense: only nn.Conv2d is a conv (a first Conv1d/Conv3d pruned)",
        old="    return isinstance(module, nn.modules.conv._ConvNd)",
        new="    return isinstance(module, nn.Conv2d)",
        tests=BB,
    ),
    dict(
        id="bbn14",
        desc="uniform keep_first_dense: a model without a conv keeps nothing dense (not its first tensor)",
        old="self.dense_index = convs[0] if convs else 0",
        new="self.dense_index = convs[0] if convs else None",
        tests=BB,
    ),
    dict(
        id="bbn15",
        desc="uniform keep_first_dense: index 0 taken for 'none' (if self.dense_index:)",
        old="        if self.dense_index is not None:",
        new="        if self.dense_index:",
        tests=BB,
    ),
    dict(
        id="bbn16",
        desc="uniform keep_first_dense: the first tensor kept dense, not the first conv",
        old="            shares[self.dense_index] = 0.0",
        new="            shares[0] = 0.0",
        tests=BB,
    ),
    dict(
        id="bbn17",
        desc="uniform: the weights' group not passed to the per-layer selections (FSDP2)",
        old="return _layer_kth(weights, counts, self._warm, self.process_group)",
        new="return _layer_kth(weights, counts, self._warm)",
        tests=DIST,
    ),
    # ------------------------------------------------------------------- global-flops
    dict(
        id="bbn18",
        desc="global-flops: T_l = s_l times the global cut, rounded (not the largest |w_l| whose score is at most the cut)",
        old="            out.append(torch.where(score <= t_star, magnitude, 0.0).amax())",
        new="            out.append(t_star / c)",
        tests=BB,
    ),
    # -------------------------------------------------------------------------- ASL+
    dict(
        id="bbn19",
        desc="ASL+ surrogate: the threshold's gradient summed in the weight's dtype (bf16), not float32",
        old="dtype = torch.promote_types(torch.promote_types(weight.dtype, t.dtype), torch.float32)",
        new="dtype = weight.dtype",
        tests=ASL,
    ),
    dict(
        id="bbn20",
        desc="ASL+: lam = 0 (no sparsity loss) refused",
        old="        if not (lam >= 0 and math.isfinite(lam)):",
        new="        if not (lam > 0 and math.isfinite(lam)):",
        tests=ASL,
    ),
    dict(
        id="bbn21",
        desc="ASL+: r_max <= 0 accepted (every threshold clamped to 0)",
        old="        if not r_max > 0:",
        new="        if not r_max >= 0:",
        tests=ASL,
    ),
    dict(
        id="bbn22",
        desc="ASL+: a NaN or infinite init accepted",
        old="        if init is not None and not math.isfinite(init):",
        new="        if False:",
        tests=ASL,
    ),
    dict(
        id="bbn23",
        desc="ASL+: init = 0.0 ignored (if self.init:), ASL's default used",
        old="        if self.init is not None:\n            value = self.init",
        new="        if self.init:\n            value = self.init",
        tests=ASL,
    ),
    dict(
        id="bbn24",
        desc="ASL+ setup: 'initialized' not reset (a reused backbone's new thresholds stay 0)",
        old="        self._initialized = False\n        self._sizes_on",
        new="        self._sizes_on",
        tests=ASL,
    ),
    dict(
        id="bbn25",
        desc="ASL+ advance: r reset to its initial value at every update",
        old="        if self._initialized:\n            return\n",
        new="",
        tests=ASL,
    ),
    dict(
        id="bbn26",
        desc="ASL+ implied sparsities: r above r_max not clamped",
        old="r = _stack([p.detach() for p in self.r]).double().clamp(0.0, self.r_max)",
        new="r = _stack([p.detach() for p in self.r]).double().clamp_min(0.0)",
        tests=ASL,
    ),
    dict(
        id="bbn27",
        desc="ASL+ forward: r not clamped to [0, r_max] (gradient where ASL's clamp gives none)",
        old="        r = self.r[index].clamp(0.0, self.r_max)",
        new="        r = self.r[index]",
        tests=ASL,
    ),
    dict(
        id="bbn28",
        desc="ASL+ forward: θ ignored (the operator applied with θ = 1)",
        old="        out = operator(weight, threshold, theta)",
        new="        out = operator(weight, threshold, 1.0)",
        tests=ASL,
    ),
    dict(
        id="bbn29",
        desc="ASL+ σ_l with Bessel's correction (N - 1), not ASL's population std",
        old="w.float().std(correction=0)",
        new="w.float().std()",
        tests=ASL,
    ),
    dict(
        id="bbn30",
        desc="ASL+: the loss's target s(t) not updated by thresholds() (stays 0)",
        old="        self._target = float(sparsity)\n",
        new="",
        tests=ASL,
    ),
    dict(
        id="bbn31",
        desc="ASL+ correction: K = floor(s·N) instead of round(s·N)",
        old="        target = round(sparsity * total)",
        new="        target = int(sparsity * total)",
        tests=ASL,
    ),
    dict(
        id="bbn32",
        desc="ASL+ correction, too few pruned: densities scaled uniformly (r ignored)",
        old="kept = [n - p for n, p in zip(self.sizes, pruned)]",
        new="kept = [float(n) for n, p in zip(self.sizes, pruned)]",
        tests=ASL,
    ),
    dict(
        id="bbn33",
        desc="ASL+ parameters(): the thresholds not moved to a moved model's device first",
        old="        self._follow_all()  # an optimizer made after",
        new="        # an optimizer made after",
        tests=ASL,
    ),
    dict(
        id="bbn34",
        desc="ASL+ regularizer: the cached sizes reused on another device",
        old="if sizes is None or sizes.device != like.device or sizes.dtype != like.dtype:",
        new="if sizes is None or sizes.dtype != like.dtype:",
        tests=ASL,
    ),
    dict(
        id="bbn35",
        desc="ASL+ load_state_dict: a state of another number of layers not refused (zip truncates)",
        old="        if r.numel() != len(self.r):",
        new="        if False:",
        tests=ASL,
    ),
    dict(
        id="bbn36",
        desc="ASL+ load_state_dict: the loss's target not restored (0 until the next update)",
        old="        self._target = float(target)\n",
        new="",
        tests=ASL,
    ),
    dict(
        id="bbn37",
        desc="ASL+ config: r_max left out (a rebuilt or resumed backbone gets the default 5)",
        old='"init": self.init, "r_max": self.r_max}',
        new='"init": self.init}',
        tests=ASL,
    ),
    dict(
        id="bbn38",
        desc="ASL_LR_SCALE: lr/10 instead of ASL's lr/100",
        old="ASL_LR_SCALE = 0.01",
        new="ASL_LR_SCALE = 0.1",
        tests=[
            "tests/test_baselines.py",
            "tests/test_backbones.py",
            "tests/test_methods.py",
        ],
    ),
    # --------------------------------------------------------- layer-collapse cap, sharded
    dict(
        id="bbn39",
        desc="layer_thresholds_at_most: layer sizes reduced with MAX over the ranks, not SUM",
        old="dist.all_reduce(total, op=dist.ReduceOp.SUM, group=process_group)",
        new="dist.all_reduce(total, op=dist.ReduceOp.MAX, group=process_group)",
        tests=DIST,
    ),
]
