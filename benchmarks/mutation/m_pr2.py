"""Mutants of the parts of src/feather_sparse/pruner.py that the first Pruner audit
(m_pruner.py: step, update_every, check_finite, finalize's target and count, the
state's fields and checks, the report's scheduled sparsity) and the DDP audit
(m_ddp.py: ddp22, ddp23, the order of finalize's and remove's FSDP2 checks) left
alone: which layers a Pruner takes (``include``/``exclude`` names and ``"re:"``
patterns, ``min_params``, GPT-2's Conv1D under the default only, tied weights and
their holders, the parameter order ``_unparametrize`` gives back), attaching (its
checks, its rollback, the backbone's forward hook, the sparsity in effect at
attach), the callable schedule, ``update()`` without a sparsity, the collapse
warning's guards and the layer cap, the finite check's names, finalize's storage
and plain keys, remove's tied layers, ``dense_state_dict(pruned=True)``,
``config()``, what ``from_state_dict`` passes on, ``_check_state``'s ranges and
required keys, the report's table, and a threshold kept through a dtype move.

A mutant with a ``tests`` key runs that list instead of TESTS, the most specific
first: the run stops at the first failure (-x).
"""

FILE = "src/feather_sparse/pruner.py"
TIMEOUT = 300  # per mutant: the whole list takes about 70 s on a shared 2-core machine

TESTS = [
    "tests/test_pruner.py",
    "tests/test_pruner_guards.py",
    "tests/test_pruner_audit.py",
    "tests/test_pruner_usage.py",
    "tests/test_pruner_no_weights.py",
    "tests/test_mutation_gaps_pruner.py",
    "tests/test_backbone_state.py",
    "tests/test_nm_pruner.py",
    "tests/test_methods.py",
    "tests/test_baselines.py",
    "tests/test_integrations_common.py",
    "tests/test_plain_keys.py",
    "tests/test_plain_keys_usage.py",
    "tests/test_pickle_model.py",
    "tests/test_first_hour.py",
    "tests/test_mutation_gaps_keys.py",
    "tests/test_nm_fused.py",
    "tests/test_nm_conv_order.py",
]

#: GPT-2's Conv1D is met in the Hugging Face tests only.
_HF = [*TESTS, "tests/test_hf_models.py"]

MUTATIONS = [
    # ------------------------------------------------------------- layer selection
    dict(
        id="pr201",
        desc="_matches: a 're:' pattern matched at the start of the name, not in full",
        old="if re.fullmatch(pat[3:], name):",
        new="if re.match(pat[3:], name):",
    ),
    dict(
        id="pr202",
        desc="_matches: a name also matches names it prefixes ('fc' excludes 'fc2')",
        old='elif name == pat or (children and name.startswith(pat + ".")):',
        new="elif name == pat or (children and name.startswith(pat)):",
    ),
    dict(
        id="pr203",
        desc="include: a module name also takes every layer below it (children=True)",
        old="or (names and _matches(name, names, children=False))",
        new="or (names and _matches(name, names, children=True))",
    ),
    dict(
        id="pr204",
        desc="min_params: a weight of exactly min_params elements skipped (<=)",
        old="if weight.numel() < min_params:",
        new="if weight.numel() <= min_params:",
    ),
    dict(
        id="pr205",
        desc="GPT-2's Conv1D taken whatever include says (not only under the default)",
        old="or (default and is_transposed_linear(module))",
        new="or is_transposed_linear(module)",
        tests=_HF,
    ),
    dict(
        id="pr206",
        desc="_type_name: any class named like a torch.nn class written nn.<name>",
        old="if getattr(nn, cls.__name__, None) is cls:",
        new="if hasattr(nn, cls.__name__):",
    ),
    # ------------------------------------------------------------- tied weights
    dict(
        id="pr207",
        desc="_tied: a layer holding its own weight under a second name not refused",
        old='if module is t.module and attr == "weight":',
        new="if module is t.module:",
    ),
    dict(
        id="pr208",
        desc="_tied: a tied layer under an excluded parent not refused (children=False)",
        old=(
            "            if _matches(name, exclude, children=True):\n"
            "                raise ValueError(\n"
            '                    f"layer {name!r} is excluded but shares'
        ),
        new=(
            "            if _matches(name, exclude, children=False):\n"
            "                raise ValueError(\n"
            '                    f"layer {name!r} is excluded but shares'
        ),
    ),
    dict(
        id="pr209",
        desc="_unparametrize: weight left last among the parameters (order not restored)",
        old="if list(params) != ranked:",
        new="if False:",
    ),
    # ------------------------------------------------------------- attach
    dict(
        id="pr210",
        desc="attach: total_steps=True taken as 1",
        old="steps = as_int(total_steps)",
        new="steps = total_steps if isinstance(total_steps, int) else as_int(total_steps)",
    ),
    dict(
        id="pr211",
        desc="attach: every layer must hold weights (all, not any: a model with one empty layer refused)",
        old="if not any(t.numel for t in targets):",
        new="if not all(t.numel for t in targets):",
    ),
    dict(
        id="pr212",
        desc="attach: the backbone's own forward (ASL+, Spartan) never hooked in",
        old='hook = self.backbone if _overrides(self.backbone, "forward_weight") else None',
        new="hook = None",
    ),
    dict(
        id="pr213",
        desc="attach: a failure midway leaves the layers already parametrized",
        old=(
            "            for t in attached:  # leave the model as we found it\n"
            "                _unparametrize(t.module, False, layouts[id(t.module)])\n"
        ),
        new="            pass\n",
    ),
    dict(
        id="pr214",
        desc="attach: the sparsity in effect recorded as the target S, not the schedule's at step 0",
        old="self._current = self.scheduled_sparsity(0)",
        new="self._current = self.sparsity",
    ),
    # ------------------------------------------------------------- schedule / update
    dict(
        id="pr215",
        desc="scheduled_sparsity(step): a callable schedule asked at the current step, not step",
        old="s = float(self.schedule(step))",
        new="s = float(self.schedule(self._step))",
    ),
    dict(
        id="pr216",
        desc="update() without a sparsity: the target S, not the schedule's sparsity now",
        old="s = self.scheduled_sparsity() if sparsity is None else check_sparsity(sparsity)",
        new="s = self.sparsity if sparsity is None else check_sparsity(sparsity)",
    ),
    # ------------------------------------------------------------- thresholds
    dict(
        id="pr217",
        desc="layer cap: the larger of the threshold and the cap (the cap never binds)",
        old="thresholds = [torch.minimum(t, c.to(t)) for t, c in zip(thresholds, caps)]",
        new="thresholds = [torch.maximum(t, c.to(t)) for t, c in zip(thresholds, caps)]",
    ),
    dict(
        id="pr218",
        desc="collapse check also at sparsity 0 (an all-zero layer warned at T = 0)",
        old="if maxima is not None and sparsity > 0 and self.backbone.thresholds_are_magnitudes:",
        new="if maxima is not None and sparsity >= 0 and self.backbone.thresholds_are_magnitudes:",
    ),
    dict(
        id="pr219",
        desc="collapse check: an empty layer (0 weights) warned as collapsed",
        old="t.name for t, f in zip(self.targets, flags) if f and t.numel",
        new="t.name for t, f in zip(self.targets, flags) if f",
    ),
    dict(
        id="pr220",
        desc="_warn_collapsed: a layer warned again at every step (the set not consulted)",
        old="new = [n for n in names if n not in self._warned_collapse]",
        new="new = list(names)",
    ),
    dict(
        id="pr221",
        desc="_check_finite: only NaN layers named (an inf layer missing from the message)",
        old="bad = [t.name for t, m in zip(self.targets, values) if not math.isfinite(m)]",
        new="bad = [t.name for t, m in zip(self.targets, values) if math.isnan(m)]",
    ),
    dict(
        id="pr222",
        desc="_abs_max (one tensor at a time): max w instead of max |w|",
        old="return torch.maximum(-lo.float(), hi.float())",
        new="return hi.float()",
    ),
    # ------------------------------------------------------------- finalize / remove
    dict(
        id="pr223",
        desc="finalize: a baked weight left a view of a shared buffer (no storage of its own)",
        old="if weight.untyped_storage().nbytes() != weight.numel() * weight.element_size():",
        new="if False:",
    ),
    dict(
        id="pr224",
        desc="finalize: the plain-key hooks left on the baked layers",
        old=("        shown = tuple(self._shown_thresholds())\n        self._release_keys()\n"),
        new="        shown = tuple(self._shown_thresholds())\n",
    ),
    dict(
        id="pr225",
        desc="remove: the tied layers keep their parametrization (targets only)",
        old=(
            "        for t in self.parametrized_layers():\n"
            "            _unparametrize(t.module, False, self._layouts[id(t.module)])\n"
            '        self._ended = _Ended("removed"'
        ),
        new=(
            "        for t in self.targets:\n"
            "            _unparametrize(t.module, False, self._layouts[id(t.module)])\n"
            '        self._ended = _Ended("removed"'
        ),
    ),
    dict(
        id="pr226",
        desc="_check_attached: the call's own hint dropped (the generic one always)",
        old='+ (hint or "To prune the model again, create a new Pruner on it")',
        new='+ "To prune the model again, create a new Pruner on it"',
    ),
    # ------------------------------------------------------------- dense_state_dict
    dict(
        id="pr227",
        desc="dense_state_dict(pruned=True): a layer under two names pruned under its first only",
        old="for name, module in self.model.named_modules(remove_duplicate=False):",
        new="for name, module in self.model.named_modules():",
    ),
    dict(
        id="pr228",
        desc="dense_state_dict(pruned=True): a tied weight one tensor per key (not shared)",
        old="if id(param) in computed:  # tied holders share one tensor, as in state_dict",
        new="if False:  # tied holders share one tensor, as in state_dict",
    ),
    # ------------------------------------------------------------- config / from_state_dict
    dict(
        id="pr229",
        desc="config(): theta saved resolved (0.5), not as given ('auto')",
        old='"theta": self.pruner_config.theta,',
        new='"theta": self.theta,',
    ),
    dict(
        id="pr230",
        desc="from_state_dict: the saved max_layer_sparsity not passed on",
        old='            "max_layer_sparsity": cfg["max_layer_sparsity"],\n',
        new="",
    ),
    dict(
        id="pr231",
        desc="from_state_dict: the saved theta_rule not passed on",
        old='            "theta_rule": cfg["theta_rule"],\n',
        new="",
    ),
    dict(
        id="pr232",
        desc="from_state_dict: the saved p not passed on (the operator's own)",
        old='"p": op.get("p"),',
        new='"p": None,',
    ),
    dict(
        id="pr233",
        desc="from_state_dict: a custom callable schedule not asked for again",
        old='if cfg["schedule"].get("name") == "<callable>" and "schedule" not in overrides:',
        new="if False:",
    ),
    dict(
        id="pr234",
        desc="load_state_dict: an N:M ramp above 1 accepted",
        old="                if float(t) > 1.0:\n",
        new="                if False:\n",
    ),
    # ------------------------------------------------------------- _check_state
    dict(
        id="pr235",
        desc="_check_state: current_sparsity 1.0 accepted",
        old="or not 0.0 <= current < 1.0",
        new="or not 0.0 <= current <= 1.0",
    ),
    dict(
        id="pr236",
        desc="_check_state: an infinite threshold accepted (only NaN and < 0 refused)",
        old="if not (math.isfinite(value) and value >= 0.0):",
        new="if not value >= 0.0:",
    ),
    dict(
        id="pr237",
        desc="_STATE_CONFIG_KEYS lacks max_layer_sparsity (a state without it: KeyError)",
        old='    "targets",\n    "max_layer_sparsity",\n)',
        new='    "targets",\n)',
    ),
    # ------------------------------------------------------------- report / parametrization
    dict(
        id="pr238",
        desc="report table: thresholds with two decimals (.2f: 1e-3 shown 0.00)",
        old="{r.threshold:.4g}",
        new="{r.threshold:.2f}",
    ),
    dict(
        id="pr239",
        desc="a dtype move after attaching: the threshold goes through the new dtype",
        old='self._buffers["threshold"] = before.to(device=after.device, dtype=dtype)',
        new='self._buffers["threshold"] = after.to(dtype=dtype)',
    ),
    dict(
        id="pr240",
        desc="recurrent modules warned about even when excluded",
        old=" or _matches(name, exclude, children=True):",
        new=":",
    ),
]
