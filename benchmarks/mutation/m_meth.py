"""Mutants of the method registry and the config → Pruner mapping: src/feather_sparse/methods.py.

What they change is which Pruner a method builds (its operator, θ, backbone and
the backbone's options, schedule, the N:M methods' decay, β, frozen mask and
default pattern), which contradictions between a method and a caller's or a
config's value are refused (and with what message), how the schedule and the
other fields of a ``TrainConfig`` pass through ``pruner_config``, and which
layers ``build_pruner`` leaves dense for an N:M pattern. The audit of the
training formulas (``m_train.py``: me01–me04) and of the training configuration
(``m_cfg.py``: recipes, rules, registry) mutate other lines.

Every mutant runs TESTS (all single-process, each a few seconds), the most
specific first: the run stops at the first failure (-x).
"""

FILE = "src/feather_sparse/methods.py"
TIMEOUT = 900  # per mutant: a survivor's set took 120-360 s on the shared, loaded 2-core machine

#: The test files that reach methods.py (grep on its names), the most specific first.
TESTS = [
    "tests/test_methods.py",
    "tests/test_baselines.py",
    "tests/test_nm_config.py",
    "tests/test_nm_methods.py",
    "tests/test_train_cli_checks.py",
    "tests/test_nm_train.py",
    "tests/test_train.py",
    "tests/test_nm_conv_order.py",
    "tests/test_mutation_gaps_train.py",
    "tests/test_mutation_gaps_nm.py",
]
#: Five more files build Pruners through make_pruner to test other things; the
#: first mutants (meth01-meth05, meth07-meth10, meth21) ran them too, after TESTS,
#: and none of them killed one. Left out for the others to fit the time.
FIRST_RUN_ALSO = [
    "tests/test_pruner_usage.py",
    "tests/test_pruner_guards.py",
    "tests/test_nm_usage.py",
    "tests/test_higher_order.py",
    "tests/test_api_docstrings.py",
]

MUTATIONS = [
    # ------------------------------------------------------- what a method fixes
    dict(
        id="meth01",
        desc="theta='auto' accepted by a method that fixes θ (_same: a string is the same θ)",
        old="return not isinstance(given, str) and float(given) == float(fixed)",
        new="return isinstance(given, str) or float(given) == float(fixed)",
    ),
    dict(
        id="meth02",
        desc="an Operator object compared by its repr, not its name (the method's own operator refused)",
        old="if isinstance(given, Operator):  # by what it computes: its config but for its name",
        new="if False:  # by what it computes: its config but for its name",
    ),
    dict(
        id="meth03",
        desc="a backbone mapping compared as a whole, not by its name (options given with gmp refused)",
        old="return BACKBONES._normalize(_backbone_name(given)) == BACKBONES._normalize(fixed)",
        new="return BACKBONES._normalize(str(given)) == BACKBONES._normalize(fixed)",
    ),
    dict(
        id="meth04",
        desc="only the first value a method fixes is checked (gmp's θ and backbone, hard's θ free)",
        old="for key, value in self.fixed.items():",
        new="for key, value in list(self.fixed.items())[:1]:",
    ),
    dict(
        id="meth05",
        desc="unset test by truth value: theta=0.0 (and p=0-like values) dropped as unset",
        old="kwargs = {k: v for k, v in kwargs.items() if v is not None}  # None: unset",
        new="kwargs = {k: v for k, v in kwargs.items() if v}  # None: unset",
    ),
    dict(
        id="meth06",
        desc="the method's own backbone by name loses its published options (gmp backbone='uniform')",
        old="            and isinstance(default, Mapping)\n",
        new="            and False\n",
    ),
    dict(
        id="meth07",
        desc="backbone options: the method's own options override the caller's (keep_first_dense=False ignored)",
        old='out["backbone"] = {**base, **options}',
        new='out["backbone"] = {**options, **base}',
    ),
    dict(
        id="meth08",
        desc="backbone options with a pattern: the default global backbone not made the N:M one",
        old='                base["name"] = "nm"  # the default backbone',
        new='                pass  # base["name"] = "nm"  # the default backbone',
    ),
    dict(
        id="meth09",
        desc="unknown backbone options not refused here (left to PrunerConfig's message)",
        old="unknown = sorted(set(options) - accepted)",
        new="unknown: list[str] = []",
    ),
    dict(
        id="meth10",
        desc="backbone options with a Backbone object not refused (dict() of the object)",
        old="            if isinstance(backbone, Backbone):\n                raise ValueError(",
        new="            if False:\n                raise ValueError(",
    ),
    # ------------------------------------------------------------- N:M form
    dict(
        id="meth11",
        desc="a method fixing a non-N:M backbone (gmp, feather-gmp, spartan) no obstacle to a pattern",
        old='if backbone is not None and BACKBONES._normalize(_backbone_name(backbone)) != "nm":',
        new="if False:",
    ),
    dict(
        id="meth12",
        desc="ST-3's operator no obstacle to a pattern (st3 + pattern accepted)",
        old="if operator is not None and not isinstance(OPERATORS.get(str(operator)), ThresholdOperator):",
        new="if False:",
    ),
    dict(
        id="meth13",
        desc="the refusal of a pattern lists the methods that cannot train one",
        old="n for n in METHODS.names() if METHODS.get(n)._pattern_obstacle() is None",
        new="n for n in METHODS.names() if METHODS.get(n)._pattern_obstacle() is not None",
    ),
    dict(
        id="meth14",
        desc="Method.config: Pruner-only arguments (process_group) not refused as no config field",
        old="extra = sorted(set(settings) - _config_fields())",
        new="extra: list[str] = []",
    ),
    # ------------------------------------------------------- the registered methods
    dict(
        id="meth15",
        desc="feather-gmp: first conv pruned (keep_first_dense False)",
        old='defaults={"backbone": {"name": "uniform", "keep_first_dense": True}},\n    ),\n)\nMETHODS.register(\n    "hard",',
        new='defaults={"backbone": {"name": "uniform", "keep_first_dense": False}},\n    ),\n)\nMETHODS.register(\n    "hard",',
    ),
    dict(
        id="meth16",
        desc="soft: θ = 0.5 instead of the plain STE (θ = 1)",
        old='fixed={"operator": "soft", "theta": 1.0},',
        new='fixed={"operator": "soft", "theta": 0.5},',
    ),
    dict(
        id="meth17",
        desc="nonste: θ = 0.5 instead of 0 (pruned weights get a gradient)",
        old='fixed={"theta": 0.0},',
        new='fixed={"theta": 0.5},',
    ),
    dict(
        id="meth18",
        desc="gmp: operator feather (p = 3) instead of the hard mask",
        old='fixed={"operator": "hard", "theta": 0.0, "backbone": "uniform"},',
        new='fixed={"operator": "feather", "theta": 0.0, "backbone": "uniform"},',
    ),
    dict(
        id="meth19",
        desc="st3: θ fixed 0 instead of 1 (the identity backward recorded and compared as θ = 0)",
        old='fixed={"operator": "st3", "theta": 1.0},',
        new='fixed={"operator": "st3", "theta": 0.0},',
    ),
    dict(
        id="meth20",
        desc="spartan: θ fixed 0 instead of 1 (no straight-through gradient to the masked weights)",
        old='fixed={"backbone": "spartan", "operator": "hard", "theta": 1.0},',
        new='fixed={"backbone": "spartan", "operator": "hard", "theta": 0.0},',
    ),
    dict(
        id="meth21",
        desc="feather-nm: default pattern 4:8 instead of 2:4",
        old='"Glentis Georgoulakis et al., BMVC 2023, applied per N:M group",\n        defaults={"pattern": DEFAULT_PATTERN},',
        new='"Glentis Georgoulakis et al., BMVC 2023, applied per N:M group",\n        defaults={"pattern": "4:8"},',
    ),
    dict(
        id="meth22",
        desc="hard-nm: θ = 0 instead of the plain STE (θ = 1)",
        old='"Bengio, Léonard & Courville 2013 (STE) with the N:M mask of Zhou et al. 2021",\n        fixed={"operator": "hard", "theta": 1.0},',
        new='"Bengio, Léonard & Courville 2013 (STE) with the N:M mask of Zhou et al. 2021",\n        fixed={"operator": "hard", "theta": 0.0},',
    ),
    dict(
        id="meth23",
        desc="N:M baselines: backbone not fixed (sr-ste/s-ste/oneshot-nm with backbone='global' lose decay/β/freeze)",
        old='fixed={"operator": operator, "theta": theta, "backbone": "nm"},',
        new='fixed={"operator": operator, "theta": theta},',
    ),
    dict(
        id="meth24",
        desc="sr-ste: operator feather (p = 3) instead of the hard mask",
        old='        operator="hard",\n        theta=1.0,\n        backbone={"decay": SR_STE_DECAY},',
        new='        operator="feather",\n        theta=1.0,\n        backbone={"decay": SR_STE_DECAY},',
    ),
    dict(
        id="meth25",
        desc="s-ste: θ = 0 instead of the plain STE (θ = 1)",
        old='        operator="soft",\n        theta=1.0,\n        backbone={"rescale": True},',
        new='        operator="soft",\n        theta=0.0,\n        backbone={"rescale": True},',
    ),
    dict(
        id="meth26",
        desc="oneshot-nm: θ = 1 instead of 0 (the fixed mask's pruned weights get gradients)",
        old='        operator="hard",\n        theta=0.0,\n        backbone={"freeze": True},',
        new='        operator="hard",\n        theta=1.0,\n        backbone={"freeze": True},',
    ),
    dict(
        id="meth27",
        desc="oneshot-nm: a linear ramp to half-way instead of dense then one shot (constant at start)",
        old='schedule={"name": "constant", "start": ONESHOT_START},',
        new='schedule={"name": "linear", "start": 0.0, "end": ONESHOT_START},',
    ),
    # ------------------------------------------------------------ from a config
    dict(
        id="meth28",
        desc="_method: an unknown method left to the registry's message (field name lost)",
        old="    if config.method not in METHODS:\n",
        new="    if False:\n",
    ),
    dict(
        id="meth29",
        desc="an N:M method without a pattern not refused (trains the default 2:4 silently)",
        old='if config.pattern is None and "pattern" in method.defaults:',
        new='if config.pattern is None and "pattern" in method.fixed:',
    ),
    dict(
        id="meth30",
        desc="_schedule_unset: schedule_start not compared (one-shot's own schedule replaces a given start)",
        old='names = ("schedule", "schedule_start", "schedule_end")',
        new='names = ("schedule", "schedule_end")',
    ),
    dict(
        id="meth31",
        desc="a pattern does not make the schedule the method's (unset fields give cubic 0 → 0.5 to N:M)",
        old='own = "schedule" in method.defaults or config.pattern is not None',
        new='own = "schedule" in method.defaults',
    ),
    dict(
        id="meth32",
        desc="the unstructured sparsity passed with a pattern (the pattern's implied one ignored)",
        old="None if config.pattern is not None else config.sparsity,  # a pattern implies it",
        new="config.sparsity,  # a pattern implies it",
    ),
    dict(
        id="meth33",
        desc="config's theta_rule not passed on (the released rule ignored)",
        old="        theta_rule=config.theta_rule,\n",
        new="",
    ),
    dict(
        id="meth34",
        desc="config's update_every not passed on",
        old="        update_every=config.update_every,\n",
        new="",
    ),
    dict(
        id="meth35",
        desc="config's max_layer_sparsity not passed on (the layer-collapse cap ignored)",
        old="        max_layer_sparsity=config.max_layer_sparsity,\n",
        new="",
    ),
    dict(
        id="meth36",
        desc="config's conv_order not passed on (channels-grouped convs trained flat)",
        old="        conv_order=config.conv_order,  # an option of the N:M backbone (None: its default)\n",
        new="",
    ),
    # ---------------------------------------------------------- build_pruner
    dict(
        id="meth37",
        desc="_leave_misfits_dense: misfits tested in the flat order whatever the conv_order",
        old='conv_order = getattr(settings.make_backbone(), "conv_order", "flat")',
        new='conv_order = "flat"',
    ),
    dict(
        id="meth38",
        desc="_leave_misfits_dense: the config's own exclude replaced by the misfits",
        old="return dataclasses.replace(settings, exclude=(*settings.exclude, *misfits))",
        new="return dataclasses.replace(settings, exclude=tuple(misfits))",
    ),
    dict(
        id="meth39",
        desc="_leave_misfits_dense: layers the config excludes tested again (named and excluded twice)",
        old="targets = _find_targets(model, settings.include, settings.exclude, settings.min_params)",
        new="targets = _find_targets(model, settings.include, (), settings.min_params)",
    ),
    dict(
        id="meth40",
        desc="check_method checks dense runs too (a dense run's leftover method refused)",
        old="    if not config.dense:\n        pruner_config(config)",
        new="    pruner_config(config)",
    ),
]
