"""Mutants of the run folder, its lock and what a resume reads: the run folder
(train/run_dir.py: its name, config.json, metrics.jsonl, train.log, the saved
model, a finished run read back, the folder prepared), the lock of one process
per run folder (run_lock.py), the floating-point environment a run records
(provenance.py), ``--init-from`` (train/init_from.py) and what ``train`` hands
back or says when interrupted (train/result.py).

Every mutant names the file it mutates (``file``) and runs the tests of that
file's set (``tests``), found with ``grep`` on the module's names, most
specific first; the run stops at the first failure (-x). ``TESTS`` is the
union (the baseline run).
"""

FILE = "src/feather_sparse/train/run_dir.py"
TIMEOUT = 420  # per mutant: a survivor runs its whole set (about 100 s here)
LOCK = "src/feather_sparse/run_lock.py"
PROV = "src/feather_sparse/provenance.py"
INIT = "src/feather_sparse/train/init_from.py"
RESULT = "src/feather_sparse/train/result.py"

RUN_DIR_TESTS = [
    "tests/test_run_metadata.py",
    "tests/test_faults.py",
    "tests/test_run_lock.py",
    "tests/test_first_hour.py",
    "tests/test_train.py",
    "tests/test_train_nodes.py",
    "tests/test_train_cli_checks.py",
    "tests/test_export.py",
]
LOCK_TESTS = [
    "tests/test_run_lock.py",
    "tests/test_faults.py",
    "tests/test_experiments.py",
]
PROV_TESTS = [
    "tests/test_train.py",
    "tests/test_experiments.py",
    "tests/test_bench_wording.py",
    "tests/test_readme_transcript.py",
]
INIT_TESTS = [
    "tests/test_init_from_read_once.py",
    "tests/test_train_init_from.py",
]
RESULT_TESTS = [
    "tests/test_train_cli_checks.py",
    "tests/test_train_nodes.py",
    "tests/test_faults.py",
    "tests/test_first_hour.py",
]

#: Every file any mutant runs (the baseline run and the docs' list).
TESTS = list(dict.fromkeys(RUN_DIR_TESTS + LOCK_TESTS + PROV_TESTS + INIT_TESTS + RESULT_TESTS))

MUTATIONS = [
    # ------------------------------------------------------------ train/run_dir.py
    dict(
        id="rn01",
        desc="default folder name: a dense run named by the config's sparsity, not s0",
        old='sparsity = "0" if config.dense else f"{config.sparsity:g}"',
        new='sparsity = f"{config.sparsity:g}"',
        tests=RUN_DIR_TESTS,
    ),
    dict(
        id="rn02",
        desc="default folder name: one suffix tried only (a third run in the same second "
        "gets the second's folder)",
        old="while candidate.exists():  # two runs started in the same second",
        new="if candidate.exists():  # two runs started in the same second",
        tests=RUN_DIR_TESTS,
    ),
    dict(
        id="rn03",
        desc="config.json's error names no fix (the default remedy)",
        old="""        Path(run_dir) / "config.json",
        remedy="it is not what the run wrote; restore it from a copy, or train the run again",
    )""",
        new="""        Path(run_dir) / "config.json",
    )""",
        tests=RUN_DIR_TESTS,
    ),
    dict(
        id="rn04",
        desc="text files (metrics.jsonl) rewritten in place, not replaced atomically",
        old='    write_atomic(path, text.encode("utf-8"))',
        new='    path.write_text(text, encoding="utf-8")',
        tests=RUN_DIR_TESTS,
    ),
    dict(
        id="rn05",
        desc="config.json written unsealed (plain JSON, not atomic)",
        old="    write_sealed_json(path, payload, indent=2)",
        new="    path.write_text(json.dumps(payload, indent=2, default=str))",
        tests=RUN_DIR_TESTS,
    ),
    dict(
        id="rn06",
        desc="resume: the checkpoint's own epoch row dropped from metrics.jsonl (< epochs_done)",
        old='if not row.get("final") and int(row.get("epoch", 0)) <= epochs_done',
        new='if not row.get("final") and int(row.get("epoch", 0)) < epochs_done',
        tests=RUN_DIR_TESTS,
    ),
    dict(
        id="rn07",
        desc="resume: a final row of an earlier finish kept in metrics.jsonl",
        old='if not row.get("final") and int(row.get("epoch", 0)) <= epochs_done',
        new='if int(row.get("epoch", 0)) <= epochs_done',
        tests=RUN_DIR_TESTS,
    ),
    dict(
        id="rn08",
        desc="resume: a lost last row put back only when no row at all is left",
        old='lost = not kept or int(kept[-1].get("epoch", 0)) < epochs_done',
        new="lost = not kept",
        tests=RUN_DIR_TESTS,
    ),
    dict(
        id="rn09",
        desc="resume: a deleted metrics.jsonl not rebuilt from the checkpoint's row",
        old="if not path.is_file() and last_row is None:",
        new="if not path.is_file():",
        tests=RUN_DIR_TESTS,
    ),
    dict(
        id="rn10",
        desc="save_sparse's ValueError not caught: the model of a finished run lost",
        old="except (ImportError, ValueError, RuntimeError) as err:",
        new="except ImportError as err:",
        tests=RUN_DIR_TESTS,
    ),
    dict(
        id="rn11",
        desc="model.pt (no safetensors) written without its seal",
        old="write_atomic(path, seal_zip(buffer.getvalue()))",
        new="write_atomic(path, buffer.getvalue())",
        tests=RUN_DIR_TESTS,
    ),
    dict(
        id="rn12",
        desc="model.pt read back without its seal checked",
        old="    check_zip_seal(data, path)\n",
        new="",
        tests=RUN_DIR_TESTS,
    ),
    dict(
        id="rn13",
        desc="a run with a saved model but no final metrics row counted as finished",
        old="if final is None or path is None:",
        new="if path is None:",
        tests=RUN_DIR_TESTS,
    ),
    dict(
        id="rn14",
        desc="a saved model that fails to read back (not a ValueError) stops the resume",
        old="except Exception as err:  # any failure to read it back means: not intact",
        new="except ValueError as err:  # any failure to read it back means: not intact",
        tests=RUN_DIR_TESTS,
    ),
    dict(
        id="rn15",
        desc="a read-only file system (EROFS) not reported as NotWritableError",
        old="if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):",
        new="if err.errno not in (errno.EACCES, errno.EPERM):",
        tests=RUN_DIR_TESTS,
    ),
    dict(
        id="rn16",
        desc="train.log's handler left on the package logger after the run",
        old="            pkg.removeHandler(handler)\n",
        new="",
        tests=RUN_DIR_TESTS,
    ),
    dict(
        id="rn17",
        desc="the package logger's level not given back after the run",
        old="        pkg.setLevel(old_level)\n",
        new="",
        tests=RUN_DIR_TESTS,
    ),
    # ------------------------------------------------------------ run_lock.py
    dict(
        id="rn18",
        file=LOCK,
        desc="a shared lock (LOCK_SH): a second process gets the run folder too",
        old="fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        new="fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)",
        tests=LOCK_TESTS,
    ),
    dict(
        id="rn19",
        file=LOCK,
        desc="opening the lock file truncates it (a refused process erases the holder's record)",
        old="fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)",
        new="fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)",
        tests=LOCK_TESTS,
    ),
    dict(
        id="rn20",
        file=LOCK,
        desc="the record written over, not truncated first (a shorter record keeps old bytes)",
        old="    os.ftruncate(fd, 0)\n",
        new="",
        tests=LOCK_TESTS,
    ),
    dict(
        id="rn21",
        file=LOCK,
        desc="the holder named with this host, not the host its record names",
        old="""return f"process {info['pid']} on {info['host']}, since {started}: {info['command']}\"""",
        new="""return f"process {info['pid']} on {socket.gethostname()}, since {started}: {info['command']}\"""",
        tests=LOCK_TESTS,
    ),
    dict(
        id="rn22",
        file=LOCK,
        desc="wait=True raises instead of waiting (if wait)",
        old="        if not wait:\n",
        new="        if wait:\n",
        tests=LOCK_TESTS,
    ),
    dict(
        id="rn23",
        file=LOCK,
        desc="a file system without locks (ENOLCK) stops the run instead of a warning",
        old="_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}",
        new="_NO_LOCKS = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}",
        tests=LOCK_TESTS,
    ),
    dict(
        id="rn24",
        file=LOCK,
        desc="a lock file that cannot be created (EACCES) stops the work",
        old="""        if err.errno not in _NOT_WRITABLE:
            raise
        logger.debug""",
        new="""        if True:
            raise
        logger.debug""",
        tests=LOCK_TESTS,
    ),
    # ------------------------------------------------------------ provenance.py
    dict(
        id="rn25",
        file=PROV,
        desc='cpu_model: the first line starting "model" (the model number), not "model name"',
        old='if line.startswith("model name"):',
        new='if line.startswith("model"):',
        tests=PROV_TESTS,
    ),
    dict(
        id="rn26",
        file=PROV,
        desc="numerics: the torch build left out",
        old='return f"torch {torch.__version__}, {kernels}"',
        new="return kernels",
        tests=PROV_TESTS,
    ),
    dict(
        id="rn27",
        file=PROV,
        desc="numerics: a CUDA device recorded as the CPU's kernels",
        old='if device.type == "cuda":',
        new='if device.type == "gpu":',
        tests=PROV_TESTS,
    ),
    dict(
        id="rn28",
        file=PROV,
        desc="numerics: the CPU's kernel set (ATEN_CPU_CAPABILITY) left out",
        old='kernels = f"CPU {cpu_model()}, {torch.backends.cpu.get_cpu_capability()} kernels"',
        new='kernels = f"CPU {cpu_model()}"',
        tests=PROV_TESTS,
    ),
    # ------------------------------------------------------------ train/init_from.py
    dict(
        id="rn29",
        file=INIT,
        desc="init_from: ~ not expanded",
        old="path = Path(source).expanduser()",
        new="path = Path(source)",
        tests=INIT_TESTS,
    ),
    dict(
        id="rn30",
        file=INIT,
        desc="init_from: the header not checked up front (a wrong file found after the data)",
        old="inspect_sparse(path)  # the header alone",
        new="path.stat()  # the header alone",
        tests=INIT_TESTS,
    ),
    dict(
        id="rn31",
        file=INIT,
        desc="init_from: the path recorded as given, not resolved (a relative path)",
        old='return {"path": str(path.resolve()), "sha256": digest}',
        new='return {"path": str(path), "sha256": digest}',
        tests=INIT_TESTS,
    ),
    dict(
        id="rn32",
        file=INIT,
        desc="init_from: the hash of a second read, not of the bytes loaded",
        old="digest = hashlib.sha256(content).hexdigest()",
        new="digest = hashlib.sha256(path.read_bytes()).hexdigest()",
        tests=INIT_TESTS,
    ),
    # ------------------------------------------------------------ train/result.py
    dict(
        id="rn33",
        file=RESULT,
        desc="resume command: as many processes as nodes' processes (local == world) "
        "given the several-node form",
        old="if local is None or not 0 < local < world_size or world_size % local:",
        new="if local is None or not 0 < local <= world_size or world_size % local:",
        tests=RESULT_TESTS,
    ),
    dict(
        id="rn34",
        file=RESULT,
        desc="resume command: processes that do not divide evenly into nodes given nodes anyway",
        old="if local is None or not 0 < local < world_size or world_size % local:",
        new="if local is None or not 0 < local < world_size:",
        tests=RESULT_TESTS,
    ),
    dict(
        id="rn35",
        file=RESULT,
        desc="interrupted after the last epoch reported as in epoch N+1 (epoch > epochs)",
        old="if epoch >= epochs",
        new="if epoch > epochs",
        tests=RESULT_TESTS,
    ),
    dict(
        id="rn36",
        file=RESULT,
        desc="interrupted: the hint for one process whatever the run's processes",
        old="{resume_command(run_dir, world_size, local_world_size)}",
        new="{resume_command(run_dir)}",
        tests=RESULT_TESTS,
    ),
]
