"""Mutants of the ONNX export and of what `feather-sparse export` reads:
src/feather_sparse/export/onnx.py (the opset range, the example-input check, the
pruned weights P_T(w) in the graph, eval mode, the dynamic batch axis, the atomic
writes and the large-model path, verify_onnx's comparison) and
src/feather_sparse/export/run.py (which file of a run folder is read, what an export
must never write over, finished or not, the sparsity checks, the warnings, the
re-encoding of a .fsp without a model spec).

A mutant with a ``file`` key mutates that file instead of FILE; each mutant runs its
own ``tests`` (the files that reach its code, the most specific first): the run stops
at the first failure (-x). onnx, onnxscript and onnxruntime were installed for the
run, so no ONNX test was skipped.
"""

FILE = "src/feather_sparse/export/onnx.py"
RUN = "src/feather_sparse/export/run.py"
TIMEOUT = 300  # per mutant: a surviving mutant's tests take about 90 s on a shared 2-core machine

ONNX_TESTS = [
    "tests/test_export_targets.py",
    "tests/test_export_audit.py",
    "tests/test_train_modes.py",
    "tests/test_export.py",
    "tests/test_nm_export.py",
]
RUN_TESTS = [
    "tests/test_export.py",
    "tests/test_export_reencode.py",
    "tests/test_export_audit.py",
    "tests/test_faults.py",
    "tests/test_faults_export.py",
]
TESTS = ONNX_TESTS + [t for t in RUN_TESTS if t not in ONNX_TESTS]

MUTATIONS = [
    # --- the opset
    dict(
        id="onx01",
        desc="default opset: the newest onnx knows, not capped by the exporter (min became max)",
        old="newest = min(int(onnx.defs.onnx_opset_version()), exporter_max)",
        new="newest = max(int(onnx.defs.onnx_opset_version()), exporter_max)",
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx02",
        desc="the newest opset asked for explicitly is refused (> became >=)",
        old="    if opset > newest:",
        new="    if opset >= newest:",
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx03",
        desc="the oldest opset the exporter writes is refused (< became <=)",
        old="    if opset < oldest:",
        new="    if opset <= oldest:",
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx04",
        desc="the torch.export-based exporter's oldest opset taken as the legacy one's (7)",
        old="    oldest = _oldest_opset(exporter)",
        new='    oldest = _oldest_opset("legacy")',
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx05",
        desc="with onnxscript, the highest opset read from the legacy exporter's constant (20)",
        old='return "dynamo", _newest_opset("dynamo")',
        new='return "dynamo", _newest_opset("legacy")',
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx06",
        desc="the opset written is not compared with the one asked for",
        old="    if written != opset:  # checked before the file is written",
        new="    if False:  # checked before the file is written",
        tests=ONNX_TESTS,
    ),
    # --- the example input
    dict(
        id="onx07",
        desc="the example-input check runs the model in its own mode (no eval)",
        old="        with evaluating(model), torch.inference_mode():\n            model(example_input)",
        new="        with torch.inference_mode():\n            model(example_input)",
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx08",
        desc="an IndexError from the model's forward is not turned into the one-line error",
        old="    except (RuntimeError, ValueError, IndexError, TypeError) as err:",
        new="    except (RuntimeError, ValueError, TypeError) as err:",
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx09",
        desc="export_onnx skips the example-input check (a wrong shape fails in the exporter)",
        old="    check_example_input(model, example_input)  # a wrong shape fails here, in one line",
        new="    pass",
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx10",
        desc="legacy exporter: exactly 2 GiB of weights accepted (>= became >)",
        old='if exporter == "legacy" and _weights_bytes(model) >= _PROTOBUF_LIMIT:',
        new='if exporter == "legacy" and _weights_bytes(model) > _PROTOBUF_LIMIT:',
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx11",
        desc="a weight two layers share counted twice towards the 2 GiB",
        old="    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}\n"
        "    return sum(t.numel() * t.element_size() for t in tensors.values())",
        new="    tensors = [*dict(model.named_parameters(remove_duplicate=False)).values(), *model.buffers()]\n"
        "    return sum(t.numel() * t.element_size() for t in tensors)",
        tests=ONNX_TESTS,
    ),
    # --- the pruned weights in the graph, the model kept
    dict(
        id="onx12",
        desc="a Pruner's layer exported with its dense weight w, not P_T(w)",
        old="value = getattr(module, tensor_name).detach().clone()",
        new="value = module.parametrizations[tensor_name].original.detach().clone()",
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx13",
        desc="the pruned weight not cloned (shares the operator's output memory)",
        old="value = getattr(module, tensor_name).detach().clone()",
        new="value = getattr(module, tensor_name).detach()",
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx14",
        desc="a Pruner's layer that also carries another parametrization is not refused",
        old="        if set(plists.keys()) != {tensor_name}:",
        new="        if tensor_name not in plists:",
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx15",
        desc="the Pruner's parametrizations (and its backbone) deep-copied with the model, then dropped",
        old="    memo: dict[int, Any] = {id(m.parametrizations): None for m, _ in layers.values()}",
        new="    memo: dict[int, Any] = {}",
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx16",
        desc="the graph exported in the model's own mode (no eval around the exporter)",
        old="        with evaluating(model), warnings.catch_warnings():",
        new="        with warnings.catch_warnings():",
        tests=ONNX_TESTS,
    ),
    # --- the dynamic batch axis
    dict(
        id="onx17",
        desc="legacy exporter: the output's batch axis not marked dynamic",
        old='dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},',
        new='dynamic_axes={"input": {0: "batch"}},',
        tests=ONNX_TESTS,
    ),
    # --- the writes
    dict(
        id="onx18",
        desc="the small-model file written in place, not atomically",
        old="        write_atomic(target, data)",
        new="        target.write_bytes(data)",
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx19",
        desc="legacy exporter's temporary file left behind",
        old="    finally:\n        Path(tmp).unlink(missing_ok=True)",
        new="    finally:\n        pass",
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx20",
        desc="large model: the graph's temporary file left behind when its save fails",
        old="    except OSError as err:\n        Path(tmp).unlink(missing_ok=True)\n        raise _unchanged",
        new="    except OSError as err:\n        raise _unchanged",
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx21",
        desc="large model: what is already at <file>.data is not checked before it is replaced",
        old='    check_writable(target.with_name(data_name), "model.onnx.data", kind=ONNX_DATA)\n',
        new="",
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx22",
        desc="large model: a model of exactly the threshold's bytes goes to two files (> became >=)",
        old="large = program is not None and _initializer_bytes(program) > _large_model_bytes()",
        new="large = program is not None and _initializer_bytes(program) >= _large_model_bytes()",
        tests=ONNX_TESTS,
    ),
    # --- verify_onnx
    dict(
        id="onx23",
        desc="verify_onnx: the signed difference's maximum, not the absolute one",
        old="return float((onnx_out.to(common) - torch_out.to(common)).abs().max()), torch_out",
        new="return float((onnx_out.to(common) - torch_out.to(common)).max()), torch_out",
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx24",
        desc="verify_onnx: outputs of different shapes compared (broadcast) instead of refused",
        old="    if onnx_out.shape != torch_out.shape:",
        new="    if onnx_out.numel() != torch_out.numel() and onnx_out.dim() != torch_out.dim():",
        tests=ONNX_TESTS,
    ),
    dict(
        id="onx25",
        desc="verify_onnx: the PyTorch model run in its own mode (no eval)",
        old="    with evaluating(model), torch.inference_mode():\n        torch_out",
        new="    with torch.inference_mode():\n        torch_out",
        tests=ONNX_TESTS,
    ),
    # --- run.py: which file of a run folder
    dict(
        id="onx26",
        desc="run folder: model.fsp read before checkpoints/last.pt",
        old="for candidate in (last, source / MODEL_NAME, previous_checkpoint_path(last)):",
        new="for candidate in (source / MODEL_NAME, last, previous_checkpoint_path(last)):",
        file=RUN,
        tests=RUN_TESTS,
    ),
    dict(
        id="onx27",
        desc="run folder: prev.pt alone (last.pt gone) not found",
        old="for candidate in (last, source / MODEL_NAME, previous_checkpoint_path(last)):",
        new="for candidate in (last, source / MODEL_NAME):",
        file=RUN,
        tests=RUN_TESTS,
    ),
    dict(
        id="onx28",
        desc="a run folder's damaged last.pt is sniffed, not read with the fallback to prev.pt",
        old="    if source.is_dir() and path.parent == checkpoint_path(source).parent:",
        new="    if False:",
        file=RUN,
        tests=RUN_TESTS,
    ),
    dict(
        id="onx29",
        desc="the fallback to prev.pt not said in the warning",
        old="    if fallback is not None:\n        previous",
        new="    if False:\n        previous",
        file=RUN,
        tests=RUN_TESTS,
    ),
    dict(
        id="onx30",
        desc="what an export must not write over: any folder holding a last.pt (checkpoints/ check dropped)",
        old="    if in_run and folder.name == CHECKPOINTS_DIR and folder.is_dir():",
        new="    if in_run and folder.is_dir():",
        file=RUN,
        tests=RUN_TESTS,
    ),
    dict(
        id="onx31",
        desc="what an export must not write over: a checkpoints/last.pt given as a file protects only itself",
        old="    in_run = source.is_dir() or path.name in (LAST_NAME, PREVIOUS_NAME)",
        new="    in_run = source.is_dir()",
        file=RUN,
        tests=RUN_TESTS,
    ),
    # --- run.py: finished or not, what is baked
    dict(
        id="onx32",
        desc="a run at its last epoch counts as unfinished (>= became >)",
        old='finished, progress = epoch >= epochs, f"epoch {epoch} of {epochs}"',
        new='finished, progress = epoch > epochs, f"epoch {epoch} of {epochs}"',
        file=RUN,
        tests=RUN_TESTS,
    ),
    dict(
        id="onx33",
        desc="no epoch count: a Pruner at its last step counts as unfinished (>= became >)",
        old='finished, progress = step >= total, f"step {step} of {total}"',
        new='finished, progress = step > total, f"step {step} of {total}"',
        file=RUN,
        tests=RUN_TESTS,
    ),
    dict(
        id="onx34",
        desc="an unfinished run exported with its dense weights w, not P_T(w) at the thresholds in use",
        old="            pruned = pruner.dense_state_dict(pruned=True)",
        new="            pruned = pruner.dense_state_dict(pruned=False)",
        file=RUN,
        tests=RUN_TESTS,
    ),
    dict(
        id="onx35",
        desc="a finished run at another sparsity than its target: no warning",
        old="            if not finished or sparsity != target:",
        new="            if not finished:",
        file=RUN,
        tests=RUN_TESTS,
    ),
    dict(
        id="onx36",
        desc="weights that leave some of the model's keys missing are loaded (strict=False)",
        old='        model.load_state_dict(ckpt["model"], strict=True)',
        new='        model.load_state_dict(ckpt["model"], strict=False)',
        file=RUN,
        tests=RUN_TESTS,
    ),
    dict(
        id="onx37",
        desc="a config that is not JSON-able kept in the metadata (no fallback to None)",
        old='        metadata["config"] = None',
        new="        pass",
        file=RUN,
        tests=RUN_TESTS,
    ),
    # --- run.py: the sparsity checks
    dict(
        id="onx38",
        desc="sparsity 1.0 accepted (< 1 became <= 1)",
        old="if sparsity is not None and not 0.0 <= sparsity < 1.0:",
        new="if sparsity is not None and not 0.0 <= sparsity <= 1.0:",
        file=RUN,
        tests=RUN_TESTS,
    ),
    dict(
        id="onx39",
        desc="N:M run: the pattern's sparsity compared exactly (1 - 4/5 refused for 4:5)",
        old="    if not math.isclose(sparsity, pattern.sparsity, abs_tol=1e-9):",
        new="    if sparsity != pattern.sparsity:",
        file=RUN,
        tests=RUN_TESTS,
    ),
    dict(
        id="onx40",
        desc="a .fsp given a sparsity: silently ignored instead of refused",
        old='        if sparsity is not None:\n            raise ValueError(\n                f"{path} is a finalized',
        new='        if False:\n            raise ValueError(\n                f"{path} is a finalized',
        file=RUN,
        tests=RUN_TESTS,
    ),
    dict(
        id="onx41",
        desc="a .fsp re-exported at fp32, not at its own precision",
        old="model=model.eval(), metadata=dict(info.metadata), path=path, values=info.values",
        new="model=model.eval(), metadata=dict(info.metadata), path=path",
        file=RUN,
        tests=RUN_TESTS,
    ),
    dict(
        id="onx42",
        desc="reencode_sparse: the header's metadata dropped",
        old="return save_sparse(state, target, values=values or info.values, metadata=info.metadata)",
        new="return save_sparse(state, target, values=values or info.values)",
        file=RUN,
        tests=RUN_TESTS,
    ),
]
