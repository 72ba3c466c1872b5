"""Mutants of file recognition and the training's checks and plumbing: the files
export checks and recognizes (export/files.py: a target checked up front, a file's
kind by its first bytes, a safetensors header's format, an ONNX model by its
protobuf fields), the check that a model takes the data (train/fit.py), joining
the process group under torchrun (train/dist.py, and its teardown in cli/train.py)
and the progress bar and epoch lines (train/progress.py).

Every mutant names the file it mutates (``file``, FILE when absent) and runs the
tests of that file's set (``tests``), found with ``grep`` on the module's names,
most specific first; the run stops at the first failure (-x). ``TESTS`` is the
union (the baseline run).
"""

FILE = "src/feather_sparse/export/files.py"
TIMEOUT = 420  # per mutant: a survivor runs its whole set (under 100 s here)
FIT = "src/feather_sparse/train/fit.py"
DIST = "src/feather_sparse/train/dist.py"
PROGRESS = "src/feather_sparse/train/progress.py"
CLI_TRAIN = "src/feather_sparse/cli/train.py"

TORCHRUN = "tests/test_distributed.py::test_torchrun_cli"  # 2 gloo processes under torchrun

FILES_TESTS = [
    "tests/test_export_targets.py",
    "tests/test_export.py",
    "tests/test_export_audit.py",
    "tests/test_export_reencode.py",
]
FIT_TESTS = [
    "tests/test_train_cli_checks.py",
    "tests/test_train_modes.py",
    "tests/test_train_process_state.py",
]
DIST_TESTS = [
    "tests/test_train_nodes.py",
    "tests/test_train_cli_checks.py",
    TORCHRUN,
]
PROGRESS_TESTS = [
    "tests/test_nm_train.py::test_cli_log_names_the_nm_ramp_not_a_threshold",
    "tests/test_train.py",
    TORCHRUN,
]

#: Every file any mutant runs (the baseline run and the docs' list).
TESTS = list(dict.fromkeys(FILES_TESTS + FIT_TESTS + DIST_TESTS + PROGRESS_TESTS))

MUTATIONS = [
    # ------------------------------------------------------------ export/files.py
    dict(
        id="xf01",
        desc="check_writable: a folder as the target not refused (no IsADirectoryError up front)",
        old="    if target.is_dir():\n        raise IsADirectoryError(",
        new="    if False:\n        raise IsADirectoryError(",
        tests=FILES_TESTS,
    ),
    dict(
        id="xf02",
        desc="check_writable: the target's own parent not checked (a file as its folder missed)",
        old="for parent in (target.parent, *target.parent.parents):",
        new="for parent in target.parent.parents:",
        tests=FILES_TESTS,
    ),
    dict(
        id="xf03",
        desc="check_writable: an empty file refused (not replaced)",
        old="if existing not in (None, _EMPTY, kind):",
        new="if existing not in (None, kind):",
        tests=FILES_TESTS,
    ),
    dict(
        id="xf04",
        desc="check_writable: a file of unknown kind replaced",
        old="if existing not in (None, _EMPTY, kind):",
        new="if existing not in (None, _EMPTY, _UNKNOWN, kind):",
        tests=FILES_TESTS,
    ),
    dict(
        id="xf05",
        desc="the directory error suggests the bare example, not the path inside the folder",
        old='f"{target} is a directory; give a file name, e.g. {target / example}",',
        new='f"{target} is a directory; give a file name, e.g. {example}",',
        tests=FILES_TESTS,
    ),
    dict(
        id="xf06",
        desc="_check_not_read: only a file directly in a folder read refused (not deeper inside)",
        old="if source in where.parents:",
        new="if source == where.parent:",
        tests=FILES_TESTS,
    ),
    dict(
        id="xf07",
        desc="_check_not_read: another name of the file read (a hard link) not refused (samefile dropped)",
        old="elif where == source or (where.exists() and source.exists() and where.samefile(source)):",
        new="elif where == source:",
        tests=FILES_TESTS,
    ),
    dict(
        id="xf08",
        desc="_check_name: the suffix compared case-sensitively (MODEL.ONNX for a .fsp accepted)",
        old="if other is None or target.suffix.lower() not in SUFFIXES[other]:",
        new="if other is None or target.suffix not in SUFFIXES[other]:",
        tests=FILES_TESTS,
    ),
    dict(
        id="xf09",
        desc="_existing_kind: a safetensors file without a format (another program's) taken for a .fsp",
        old="elif name not in (None, FORMAT_NAME):",
        new='elif name not in (None, "", FORMAT_NAME):',
        tests=FILES_TESTS,
    ),
    dict(
        id="xf10",
        desc="_existing_kind: a text file with '{' as its ninth byte kept as safetensors (a .fsp)",
        old='kind = None  # a "{" as its ninth byte, by chance',
        new="pass",
        tests=FILES_TESTS,
    ),
    dict(
        id="xf11",
        desc="_safetensors_format: a header length past the format's cap read as a damaged .fsp",
        old="        if length > _MAX_HEADER_BYTES:\n            return _NOT_SAFETENSORS",
        new="        if length > _MAX_HEADER_BYTES:\n            return None",
        tests=FILES_TESTS,
    ),
    dict(
        id="xf12",
        desc="_safetensors_format: a header cut short taken as another program's file (a damaged .fsp refused)",
        old="    if len(text) != length:\n        return None",
        new='    if len(text) != length:\n        return ""',
        tests=FILES_TESTS,
    ),
    dict(
        id="xf13",
        desc="sniff: the '{' looked for in the eighth byte, not the ninth",
        old='if len(head) == 9 and head[8:9] == b"{":',
        new='if len(head) == 9 and head[7:8] == b"{":',
        tests=FILES_TESTS,
    ),
    dict(
        id="xf14",
        desc="is_onnx: the IR version, graph and opset not required (any walkable protobuf)",
        old="return size > 0 and _ONNX_REQUIRED.issubset(seen)",
        new="return size > 0 and bool(seen)",
        tests=FILES_TESTS,
    ),
    dict(
        id="xf15",
        desc="is_onnx: a field's wire type not checked against ONNX's",
        old="if field == 0 or _ONNX_FIELDS.get(field, wire) != wire:",
        new="if field == 0:",
        tests=FILES_TESTS,
    ),
    dict(
        id="xf16",
        desc="is_onnx: IR version 0 accepted",
        old="if value is None or (field == 1 and value == 0):",
        new="if value is None:",
        tests=FILES_TESTS,
    ),
    dict(
        id="xf17",
        desc="_varint: a byte of 0x80 taken as the last (continuation bit misread)",
        old="if byte[0] < 0x80:",
        new="if byte[0] <= 0x80:",
        tests=FILES_TESTS,
    ),
    dict(
        id="xf18",
        desc="_named_by_onnx_model: any external weights of the model accepted (the file's name not compared)",
        old='entry.key == "location" and entry.value == weights.name',
        new='entry.key == "location"',
        tests=FILES_TESTS,
    ),
    # ---------------------------------------------------------------- train/fit.py
    dict(
        id="xf19",
        desc="_runs_on: the random state not forked (a model that draws in its forward moves it)",
        old="stack.enter_context(torch.random.fork_rng(devices=[]))  # the CPU's",
        new="pass  # the CPU's random state not forked",
        file=FIT,
        tests=FIT_TESTS,
    ),
    dict(
        id="xf20",
        desc="_runs_on: one zero sample instead of two",
        old="torch.zeros((2, *shape)",
        new="torch.zeros((1, *shape)",
        file=FIT,
        tests=FIT_TESTS,
    ),
    dict(
        id="xf21",
        desc="check_model_takes: a TypeError or IndexError of the forward passed through raw",
        old="except (RuntimeError, ValueError, TypeError, IndexError) as err:",
        new="except (RuntimeError, ValueError) as err:",
        file=FIT,
        tests=FIT_TESTS,
    ),
    dict(
        id="xf22",
        desc="check_model_takes: every bundled recipe suggested, not those of the data set",
        old="fits = recipes_for(dataset)",
        new="fits = recipes_for(None)",
        file=FIT,
        tests=FIT_TESTS,
    ),
    dict(
        id="xf23",
        desc="models_taking: a model of several recipes listed once per recipe",
        old="        if name in found:\n            continue\n",
        new="",
        file=FIT,
        tests=FIT_TESTS,
    ),
    dict(
        id="xf24",
        desc="check_model_takes: the recipe not named in the message",
        old='of_recipe = f" (of recipe {recipe})" if recipe is not None else ""',
        new='of_recipe = ""',
        file=FIT,
        tests=FIT_TESTS,
    ),
    # --------------------------------------------------------------- train/dist.py
    dict(
        id="xf25",
        desc="init_distributed: a group initialised already joined again",
        old='if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():',
        new='if int(os.environ.get("WORLD_SIZE", "1")) <= 1:',
        file=DIST,
        tests=DIST_TESTS,
    ),
    dict(
        id="xf26",
        desc="init_distributed: gloo on CUDA too (nccl never chosen)",
        old='dist.init_process_group("nccl" if cuda else "gloo")',
        new='dist.init_process_group("gloo")',
        file=DIST,
        tests=DIST_TESTS,
    ),
    dict(
        id="xf27",
        desc="init_distributed: the GPU from RANK instead of LOCAL_RANK",
        old='local = int(os.environ.get("LOCAL_RANK", "0"))',
        new='local = int(os.environ.get("RANK", "0"))',
        file=DIST,
        tests=DIST_TESTS,
    ),
    dict(
        id="xf28",
        desc="init_distributed: says it did not initialise the group (the caller never destroys it)",
        old='    dist.init_process_group("nccl" if cuda else "gloo")\n    return True',
        new='    dist.init_process_group("nccl" if cuda else "gloo")\n    return False',
        file=DIST,
        tests=DIST_TESTS,
    ),
    dict(
        id="xf29",
        desc="_local_world_size: a negative LOCAL_WORLD_SIZE that divides the world size kept",
        old="if local < 1 or local > world_size or world_size % local:",
        new="if local == 0 or local > world_size or world_size % local:",
        file=DIST,
        tests=DIST_TESTS,
    ),
    dict(
        id="xf30",
        desc="_local_world_size: more per node than the world size not refused",
        old="if local < 1 or local > world_size or world_size % local:",
        new="if local < 1 or world_size % local:",
        file=DIST,
        tests=DIST_TESTS,
    ),
    dict(
        id="xf31",
        desc="distributed_context: the rank not handed on (rank 0 on every process)",
        old="            rank=dist.get_rank(),\n",
        new="            rank=0,\n",
        file=DIST,
        tests=DIST_TESTS,
    ),
    dict(
        id="xf32",
        desc="cli train: the group this process joined not destroyed at the end",
        old="    finally:\n        if initialised:\n            torch.distributed.destroy_process_group()",
        new="    finally:\n        pass",
        file=CLI_TRAIN,
        tests=DIST_TESTS,
    ),
    # ----------------------------------------------------------- train/progress.py
    dict(
        id="xf33",
        desc="_use_bar: the bar follows stdout's terminal, not stderr's (where it is drawn)",
        old="return sys.stderr.isatty()",
        new="return sys.stdout.isatty()",
        file=PROGRESS,
        tests=PROGRESS_TESTS,
    ),
    dict(
        id="xf34",
        desc="_use_bar: progress=False not honoured on a terminal (falsy taken as unset)",
        old="    if progress is not None:\n        return progress",
        new="    if progress:\n        return progress",
        file=PROGRESS,
        tests=PROGRESS_TESTS,
    ),
    dict(
        id="xf35",
        desc="_Progress: the bar drawn on stdout (mixed into the results) instead of stderr",
        old="total=total, desc=desc, leave=False, dynamic_ncols=True, file=sys.stderr",
        new="total=total, desc=desc, leave=False, dynamic_ncols=True, file=sys.stdout",
        file=PROGRESS,
        tests=PROGRESS_TESTS,
    ),
    dict(
        id="xf36",
        desc="_Progress: a missing tqdm crashes the run (ImportError not caught)",
        old="            except ImportError:\n                tqdm = None",
        new="            except AttributeError:\n                tqdm = None",
        file=PROGRESS,
        tests=PROGRESS_TESTS,
    ),
    dict(
        id="xf37",
        desc="_Progress.update: without a bar, a line at every refresh once 30 s passed (time not reset)",
        old="            self.last_log = time.monotonic()\n            text",
        new="            text",
        file=PROGRESS,
        tests=PROGRESS_TESTS,
    ),
    dict(
        id="xf38",
        desc="_Progress.update: without a bar, a line at every refresh within 30 s (>= became <=)",
        old="time.monotonic() - self.last_log >= LOG_INTERVAL_S",
        new="time.monotonic() - self.last_log <= LOG_INTERVAL_S",
        file=PROGRESS,
        tests=PROGRESS_TESTS,
    ),
    dict(
        id="xf39",
        desc="_threshold_value: the largest layer threshold instead of the mean",
        old="return float(torch.stack(values).mean())",
        new="return float(torch.stack(values).max())",
        file=PROGRESS,
        tests=PROGRESS_TESTS,
    ),
    dict(
        id="xf40",
        desc="_dense_table: every module with a weight counted (norm layers too), not the prunable types",
        old="if not isinstance(module, DEFAULT_INCLUDE) or not isinstance(weight, Tensor):",
        new="if not isinstance(weight, Tensor):",
        file=PROGRESS,
        tests=PROGRESS_TESTS,
    ),
    dict(
        id="xf41",
        desc="_log_epoch: the test accuracy printed as a fraction, not a percentage",
        old="f\"test loss {row['test_loss']:.4f} acc {100 * row['test_acc']:.2f}%\"",
        new="f\"test loss {row['test_loss']:.4f} acc {row['test_acc']:.2f}%\"",
        file=PROGRESS,
        tests=PROGRESS_TESTS,
    ),
]
