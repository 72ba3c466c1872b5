"""Mutants of the unstructured baselines the paper compares Feather against:
src/feather_sparse/baselines.py (ST-3's operator and its per-output-channel
rescale; Spartan's Sinkhorn soft top-k, its budget polish, its result and
warning, the implicit-gradient backward, ``soft_topk_mask``, and the Spartan
backbone: its argument checks, β ramp and freeze step, the budget and the
solver settings of each update, the soft masks after a return to sparsity 0,
the freeze, the forward, the pruned-weight count, its state and config; the
module's lazy ``__getattr__``). The eleven mutants of this file that the
training-formulas audit made (m_train.py: bl01-bl11: ST3_C, the rescale's
dims and ``a > t``, the soft shrink, the backward's budget term and sign, the β
ramp's end, the freeze's step and soft values, the default ``freeze_at``, the
forward's ``|w| > T``) are not repeated.

Every mutant runs TESTS (the files that import the module's names or train
with ``st3``/``spartan``, found with ``grep``), the most specific first: the run
stops at the first failure (-x).
"""

FILE = "src/feather_sparse/baselines.py"
TIMEOUT = 420  # per mutant: the whole list takes about 50 s on a shared 2-core machine

TESTS = [
    "tests/test_baselines.py",
    "tests/test_mutation_gaps_train.py",
    "tests/test_backbone_state.py",
    "tests/test_methods.py",
    "tests/test_pickle_model.py",
    "tests/test_device_operands.py",
    "tests/test_higher_order.py",
    "tests/test_pruner_usage.py",
    "tests/test_mutation_gaps_meth.py",
    "tests/test_pruner_audit.py",
    "tests/test_train_cli_checks.py",
    "tests/test_distributed_checkpoint.py",
    "tests/test_amp.py",
]

MUTATIONS = [
    # ---------------------------------------------------------------- ST-3
    dict(
        id="bas01",
        desc="ST-3 smoothing ε = 1e-3 instead of 1e-6",
        old="ST3_EPS = 1e-6",
        new="ST3_EPS = 1e-3",
    ),
    dict(
        id="bas02",
        desc="ST-3 rescale of a 1-d weight per element, not over the whole tensor",
        old="if a.dim() >= 2 else tuple(range(a.dim()))",
        new="if a.dim() >= 2 else ()",
    ),
    dict(
        id="bas03",
        desc="ST-3 rescale over the whole tensor for a 2-d (Linear) weight (dim > 2)",
        old="dims = tuple(range(1, a.dim())) if a.dim() >= 2",
        new="dims = tuple(range(1, a.dim())) if a.dim() > 2",
    ),
    dict(
        id="bas04",
        desc="ST-3 ρ_c from the shrunk magnitudes |w| − T, not |w|·m",
        old="kept = torch.where(a > t, a, 0.0)",
        new="kept = torch.where(a > t, a - t, 0.0)",
    ),
    dict(
        id="bas05",
        desc="ST-3 s_c = 1/(ρ_c + C) (numerator 1, not 1 + C)",
        old="return (one + ST3_C) / (rho + ST3_C)",
        new="return one / (rho + ST3_C)",
    ),
    dict(
        id="bas06",
        desc="ST-3 forward returns float32 for a half-precision weight (not cast back)",
        old="return soft.mul_(st3_rescale(w, tc)).to(w.dtype)",
        new="return soft.mul_(st3_rescale(w, tc))",
    ),
    # ------------------------------------------------------- Sinkhorn top-k
    dict(
        id="bas07",
        desc="sinkhorn_topk: the budget k = N accepted (k <= N)",
        old="if not 0 < k < n:",
        new="if not 0 < k <= n:",
    ),
    dict(
        id="bas08",
        desc="sinkhorn_topk: β = 0 accepted (beta < 0 refused only)",
        old="if not beta > 0:",
        new="if beta < 0:",
    ),
    dict(
        id="bas09",
        desc="sinkhorn_topk: ν starts at 0, not −softplus(z)",
        old="z_nu = [zi - F.softplus(zi) for zi in z]",
        new="z_nu = list(z)",
    ),
    dict(
        id="bas10",
        desc="sinkhorn_topk: the change measured from the first objective (prev never updated)",
        old="            prev = obj\n",
        new="",
    ),
    dict(
        id="bas11",
        desc="sinkhorn_topk: tol taken as an absolute change of Σ m·v, not relative",
        old="if abs(obj - prev) <= tol * abs(prev):",
        new="if abs(obj - prev) <= tol:",
    ),
    dict(
        id="bas12",
        desc="budget polish: the bracket's ends swapped (f > 0 raises lo)",
        old="            if f > 0:\n                hi = min(hi, mu)\n            else:\n                lo = max(lo, mu)",
        new="            if f > 0:\n                lo = max(lo, mu)\n            else:\n                hi = min(hi, mu)",
    ),
    dict(
        id="bas13",
        desc="budget polish: budget_tol taken as absolute (|Σm − k| <= tol), not relative to k",
        old="if abs(f) <= budget_tol * k or steps >= max_newton:",
        new="if abs(f) <= budget_tol or steps >= max_newton:",
    ),
    dict(
        id="bas14",
        desc="budget_error reported absolute |Σm − k|, not relative",
        old="error = abs(f) / k",
        new="error = abs(f)",
    ),
    dict(
        id="bas15",
        desc="a budget missed after the polish logged at debug level (no warning)",
        old='logger.warning("Spartan: budget error',
        new='logger.debug("Spartan: budget error',
    ),
    dict(
        id="bas16",
        desc="SinkhornResult: iterations and newton_steps swapped",
        old="return SinkhornResult(masks, mu, float(tau), iterations, steps, error)",
        new="return SinkhornResult(masks, mu, float(tau), steps, iterations, error)",
    ),
    # ------------------------------------------------- implicit backward
    dict(
        id="bas17",
        desc="backward: a saturated (binary) mask divides 0 by 0 (den >= 0)",
        old="coef = torch.where(den > 0, num / den, torch.zeros_like(den))",
        new="coef = torch.where(den >= 0, num / den, torch.zeros_like(den))",
    ),
    dict(
        id="bas18",
        desc="backward: the budget term per tensor instead of over all tensors",
        old="(g - coef).mul_(s)",
        new="(g - (g * s).sum() / s.sum()).mul_(s)",
    ),
    dict(
        id="bas19",
        desc="soft_topk_mask: budget_tol not passed on (the default 1e-6 used)",
        old="result = sinkhorn_topk(values, k, beta, tau, max_iters, tol, budget_tol)",
        new="result = sinkhorn_topk(values, k, beta, tau, max_iters, tol)",
    ),
    # ---------------------------------------------------- SpartanBackbone
    dict(
        id="bas20",
        desc="SpartanBackbone: beta_init == beta_target (a constant β) refused",
        old="if not 0 < beta_init <= beta_target:",
        new="if not 0 < beta_init < beta_target:",
    ),
    dict(
        id="bas21",
        desc="SpartanBackbone: freeze_at = 0 (freeze at the first update) refused",
        old="if not 0.0 <= freeze_at <= 1.0:",
        new="if not 0.0 < freeze_at <= 1.0:",
    ),
    dict(
        id="bas22",
        desc="SpartanBackbone: budget_tol <= 0 accepted (its check dropped)",
        old="if max_iters < 1 or not tol > 0 or not budget_tol > 0:",
        new="if max_iters < 1 or not tol > 0:",
    ),
    dict(
        id="bas23",
        desc="freeze step rounded up (ceil) instead of floor(freeze_at·total)",
        old="return math.floor(self.freeze_at * total_steps)",
        new="return math.ceil(self.freeze_at * total_steps)",
    ),
    dict(
        id="bas24",
        desc="β ramp: step > end (freeze step 0 divides by zero)",
        old="ratio = 1.0 if step >= end else",
        new="ratio = 1.0 if step > end else",
    ),
    dict(
        id="bas25",
        desc="soft-mask budget k = N − floor(s·N), not N − round(s·N) (the hard part's)",
        old="keep = n - round(sparsity * n)",
        new="keep = n - math.floor(sparsity * n)",
    ),
    dict(
        id="bas26",
        desc="each update solves with the default max_iters/tol/budget_tol, not the backbone's",
        old="values, keep, self.beta, float(t), self.max_iters, self.tol, self.budget_tol",
        new="values, keep, self.beta, float(t)",
    ),
    dict(
        id="bas27",
        desc="the soft masks tied to the weights with β_target, not the current β",
        old="_SoftTopKMask.apply(self.beta, self.last.masks, *weights)",
        new="_SoftTopKMask.apply(self.beta_target, self.last.masks, *weights)",
    ),
    dict(
        id="bas28",
        desc="an update at sparsity 0 keeps the previous soft masks",
        old="as Spartan does\n            self._masks = None",
        new="as Spartan does\n            pass",
    ),
    dict(
        id="bas29",
        desc="_solve does not record the sparsity (the state says 0)",
        old="        self._sparsity = sparsity\n        self._threshold = t",
        new="        self._threshold = t",
    ),
    dict(
        id="bas30",
        desc="load_state_dict before the freeze: the soft masks not recomputed",
        old="        else:\n            self._solve(self._sparsity)",
        new="        else:\n            pass",
    ),
    dict(
        id="bas31",
        desc="load_state_dict: β not restored (the masks recomputed at the fresh Pruner's β)",
        old='self.beta = float(state["beta"])',
        new="pass",
    ),
    dict(
        id="bas32",
        desc="freeze: a weight at |w| = T kept by the frozen mask (>=)",
        old="hard = (w.abs() > t).to(w.dtype)",
        new="hard = (w.abs() >= t).to(w.dtype)",
    ),
    dict(
        id="bas33",
        desc="pruned_mask before the freeze: a weight at |w| = T counted kept (<)",
        old="return weight.abs() <= threshold",
        new="return weight.abs() < threshold",
    ),
    dict(
        id="bas34",
        desc="forward: the hard part compares |w·m| with T, not |w|",
        old=(
            "        keep = weight.abs() > threshold\n"
            "        if self._masks is not None:\n"
            "            weight = weight * self._soft_mask(index, weight.device).to(weight.dtype)\n"
        ),
        new=(
            "        if self._masks is not None:\n"
            "            weight = weight * self._soft_mask(index, weight.device).to(weight.dtype)\n"
            "        keep = weight.abs() > threshold\n"
        ),
    ),
    dict(
        id="bas35",
        desc="config(): budget_tol left out (a Pruner rebuilt from its state has the default)",
        old='            "budget_tol": self.budget_tol,\n        }',
        new="        }",
    ),
    dict(
        id="bas36",
        desc="setup(): a backbone reused by a second Pruner stays frozen",
        old="        super().setup(targets)\n        self.frozen = False\n",
        new="        super().setup(targets)\n",
    ),
    dict(
        id="bas37",
        desc="module __getattr__: an unknown name gives None instead of AttributeError",
        old='raise AttributeError(f"module {__name__!r} has no attribute {name!r}")',
        new="return None",
    ),
]
