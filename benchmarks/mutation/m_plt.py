"""Mutants of the figures, the old experiments import path and the export command:
src/feather_sparse/plots.py (which series each figure draws and where: the x/y
pairing, categorical ticks and their labels, the std band and the error bars, the
dense baseline, the legend, the panels' labels, the stability epochs, the grouped
bars of layer sparsity and FLOPs, the operator family's axis, threshold and labels,
the PNG's resolution and the missing-matplotlib message),
src/feather_sparse/experiments.py (the old import path of ``feather-sparse bench``:
each name the very object of its new home) and src/feather_sparse/cli/export.py
(the ``feather-sparse export`` command: the checks before anything is written, what
it must not write over, the input shape and example input for ONNX, the precision
and metadata of the .fsp, the verdict on onnxruntime's difference, the messages).
The ONNX writer and what ``export`` reads (export/onnx.py, export/run.py) are
m_onnx.py's.

A mutant with a ``file`` key mutates that file instead of FILE; each mutant runs its
own ``tests`` (the files that reach its module, the most specific first): the run
stops at the first failure (-x). matplotlib, onnx, onnxscript and onnxruntime were
installed for the run, so no figure or ONNX test was skipped.
"""

FILE = "src/feather_sparse/plots.py"
EXPERIMENTS = "src/feather_sparse/experiments.py"
EXPORT = "src/feather_sparse/cli/export.py"
TIMEOUT = 900  # per mutant: far above the 1-5 min a survivor took on the loaded machine

# plots.py is drawn by test_plots_write_pngs and by the experiments of `feather-sparse
# bench`, whose quick runs draw every figure of the results pages.
PLOT_TESTS = [
    "tests/test_analysis.py::test_plots_write_pngs",
    "tests/test_experiments.py::test_quick_run_of_every_experiment",
    "tests/test_experiments.py::test_compare_lists_every_method_and_the_dense_model",
    "tests/test_experiments.py::test_flops_page_validates_against_torch_flop_counter",
]
EXPERIMENTS_TESTS = ["tests/test_experiments.py"]
# cli/export.py is imported by the command line only: the tests that run
# `feather-sparse export` or `inspect` (cli.main, directly or through a helper).
EXPORT_TESTS = [
    "tests/test_export_targets.py::test_a_file_of_unknown_kind_or_an_onnx_model_is_never_replaced",
    "tests/test_export_targets.py::test_a_name_that_says_the_other_format_is_refused",
    "tests/test_export_targets.py::test_an_output_named_neither_way_is_written_with_a_warning",
    "tests/test_export_audit.py::test_cli_re_export_of_a_float64_file_keeps_float64",
    "tests/test_export_audit.py::test_a_plain_safetensors_file_is_never_replaced",
    "tests/test_export_audit.py::test_cli_checks_every_option_before_writing",
    "tests/test_export_audit.py::test_cli_export_of_an_nm_run_at_another_sparsity_says_drop_sparsity",
    "tests/test_export_reencode.py",
    "tests/test_export.py::test_cli_bad_files_are_one_line",
    "tests/test_export.py::test_cli_inspect",
    "tests/test_export.py::test_cli_errors_are_one_line",
    "tests/test_export.py::test_cli_export_from_run_dir",
    "tests/test_export.py::test_cli_export_of_an_unfinished_run_keeps_its_thresholds",
    "tests/test_export.py::test_cli_export_at_an_explicit_sparsity_warns",
    "tests/test_export.py::test_cli_export_of_a_finished_run_bakes_the_target",
    "tests/test_export.py::test_cli_export_rejects_a_bad_sparsity",
    "tests/test_export.py::test_cli_export_sparsity_needs_a_sparse_training_checkpoint",
    "tests/test_export.py::test_cli_export_of_a_checkpoint_that_does_not_fit_its_spec",
    "tests/test_export.py::test_cli_export_rejects_other_checkpoints",
    "tests/test_export.py::test_cli_export_never_writes_over_what_it_reads_or_another_kind",
    "tests/test_export.py::test_cli_export_onnx_refuses_a_file_that_does_not_match",
    "tests/test_export.py::test_cli_export_onnx",
    "tests/test_faults_export.py::test_damaged_training_checkpoint_does_not_replace_model_fsp",
    "tests/test_faults.py::test_export_of_a_damaged_run_falls_back_to_the_previous_checkpoint",
    "tests/test_faults.py::test_export_of_a_run_whose_last_checkpoint_is_no_zip_falls_back",
    "tests/test_faults.py::test_export_of_a_damaged_checkpoint_file_is_refused",
    "tests/test_cli.py",
    "tests/test_docs.py::test_export_and_nm_pages_tied_weight_statements_hold",
    "tests/test_train.py::test_saved_model_and_export_of_the_run_agree",
    "tests/test_first_hour.py::test_inspect_of_an_own_model_says_how_to_load_it",
]
TESTS = PLOT_TESTS + EXPERIMENTS_TESTS + EXPORT_TESTS  # every mutant names its own

MUTATIONS = [
    # --- plots.py: the canvas, the legend, the file
    dict(
        id="plt01",
        desc="matplotlib missing: the bare ImportError, not the message naming the extra to install",
        old=(
            "        raise ImportError(\n"
            "            f\"plots need matplotlib ({err}); install it with: pip install 'feather-sparse[train]'\"\n"
            "        ) from err"
        ),
        new="        raise",
    ),
    dict(
        id="plt02",
        desc="legend drawn only when nothing is labelled (condition inverted)",
        old="    if ax.get_legend_handles_labels()[0]:",
        new="    if not ax.get_legend_handles_labels()[0]:",
    ),
    dict(
        id="plt03",
        desc="PNG saved at matplotlib's default resolution, not DPI (120)",
        old="    fig.savefig(out, dpi=DPI)",
        new="    fig.savefig(out)",
    ),
    dict(
        id="plt04",
        desc="the folder of the PNG not created (a figure into a new folder fails)",
        old="    out.parent.mkdir(parents=True, exist_ok=True)\n",
        new="",
    ),
    # --- plots.py: _draw_curves (plot_curves and every panel)
    dict(
        id="plt05",
        desc="categorical ticks in first-seen order, not sorted (a curve lacking the first x reorders them)",
        old="ticks = sorted({v for curve in curves for v in curve.x}) if categorical_x else []",
        new="ticks = list(dict.fromkeys(v for curve in curves for v in curve.x)) if categorical_x else []",
    ),
    dict(
        id="plt06",
        desc="categorical x: a point placed at its index in its own curve, not at its x's tick",
        old="[float(ticks.index(v)) for v in curve.x] if categorical_x else list(curve.x)",
        new="[float(i) for i, _ in enumerate(curve.x)] if categorical_x else list(curve.x)",
    ),
    dict(
        id="plt07",
        desc="error bars of twice the std (a ±2σ interval for the documented ±1σ)",
        old="ax.errorbar(xs, curve.mean, yerr=curve.std,",
        new="ax.errorbar(xs, curve.mean, yerr=[2 * s for s in curve.std],",
    ),
    dict(
        id="plt08",
        desc="error-bar curves drawn without their label (no legend entry naming the method)",
        old='marker="o", capsize=3, label=curve.label)',
        new='marker="o", capsize=3)',
    ),
    dict(
        id="plt09",
        desc="std band's lower edge from (std, mean) swapped: s − m instead of m − s",
        old="lo = [m - s for m, s in zip(curve.mean, curve.std)]",
        new="lo = [m - s for m, s in zip(curve.std, curve.mean)]",
    ),
    dict(
        id="plt10",
        desc="baseline tuple unpacked as (label, std, mean), not the documented (label, mean, std)",
        old="        label, mean, std = baseline",
        new="        label, std, mean = baseline",
    ),
    dict(
        id="plt11",
        desc="baseline band drawn for a NaN std too (one dense seed)",
        old="        if std > 0 and not math.isnan(std):",
        new="        if not std <= 0:",
    ),
    dict(
        id="plt12",
        desc="more xticklabels than distinct x values accepted (!= became <)",
        old="if xticklabels is not None and len(xticklabels) != len(ticks):",
        new="if xticklabels is not None and len(xticklabels) < len(ticks):",
    ),
    dict(
        id="plt13",
        desc="categorical ticks at 1..n, the points at 0..n-1 (labels one place off)",
        old="        ax.set_xticks(range(len(ticks)))",
        new="        ax.set_xticks(range(1, len(ticks) + 1))",
    ),
    dict(
        id="plt14",
        desc="xticklabels without categorical_x silently ignored (not refused)",
        old=(
            "    elif xticklabels is not None:\n"
            '        raise ValueError("xticklabels needs categorical_x=True")\n'
        ),
        new="",
    ),
    # --- plots.py: plot_panels, plot_stability
    dict(
        id="plt15",
        desc="panels: the y label on the last panel, not the first",
        old="    axes[0].set_ylabel(ylabel)",
        new="    axes[-1].set_ylabel(ylabel)",
    ),
    dict(
        id="plt16",
        desc="panels: categorical_x not passed on (panels drawn at the raw x values)",
        old=("            xscale=None,\n            categorical_x=categorical_x,\n"),
        new=("            xscale=None,\n            categorical_x=False,\n"),
    ),
    dict(
        id="plt17",
        desc="stability: r plotted against 0, 1, ... (its index), not the recorded epochs",
        old='        ax.plot(run.epochs, run.pearson, marker=".", label=run.label)',
        new='        ax.plot(range(len(run.pearson)), run.pearson, marker=".", label=run.label)',
    ),
    dict(
        id="plt18",
        desc="stability: y axis from 0 (negative Pearson r cut off)",
        old="    ax.set_ylim(top=1.02)",
        new="    ax.set_ylim(0, 1.02)",
    ),
    # --- plots.py: the grouped bars
    dict(
        id="plt19",
        desc="layer bars: results over other layers not refused (bars under the wrong names)",
        old="        if [r.name for r in result.layers] != names:",
        new="        if False:",
    ),
    dict(
        id="plt20",
        desc="layer sparsity: bars of the fraction, not the percentage (axis 0-100 %)",
        old="bars = [(label, [100 * r.sparsity for r in d.layers]) for label, d in items]",
        new="bars = [(label, [r.sparsity for r in d.layers]) for label, d in items]",
    ),
    dict(
        id="plt21",
        desc="layer bars: the group of bars not centred on its tick ((i − n/2)·width)",
        old="xs = [j + (i - (len(bars) - 1) / 2) * width for j in range(len(names))]",
        new="xs = [j + (i - len(bars) / 2) * width for j in range(len(names))]",
    ),
    dict(
        id="plt22",
        desc="FLOPs bars: each layer's dense MACs, not its sparse ones",
        old="[x.sparse_macs / 1e6 for x in r.layers]",
        new="[x.macs / 1e6 for x in r.layers]",
    ),
    # --- plots.py: plot_operator_family
    dict(
        id="plt23",
        desc="operator family: w from 0 to span, not over [-span, span]",
        old="w = torch.linspace(-span, span, 1201, dtype=torch.float64)",
        new="w = torch.linspace(0.0, span, 1201, dtype=torch.float64)",
    ),
    dict(
        id="plt24",
        desc="operator family: the threshold argument ignored (T = 1)",
        old="t = torch.tensor(threshold, dtype=torch.float64)",
        new="t = torch.tensor(1.0, dtype=torch.float64)",
    ),
    dict(
        id="plt25",
        desc="operator family: p = 1 labelled hard and p = ∞ soft",
        old='name = {1.0: " (soft)", math.inf: " (hard)"}.get(float(p), "")',
        new='name = {1.0: " (hard)", math.inf: " (soft)"}.get(float(p), "")',
    ),
    # --- experiments.py: the old import path
    dict(
        id="plt26",
        desc="THETA_OPERATOR_SPARSITIES and THETA_OPERATOR_THETAS re-exported under each other's name",
        old="    THETA_OPERATOR_SPARSITIES,\n    THETA_OPERATOR_THETAS,\n)",
        new=(
            "    THETA_OPERATOR_SPARSITIES as THETA_OPERATOR_THETAS,\n"
            "    THETA_OPERATOR_THETAS as THETA_OPERATOR_SPARSITIES,\n)"
        ),
        file=EXPERIMENTS,
        tests=EXPERIMENTS_TESTS,
    ),
    dict(
        id="plt27",
        desc="BENCH_OVERRIDES and QUICK_OVERRIDES re-exported under each other's name",
        old="    BENCH_OVERRIDES,\n    QUICK_OVERRIDES,\n",
        new="    BENCH_OVERRIDES as QUICK_OVERRIDES,\n    QUICK_OVERRIDES as BENCH_OVERRIDES,\n",
        file=EXPERIMENTS,
        tests=EXPERIMENTS_TESTS,
    ),
    # --- cli/export.py: the checks before anything is written
    dict(
        id="plt28",
        desc="-o and --onnx naming one file by two spellings (a/../a/m) not refused (== of the paths)",
        old="    return a.resolve() == b.resolve() or (a.exists() and b.exists() and a.samefile(b))",
        new="    return a == b or (a.exists() and b.exists() and a.samefile(b))",
        file=EXPORT,
        tests=EXPORT_TESTS,
    ),
    dict(
        id="plt29",
        desc="--opset / --input-shape without --onnx silently ignored (not refused)",
        old="        if given:\n            flags",
        new="        if False:\n            flags",
        file=EXPORT,
        tests=EXPORT_TESTS,
    ),
    dict(
        id="plt30",
        desc="--input-shape with a zero size accepted (d <= 0 became d < 0)",
        old="    if not shape or any(d <= 0 for d in shape):",
        new="    if not shape or any(d < 0 for d in shape):",
        file=EXPORT,
        tests=EXPORT_TESTS,
    ),
    dict(
        id="plt31",
        desc="what must not be written over: only the path given, not a run's checkpoints",
        old="    reads = source_paths(args.source)",
        new="    reads = [args.source]",
        file=EXPORT,
        tests=EXPORT_TESTS,
    ),
    dict(
        id="plt32",
        desc="the --onnx target not checked before the export (only -o is)",
        old='        (args.onnx, "model.onnx", "onnx"),\n    ):\n        if target is not None:',
        new="    ):\n        if target is not None:",
        file=EXPORT,
        tests=EXPORT_TESTS,
    ),
    dict(
        id="plt33",
        desc="name warning: what the file will hold swapped (-o x.pt 'will hold an ONNX model')",
        old='what = "a sparse checkpoint (.fsp)" if kind == "safetensors" else "an ONNX model"',
        new='what = "a sparse checkpoint (.fsp)" if kind == "onnx" else "an ONNX model"',
        file=EXPORT,
        tests=EXPORT_TESTS,
    ),
    # --- cli/export.py: the ONNX input
    dict(
        id="plt34",
        desc="--input-shape ignored for a model with a registered input shape (the spec first)",
        old=(
            "    if shape:\n"
            "        return shape\n"
            "    spec = getattr(model, MODEL_SPEC_ATTR, None)\n"
            "    if spec:\n"
            '        return tuple(models.model_info(str(spec["name"])).input_shape)\n'
        ),
        new=(
            "    spec = getattr(model, MODEL_SPEC_ATTR, None)\n"
            "    if spec:\n"
            '        return tuple(models.model_info(str(spec["name"])).input_shape)\n'
            "    if shape:\n"
            "        return shape\n"
        ),
        file=EXPORT,
        tests=EXPORT_TESTS,
    ),
    dict(
        id="plt35",
        desc="example input always float32 (not the dtype of the model's weights)",
        old="    return torch.randn(2, *shape, dtype=dtype)",
        new="    return torch.randn(2, *shape)",
        file=EXPORT,
        tests=EXPORT_TESTS,
    ),
    dict(
        id="plt36",
        desc="a shape the model cannot take found only by export_onnx, after -o was written",
        old=(
            "        try:\n"
            "            check_example_input(model, example)\n"
            "        except ValueError as err:\n"
        ),
        new=("        try:\n            pass\n        except ValueError as err:\n"),
        file=EXPORT,
        tests=EXPORT_TESTS,
    ),
    dict(
        id="plt37",
        desc="a .fsp without a model spec given --onnx: the .fsp re-encoded and --onnx dropped silently",
        old=(
            "        if args.onnx is not None:\n            raise ValueError(_onnx_needs_a_model("
        ),
        new=("        if False:\n            raise ValueError(_onnx_needs_a_model("),
        file=EXPORT,
        tests=EXPORT_TESTS,
    ),
    # --- cli/export.py: what is written and said
    dict(
        id="plt38",
        desc="--values ignored where the source has its own precision (source first)",
        old="values=args.values or source.values,",
        new="values=source.values or args.values,",
        file=EXPORT,
        tests=EXPORT_TESTS,
    ),
    dict(
        id="plt39",
        desc="the .fsp written without the source's metadata (config, step, ...)",
        old="                metadata=source.metadata,\n",
        new="",
        file=EXPORT,
        tests=EXPORT_TESTS,
    ),
    dict(
        id="plt40",
        desc="a NaN difference from onnxruntime reported as matching (diff > tol, not not diff <= tol)",
        old="            if not diff <= tolerance:  # NaN too",
        new="            if diff > tolerance:  # NaN too",
        file=EXPORT,
        tests=EXPORT_TESTS,
    ),
    dict(
        id="plt41",
        desc="ONNX tolerance without the floor of 1 on the scale (an all-zero output must match exactly)",
        old="    return 1000 * eps * max(1.0, scale)",
        new="    return 1000 * eps * scale",
        file=EXPORT,
        tests=EXPORT_TESTS,
    ),
    dict(
        id="plt42",
        desc="unfinished run: the hint names the sparsity in use, not the target, as the value forcing the target",
        old="; --sparsity {source.target:g} forces the target)",
        new="; --sparsity {source.sparsity:g} forces the target)",
        file=EXPORT,
        tests=EXPORT_TESTS,
    ),
]
