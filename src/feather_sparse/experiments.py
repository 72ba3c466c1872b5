"""The paper's experiments, one command each: ``feather-sparse bench <name>``.

Glentis Georgoulakis, Retsinas & Maragos, "Feather: An Elegant Solution to
Effective DNN Sparsification", BMVC 2023. Each experiment is a grid of
training runs of :func:`feather_sparse.train.train` (the same code path as
``feather-sparse train``), summarised as Markdown tables (mean ± std over
seeds, best per column in bold, with the command, library version and machine
underneath) and PNG plots:

==================  ============================================================
``compare``         Table 1: Feather-Global, Feather-ASL+, ST-3, Spartan, GMP,
                    hard-STE, soft-STE, non-STE × sparsity, and the dense model
``operator``        Fig. 2: hard / soft / Feather (p = 3) operators, θ = 1
``theta``           Fig. 3: θ ∈ {0, 0.25, 0.5, 0.75, 1} × sparsity
``theta-operator``  Fig. 4: θ under each operator at high sparsity
``p``               appendix: p ∈ {1, 2, 3, 4, ∞}, and the operator family (Fig. 1b)
``stability``       appendix: Pearson r of each epoch's mask with the final one, per θ
``backbones``       appendix: Feather vs no Feather on the GMP and ASL+ backbones
``flops``           appendix: accuracy vs FLOPs for the global, global-flops and
                    uniform backbones, and their per-layer sparsity
==================  ============================================================

By default everything runs on the bundled data (MNIST-1D, the ``mnist1d``
recipe); ``--recipe cifar100 --model resnet20 --data-dir DATA`` (or
``--data cifar100``) runs the paper's scale. ``--quick`` is a CI-sized smoke
run.

Runs are independent processes (``--jobs``), and each run's outcome is kept
as ``RUNS_DIR/<key>/result.json``, keyed by a hash of the run's whole config:
an interrupted sweep continues where it stopped, and experiments that share a
run (``theta`` and ``stability`` at the same θ and sparsity) train it once.
Every run also records its mask stability, per-layer sparsity and FLOPs, so
any experiment can be summarised from any run.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import hashlib
import json
import logging
import math
import multiprocessing
import os
import platform
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from feather_sparse._version import __version__
from feather_sparse.analysis import Curve, mean_std
from feather_sparse.registry import Registry

__all__ = [
    "EXPERIMENTS",
    "BenchOptions",
    "Experiment",
    "ExperimentResult",
    "RunOutcome",
    "RunSpec",
    "add_cli_arguments",
    "machine_description",
    "register_methods",
    "run_cli",
    "run_experiment",
]

logger = logging.getLogger(__name__)

#: Result files of this format (bump when RunOutcome changes incompatibly).
OUTCOME_FORMAT = "feather-sparse-bench-run/1"

#: The paper's sparsity grid (Table 1 and every ablation figure).
PAPER_SPARSITIES = (0.9, 0.95, 0.98, 0.99)
#: θ values of Fig. 3 and of the stability study.
PAPER_THETAS = (0.0, 0.25, 0.5, 0.75, 1.0)
#: p values of the appendix study (1 = soft, inf = hard).
PAPER_PS = (1.0, 2.0, 3.0, 4.0, math.inf)
#: θ values and sparsities of the θ-under-each-operator study (Fig. 4: high sparsity).
THETA_OPERATOR_THETAS = (0.0, 0.5, 1.0)
THETA_OPERATOR_SPARSITIES = (0.95, 0.99)
#: The sparsity of the mask-stability study (where θ matters: high sparsity).
STABILITY_SPARSITY = 0.98
DEFAULT_SEEDS = (0, 1, 2)

#: ``--quick``: the smallest run that still exercises every code path.
QUICK_OVERRIDES: Mapping[str, Any] = {"epochs": 2}
QUICK_SPARSITIES = (0.95,)
#: Config fields every bench run sets: no TensorBoard files, and the test set
#: only for the final model (no table reads the per-epoch test accuracy, which
#: cost 7 % of a run of the bundled recipe; the weights are the same either way).
BENCH_OVERRIDES: Mapping[str, Any] = {"tensorboard": False, "eval_every": 0}

#: Recipe used when a data set with no recipe of its name is asked for.
DEFAULT_BENCH_RECIPE = "mnist1d"


# ==================================================================== options
@dataclass(frozen=True)
class BenchOptions:
    """How to run an experiment.

    Attributes:
        recipe: the training recipe every run starts from (bundled name or TOML path).
        overrides: config fields set for every run (``model``, ``dataset``,
            ``epochs``, ``device``, ...). Fields an experiment varies (its
            method, sparsity, θ, ...) may not be overridden.
        seeds: training seeds; each cell is run once per seed.
        sparsities: the sparsity columns; ``None`` for the experiment's default.
        thetas: θ values of ``theta``/``theta-operator``/``stability``; ``None`` for default.
        ps: p values of ``p``; ``None`` for the default.
        methods: labels of ``compare``'s methods to run; ``None`` for all.
        quick: a CI-sized smoke run (2 epochs, one seed, one sparsity).
        jobs: parallel training processes; 0 = automatic (see :meth:`worker_count`).
        threads: torch CPU threads per run (the config field ``threads``);
            ``None`` keeps the recipe's.
        out: folder of the tables, plots and raw results.
        runs_dir: folder of the per-run outputs; default ``out/runs``.
        force: re-run runs that already have a result.
        command: the command line to print under the tables (default: rebuilt
            from these options).
    """

    recipe: str = DEFAULT_BENCH_RECIPE
    overrides: Mapping[str, Any] = field(default_factory=dict)
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    sparsities: tuple[float, ...] | None = None
    thetas: tuple[float, ...] | None = None
    ps: tuple[float, ...] | None = None
    methods: tuple[str, ...] | None = None
    quick: bool = False
    jobs: int = 0
    threads: int | None = None
    out: Path = Path("results")
    runs_dir: Path | None = None
    force: bool = False
    command: str | None = None

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ValueError("seeds: give at least one seed")
        if any(s < 0 for s in self.seeds):
            raise ValueError(f"seeds must be >= 0, got {self.seeds}")
        for s in self.sparsities or ():
            if not 0.0 < s < 1.0:
                raise ValueError(f"sparsities must be in (0, 1), got {s}")
        for t in self.thetas or ():
            if not 0.0 <= t <= 1.0:
                raise ValueError(f"thetas must be in [0, 1], got {t}")
        for p in self.ps or ():
            if not p >= 1.0:
                raise ValueError(f"ps must be >= 1 (1 = soft, inf = hard), got {p}")
        if self.jobs < 0:
            raise ValueError(f"jobs must be >= 0 (0 = automatic), got {self.jobs}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    @property
    def run_seeds(self) -> tuple[int, ...]:
        """The seeds actually run (the first one only with ``quick``)."""
        return self.seeds[:1] if self.quick else self.seeds

    def sparsity_grid(self, default: Sequence[float]) -> tuple[float, ...]:
        """The sparsity columns: the given ones, else ``QUICK_SPARSITIES`` or ``default``."""
        if self.sparsities:
            return tuple(self.sparsities)
        return QUICK_SPARSITIES if self.quick else tuple(default)

    @property
    def runs_path(self) -> Path:
        return self.runs_dir if self.runs_dir is not None else self.out / "runs"

    def base_config(self) -> Any:
        """The ``TrainConfig`` every run starts from (recipe, bench settings, overrides)."""
        from feather_sparse.recipes import load_config

        return load_config(self.recipe, self.base_overrides())

    def base_overrides(self) -> dict[str, Any]:
        """Config fields set for every run: bench settings < ``--quick`` < the user's."""
        values: dict[str, Any] = dict(BENCH_OVERRIDES)
        if self.quick:
            values.update(QUICK_OVERRIDES)
        if self.threads is not None:
            values["threads"] = self.threads
        values.update(self.overrides)
        return values

    def worker_count(self) -> int:
        """Parallel processes: ``jobs`` if given; else one per run on a GPU, one
        when runs use all cores (``threads`` unset), and otherwise the usable
        cores divided by each run's threads."""
        if self.jobs:
            return self.jobs
        base = self.base_config()
        device = str(base.device)
        if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
            return 1
        if base.threads is None:
            return 1
        return max(1, _usable_cpus() // int(base.threads))


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# ====================================================================== runs
@dataclass(frozen=True)
class RunSpec:
    """One training run of an experiment: a table cell for one seed.

    Attributes:
        group: the row / line it belongs to (``"Feather-Global"``, ``"θ=0.5"``).
        x: its column (a sparsity, θ or p; 0 for the dense model).
        seed: the training seed.
        settings: the config fields the experiment sets for this cell.
    """

    group: str
    x: float
    seed: int
    settings: Mapping[str, Any]


@dataclass(frozen=True)
class RunOutcome:
    """What one finished run left, as stored in ``RUNS_DIR/<key>/result.json``.

    Attributes:
        key: the run's folder name (readable prefix + config hash).
        config: the run's full ``TrainConfig`` as a dict.
        ok: False when training raised (``error`` says what).
        error: the exception, or None.
        test_accuracy: top-1 accuracy of the final (finalized) model, in [0, 1].
        sparsity: achieved fraction of zeros among the pruned weights.
        wall_time: seconds the run took.
        epochs: epochs trained.
        test_acc_history: the test accuracy after each tested epoch (none with
            the bench's ``eval_every=0``; ``--set eval_every=1`` records every epoch).
        model_spec: ``{"name", "kwargs"}`` rebuilding the architecture.
        input_shape: one sample's shape.
        params: parameters of the model.
        dense_macs: MACs per sample of the dense model (the paper's "FLOPs").
        sparse_macs: MACs per sample with the zero weights skipped.
        layers: ``(name, params, nonzeros)`` of each pruned layer of the final model.
        stability_epochs: epochs at which the mask was recorded.
        stability_pearson: Pearson r of each recorded mask with the final one.
        stability_changed: fraction of the mask that flipped since the previous record.
        version: feather-sparse version.
        torch_version: torch version.
    """

    key: str
    config: Mapping[str, Any]
    ok: bool
    error: str | None = None
    test_accuracy: float = math.nan
    sparsity: float = math.nan
    wall_time: float = 0.0
    epochs: int = 0
    test_acc_history: tuple[float, ...] = ()
    model_spec: Mapping[str, Any] = field(default_factory=dict)
    input_shape: tuple[int, ...] = ()
    params: int = 0
    dense_macs: int = 0
    sparse_macs: int = 0
    layers: tuple[tuple[str, int, int], ...] = ()
    stability_epochs: tuple[int, ...] = ()
    stability_pearson: tuple[float, ...] = ()
    stability_changed: tuple[float, ...] = ()
    version: str = __version__
    torch_version: str = torch.__version__

    def to_json(self) -> dict[str, Any]:
        out = {"format": OUTCOME_FORMAT}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = _jsonable(value)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunOutcome:
        if data.get("format") != OUTCOME_FORMAT:
            raise ValueError("not a bench run result of this version")
        values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for name in ("test_acc_history", "stability_pearson", "stability_changed"):
            values[name] = tuple(_float(v) for v in values.get(name, ()))
        values["stability_epochs"] = tuple(values.get("stability_epochs", ()))
        values["input_shape"] = tuple(values.get("input_shape", ()))
        values["layers"] = tuple(tuple(r) for r in values.get("layers", ()))
        for name in ("test_accuracy", "sparsity"):
            values[name] = _float(values.get(name))
        return cls(**values)

    @property
    def density_macs(self) -> float:
        return self.sparse_macs / self.dense_macs if self.dense_macs else math.nan


def _jsonable(value: Any) -> Any:
    """JSON-safe: tuples to lists, non-finite floats to strings (strict JSON has none)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def _config_dict(opts: BenchOptions, spec: RunSpec) -> dict[str, Any]:
    """The run's resolved config: recipe < bench/quick settings < user overrides < cell."""
    from feather_sparse.recipes import load_config

    clash = sorted(set(opts.overrides) & set(spec.settings))
    if clash:
        raise ValueError(
            f"{', '.join(clash)}: set by the experiment for each run (it is what it varies); "
            "drop the override"
        )
    values = opts.base_overrides()
    values.update(spec.settings)
    values["seed"] = spec.seed
    return load_config(opts.recipe, values).to_dict()


def run_key(config: Mapping[str, Any]) -> str:
    """The run's folder name: readable prefix plus a hash of its whole config."""
    blob = json.dumps(_jsonable(config), sort_keys=True).encode()
    digest = hashlib.sha1(blob).hexdigest()[:10]
    method = "dense" if config.get("dense") else str(config.get("method"))
    sparsity = 0.0 if config.get("dense") else float(config.get("sparsity", 0.0))
    return f"{method}-s{sparsity:g}-seed{config.get('seed')}-{digest}"


def _execute(config: dict[str, Any], run_dir: str) -> dict[str, Any]:
    """Train one run and measure it; the body of every worker process.

    Module-level so that a spawned process can import and call it. Returns
    (and writes) the :class:`RunOutcome` as JSON; an exception during training
    becomes an outcome with ``ok=False``.
    """
    from feather_sparse.analysis import MaskStabilityRecorder, count_flops, layer_sparsity
    from feather_sparse.recipes import TrainConfig
    from feather_sparse.train import train

    register_methods()
    path = Path(run_dir)
    key = path.name
    started = time.perf_counter()
    # Each run logs into its own RUN_DIR/train.log (train() attaches that
    # handler); keep the console for the sweep's one line per run.
    package_logger = logging.getLogger("feather_sparse")
    propagate = package_logger.propagate
    package_logger.propagate = False
    try:
        if path.exists():  # an unfinished earlier attempt: train() refuses to overwrite it
            shutil.rmtree(path)
        cfg = TrainConfig.from_dict(config)
        recorder = MaskStabilityRecorder(key)
        result = train(cfg, path, callbacks=[recorder], progress=False)
        info = json.loads((path / "config.json").read_text())
        input_shape = tuple(info["data"]["input_shape"])
        flops = count_flops(result.model.cpu(), input_shape)
        stability = recorder.result()
        dist = layer_sparsity(result.model)
        outcome = RunOutcome(
            key=key,
            config=config,
            ok=True,
            test_accuracy=result.test_accuracy,
            sparsity=result.sparsity,
            wall_time=time.perf_counter() - started,
            epochs=result.epochs,
            test_acc_history=tuple(float(r["test_acc"]) for r in result.history if "test_acc" in r),
            model_spec=info["model"],
            input_shape=input_shape,
            params=sum(p.numel() for p in result.model.parameters()),
            dense_macs=flops.dense_macs,
            sparse_macs=flops.sparse_macs,
            layers=tuple((r.name, r.params, r.nonzeros) for r in dist.layers),
            stability_epochs=stability.epochs,
            stability_pearson=stability.pearson,
            stability_changed=stability.changed,
        )
    except Exception as err:  # one bad run must not stop a sweep; it is reported
        logger.exception("run %s failed", key)
        outcome = RunOutcome(
            key=key,
            config=config,
            ok=False,
            error=f"{type(err).__name__}: {err}",
            wall_time=time.perf_counter() - started,
        )
    finally:
        package_logger.propagate = propagate
    path.mkdir(parents=True, exist_ok=True)
    data = outcome.to_json()
    (path / "result.json").write_text(json.dumps(data, indent=1) + "\n")
    return data


def _load_outcome(run_dir: Path) -> RunOutcome | None:
    file = run_dir / "result.json"
    if not file.is_file():
        return None
    try:
        return RunOutcome.from_json(json.loads(file.read_text()))
    except (ValueError, TypeError, KeyError) as err:
        logger.warning("ignoring unreadable %s (%s): the run is repeated", file, err)
        return None


# ============================================================ training methods
#: The bench's own method name: Feather on the GMP backbone as the paper's
#: appendix runs it (uniform per-layer sparsity, first conv dense), which a
#: ``TrainConfig`` cannot say (its ``backbone`` is a name, without options).
#: Every other row is a plain config: ``method`` one of ``baselines.METHODS``,
#: with ``backbone="asl+"`` for the ASL+ rows.
FEATHER_GMP = "feather-gmp"


def _build_feather_gmp(config: Any, model: Any, total_steps: int) -> Any:
    """Feather (the config's operator, p and θ) on the uniform backbone, first conv dense."""
    from feather_sparse.baselines import make_pruner

    return make_pruner(
        model,
        "feather",
        sparsity=config.sparsity,
        total_steps=total_steps,
        operator=config.operator,
        p=config.p,
        theta=config.theta,
        theta_rule=config.theta_rule,
        backbone={"name": "uniform", "keep_first_dense": True},
        schedule={
            "name": config.schedule,
            "start": config.schedule_start,
            "end": config.schedule_end,
        },
        update_every=config.update_every,
        exclude=config.exclude,
        max_layer_sparsity=config.max_layer_sparsity,
    )


def register_methods() -> None:
    """Register ``feather-gmp`` in ``train.PRUNER_BUILDERS``, the training loop's extension point.

    Called before a sweep, in the main process and in every worker; a name
    already registered is left alone.
    """
    from feather_sparse.train import PRUNER_BUILDERS

    if FEATHER_GMP not in PRUNER_BUILDERS:
        PRUNER_BUILDERS.register(FEATHER_GMP, _build_feather_gmp)


def _check_names(configs: Sequence[Mapping[str, Any]]) -> None:
    """Fail before any training when a method, model or data set is unknown."""
    from feather_sparse.data import DATASETS
    from feather_sparse.models import list_models
    from feather_sparse.train import PRUNER_BUILDERS, SUPPORTED_METHODS

    register_methods()
    methods = sorted({*SUPPORTED_METHODS, *PRUNER_BUILDERS.names()})
    models = set(list_models())
    for cfg in configs:
        if not cfg["dense"] and cfg["method"] not in methods:
            raise ValueError(
                f"method {cfg['method']!r} is not a training method here; choose one of: "
                f"{', '.join(methods)}"
            )
        if cfg["dataset"] not in DATASETS:
            raise ValueError(
                f"unknown dataset {cfg['dataset']!r}; choose one of: {', '.join(DATASETS.names())}"
            )
        if cfg["model"] not in models:
            raise ValueError(
                f"unknown model {cfg['model']!r}; choose one of: {', '.join(sorted(models))}"
            )


ProgressFn = Callable[[int, int, RunSpec, RunOutcome], None]


def execute_runs(
    opts: BenchOptions, specs: Sequence[RunSpec], on_progress: ProgressFn | None = None
) -> tuple[list[tuple[RunSpec, RunOutcome]], int, float]:
    """Run every spec that has no result yet; return ``(pairs, runs executed, seconds)``.

    Runs execute in ``opts.worker_count()`` spawned processes (in this process
    when that is 1). Identical configs are trained once.
    """
    configs = [_config_dict(opts, s) for s in specs]
    _check_names(configs)
    keys = [run_key(c) for c in configs]
    root = opts.runs_path
    outcomes: dict[str, RunOutcome] = {}
    todo: dict[str, dict[str, Any]] = {}
    for key, cfg in zip(keys, configs):
        if key in outcomes or key in todo:
            continue
        found = None if opts.force else _load_outcome(root / key)
        if found is not None and found.ok:
            outcomes[key] = found
        else:
            todo[key] = cfg
    spec_of = {k: s for k, s in zip(keys, specs)}
    total, done = len(todo), 0
    started = time.perf_counter()
    workers = min(opts.worker_count(), max(1, total))
    logger.info("%d runs to train (%d reused), %d process(es)", total, len(outcomes), workers)

    def finished(data: dict[str, Any]) -> None:
        nonlocal done
        outcome = RunOutcome.from_json(data)
        outcomes[outcome.key] = outcome
        done += 1
        if on_progress is not None:
            on_progress(done, total, spec_of[outcome.key], outcome)

    if total:
        root.mkdir(parents=True, exist_ok=True)
    if workers <= 1:
        for key, cfg in todo.items():
            finished(_execute(cfg, str(root / key)))
    elif total:
        context = multiprocessing.get_context("spawn")  # no fork of a threaded parent
        with futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            pending = [pool.submit(_execute, cfg, str(root / key)) for key, cfg in todo.items()]
            for fut in futures.as_completed(pending):
                finished(fut.result())
    elapsed = time.perf_counter() - started
    return [(s, outcomes[k]) for s, k in zip(specs, keys)], total, elapsed


# ============================================================ tables, summaries
def machine_description(workers: int | None = None, threads: int | str | None = None) -> str:
    """One line naming the hardware (and Python); the library versions are listed apart."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    parts = [
        f"Python {platform.python_version()}",
        f"{platform.system()} {platform.machine()}",
        f"{cpu}, {_usable_cpus()} usable cores",
    ]
    if torch.cuda.is_available():
        parts.append(f"GPU {torch.cuda.get_device_name(0)}")
    else:
        parts.append("no GPU")
    if workers is not None:
        parts.append(f"{workers} parallel run(s) × {threads or 1} torch thread(s)")
    return ", ".join(parts)


class Grid:
    """Values of a metric per ``(row, column)``, over seeds; failed runs counted apart."""

    def __init__(
        self,
        pairs: Sequence[tuple[RunSpec, RunOutcome]],
        metric: Callable[[RunOutcome], float],
        rows: Sequence[str] | None = None,
    ) -> None:
        self.values: dict[tuple[str, float], list[float]] = {}
        self.failed: dict[tuple[str, float], int] = {}
        self.rows: list[str] = list(rows) if rows is not None else []
        self.cols: list[float] = []
        for spec, outcome in pairs:
            cell = (spec.group, spec.x)
            if rows is None and spec.group not in self.rows:
                self.rows.append(spec.group)
            if spec.group not in self.rows:
                continue
            if spec.x not in self.cols:
                self.cols.append(spec.x)
            self.values.setdefault(cell, [])
            if outcome.ok and math.isfinite(metric(outcome)):
                self.values[cell].append(metric(outcome))
            else:
                self.failed[cell] = self.failed.get(cell, 0) + 1
        self.cols.sort()

    def stat(self, row: str, col: float) -> tuple[float, float]:
        return mean_std(self.values.get((row, col), []))

    def table(
        self,
        row_title: str,
        col_label: Callable[[float], str],
        fmt: str = "{:.2f}",
        best: str | None = "max",
    ) -> str:
        """A Markdown table of mean ± std; the best mean per column in bold."""
        lines = [
            f"| {row_title} | " + " | ".join(col_label(c) for c in self.cols) + " |",
            "|---|" + "---:|" * len(self.cols),
        ]
        bests: dict[float, float] = {}
        if best is not None:
            for c in self.cols:
                means = [self.stat(r, c)[0] for r in self.rows]
                finite = [m for m in means if math.isfinite(m)]
                if finite:
                    bests[c] = max(finite) if best == "max" else min(finite)
        for r in self.rows:
            cells = []
            for c in self.cols:
                if (r, c) not in self.values:
                    cells.append("")
                    continue
                mean, std = self.stat(r, c)
                if math.isnan(mean):
                    text = "—"
                elif len(self.values[(r, c)]) == 1:  # one seed: no spread to show
                    text = fmt.format(mean)
                else:
                    text = f"{fmt.format(mean)} ± {fmt.format(std)}"
                if c in bests and math.isfinite(mean) and fmt.format(mean) == fmt.format(bests[c]):
                    text = f"**{text}**"
                failed = self.failed.get((r, c), 0)
                if failed:
                    total = failed + len(self.values[(r, c)])
                    text += f" ({failed}/{total} failed)"
                cells.append(text)
            lines.append(f"| {r} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def curves_by_row(self) -> list[Curve]:
        """One curve per row, x = the columns (cells without values left out)."""
        out = []
        for r in self.rows:
            xs, means, stds = [], [], []
            for c in self.cols:
                mean, std = self.stat(r, c)
                if math.isfinite(mean):
                    xs.append(c)
                    means.append(mean)
                    stds.append(std)
            if xs:
                out.append(Curve(r, tuple(xs), tuple(means), tuple(stds)))
        return out


def _pct(x: float) -> str:
    return f"{100 * x:g} %"


def _theta_label(t: float) -> str:
    return f"θ = {t:g}"


def _p_label(p: float) -> str:
    names = {1.0: " (soft)", 3.0: " (Feather)", math.inf: " (hard)"}
    return f"p = {'∞' if math.isinf(p) else f'{p:g}'}{names.get(float(p), '')}"


def _accuracy(o: RunOutcome) -> float:
    return 100.0 * o.test_accuracy


@dataclass(frozen=True)
class Context:
    """What a summary needs: the options, the runs and their outcomes, where to write."""

    name: str
    opts: BenchOptions
    pairs: list[tuple[RunSpec, RunOutcome]]
    executed: int
    elapsed: float
    workers: int
    pool: tuple[int, float] | None = None

    @property
    def out(self) -> Path:
        return self.opts.out

    def figure(self, suffix: str) -> Path:
        return self.out / f"{self.name}-{suffix}.png"

    def of_group(self, group: str) -> list[tuple[RunSpec, RunOutcome]]:
        return [(s, o) for s, o in self.pairs if s.group == group]


def _dense_line(ctx: Context) -> str:
    dense = [o for _, o in ctx.of_group(DENSE) if o.ok]
    if not dense:
        return ""
    mean, std = mean_std([_accuracy(o) for o in dense])
    value = f"{mean:.2f}" if len(dense) == 1 else f"{mean:.2f} ± {std:.2f}"
    return f"Dense model ({dense[0].params:,} parameters): **{value}** % top-1.\n\n"


def _dense_baseline(ctx: Context) -> tuple[str, float, float] | None:
    dense = [_accuracy(o) for _, o in ctx.of_group(DENSE) if o.ok]
    if not dense:
        return None
    mean, std = mean_std(dense)
    return ("dense", mean, std)


def _footer(ctx: Context) -> str:
    """Command, version, machine and run facts under every table."""
    ok = [o for _, o in ctx.pairs if o.ok]
    cfg = ok[0].config if ok else (ctx.pairs[0][1].config if ctx.pairs else {})
    unique = {o.key: o for _, o in ctx.pairs}
    failed = [o for o in unique.values() if not o.ok]
    run_time = sum(o.wall_time for o in unique.values())
    command = ctx.opts.command or _rebuild_command(ctx.name, ctx.opts)
    lines = [
        "",
        f"- command: `{command}`",
        f"- library: feather-sparse {__version__}, torch {torch.__version__}",
        f"- machine: {machine_description(ctx.workers, cfg.get('threads') or 'default')}",
        f"- data and model: {cfg.get('dataset')}, {cfg.get('model')}; recipe "
        f"{cfg.get('recipe')}: {cfg.get('epochs')} epochs, batch {cfg.get('batch_size')}, "
        f"{cfg.get('optimizer')} lr {cfg.get('lr')}, weight decay {cfg.get('weight_decay')}, "
        f"gradient clipping {cfg.get('grad_clip') or 'none'}; "
        f"seeds {', '.join(map(str, ctx.opts.run_seeds))}",
        f"- runs: {len(unique)} ({ctx.executed} trained by this command, the others reused "
        f"from earlier results); summed run time {run_time / 60:.1f} min; this command's "
        f"wall time {ctx.elapsed / 60:.1f} min",
    ]
    if ctx.pool is not None:
        trained, seconds = ctx.pool
        lines[-1] = (
            f"- runs: {len(unique)}, trained together with the other experiments' runs in one "
            f"pool (`bench all`: {trained} runs trained in {seconds / 60:.1f} min of wall time); "
            f"summed run time of this page's runs {run_time / 60:.1f} min"
        )
    if failed:
        lines.append(
            f"- **{len(failed)} run(s) failed**: "
            + "; ".join(f"{o.key}: {o.error}" for o in failed[:5])
        )
    if ctx.opts.quick:
        lines.append("- **--quick smoke run**: too short to mean anything; only checks the code")
    return "\n".join(lines) + "\n"


def _rebuild_command(name: str, opts: BenchOptions) -> str:
    args = ["feather-sparse", "bench", name]
    if opts.quick:
        args.append("--quick")
    if opts.recipe != DEFAULT_BENCH_RECIPE:
        args += ["--recipe", opts.recipe]
    for key, value in opts.overrides.items():
        args += ["--set", f"{key}={value}"]
    if opts.seeds != DEFAULT_SEEDS:
        args += ["--seeds", ",".join(map(str, opts.seeds))]
    for flag, values in (
        ("--sparsities", opts.sparsities),
        ("--thetas", opts.thetas),
        ("--ps", opts.ps),
    ):
        if values:
            args += [flag, ",".join(f"{v:g}" for v in values)]
    if opts.methods:
        args += ["--methods", ",".join(opts.methods)]
    if opts.out != Path("results"):
        args += ["--out", str(opts.out)]
    return shlex.join(args)


def _write_page(ctx: Context, title: str, body: str) -> Path:
    ctx.out.mkdir(parents=True, exist_ok=True)
    page = ctx.out / f"{ctx.name}.md"
    page.write_text(f"# {title}\n\n{body.rstrip()}\n{_footer(ctx)}")
    raw = [
        {
            "group": s.group,
            "x": _jsonable(s.x),
            "seed": s.seed,
            "key": o.key,
            "ok": o.ok,
            "error": o.error,
            "test_accuracy": _jsonable(o.test_accuracy),
            "sparsity": _jsonable(o.sparsity),
            "dense_macs": o.dense_macs,
            "sparse_macs": o.sparse_macs,
            "wall_time": round(o.wall_time, 2),
            "epochs": o.epochs,
        }
        for s, o in ctx.pairs
    ]
    (ctx.out / f"{ctx.name}.json").write_text(json.dumps(raw, indent=1) + "\n")
    return page


def _img(path: Path, alt: str) -> str:
    return f"![{alt}]({path.name})\n"


# =============================================================== experiments
DENSE = "dense"

#: ``compare``'s methods: label -> config fields (Table 1 of the paper).
COMPARE_METHODS: dict[str, dict[str, Any]] = {
    "Feather-Global": {"method": "feather", "backbone": "global"},
    "Feather-ASL+": {"method": "feather", "backbone": "asl+"},
    "ST-3": {"method": "st3"},
    "Spartan": {"method": "spartan"},
    "GMP": {"method": "gmp"},
    "hard-STE": {"method": "hard"},
    "soft-STE": {"method": "soft"},
    "non-STE": {"method": "nonste"},
}

#: ``operator``'s rows: thresholding operators with the plain STE (θ = 1, Fig. 2).
OPERATOR_ROWS: dict[str, dict[str, Any]] = {
    "hard": {"method": "feather", "operator": "hard", "theta": 1.0},
    "soft": {"method": "feather", "operator": "soft", "theta": 1.0},
    "Feather (p = 3)": {"method": "feather", "operator": "feather", "theta": 1.0},
}

#: ``backbones``' rows: each backbone with and without Feather (appendix).
BACKBONE_ROWS: dict[str, dict[str, Any]] = {
    "GMP": {"method": "gmp"},
    "Feather-GMP": {"method": FEATHER_GMP},
    "ASL+": {"method": "hard", "backbone": "asl+"},
    "Feather-ASL+": {"method": "feather", "backbone": "asl+"},
}

#: ``flops``' rows: Feather on each threshold backbone (appendix).
FLOPS_ROWS: dict[str, dict[str, Any]] = {
    "global": {"method": "feather", "backbone": "global"},
    "global-flops": {"method": "feather", "backbone": "global-flops"},
    "uniform": {"method": "feather", "backbone": "uniform"},
}


@dataclass(frozen=True)
class Experiment:
    """A named grid of runs and how to summarise it.

    Attributes:
        name: the ``feather-sparse bench`` name.
        title: the results page's title.
        paper: what it reproduces (table / figure of the paper).
        plan: ``opts -> runs``.
        summarize: ``context -> (Markdown body, figures written)``.
    """

    name: str
    title: str
    paper: str
    plan: Callable[[BenchOptions], list[RunSpec]]
    summarize: Callable[[Context], tuple[str, list[Path]]]


EXPERIMENTS: Registry[Experiment] = Registry("experiment")


def _cells(
    opts: BenchOptions, rows: Mapping[str, Mapping[str, Any]], sparsities: Sequence[float]
) -> list[RunSpec]:
    return [
        RunSpec(label, s, seed, {**settings, "dense": False, "sparsity": s})
        for label, settings in rows.items()
        for s in sparsities
        for seed in opts.run_seeds
    ]


def _dense_runs(opts: BenchOptions) -> list[RunSpec]:
    return [RunSpec(DENSE, 0.0, seed, {"dense": True}) for seed in opts.run_seeds]


def _selected_methods(opts: BenchOptions) -> dict[str, dict[str, Any]]:
    if not opts.methods:
        return COMPARE_METHODS
    unknown = [m for m in opts.methods if m not in COMPARE_METHODS]
    if unknown:
        raise ValueError(
            f"unknown compare method(s) {', '.join(unknown)}; choose from: "
            f"{', '.join(COMPARE_METHODS)}"
        )
    return {m: COMPARE_METHODS[m] for m in opts.methods}


def _accuracy_vs_sparsity_plot(
    ctx: Context, grid: Grid, title: str, suffix: str = "accuracy"
) -> Path:
    from feather_sparse.plots import plot_curves

    return plot_curves(
        grid.curves_by_row(),
        ctx.figure(suffix),
        xlabel="sparsity",
        ylabel="top-1 accuracy (%)",
        title=title,
        baseline=_dense_baseline(ctx),
        categorical_x=True,
        xticklabels=[_pct(c) for c in grid.cols],
    )


# ------------------------------------------------------------------- compare
def _plan_compare(opts: BenchOptions) -> list[RunSpec]:
    sparsities = opts.sparsity_grid(PAPER_SPARSITIES)
    return _cells(opts, _selected_methods(opts), sparsities) + _dense_runs(opts)


def _summarize_compare(ctx: Context) -> tuple[str, list[Path]]:
    rows = list(_selected_methods(ctx.opts))
    acc = Grid(ctx.pairs, _accuracy, rows)
    achieved = Grid(ctx.pairs, lambda o: 100.0 * o.sparsity, rows)
    seconds = Grid(ctx.pairs, lambda o: o.wall_time, rows)
    fig = _accuracy_vs_sparsity_plot(ctx, acc, "Top-1 accuracy vs sparsity")
    body = (
        "Top-1 test accuracy (%) after training, mean ± std over seeds; the best mean "
        "per column is in bold.\n\n"
        + _dense_line(ctx)
        + acc.table("method", _pct)
        + "\n\n"
        + _img(fig, "accuracy vs sparsity")
        + "\nAchieved sparsity (%) of the pruned layers after `finalize()`:\n\n"
        + achieved.table("method", _pct, fmt="{:.2f}", best=None)
        + "\n\nWall time per run (s; parallel runs share the cores, so these are only "
        "indicative):\n\n" + seconds.table("method", _pct, fmt="{:.1f}", best=None) + "\n"
    )
    return body, [fig]


# ------------------------------------------------------------------ operator
def _plan_operator(opts: BenchOptions) -> list[RunSpec]:
    return _cells(opts, OPERATOR_ROWS, opts.sparsity_grid(PAPER_SPARSITIES))


def _summarize_operator(ctx: Context) -> tuple[str, list[Path]]:
    acc = Grid(ctx.pairs, _accuracy, list(OPERATOR_ROWS))
    fig = _accuracy_vs_sparsity_plot(ctx, acc, "Thresholding operator, plain STE (θ = 1)")
    body = (
        "Thresholding operator ablation, no gradient scaling (θ = 1 for all), global "
        "backbone. Top-1 accuracy (%), mean ± std over seeds; best per column in bold.\n\n"
        + acc.table("operator", _pct)
        + "\n\n"
        + _img(fig, "accuracy vs sparsity per operator")
    )
    return body, [fig]


# --------------------------------------------------------------------- theta
def _thetas(opts: BenchOptions, default: Sequence[float]) -> tuple[float, ...]:
    return tuple(opts.thetas) if opts.thetas else tuple(default)


def _plan_theta(opts: BenchOptions) -> list[RunSpec]:
    rows = {
        _theta_label(t): {"method": "feather", "operator": "feather", "theta": t}
        for t in _thetas(opts, PAPER_THETAS)
    }
    return _cells(opts, rows, opts.sparsity_grid(PAPER_SPARSITIES))


def _panels_over_theta(
    ctx: Context, grids: Mapping[str, Grid], thetas: Sequence[float]
) -> list[tuple[str, list[Curve]]]:
    """Per sparsity (one panel), accuracy against θ, one curve per grid."""
    cols = sorted({c for g in grids.values() for c in g.cols})
    panels = []
    for c in cols:
        curves = []
        for label, grid in grids.items():
            xs, means, stds = [], [], []
            for t in thetas:
                mean, std = grid.stat(_theta_label(t), c)
                if math.isfinite(mean):
                    xs.append(t)
                    means.append(mean)
                    stds.append(std)
            if xs:
                curves.append(Curve(label, tuple(xs), tuple(means), tuple(stds)))
        panels.append((f"sparsity {_pct(c)}", curves))
    return panels


def _summarize_theta(ctx: Context) -> tuple[str, list[Path]]:
    from feather_sparse.plots import plot_panels

    thetas = _thetas(ctx.opts, PAPER_THETAS)
    acc = Grid(ctx.pairs, _accuracy, [_theta_label(t) for t in thetas])
    fig = plot_panels(
        _panels_over_theta(ctx, {"Feather": acc}, thetas),
        ctx.figure("accuracy"),
        xlabel="θ",
        ylabel="top-1 accuracy (%)",
        title="Gradient scale θ of the pruned weights",
    )
    body = (
        "Gradient scaling θ of the pruned weights (θ = 0: non-STE, θ = 1: plain STE), "
        "Feather operator (p = 3), global backbone. Top-1 accuracy (%), mean ± std over "
        "seeds; the best θ per sparsity in bold. The paper's automatic rule picks θ = 1 "
        "below 95 % and θ = 0.5 from 95 % on.\n\n"
        + acc.table("θ", _pct)
        + "\n\n"
        + _img(fig, "accuracy vs theta")
    )
    return body, [fig]


# ------------------------------------------------------------ theta-operator
_OPERATORS = {"hard": "hard", "soft": "soft", "Feather": "feather"}


def _plan_theta_operator(opts: BenchOptions) -> list[RunSpec]:
    specs = []
    for label, op in _OPERATORS.items():
        rows = {
            f"{label}, {_theta_label(t)}": {"method": "feather", "operator": op, "theta": t}
            for t in _thetas(opts, THETA_OPERATOR_THETAS)
        }
        specs += _cells(opts, rows, opts.sparsity_grid(THETA_OPERATOR_SPARSITIES))
    return specs


def _summarize_theta_operator(ctx: Context) -> tuple[str, list[Path]]:
    from feather_sparse.plots import plot_panels

    thetas = _thetas(ctx.opts, THETA_OPERATOR_THETAS)
    grids = {}
    for label in _OPERATORS:
        relabeled = [
            (replace(s, group=s.group.split(", ", 1)[1]), o)
            for s, o in ctx.pairs
            if s.group.startswith(label + ", ")
        ]
        grids[label] = Grid(relabeled, _accuracy, [_theta_label(t) for t in thetas])
    fig = plot_panels(
        _panels_over_theta(ctx, grids, thetas),
        ctx.figure("accuracy"),
        xlabel="θ",
        ylabel="top-1 accuracy (%)",
        title="Gradient scaling under each thresholding operator",
    )
    full = Grid(ctx.pairs, _accuracy)
    body = (
        "Gradient scale θ under each thresholding operator, global backbone. Top-1 "
        "accuracy (%), mean ± std over seeds; best per column in bold.\n\n"
        + full.table("operator, θ", _pct)
        + "\n\n"
        + _img(fig, "accuracy vs theta per operator")
    )
    return body, [fig]


# ------------------------------------------------------------------------- p
def _ps(opts: BenchOptions) -> tuple[float, ...]:
    return tuple(opts.ps) if opts.ps else PAPER_PS


def _plan_p(opts: BenchOptions) -> list[RunSpec]:
    # p = 3 is the feather operator's own power: leaving it unset makes that
    # row the very config of compare's Feather-Global, trained once for both.
    rows = {
        _p_label(p): {"method": "feather", "operator": "feather", **({} if p == 3.0 else {"p": p})}
        for p in _ps(opts)
    }
    return _cells(opts, rows, opts.sparsity_grid(PAPER_SPARSITIES))


def _summarize_p(ctx: Context) -> tuple[str, list[Path]]:
    from feather_sparse.plots import plot_operator_family

    acc = Grid(ctx.pairs, _accuracy, [_p_label(p) for p in _ps(ctx.opts)])
    fig = _accuracy_vs_sparsity_plot(ctx, acc, "The operator's power p")
    family = plot_operator_family(_ps(ctx.opts), ctx.figure("operators"))
    body = (
        "The power p of the thresholding family (p = 1 soft, p = ∞ hard), θ automatic "
        "(the paper's rule), global backbone. Top-1 accuracy (%), mean ± std over seeds; "
        "best per column in bold.\n\n"
        + acc.table("p", _pct)
        + "\n\n"
        + _img(fig, "accuracy vs sparsity per p")
        + "\nThe operators (paper Fig. 1b), T = 1:\n\n"
        + _img(family, "the thresholding family")
    )
    return body, [fig, family]


# ----------------------------------------------------------------- stability
def _plan_stability(opts: BenchOptions) -> list[RunSpec]:
    sparsity = opts.sparsity_grid((STABILITY_SPARSITY,))[0]
    rows = {
        _theta_label(t): {"method": "feather", "operator": "feather", "theta": t}
        for t in _thetas(opts, PAPER_THETAS)
    }
    return _cells(opts, rows, (sparsity,))


def _summarize_stability(ctx: Context) -> tuple[str, list[Path]]:
    from feather_sparse.plots import plot_curves

    thetas = _thetas(ctx.opts, PAPER_THETAS)
    curves, rows = [], []
    acc = Grid(ctx.pairs, _accuracy, [_theta_label(t) for t in thetas])
    sparsity = ctx.pairs[0][0].x if ctx.pairs else math.nan
    for t in thetas:
        label = _theta_label(t)
        runs = [o for _, o in ctx.of_group(label) if o.ok and o.stability_epochs]
        if not runs:
            continue
        epochs = runs[0].stability_epochs
        per_epoch = list(zip(*(o.stability_pearson for o in runs)))
        stats = [mean_std([v for v in vals if math.isfinite(v)]) for vals in per_epoch]
        keep = [i for i, (m, _) in enumerate(stats) if math.isfinite(m)]
        curves.append(
            Curve(
                label,
                tuple(float(epochs[i]) for i in keep),
                tuple(stats[i][0] for i in keep),
                tuple(stats[i][1] for i in keep),
            )
        )
        flips = [
            v for o in runs for v in o.stability_changed[len(o.stability_changed) // 2 :] if v == v
        ]
        first = [_first_above(o.stability_epochs, o.stability_pearson, 0.9) for o in runs]
        quarter = [_at_fraction(o, 0.25) for o in runs]
        half = [_at_fraction(o, 0.5) for o in runs]
        mean_acc, std_acc = acc.stat(label, sparsity)
        rows.append(
            f"| {label} | {_fmt_ms(mean_std(quarter), '{:.3f}')} "
            f"| {_fmt_ms(mean_std(half), '{:.3f}')} "
            f"| {_fmt_ms(mean_std([f for f in first if f is not None]), '{:.1f}')} "
            f"| {100 * mean_std(flips)[0]:.3f} | {mean_acc:.2f} ± {std_acc:.2f} |"
        )
    fig = plot_curves(
        curves,
        ctx.figure("pearson"),
        xlabel="epoch",
        ylabel="Pearson r with the final mask",
        title=f"Mask stability at sparsity {_pct(sparsity)}",
    )
    body = (
        f"Pearson correlation between the mask (1 = weight kept) at the end of each epoch "
        f"and the final mask, Feather operator, global backbone, sparsity {_pct(sparsity)}, "
        "mean over seeds (shaded: ± std). Before pruning starts the mask is all ones and "
        "r is undefined; those epochs are not drawn.\n\n"
        "| θ | r at 25 % of training | r at 50 % | first epoch with r ≥ 0.9 from then on "
        "| mask flips per epoch, 2nd half (%) | top-1 (%) |\n"
        "|---|---:|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n\n" + _img(fig, "mask stability")
    )
    return body, [fig]


def _fmt_ms(stat: tuple[float, float], fmt: str) -> str:
    mean, std = stat
    if math.isnan(mean):
        return "—"
    return f"{fmt.format(mean)} ± {fmt.format(std)}"


def _first_above(epochs: Sequence[int], values: Sequence[float], level: float) -> float | None:
    found: float | None = None
    for e, v in zip(epochs, values):
        if not math.isfinite(v) or v < level:
            found = None
        elif found is None:
            found = float(e)
    return found


def _at_fraction(o: RunOutcome, fraction: float) -> float:
    """r at the recorded epoch closest to ``fraction`` of training."""
    if not o.stability_epochs:
        return math.nan
    target = fraction * o.stability_epochs[-1]
    i = min(range(len(o.stability_epochs)), key=lambda j: abs(o.stability_epochs[j] - target))
    return o.stability_pearson[i]


# ----------------------------------------------------------------- backbones
def _plan_backbones(opts: BenchOptions) -> list[RunSpec]:
    return _cells(opts, BACKBONE_ROWS, opts.sparsity_grid(PAPER_SPARSITIES))


def _summarize_backbones(ctx: Context) -> tuple[str, list[Path]]:
    from feather_sparse.plots import plot_panels

    acc = Grid(ctx.pairs, _accuracy, list(BACKBONE_ROWS))
    curves = {c.label: c for c in acc.curves_by_row()}
    panels = [
        ("GMP backbone (uniform)", [curves[k] for k in ("GMP", "Feather-GMP") if k in curves]),
        ("ASL+ backbone", [curves[k] for k in ("ASL+", "Feather-ASL+") if k in curves]),
    ]
    fig = plot_panels(
        panels,
        ctx.figure("accuracy"),
        xlabel="sparsity",
        ylabel="top-1 accuracy (%)",
        title="Feather on other pruning backbones",
        categorical_x=True,
        xticklabels=[_pct(c) for c in acc.cols],
    )
    body = (
        "Each backbone with its own thresholding (GMP: hard mask, no gradient to pruned "
        "weights; ASL+: hard thresholding, plain STE) and with Feather (p = 3, θ "
        "automatic). Top-1 accuracy (%), mean ± std over seeds; best per column in bold.\n\n"
        + acc.table("backbone", _pct)
        + "\n\n"
        + _img(fig, "feather on other backbones")
    )
    return body, [fig]


# --------------------------------------------------------------------- flops
def _plan_flops(opts: BenchOptions) -> list[RunSpec]:
    return _cells(opts, FLOPS_ROWS, opts.sparsity_grid(PAPER_SPARSITIES)) + _dense_runs(opts)


def _summarize_flops(ctx: Context) -> tuple[str, list[Path]]:
    from feather_sparse.analysis import LayerSparsity, SparsityDistribution
    from feather_sparse.plots import plot_curves, plot_layer_sparsity

    rows = list(FLOPS_ROWS)
    acc = Grid(ctx.pairs, _accuracy, rows)
    mflops = Grid(ctx.pairs, lambda o: o.sparse_macs / 1e6, rows)
    curves = []
    for r in rows:
        pts = [
            (mflops.stat(r, c)[0], *acc.stat(r, c))
            for c in acc.cols
            if math.isfinite(acc.stat(r, c)[0])
        ]
        if pts:
            xs, ms, ss = zip(*pts)
            curves.append(Curve(r, tuple(xs), tuple(ms), tuple(ss)))
    acc_fig = plot_curves(
        curves,
        ctx.figure("accuracy"),
        xlabel="MFLOPs per sample (multiply-accumulates)",
        ylabel="top-1 accuracy (%)",
        title="Accuracy vs FLOPs per backbone (Feather)",
        baseline=_dense_baseline(ctx),
        xscale="log",
        errorbars=True,
    )
    figures = [acc_fig]
    top = max(acc.cols) if acc.cols else None
    dists = {}
    for r in rows:
        runs = [o for s, o in ctx.pairs if s.group == r and s.x == top and o.ok and o.layers]
        if runs:
            dists[r] = SparsityDistribution(
                tuple(LayerSparsity(n, (p,), p, nz) for n, p, nz in runs[0].layers)
            )
    if dists:
        figures.append(
            plot_layer_sparsity(
                dists,
                ctx.figure("layers"),
                title=f"Per-layer sparsity at {_pct(top or 0)} (seed {ctx.opts.run_seeds[0]})",
            )
        )
    dense = [o for _, o in ctx.of_group(DENSE) if o.ok]
    validation = ""
    if dense:
        validation = _validate_flops(dense[0])
    body = (
        "Feather (p = 3, θ automatic) on three threshold backbones. FLOPs are counted as "
        "multiply-accumulates per sample of the convolution and linear layers with zero "
        "weights skipped (the paper's convention, see `feather_sparse.analysis`).\n\n"
        + validation
        + "Top-1 accuracy (%), mean ± std over seeds; best per column in bold:\n\n"
        + acc.table("backbone", _pct)
        + "\n\nSparse MFLOPs per sample, mean ± std over seeds; fewest per column in bold:\n\n"
        + mflops.table("backbone", _pct, fmt="{:.4f}", best="min")
        + "\n\n"
        + _img(acc_fig, "accuracy vs flops")
        + ("\n" + _img(figures[1], "per-layer sparsity") if len(figures) > 1 else "")
    )
    return body, figures


def _validate_flops(dense: RunOutcome) -> str:
    """Check the dense count against ``torch.utils.flop_counter`` on the same architecture."""
    from feather_sparse.analysis import count_flops, reference_flops
    from feather_sparse.models import create_model

    spec = dict(dense.model_spec)
    model = create_model(spec["name"], **dict(spec.get("kwargs", {})))
    ours = count_flops(model, dense.input_shape)
    theirs = reference_flops(model, dense.input_shape)
    verdict = "agree" if ours.torch_flops == theirs else "**disagree**"
    return (
        f"Dense {spec['name']}: {ours.dense_macs / 1e6:.4f} MFLOPs (MACs) per sample; "
        f"`torch.utils.flop_counter` counts {theirs:,} FLOPs = 2 × {theirs / 2:,.0f} MACs "
        f"for the same forward ({verdict} with this count).\n\n"
    )


for _experiment in (
    Experiment(
        "compare", "Comparison with the baselines", "Table 1", _plan_compare, _summarize_compare
    ),
    Experiment("operator", "Thresholding operator", "Fig. 2", _plan_operator, _summarize_operator),
    Experiment("theta", "Gradient scaling θ", "Fig. 3", _plan_theta, _summarize_theta),
    Experiment(
        "theta-operator",
        "Gradient scaling under each operator",
        "Fig. 4",
        _plan_theta_operator,
        _summarize_theta_operator,
    ),
    Experiment("p", "The operator's power p", "appendix, Fig. 1b", _plan_p, _summarize_p),
    Experiment(
        "stability", "Mask stability vs θ", "appendix", _plan_stability, _summarize_stability
    ),
    Experiment(
        "backbones", "Feather on other backbones", "appendix", _plan_backbones, _summarize_backbones
    ),
    Experiment("flops", "Accuracy vs FLOPs", "appendix", _plan_flops, _summarize_flops),
):
    EXPERIMENTS.register(_experiment.name, _experiment)


# ====================================================================== driver
@dataclass(frozen=True)
class ExperimentResult:
    """What :func:`run_experiment` produced.

    Attributes:
        name: the experiment.
        page: the Markdown results page.
        figures: the PNG plots.
        runs: distinct runs in the experiment.
        trained: runs trained by this call (the rest were reused).
        failed: runs that raised.
        wall_time: seconds this call took, training and summary.
    """

    name: str
    page: Path
    figures: tuple[Path, ...]
    runs: int
    trained: int
    failed: int
    wall_time: float


def run_experiment(
    name: str | Experiment,
    opts: BenchOptions,
    on_progress: ProgressFn | None = None,
    pool: tuple[int, float] | None = None,
) -> ExperimentResult:
    """Run (or continue) an experiment and write its page, plots and raw results.

    Args:
        name: a registered experiment name (``EXPERIMENTS.names()``) or an Experiment.
        opts: how to run it.
        on_progress: called after every finished run with ``(done, total, spec, outcome)``.
        pool: ``(runs trained, seconds)`` of a pool that trained this
            experiment's runs just before, with other experiments' (``bench
            all``); the page then names that pool instead of "0 trained".

    Raises:
        ValueError: for an unknown experiment, method, model or data set, or an
            override of a field the experiment varies.
    """
    experiment: Experiment = EXPERIMENTS.get(name)
    started = time.perf_counter()
    specs = experiment.plan(opts)
    pairs, trained, elapsed = execute_runs(opts, specs, on_progress)
    ctx = Context(
        name=experiment.name,
        opts=opts,
        pairs=pairs,
        executed=trained,
        elapsed=elapsed,
        workers=opts.worker_count(),
        pool=pool if pool is not None and trained == 0 else None,
    )
    body, figures = experiment.summarize(ctx)
    title = f"{experiment.title} ({experiment.paper})"
    page = _write_page(ctx, title, body)
    unique = {o.key: o for _, o in pairs}
    return ExperimentResult(
        name=experiment.name,
        page=page,
        figures=tuple(figures),
        runs=len(unique),
        trained=trained,
        failed=sum(not o.ok for o in unique.values()),
        wall_time=time.perf_counter() - started,
    )


# ========================================================================= CLI
def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, got {text!r}"
        ) from None


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas, got {text!r}"
        ) from None


def add_cli_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    """``feather-sparse bench NAME``: the experiment, the scale, where results go."""
    parser.description = (
        "Reproduce the paper's tables and figures: each experiment trains a grid of runs and "
        "writes a Markdown table (mean ± std over seeds, best per column in bold) and PNG plots. "
        "Default scale: the bundled MNIST-1D with its 1-D CNN; --recipe cifar100 --model resnet20 "
        "--data-dir DATA for the paper's."
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    names = EXPERIMENTS.names()
    parser.epilog = "experiments:\n" + "\n".join(
        f"  {e.name:<15} {e.title} ({e.paper})" for e in (EXPERIMENTS.get(n) for n in names)
    )
    parser.add_argument(
        "experiment", choices=[*names, "all"], metavar="EXPERIMENT", help="|".join(names) + "|all"
    )
    parser.add_argument("--quick", action="store_true", help="CI-sized smoke run")
    scale = parser.add_argument_group("scale (every run)")
    scale.add_argument(
        "--recipe", default=None, help=f"training recipe (name or .toml) [{DEFAULT_BENCH_RECIPE}]"
    )
    scale.add_argument(
        "--data", default=None, help="data set (a recipe of that name is used if there is one)"
    )
    scale.add_argument("--model", default=None, help="registered model name")
    scale.add_argument("--data-dir", default=None, help="where the data set lives")
    scale.add_argument("--epochs", type=int, default=None, help="training epochs")
    scale.add_argument("--batch-size", type=int, default=None, help="training batch size")
    scale.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:N")
    scale.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="any other recipe field for every run (repeatable)",
    )
    grid = parser.add_argument_group("grid")
    grid.add_argument("--seeds", type=_ints, default=DEFAULT_SEEDS, help="seeds [0,1,2]")
    grid.add_argument(
        "--sparsities", type=_floats, default=None, help="sparsity columns [0.9,0.95,0.98,0.99]"
    )
    grid.add_argument("--thetas", type=_floats, default=None, help="θ values (theta experiments)")
    grid.add_argument("--ps", type=_floats, default=None, help="p values (p experiment)")
    grid.add_argument(
        "--methods",
        default=None,
        help=f"compare only these (comma-separated): {','.join(COMPARE_METHODS)}",
    )
    run = parser.add_argument_group("running")
    run.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="parallel runs [usable cores // threads per run; 1 on a GPU]",
    )
    run.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads per run [the recipe's]"
    )
    run.add_argument("--out", default="results", help="folder of tables and plots [results]")
    run.add_argument("--runs-dir", default=None, help="folder of the runs [OUT/runs]")
    run.add_argument("--force", action="store_true", help="re-run runs that have results")


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """The :class:`BenchOptions` of a parsed ``bench`` command line."""
    from feather_sparse.recipes import list_recipes, parse_override

    overrides: dict[str, Any] = {}
    for text in args.set:
        key, value = parse_override(text)
        overrides[key] = value
    recipe = args.recipe
    if args.data is not None:
        overrides["dataset"] = args.data
        if recipe is None and args.data in list_recipes():
            recipe = args.data
    for key in ("model", "data_dir", "epochs", "batch_size", "device"):
        value = getattr(args, key)
        if value is not None:
            overrides[key] = value
    methods = tuple(m.strip() for m in args.methods.split(",")) if args.methods else None
    return BenchOptions(
        recipe=recipe or DEFAULT_BENCH_RECIPE,
        overrides=overrides,
        seeds=tuple(args.seeds),
        sparsities=args.sparsities,
        thetas=args.thetas,
        ps=args.ps,
        methods=methods,
        quick=args.quick,
        jobs=args.jobs,
        threads=args.threads,
        out=Path(args.out),
        runs_dir=Path(args.runs_dir) if args.runs_dir else None,
        force=args.force,
    )


def run_cli(command: str, args: argparse.Namespace) -> int:
    """Run ``feather-sparse bench``; prints one line per finished run and the pages written."""
    opts = options_from_args(args)
    names = EXPERIMENTS.names() if args.experiment == "all" else [args.experiment]

    def progress(done: int, total: int, spec: RunSpec, outcome: RunOutcome) -> None:
        status = (
            f"top-1 {100 * outcome.test_accuracy:.2f} %, sparsity {100 * outcome.sparsity:.2f} %"
            if outcome.ok
            else f"FAILED: {outcome.error}"
        )
        print(
            f"[{done}/{total}] {spec.group} @ {spec.x:g} seed {spec.seed}: {status} "
            f"({outcome.wall_time:.1f} s)",
            file=sys.stderr,
            flush=True,
        )

    pool: tuple[int, float] | None = None
    if len(names) > 1:
        # One pool over the union of every experiment's runs keeps all cores busy
        # to the end; the pages are then written from the stored results.
        specs = [spec for name in names for spec in EXPERIMENTS.get(name).plan(opts)]
        _, trained, elapsed = execute_runs(opts, specs, progress)
        print(f"all: {trained} runs trained in {elapsed / 60:.1f} min")
        pool = (trained, elapsed) if trained else None
    failed = 0
    for name in names:
        result = run_experiment(name, opts, progress, pool)
        failed += result.failed
        print(
            f"{name}: {result.runs} runs ({result.trained} trained, {result.failed} failed) in "
            f"{result.wall_time / 60:.1f} min -> {result.page}"
        )
    return 1 if failed else 0
