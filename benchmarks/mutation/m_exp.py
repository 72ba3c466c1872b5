"""Mutants of the benchmark experiments' definitions: src/feather_sparse/bench/experiments/
(base.py: the cells, the dense runs, the θ values, the paired sections and accuracy
tables, the dense line and baseline, the accuracy-vs-sparsity plot and its ticks, the
panels over θ; compare.py, operator.py, theta.py, theta_operator.py, p.py, stability.py,
backbones.py, flops.py and the registry in __init__.py; nm.py has its own audit).

What they change is which runs an experiment makes (methods × sparsities × seeds, the
θ grid and its default, an option the user gives) and what its results page states
(the pairs compared and their direction, the reference row, the dense line and
baseline, the labels). A mutant with a ``file`` key mutates that file instead of
FILE. Every mutant runs TESTS (all single-process; they reach these modules through
the bench driver and the command line), the most specific first: the run stops at
the first failure (-x).
"""

EXP = "src/feather_sparse/bench/experiments/"
FILE = EXP + "base.py"
COMPARE = EXP + "compare.py"
OPERATOR = EXP + "operator.py"
THETA = EXP + "theta.py"
THETA_OP = EXP + "theta_operator.py"
P = EXP + "p.py"
STABILITY = EXP + "stability.py"
BACKBONES = EXP + "backbones.py"
FLOPS = EXP + "flops.py"
REGISTRY = EXP + "__init__.py"
TIMEOUT = 420  # per mutant: the unmodified set takes about 105 s on the shared 2-core machine

TESTS = [
    "tests/test_experiments.py",
    "tests/test_bench_options.py",
    "tests/test_bench_sweeps.py",
    "tests/test_bench_audit.py",
    "tests/test_bench_claims.py",
    "tests/test_bench_wording.py",
    "tests/test_mutation_gaps_cli.py",
    "tests/test_mutation_gaps_stats.py",
    "tests/test_nm_bench.py",
]

MUTATIONS = [
    # ------------------------------------------------------------------ base.py
    dict(
        id="exp01",
        desc="cells: every seed given, not the seeds run (--quick's first seed only ignored)",
        old="        for seed in opts.run_seeds\n    ]\n\n\ndef dense_runs",
        new="        for seed in opts.seeds\n    ]\n\n\ndef dense_runs",
    ),
    dict(
        id="exp02",
        desc="cells: every column trains at the first sparsity (config's sparsity sparsities[0])",
        old='{**settings, "dense": False, "sparsity": s}',
        new='{**settings, "dense": False, "sparsity": sparsities[0]}',
    ),
    dict(
        id="exp03",
        desc="dense runs: the dense model for the first seed only",
        old='RunSpec(DENSE, 0.0, seed, {"dense": True}) for seed in opts.run_seeds]',
        new='RunSpec(DENSE, 0.0, seed, {"dense": True}) for seed in opts.run_seeds[:1]]',
    ),
    dict(
        id="exp04",
        desc="thetas: only the first θ given (the rest of --thetas ignored)",
        old="return tuple(opts.thetas) if opts.thetas else tuple(default)",
        new="return tuple(opts.thetas[:1]) if opts.thetas else tuple(default)",
    ),
    dict(
        id="exp05",
        desc="PAPER_THETAS without 0.25 (Fig. 3's grid is 0, 0.25, 0.5, 0.75, 1)",
        old="PAPER_THETAS = (0.0, 0.25, 0.5, 0.75, 1.0)",
        new="PAPER_THETAS = (0.0, 0.5, 0.75, 1.0)",
    ),
    dict(
        id="exp06",
        desc="paired caption names the row title, not the reference",
        old="return paired_caption(reference_name) + grid.paired_table(",
        new="return paired_caption(row_title) + grid.paired_table(",
    ),
    dict(
        id="exp07",
        desc="accuracy_tables: the paired section even when the reference row was not run",
        old="paired = callable(reference) or reference in grid.rows",
        new="paired = True",
    ),
    dict(
        id="exp08",
        desc="accuracy_tables: no paired section for a named (non-callable) reference",
        old="paired = callable(reference) or reference in grid.rows",
        new="paired = callable(reference)",
    ),
    dict(
        id="exp09",
        desc="dense line: failed dense runs counted (their NaN accuracy in the mean)",
        old='    dense = [o for _, o in ctx.of_group(DENSE) if o.ok]\n    if not dense:\n        return ""',
        new='    dense = [o for _, o in ctx.of_group(DENSE)]\n    if not dense:\n        return ""',
    ),
    dict(
        id="exp10",
        desc="dense baseline: the mean of every run of the page, not the dense runs'",
        old="dense = [accuracy(o) for _, o in ctx.of_group(DENSE) if o.ok]",
        new="dense = [accuracy(o) for _, o in ctx.pairs if o.ok]",
    ),
    dict(
        id="exp11",
        desc="accuracy-vs-sparsity plot: no dense baseline",
        old="        baseline=dense_baseline(ctx),\n        categorical_x=True,",
        new="        baseline=None,\n        categorical_x=True,",
    ),
    dict(
        id="exp12",
        desc="sparsity ticks from the first curve only (a column another curve has is unlabelled)",
        old="xticklabels=sparsity_ticks(curves),",
        new="xticklabels=sparsity_ticks(curves[:1]),",
    ),
    dict(
        id="exp13",
        desc="panels over θ: every panel shows the first sparsity's accuracies",
        old="[(t, grid.stat(theta_label(t), c)) for t in thetas]",
        new="[(t, grid.stat(theta_label(t), cols[0])) for t in thetas]",
    ),
    # --------------------------------------------------------------- compare.py
    dict(
        id="exp14",
        desc="compare: hard-STE and soft-STE rows train each other's method",
        old='    "hard-STE": {"method": "hard"},\n    "soft-STE": {"method": "soft"},',
        new='    "hard-STE": {"method": "soft"},\n    "soft-STE": {"method": "hard"},',
        file=COMPARE,
    ),
    dict(
        id="exp15",
        desc="compare: Feather-ASL+ trains on the global backbone",
        old='"Feather-ASL+": {"method": "feather", "backbone": "asl+"},',
        new='"Feather-ASL+": {"method": "feather", "backbone": "global"},',
        file=COMPARE,
    ),
    dict(
        id="exp16",
        desc="compare: the paired reference is Feather-ASL+, not Feather-Global",
        old='REFERENCE = "Feather-Global"',
        new='REFERENCE = "Feather-ASL+"',
        file=COMPARE,
    ),
    dict(
        id="exp17",
        desc="compare summary: rows for every method, not the selected ones",
        old="    rows = list(_selected_methods(ctx.opts))",
        new="    rows = list(COMPARE_METHODS)",
        file=COMPARE,
    ),
    dict(
        id="exp18",
        desc="compare: achieved-sparsity table shows the density (100·(1 − s))",
        old="lambda o: 100.0 * o.sparsity, rows)",
        new="lambda o: 100.0 * (1.0 - o.sparsity), rows)",
        file=COMPARE,
    ),
    # -------------------------------------------------------------- operator.py
    dict(
        id="exp19",
        desc="operator: the soft row trains with θ automatic, not θ = 1",
        old='"soft": {"method": "feather", "operator": "soft", "theta": 1.0},',
        new='"soft": {"method": "feather", "operator": "soft"},',
        file=OPERATOR,
    ),
    dict(
        id="exp20",
        desc="operator: the paired reference is the hard operator, not Feather's",
        old='REFERENCE = "Feather (p = 3)"',
        new='REFERENCE = "hard"',
        file=OPERATOR,
    ),
    # ----------------------------------------------------------------- theta.py
    dict(
        id="exp21",
        desc="theta: the auto row by the paper's rule whatever the recipe's theta_rule",
        old="label = theta_label(auto_theta(sparsity, rule))",
        new="label = theta_label(auto_theta(sparsity))",
        file=THETA,
    ),
    dict(
        id="exp22",
        desc="theta: the rows train with the hard operator",
        old='theta_label(t): {"method": "feather", "operator": "feather", "theta": t}\n        for t in thetas(opts, PAPER_THETAS)\n    }\n    return cells(opts, rows, opts.sparsity_grid(PAPER_SPARSITIES))',
        new='theta_label(t): {"method": "feather", "operator": "hard", "theta": t}\n        for t in thetas(opts, PAPER_THETAS)\n    }\n    return cells(opts, rows, opts.sparsity_grid(PAPER_SPARSITIES))',
        file=THETA,
    ),
    # -------------------------------------------------------- theta_operator.py
    dict(
        id="exp23",
        desc="theta-operator: the hard and soft labels swapped (each row trains the other operator)",
        old='_OPERATORS = {"hard": "hard", "soft": "soft", "Feather": "feather"}',
        new='_OPERATORS = {"hard": "soft", "soft": "hard", "Feather": "feather"}',
        file=THETA_OP,
    ),
    dict(
        id="exp24",
        desc="theta-operator summary: the default θ grid, not the θ values given",
        old="    values = thetas(ctx.opts, THETA_OPERATOR_THETAS)",
        new="    values = THETA_OPERATOR_THETAS",
        file=THETA_OP,
    ),
    dict(
        id="exp25",
        desc="theta-operator: default sparsities 0.9 and 0.99 instead of 0.95 and 0.99",
        old="THETA_OPERATOR_SPARSITIES = (0.95, 0.99)",
        new="THETA_OPERATOR_SPARSITIES = (0.9, 0.99)",
        file=THETA_OP,
    ),
    # --------------------------------------------------------------------- p.py
    dict(
        id="exp26",
        desc="p: the paired reference is p = 1 (soft), not Feather's p = 3",
        old='accuracy_tables(acc, "p", _p_label(3.0), "Feather\'s p = 3")',
        new='accuracy_tables(acc, "p", _p_label(1.0), "Feather\'s p = 3")',
        file=P,
    ),
    dict(
        id="exp27",
        desc="p: the soft and hard names swapped in the labels (p = 1 (hard), p = ∞ (soft))",
        old='names = {1.0: " (soft)", 3.0: " (Feather)", math.inf: " (hard)"}',
        new='names = {1.0: " (hard)", 3.0: " (Feather)", math.inf: " (soft)"}',
        file=P,
    ),
    dict(
        id="exp28",
        desc="p: the operator-family figure draws the default p values, not the ones given",
        old='plot_operator_family(_ps(ctx.opts), ctx.figure("operators"))',
        new='plot_operator_family(PAPER_PS, ctx.figure("operators"))',
        file=P,
    ),
    # ------------------------------------------------------------- stability.py
    dict(
        id="exp29",
        desc="stability: mask flips of the first half of the records, not the second",
        old="o.stability_changed[len(o.stability_changed) // 2 :]",
        new="o.stability_changed[: len(o.stability_changed) // 2]",
        file=STABILITY,
    ),
    dict(
        id="exp30",
        desc="stability: the first epoch with r ≥ 0.9 is not reset by a later dip (not 'from then on')",
        old="        if not math.isfinite(v) or v < level:\n            found = None",
        new="        if not math.isfinite(v) or v < level:\n            pass",
        file=STABILITY,
    ),
    dict(
        id="exp31",
        desc="stability: the r at 25 % and at 50 % of training swapped",
        old="        quarter = [_at_fraction(o, 0.25) for o in runs]\n        half = [_at_fraction(o, 0.5) for o in runs]",
        new="        quarter = [_at_fraction(o, 0.5) for o in runs]\n        half = [_at_fraction(o, 0.25) for o in runs]",
        file=STABILITY,
    ),
    dict(
        id="exp32",
        desc="stability: each sparsity's curve and row from the runs of every sparsity",
        old="o for s, o in ctx.of_group(label) if s.x == sparsity and o.ok and o.stability_epochs",
        new="o for s, o in ctx.of_group(label) if o.ok and o.stability_epochs",
        file=STABILITY,
    ),
    dict(
        id="exp33",
        desc="stability: default sparsity 0.95 instead of 0.98",
        old="STABILITY_SPARSITY = 0.98",
        new="STABILITY_SPARSITY = 0.95",
        file=STABILITY,
    ),
    # ------------------------------------------------------------- backbones.py
    dict(
        id="exp34",
        desc="backbones: the ASL+ row (no Feather) trains on the global backbone",
        old='"ASL+": {"method": "hard", "backbone": "asl+"},',
        new='"ASL+": {"method": "hard"},',
        file=BACKBONES,
    ),
    dict(
        id="exp35",
        desc="backbones: the ASL+ panel draws GMP instead of ASL+",
        old='[curves[k] for k in ("ASL+", "Feather-ASL+") if k in curves]',
        new='[curves[k] for k in ("GMP", "Feather-ASL+") if k in curves]',
        file=BACKBONES,
    ),
    # ----------------------------------------------------------------- flops.py
    dict(
        id="exp36",
        desc="flops: the global-flops row trains on the global backbone",
        old='"global-flops": {"method": "feather", "backbone": "global-flops"},',
        new='"global-flops": {"method": "feather"},',
        file=FLOPS,
    ),
    # ------------------------------------------------------------- __init__.py
    dict(
        id="exp37",
        desc="registry: flops left out of the experiments",
        old="for _module in (compare, operator, theta, theta_operator, p, stability, backbones, flops, nm):",
        new="for _module in (compare, operator, theta, theta_operator, p, stability, backbones, nm):",
        file=REGISTRY,
    ),
]
