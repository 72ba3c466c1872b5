"""Mutants of the benchmark runner and the CLI (runner, options, suites, driver, cli/)."""

RUNNER = "src/feather_sparse/bench/runner.py"
OPTIONS = "src/feather_sparse/bench/options.py"
SUITES = "src/feather_sparse/bench/suites.py"
DRIVER = "src/feather_sparse/bench/driver.py"
CLI = "src/feather_sparse/cli/__init__.py"
TRAIN = "src/feather_sparse/cli/train.py"
BENCH = "src/feather_sparse/cli/bench.py"

FILE = RUNNER
_BENCH_TESTS = [
    "tests/test_bench_options.py",
    "tests/test_bench_sweeps.py",
    "tests/test_run_lock.py",
    "tests/test_run_metadata.py",
]
_DRIVER_TESTS = [
    "tests/test_experiments.py",
    "tests/test_bench_options.py",
    "tests/test_bench_sweeps.py",
]
_CLI_BENCH_TESTS = [
    "tests/test_bench_options.py",
    "tests/test_bench_sweeps.py",
    "tests/test_cli.py",
    "tests/test_bench_wording.py",
]
_CLI_TESTS = [
    "tests/test_cli.py",
    "tests/test_train_cli_checks.py",
    "tests/test_train.py",
    "tests/test_train_nodes.py",
]
TESTS = _BENCH_TESTS
TIMEOUT = 480  # generous: the two cores are shared with other runs
MUTATIONS = [
    # ------------------------------------------------------------ options.py
    dict(
        id="cl01",
        file=OPTIONS,
        desc="seeds: a negative seed accepted (s < -1)",
        old="if any(s < 0 for s in self.seeds):",
        new="if any(s < -1 for s in self.seeds):",
    ),
    dict(
        id="cl02",
        file=OPTIONS,
        desc="seeds: a repeated seed accepted (the seeds left out of the repeat check)",
        old='("seeds", self.seeds, "a seed is one run"),',
        new='("seeds", (), "a seed is one run"),',
    ),
    dict(
        id="cl03",
        file=OPTIONS,
        desc="sparsities: 1.0 accepted (s <= 1)",
        old="if not 0.0 < s < 1.0:",
        new="if not 0.0 < s <= 1.0:",
    ),
    dict(
        id="cl04",
        file=OPTIONS,
        desc="ps: p < 1 accepted (p >= 0)",
        old="if not p >= 1.0:",
        new="if not p >= 0.0:",
    ),
    dict(
        id="cl05",
        file=OPTIONS,
        desc="run_seeds: --quick runs every seed",
        old="return self.seeds[:1] if self.quick else self.seeds",
        new="return self.seeds",
    ),
    dict(
        id="cl06",
        file=OPTIONS,
        desc="base_overrides: --quick applied after the user's overrides (quick wins)",
        old="""        values.update(self.overrides)
        return values""",
        new="""        values.update(self.overrides)
        if self.quick:
            values.update(QUICK_OVERRIDES)
        return values""",
    ),
    dict(
        id="cl07",
        file=OPTIONS,
        desc="worker_count: --threads ignored (always one process on CPU)",
        old="return max(1, usable_cpus() // int(base.threads))",
        new="return 1",
    ),
    dict(
        id="cl08",
        file=OPTIONS,
        desc="worker_count: --jobs ignored",
        old="""        if self.jobs:
            return self.jobs
""",
        new="",
    ),
    # ------------------------------------------------------------- suites.py
    dict(
        id="cl09",
        file=SUITES,
        desc="options_fields: an explicit flag keeps the suite's per-experiment value",
        old="                fields.pop(name, None)",
        new="                pass",
    ),
    # ------------------------------------------------------------- driver.py
    dict(
        id="cl10",
        file=DRIVER,
        desc="plan_experiments: per-experiment options not applied",
        old="planned = experiment.plan(opts.for_experiment(experiment.name))",
        new="planned = experiment.plan(opts)",
        tests=_DRIVER_TESTS,
    ),
    dict(
        id="cl11",
        file=DRIVER,
        desc="run_experiment: pooled counts every run of the page",
        old="pooled = len(before & set(unique)) if pool is not None else 0",
        new="pooled = len(set(unique)) if pool is not None else 0",
        tests=_DRIVER_TESTS,
    ),
    dict(
        id="cl12",
        file=DRIVER,
        desc="run_experiment: failures counted per spec, not per distinct run",
        old="failures = tuple(o for o in unique.values() if not o.ok)",
        new="failures = tuple(o for _, o in pairs if not o.ok)",
        tests=_DRIVER_TESTS,
    ),
    # ------------------------------------------------------------- runner.py
    dict(
        id="cl13",
        desc="_config_dict: an override of a varied field not refused",
        old="    if clash:\n        raise ValueError(\n            f\"{', '.join(clash)}: set by",
        new="    if False:\n        raise ValueError(\n            f\"{', '.join(clash)}: set by",
    ),
    dict(
        id="cl14",
        desc="_config_dict: the run's seed not set (recipe's seed)",
        old='    values["seed"] = spec.seed\n',
        new="",
    ),
    dict(
        id="cl15",
        desc="_config_dict: the user's overrides win over the cell's settings",
        old="    values.update(spec.settings)\n",
        new="    values = {**spec.settings, **values}\n",
    ),
    dict(
        id="cl16",
        desc="run_key: the hash not over sorted keys",
        old="blob = json.dumps(jsonable(config), sort_keys=True).encode()",
        new="blob = json.dumps(jsonable(config)).encode()",
    ),
    dict(
        id="cl17",
        desc="plan_runs: a stored failed run reused (not retried)",
        old="        if found is not None and found.ok:\n            stored[key] = found",
        new="        if found is not None:\n            stored[key] = found",
    ),
    dict(
        id="cl18",
        desc="plan_runs: --force ignored (stored results reused)",
        old="found = None if opts.force else load_outcome(opts.runs_path / key)",
        new="found = load_outcome(opts.runs_path / key)",
    ),
    dict(
        id="cl19",
        desc="plan_runs: a run tried by this command trained again",
        old="        if attempted is not None and key in attempted:\n            stored[key] = attempted[key]\n            continue\n",
        new="",
    ),
    dict(
        id="cl20",
        desc="_check_names: an unknown method not refused before training",
        old='if not cfg["dense"] and cfg["method"] not in methods:',
        new="if False:",
    ),
    dict(
        id="cl21",
        desc="execute_runs: runs another process stored meanwhile counted as trained",
        old="trained += not data.get(REUSED, False)",
        new="trained += 1",
    ),
    dict(
        id="cl22",
        desc="_execute: a stored failed result of another process taken as it is",
        old="if stored is not None and stored.ok:",
        new="if stored is not None:",
    ),
    # --------------------------------------------------------- cli/bench.py
    dict(
        id="cl23",
        file=BENCH,
        desc="_floats: an empty list accepted (the default grid)",
        old="    if not values:  # an empty list would mean the default grid: say so instead",
        new="    if False:  # an empty list would mean the default grid: say so instead",
        tests=_CLI_BENCH_TESTS,
    ),
    dict(
        id="cl24",
        file=BENCH,
        desc="--quick with several seeds accepted (len > 2)",
        old="if args.quick and args.seeds is not None and len(args.seeds) > 1:",
        new="if args.quick and args.seeds is not None and len(args.seeds) > 2:",
        tests=_CLI_BENCH_TESTS,
    ),
    dict(
        id="cl25",
        file=BENCH,
        desc="options_from_args: --seeds keeps nm's own seeds (per-experiment seeds always set)",
        old='        if "seeds" not in explicit:  # experiments with seeds of their own (nm: 5)',
        new="        if True:  # experiments with seeds of their own (nm: 5)",
        tests=_CLI_BENCH_TESTS,
    ),
    dict(
        id="cl26",
        file=BENCH,
        desc="options_from_args: --data does not pick the recipe of its name",
        old="if recipe is None and args.data in list_recipes():",
        new="if False:",
        tests=_CLI_BENCH_TESTS,
    ),
    dict(
        id="cl27",
        file=BENCH,
        desc="_run: exit code 0 with failed runs",
        old="return 1 if failures else 0",
        new="return 0",
        tests=_CLI_BENCH_TESTS,
    ),
    dict(
        id="cl28",
        file=BENCH,
        desc="_grid_fit: a grid flag no experiment takes not refused",
        old="        if not takers:\n            elsewhere",
        new="        if False:\n            elsewhere",
        tests=_CLI_BENCH_TESTS,
    ),
    # --------------------------------------------------------- cli/train.py
    dict(
        id="cl29",
        file=TRAIN,
        desc="_cli_overrides: --set wins over a field's own flag",
        old="""    for text in args.set:
        key, value = parse_override(text)
        overrides[key] = value
    for f in config_fields():
        flag_value = getattr(args, f.name, None)
        if f.name != "recipe" and flag_value is not None:
            overrides[f.name] = flag_value""",
        new="""    for f in config_fields():
        flag_value = getattr(args, f.name, None)
        if f.name != "recipe" and flag_value is not None:
            overrides[f.name] = flag_value
    for text in args.set:
        key, value = parse_override(text)
        overrides[key] = value""",
        tests=_CLI_TESTS,
    ),
    dict(
        id="cl30",
        file=TRAIN,
        desc="_check_dense_flags: pruning flags with --dense accepted",
        old="    if given:\n        flags =",
        new="    if False:\n        flags =",
        tests=_CLI_TESTS,
    ),
    dict(
        id="cl31",
        file=TRAIN,
        desc="--print-config skips the config checks",
        old="        check_config(config, stop_after_epoch=args.stop_after_epoch, layers=True)\n        print(config_toml",
        new="        print(config_toml",
        tests=_CLI_TESTS,
    ),
    dict(
        id="cl32",
        file=TRAIN,
        desc="SIGTERM exits with 130 (as Ctrl-C)",
        old="return TERMINATED_EXIT_CODE if terminated else INTERRUPTED_EXIT_CODE",
        new="return INTERRUPTED_EXIT_CODE",
        tests=_CLI_TESTS,
    ),
    # ------------------------------------------------------ cli/__init__.py
    dict(
        id="cl33",
        file=CLI,
        desc="main: a bad input raises a traceback (only ValueError caught, not OSError)",
        old="except (ValueError, OSError, RuntimeError, ImportError) as err:",
        new="except (ValueError, RuntimeError, ImportError) as err:",
        tests=_CLI_TESTS,
    ),
]
