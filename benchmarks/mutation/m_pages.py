"""Mutants of the results-page writer and the suites: src/feather_sparse/bench/pages.py
(the Grid of mean ± std per row and column, the bold best per column, the paired
table and its caption, the page's footer: the command that reproduces it, the runs
counted as trained, reused and failed, the seeds, the dates, the numerics, the
sessions; the figure links, ``pct``, ``finite_curve``, the page's JSON) and
src/feather_sparse/bench/suites.py (what ``--suite paper-regime`` runs and where).
The parts of pages.py mutated by the statistics audit (m_stats.py: st33-st37) are
left out.

A mutant with a ``file`` key mutates that file instead of FILE. Every mutant runs
TESTS, or its own list (``tests``), the most specific first: the run stops at the
first failure (-x).
"""

FILE = "src/feather_sparse/bench/pages.py"
SUITES = "src/feather_sparse/bench/suites.py"
TIMEOUT = 420  # per mutant: the whole list takes about 100 s on a shared 2-core machine

TESTS = [
    "tests/test_mutation_gaps_stats.py",
    "tests/test_bench_stats.py",
    "tests/test_experiments.py",
    "tests/test_bench_wording.py",
    "tests/test_bench_options.py",
    "tests/test_bench_sweeps.py",
    "tests/test_mutation_gaps_exp.py",
    "tests/test_bench_audit.py",
    "tests/test_mutation_gaps_cli.py",
]

#: The suite's mutants: the tests that read the suite, then the ones that run it.
_SUITE_TESTS = [
    "tests/test_bench_sweeps.py",
    "tests/test_bench_options.py",
    "tests/test_mutation_gaps_cli.py",
    "tests/test_docs.py::test_results_page_run_count_command_prints_what_the_page_says",
    "tests/test_bench_audit.py",
    "tests/test_bench_wording.py",
]

MUTATIONS = [
    # ------------------------------------------------------------- finite_curve
    dict(
        id="pages01",
        desc="finite_curve: a cell without a value (NaN mean) kept in the curve",
        old="for x, (mean, std) in points if math.isfinite(mean)]",
        new="for x, (mean, std) in points]",
    ),
    dict(
        id="pages02",
        desc="finite_curve: each point's band is its mean, not its std",
        old="return Curve(label, tuple(xs), tuple(means), tuple(stds))",
        new="return Curve(label, tuple(xs), tuple(means), tuple(means))",
    ),
    # --------------------------------------------------------------------- Grid
    dict(
        id="pages03",
        desc="Grid: runs of a group that is not a row still add their column",
        old="            if spec.group not in self.rows:\n                continue\n",
        new="",
    ),
    dict(
        id="pages04",
        desc="Grid: a failed run goes on to the metric (counted failed and n/a)",
        old="                self.failed[cell] = self.failed.get(cell, 0) + 1\n                continue\n",
        new="                self.failed[cell] = self.failed.get(cell, 0) + 1\n",
    ),
    dict(
        id="pages05",
        desc="Grid: a finished run with an undefined metric counted as failed",
        old="self.undefined[cell] = self.undefined.get(cell, 0) + 1",
        new="self.failed[cell] = self.failed.get(cell, 0) + 1",
    ),
    dict(
        id="pages06",
        desc="Grid: columns in order of appearance, not sorted",
        old="        self.cols.sort()\n",
        new="",
    ),
    dict(
        id="pages07",
        desc="table: the best mean taken over every mean, NaN (no value) included",
        old="finite = [m for m in means if math.isfinite(m)]",
        new="finite = means",
    ),
    dict(
        id="pages08",
        desc="table: a one-seed cell shown as 'mean ± 0.00' (the branch never taken)",
        old="elif len(self.values[(r, c)]) == 1:",
        new="elif len(self.values[(r, c)]) == 0:",
    ),
    dict(
        id="pages09",
        desc="table: the failed runs left out of the cell's total (1/1 failed, not 1/2)",
        old="total = failed + undefined + len(self.values[(r, c)])",
        new="total = undefined + len(self.values[(r, c)])",
    ),
    dict(
        id="pages11",
        desc="table: failed runs not shown where other seeds finished",
        old="                if failed:\n                    text +=",
        new="                if failed and not self.values[(r, c)]:\n                    text +=",
    ),
    # ------------------------------------------------------------- paired table
    dict(
        id="pages12",
        desc="paired table: a row compared where the reference was not run in that column",
        old="if ref is None or (r, c) not in self.values or (ref, c) not in self.values:",
        new="if ref is None or (r, c) not in self.values:",
    ),
    dict(
        id="pages13",
        desc="paired table: the reference row paired with itself (no 'reference' cell)",
        old='                if r == ref:\n                    cells.append("reference")\n                    continue\n',
        new="",
    ),
    dict(
        id="pages15",
        desc="paired table: every column paired with the first column's reference",
        old="ref = reference(c) if callable(reference) else reference",
        new="ref = reference(self.cols[0]) if callable(reference) else reference",
    ),
    # ------------------------------------------------------------------- footer
    dict(
        id="pages19",
        desc="footer: failed runs counted per cell, not per distinct run",
        old="failed = [o for o in unique.values() if not o.ok]",
        new="failed = [o for _, o in ctx.pairs if not o.ok]",
    ),
    dict(
        id="pages20",
        desc="footer: summed run time counts a run once per cell that shows it",
        old="run_time = sum(o.wall_time for o in unique.values())",
        new="run_time = sum(o.wall_time for _, o in ctx.pairs)",
    ),
    dict(
        id="pages21",
        desc="footer: the seeds given, not the seeds run (--quick runs the first only)",
        old="seeds = ctx.opts.run_seeds",
        new="seeds = ctx.opts.seeds",
    ),
    dict(
        id="pages22",
        desc="footer: the command given in the options ignored (always rebuilt)",
        old="command = ctx.opts.command or _rebuild_command(ctx.name, ctx.opts)",
        new="command = _rebuild_command(ctx.name, ctx.opts)",
    ),
    dict(
        id="pages23",
        desc="runs line: runs trained in the pool counted as reused",
        old="trained = ctx.executed + ctx.pooled",
        new="trained = ctx.executed",
    ),
    dict(
        id="pages24",
        desc="dates line: the start day only (a run over midnight ends a day earlier)",
        old="        days += found\n",
        new="        days += found[:1]\n",
    ),
    dict(
        id="pages25",
        desc="dates line: first and last run in their order, not the earliest and latest day",
        old="first, last = min(days), max(days)",
        new="first, last = days[0], days[-1]",
    ),
    dict(
        id="pages26",
        desc="numerics line: a run counted once per cell that shows it",
        old="runs = {o.key: o for o in outcomes}.values()",
        new="runs = outcomes",
    ),
    # -------------------------------------------------------- rebuilt command
    dict(
        id="pages27",
        desc="command: --seeds left out when as many seeds as the default are given",
        old="if opts.seeds != ref.seeds:",
        new="if len(opts.seeds) != len(ref.seeds):",
    ),
    dict(
        id="pages28",
        desc="command: --set values written as Python reprs (quoted strings)",
        old='args += ["--set", f"{key}={_set_text(value)}"]',
        new='args += ["--set", f"{key}={_set_text(value)!r}"]',
    ),
    dict(
        id="pages29",
        desc="command: grid values with two decimals (0.995 written 0.99 or 1.00)",
        old='args += [flag, ",".join(f"{v:g}" for v in values)]',
        new='args += [flag, ",".join(f"{v:.2f}" for v in values)]',
    ),
    dict(
        id="pages30",
        desc="command: --ps left out",
        old='        ("--ps", opts.ps, ref.ps),\n',
        new="",
    ),
    dict(
        id="pages31",
        desc="command: a suite's threads unset (--set threads=none) not written",
        old='        elif "threads" not in opts.overrides:',
        new="        elif False:",
    ),
    dict(
        id="pages32",
        desc="page JSON: failed runs left out",
        old="        for s, o in ctx.pairs\n    ]",
        new="        for s, o in ctx.pairs\n        if o.ok\n    ]",
    ),
    # ---------------------------------------------------------------- suites.py
    dict(
        id="pages33",
        file=SUITES,
        desc="options_fields: the suite's value kept over an explicit flag",
        old="            values[name] = value\n",
        new="            values.setdefault(name, value)\n",
        tests=_SUITE_TESTS,
    ),
    dict(
        id="pages34",
        file=SUITES,
        desc="paper-regime: the ablations at the three highest sparsities (98 % too)",
        old="_REGIME_ABLATION_SPARSITIES = _REGIME_SPARSITIES[-2:]",
        new="_REGIME_ABLATION_SPARSITIES = _REGIME_SPARSITIES[-3:]",
        tests=_SUITE_TESTS,
    ),
    dict(
        id="pages35",
        file=SUITES,
        desc="paper-regime: stability at the highest sparsity (99.5 %), not the lowest",
        old='"stability": {"sparsities": _REGIME_SPARSITIES[:1]},',
        new='"stability": {"sparsities": _REGIME_SPARSITIES[-1:]},',
        tests=_SUITE_TESTS,
    ),
    dict(
        id="pages36",
        file=SUITES,
        desc="paper-regime: 'all' without p",
        old='experiments=("compare", "operator", "theta", "p"),',
        new='experiments=("compare", "operator", "theta"),',
        tests=_SUITE_TESTS,
    ),
    dict(
        id="pages37",
        file=SUITES,
        desc="paper-regime: p runs every sparsity (not among the ablations)",
        old='for name in ("operator", "theta", "p")',
        new='for name in ("operator", "theta")',
        tests=_SUITE_TESTS,
    ),
    dict(
        id="pages38",
        file=SUITES,
        desc="paper-regime: 3 seeds instead of 5",
        old='"seeds": (0, 1, 2, 3, 4),',
        new='"seeds": (0, 1, 2),',
        tests=_SUITE_TESTS,
    ),
]
