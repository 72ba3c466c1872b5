"""Mutants of the N:M evidence experiment: src/feather_sparse/bench/experiments/nm.py
(``feather-sparse bench nm``, the page docs/results/nm/nm.md).

What they change is which runs the experiment makes (methods × patterns × models ×
seeds, the θ and p ablation rows at the ablation pattern, ``--seeds``, ``--quick``,
``--methods``, ``--thetas``, ``--ps``, ``--ablation-pattern``, ``--set model=...``)
and what its page states: which runs each table reads (the model's own, the
method's own), the paired section and its reference, the mask flip rate (the
second half of training, in %, NaN when unrecorded), the columns' and the
ablations' labels, the figure's ticks and the ranking. Every mutant runs TESTS
(all single-process; nothing there trains but the ``--quick`` pages), the most
specific first: the run stops at the first failure (-x). The one existing mutant
of this file (st39, the ranking's order) is in m_stats.py.
"""

FILE = "src/feather_sparse/bench/experiments/nm.py"
TIMEOUT = 420  # per mutant: the unmodified set takes about 65 s on the shared 2-core machine

TESTS = [
    "tests/test_nm_bench.py",
    "tests/test_mutation_gaps_stats.py",
    "tests/test_experiments.py",
    "tests/test_bench_options.py",
    "tests/test_mutation_gaps_exp.py",
    "tests/test_mutation_gaps_cli.py",
]

MUTATIONS = [
    # ------------------------------------------------------------- the grid
    dict(
        id="enm01",
        desc="patterns: 2:8 in place of 1:4 (three columns still)",
        old='NM_PATTERNS = ("2:4", "4:8", "1:4")',
        new='NM_PATTERNS = ("2:4", "4:8", "2:8")',
    ),
    dict(
        id="enm02",
        desc="θ ablation grid: 0.25 in place of 0.5",
        old="NM_THETAS = (0.0, 0.5, 1.0)",
        new="NM_THETAS = (0.0, 0.25, 1.0)",
    ),
    dict(
        id="enm03",
        desc="p ablation grid: 4 in place of 2",
        old="NM_PS = (1.0, 2.0, 3.0, math.inf)",
        new="NM_PS = (1.0, 3.0, 4.0, math.inf)",
    ),
    dict(
        id="enm04",
        desc="--quick runs the CNN instead of the mixer",
        old='QUICK_MODELS = ("mnist1d_mlpmixer",)',
        new='QUICK_MODELS = ("mnist1d_cnn",)',
    ),
    dict(
        id="enm05",
        desc="--set model=NAME ignored under --quick (the quick model runs)",
        old='    if "model" in opts.overrides:  # one model for every run, set by the user',
        new='    if "model" in opts.overrides and not opts.quick:  # one model, set by the user',
    ),
    dict(
        id="enm06",
        desc="--quick ignored for the patterns (every pattern runs)",
        old="    return QUICK_PATTERNS if opts.quick else NM_PATTERNS",
        new="    return NM_PATTERNS",
    ),
    dict(
        id="enm07",
        desc="--methods: an unknown method silently dropped instead of refused",
        old="    if unknown:\n        raise ValueError(",
        new="    if unknown and False:\n        raise ValueError(",
    ),
    dict(
        id="enm08",
        desc="--ablation-pattern ignored (the ablations always at 2:4)",
        old="    return opts.ablation_pattern or ABLATION_PATTERN",
        new="    return ABLATION_PATTERN",
    ),
    dict(
        id="enm09",
        desc="--thetas: only the first θ given runs",
        old="    return tuple(opts.thetas) if opts.thetas else NM_THETAS",
        new="    return tuple(opts.thetas[:1]) if opts.thetas else NM_THETAS",
    ),
    dict(
        id="enm10",
        desc="--ps ignored (the default p grid runs)",
        old="    return tuple(opts.ps) if opts.ps else NM_PS",
        new="    return NM_PS",
    ),
    dict(
        id="enm11",
        desc="θ label: '(feather-nm)' on every θ ≥ 0.5, not on θ = 1 only",
        old='(" (feather-nm)" if t == own else "")',
        new='(" (feather-nm)" if t >= 0.5 else "")',
    ),
    dict(
        id="enm12",
        desc="p label: the soft and hard names swapped (p = 1 (hard), p = ∞ (soft))",
        old='names = {1.0: "soft", math.inf: "hard"}',
        new='names = {1.0: "hard", math.inf: "soft"}',
    ),
    dict(
        id="enm13",
        desc="main grid: every column trains the first pattern",
        old='                    "pattern": pattern,',
        new='                    "pattern": patterns[0],',
    ),
    dict(
        id="enm14",
        desc="main grid: every seed given, not the seeds run (--quick's first seed only ignored)",
        old="                specs += [RunSpec(method, float(x), s, settings) for s in opts.run_seeds]",
        new="                specs += [RunSpec(method, float(x), s, settings) for s in opts.seeds]",
    ),
    dict(
        id="enm15",
        desc="main grid: each pattern's runs in the next column (x + 1)",
        old="RunSpec(method, float(x), s, settings)",
        new="RunSpec(method, float(x + 1), s, settings)",
    ),
    dict(
        id="enm16",
        desc="ablations train sr-ste, not feather-nm",
        old='            "method": REFERENCE,',
        new='            "method": "sr-ste",',
    ),
    dict(
        id="enm17",
        desc="ablations: every model column trains the first model",
        old="            **_model_settings(opts, model),\n        }\n        for t in",
        new="            **_model_settings(opts, models[0]),\n        }\n        for t in",
    ),
    dict(
        id="enm18",
        desc="θ ablation: θ = 1 left to feather-nm (θ automatic, 0.5 at 95 % or more)",
        old='            settings = {**base, "theta": t}',
        new='            settings = base if t == 1.0 else {**base, "theta": t}',
    ),
    dict(
        id="enm19",
        desc="θ ablation: every model's runs in the first column (x = 0)",
        old="RunSpec(label, float(x), s, settings)",
        new="RunSpec(label, 0.0, s, settings)",
    ),
    dict(
        id="enm20",
        desc="p ablation: p = 3 left to the config although the recipe or --set gives p",
        old='            settings = base if p == 3.0 and own_p else {**base, "p": p}',
        new='            settings = base if p == 3.0 else {**base, "p": p}',
    ),
    # --------------------------------------------------------- the flip rate
    dict(
        id="enm21",
        desc="flip rate over the first half of the records, not the second",
        old="changed[len(changed) // 2 :]",
        new="changed[: len(changed) // 2]",
    ),
    dict(
        id="enm22",
        desc="flip rate as a fraction, not in %",
        old="    return 100.0 * sum(flips) / len(flips) if flips else math.nan",
        new="    return sum(flips) / len(flips) if flips else math.nan",
    ),
    dict(
        id="enm23",
        desc="flip rate of a run without records 0 instead of NaN (not measured)",
        old="    return 100.0 * sum(flips) / len(flips) if flips else math.nan",
        new="    return 100.0 * sum(flips) / len(flips) if flips else 0.0",
    ),
    dict(
        id="enm24",
        desc="flip rate: a NaN record counted in the denominator",
        old="    return 100.0 * sum(flips) / len(flips) if flips else math.nan",
        new="    return 100.0 * sum(flips) / (len(changed) - len(changed) // 2) if flips else math.nan",
    ),
    # ------------------------------------------------------------- the page
    dict(
        id="enm25",
        desc="with --set model=NAME the runs (no model in their settings) belong to no model",
        old='    return str(model) if model is not None else str(opts.overrides.get("model", ""))',
        new='    return str(model) if model is not None else ""',
    ),
    dict(
        id="enm26",
        desc="a model's section reads the runs of every model",
        old="if s.group in groups and _model_of(s, ctx.opts) == model]",
        new="if s.group in groups]",
    ),
    dict(
        id="enm27",
        desc="a model's flip-rate table reads every model's runs",
        old="    flips = Grid(pairs, flip_rate, methods)",
        new="    flips = Grid(ctx.pairs, flip_rate, methods)",
    ),
    dict(
        id="enm28",
        desc="paired section without feather-nm among the methods (a reference never run)",
        old="        if REFERENCE in methods and len(methods) > 1",
        new="        if len(methods) > 1",
    ),
    dict(
        id="enm29",
        desc="ablation columns named from the default models, not the models run",
        old="        return models[int(x)]",
        new="        return NM_MODELS[int(x)]",
    ),
    dict(
        id="enm30",
        desc="ablation: a paired section although the reference row was not run",
        old='    paired = _paired(acc, title, label, reference) if reference in rows else ""',
        new="    paired = _paired(acc, title, label, reference)",
    ),
    dict(
        id="enm31",
        desc="ablation flip-rate table shows the accuracy",
        old="    flips = Grid(pairs, flip_rate, list(rows))",
        new="    flips = Grid(pairs, accuracy, list(rows))",
    ),
    dict(
        id="enm32",
        desc="p ablation paired against p = 1 (soft), not feather-nm's p = 3",
        old='_ablation(ctx, "p", ps, p_label(p_own, p_own), models)',
        new='_ablation(ctx, "p", ps, p_label(1.0, p_own), models)',
    ),
    dict(
        id="enm33",
        desc="θ ablation rows: the default θ grid, not the θ values given",
        old="    thetas = [theta_label(t, theta_own) for t in _thetas(ctx.opts)]",
        new="    thetas = [theta_label(t, theta_own) for t in NM_THETAS]",
    ),
    dict(
        id="enm34",
        desc="figure: named pattern ticks even when the panels' patterns differ",
        old="    same = all(xs == shown[0] for xs in shown)",
        new="    same = True",
    ),
    dict(
        id="enm35",
        desc="ranking: failed runs (NaN accuracy) counted in the means",
        old="            if o.ok:\n                means.setdefault",
        new="            if True:\n                means.setdefault",
    ),
    dict(
        id="enm36",
        desc="ranking: the ablation rows and every model's runs ranked with the methods",
        old="        for s, o in _pairs_of(ctx, model, _methods(ctx.opts)):",
        new="        for s, o in ctx.pairs:",
    ),
    dict(
        id="enm37",
        desc="the θ ablation's table says the main patterns' first, not the ablation pattern",
        old="seeds, {_ablation_pattern(ctx.opts)}; best per model",
        new="seeds, {_patterns(ctx.opts)[0]}; best per model",
    ),
    dict(
        id="enm38",
        desc="registry: --ablation-pattern not among the options nm takes",
        old='options=frozenset({"thetas", "ps", "ablation_pattern", "methods"}),',
        new='options=frozenset({"thetas", "ps", "methods"}),',
    ),
]
