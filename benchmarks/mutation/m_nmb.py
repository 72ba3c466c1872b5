"""Mutants of the N:M methods: src/feather_sparse/nm/backbone.py (SR-STE's decay,
S-STE's β, one-shot's frozen mask, the ramp, the report and pruned masks),
src/feather_sparse/nm/methods.py (the methods' constants) and
src/feather_sparse/nm/fused.py (the fused forward and its cache).

A mutant with a ``file`` key mutates that file instead of FILE. Every mutant runs
TESTS (all single-process), the most specific first: the run stops at the first
failure (-x).
"""

FILE = "src/feather_sparse/nm/backbone.py"
METHODS = "src/feather_sparse/nm/methods.py"
FUSED = "src/feather_sparse/nm/fused.py"
TIMEOUT = 420  # per mutant: the whole list takes about 60-120 s on a shared 2-core machine

TESTS = [
    "tests/test_nm_methods.py",
    "tests/test_nm_fused.py",
    "tests/test_nm_pruner.py",
    "tests/test_backbone_state.py",
    "tests/test_nm.py",
    "tests/test_nm_conv_order.py",
    "tests/test_nm_config.py",
    "tests/test_nm_devices.py",
    "tests/test_higher_order.py",
    "tests/test_nm_export.py",
    "tests/test_nm_compile.py",
    "tests/test_pruner_guards.py",
    "tests/test_nm_train.py",
    "tests/test_nm_usage.py",
]

MUTATIONS = [
    # --- SR-STE: the sparse-refined decay λ·(1 − mask)⊙w
    dict(
        id="nmb01",
        desc="SR-STE's λ 2e-5 instead of 2e-4",
        file=METHODS,
        old="SR_STE_DECAY = 2e-4",
        new="SR_STE_DECAY = 2e-5",
    ),
    dict(
        id="nmb02",
        desc="fused path (after the first forward): decay sign flipped (-λ)",
        old="                    self.decay,\n                    None,\n                    None,\n                    pre,",
        new="                    -self.decay,\n                    None,\n                    None,\n                    pre,",
    ),
    dict(
        id="nmb03",
        desc="layers grouped by channels: decay dropped (λ = 0)",
        old="decay=self.decay,\n                mask=None if self._masks is None else self._grouped(",
        new="decay=0.0,\n                mask=None if self._masks is None else self._grouped(",
    ),
    dict(
        id="nmb04",
        desc="fused small layers: plain straight-through although λ > 0 (decay condition dropped)",
        old="plain = theta == 1.0 and self.decay == 0.0 and self._beta is None",
        new="plain = theta == 1.0 and self._beta is None",
    ),
    # --- S-STE: β = ⟨w, S(w)⟩ / ⟨S(w), S(w)⟩, fixed once training has started
    dict(
        id="nmb05",
        desc="β recomputed at every update (not fixed after the first step)",
        old="if self.rescale and (self._beta is None or self._at_start):",
        new="if self.rescale:",
    ),
    dict(
        id="nmb06",
        desc="β numerator from the weights alone: ⟨w, w⟩ / ⟨S, S⟩",
        old="sums.append(torch.stack([(w64 * s64).sum(), (s64 * s64).sum()]))",
        new="sums.append(torch.stack([(w64 * w64).sum(), (s64 * s64).sum()]))",
    ),
    dict(
        id="nmb07",
        desc="β inverted: ⟨S, S⟩ / ⟨w, S⟩",
        old="both[:, 0] / both[:, 1].clamp_min(1e-300)",
        new="both[:, 1] / both[:, 0].clamp_min(1e-300)",
    ),
    dict(
        id="nmb08",
        desc="β of an all-zero tensor 0 instead of 1",
        old="both[:, 1].clamp_min(1e-300), 1.0)",
        new="both[:, 1].clamp_min(1e-300), 0.0)",
    ),
    dict(
        id="nmb09",
        desc="β's S from the weight in storage order, not the group order (channels-grouped convs)",
        old="w = self._grouped(i, w)\n            s = nm_threshold(w, self.pattern, p=1.0)",
        new="s = nm_threshold(w, self.pattern, p=1.0)",
    ),
    dict(
        id="nmb10",
        desc="fused pass: every layer scaled by the first layer's β",
        file=FUSED,
        old="(ones if scales[i] is None else scales[i]).reshape(1)",
        new="(ones if scales[i] is None else scales[group[0]]).reshape(1)",
    ),
    dict(
        id="nmb11",
        desc="fused pass asked without β (small layers unscaled after the first forward)",
        old="pre = fused.get(index, weight, threshold, operator.p, self._stored, self._beta)",
        new="pre = fused.get(index, weight, threshold, operator.p, self._stored, None)",
    ),
    # --- one-shot: the frozen magnitude mask
    dict(
        id="nmb12",
        desc="one-shot mask taken again at every update (not frozen)",
        old="if self.freeze and (self._masks is None or self._at_start):",
        new="if self.freeze:",
    ),
    dict(
        id="nmb13",
        desc="one-shot forward with 1 − mask (the pruned weights kept)",
        old="mask=None if self._masks is None else self._masks[index],",
        new="mask=None if self._masks is None else ~self._masks[index],",
    ),
    dict(
        id="nmb14",
        desc="fused path taken with a frozen mask (the mask bypassed on small layers)",
        old="if fused is not None and self._masks is None and fused.usable(index, weight):",
        new="if fused is not None and fused.usable(index, weight):",
    ),
    dict(
        id="nmb15",
        desc="one-shot starts at a quarter of the steps instead of half-way",
        file=METHODS,
        old="ONESHOT_START = 0.5",
        new="ONESHOT_START = 0.25",
    ),
    # --- the ramp and the steps: when β and the mask are taken
    dict(
        id="nmb16",
        desc="step counted off by one: still 'at start' after the first step (step <= 1)",
        old="self._at_start = step == 0",
        new="self._at_start = step <= 1",
    ),
    dict(
        id="nmb17",
        desc="a dtype change after the first step still re-takes β and the mask (step > 1)",
        old="if step:  # trained since: what was taken is fixed",
        new="if step > 1:  # trained since: what was taken is fixed",
    ),
    dict(
        id="nmb18",
        desc="β and the mask taken only past the full pattern (ramp > 1)",
        old="if ramp >= 1.0:",
        new="if ramp > 1.0:",
    ),
    # --- state: save, load, the cache after a load
    dict(
        id="nmb19",
        desc="load_state_dict keeps the fused cache (forwards cached with the old β)",
        old="self._taken = None  # kept as loaded\n        self.release()",
        new="self._taken = None  # kept as loaded",
    ),
    dict(
        id="nmb20",
        desc="load_state_dict takes placeholders (taken = False) as taken values",
        old="self._beta, self._masks = (beta, masks) if taken else (None, None)",
        new="self._beta, self._masks = beta, masks",
    ),
    dict(
        id="nmb21",
        desc="state_dict: 'taken' from β only (a one-shot mask saved as a placeholder)",
        old="taken = self._beta is not None or self._masks is not None",
        new="taken = self._beta is not None",
    ),
    # --- what the Pruner reports and counts
    dict(
        id="nmb22",
        desc="report: mean group threshold without the ramp r",
        old="float(s / n) * float(r) if n else 0.0",
        new="float(s / n) if n else 0.0",
    ),
    dict(
        id="nmb23",
        desc="keep_mask at ramp < 1: a weight at r·T_g counted as kept (>=)",
        old="keep = keep | (x > t * threshold.to(t.dtype))",
        new="keep = keep | (x >= t * threshold.to(t.dtype))",
    ),
    dict(
        id="nmb24",
        desc="pruned_mask (finite p): the ramp ignored (T_g, not r·T_g)",
        old="t = t * threshold.to(t.dtype)",
        new="t = t * 1.0",
    ),
    dict(
        id="nmb25",
        desc="pruned_mask (hard, mask): zero weights among the kept not counted",
        old="return ~self.keep_mask(weight, threshold, index) | (weight.detach() == 0)",
        new="return ~self.keep_mask(weight, threshold, index)",
    ),
    # --- the fused forward and its cache: the same bits as layer by layer, never stale
    dict(
        id="nmb26",
        desc="cache valid whatever p (a forward of another p reused)",
        file=FUSED,
        old="entry.p == p\n            and entry.ramp is ramp",
        new="entry.ramp is ramp",
    ),
    dict(
        id="nmb27",
        desc="cache valid after the ramp buffer was written in place (version not checked)",
        file=FUSED,
        old="and entry.ramp_version == ramp._version\n",
        new="\n",
    ),
    dict(
        id="nmb28",
        desc="layer cached alone: bit reference aliases the weight (never stale after a step)",
        file=FUSED,
        old="reference = weight.detach().clone()",
        new="reference = weight.detach()",
    ),
    dict(
        id="nmb29",
        desc="fused pass: bit reference aliases the stored weight (never stale after a step)",
        file=FUSED,
        old="                flat, offset, forward, aux, first, g, r, r._version, p, version",
        new="                w.detach().reshape(-1), 0, forward, aux, first, g, r, r._version, p, version",
    ),
    dict(
        id="nmb30",
        desc="same_bits compares numel bytes, not numel·element_size (a quarter of float32)",
        file=FUSED,
        old="n = a.numel() * a.element_size()",
        new="n = a.numel()",
    ),
    dict(
        id="nmb31",
        desc="fused pass: every layer's backward constants from the first layer (aux[:g])",
        file=FUSED,
        old="        return t if self.rows == t.shape[0] else t[self.first : self.first + self.rows]",
        new="        return t if self.rows == t.shape[0] else t[: self.rows]",
    ),
]
