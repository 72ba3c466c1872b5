"""The runs of a sweep: what a run is and leaves, where it is stored, the pool that trains it.

Each run's outcome is kept as ``RUNS_DIR/<key>/result.json``, keyed by a hash
of the run's whole config: an interrupted sweep continues where it stopped,
and experiments that share a run train it once. Runs train in spawned worker
processes (or in this one with one worker), each through
:func:`feather_sparse.train.train`, the same code path as ``feather-sparse train``.
"""

from __future__ import annotations

import concurrent.futures as futures
import hashlib
import json
import logging
import math
import multiprocessing
import shutil
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from feather_sparse import run_lock
from feather_sparse import train as training
from feather_sparse._text import count, plural
from feather_sparse._version import __version__
from feather_sparse.analysis import MaskStabilityRecorder, count_flops, layer_sparsity
from feather_sparse.bench.options import BenchOptions
from feather_sparse.data import DATASETS, load_dataset
from feather_sparse.integrity import read_sealed_json, write_sealed_json
from feather_sparse.methods import METHODS, pruner_config
from feather_sparse.models import create_model, list_models
from feather_sparse.provenance import numerics
from feather_sparse.pruner_config import PrunerConfig
from feather_sparse.recipes import TrainConfig, load_config
from feather_sparse.train.dist import resolve_device
from feather_sparse.train.fit import check_model_takes
from feather_sparse.train.run_dir import read_run_info

__all__ = [
    "OUTCOME_FORMAT",
    "TIME_FORMAT",
    "TRACEBACK_FILE",
    "ProgressFn",
    "RunOutcome",
    "RunPlan",
    "RunSpec",
    "StopFn",
    "check_data",
    "execute_runs",
    "jsonable",
    "load_outcome",
    "plan_runs",
    "run_key",
    "run_name",
]

logger = logging.getLogger(__name__)

#: Result files of this format (bump when RunOutcome changes incompatibly).
OUTCOME_FORMAT = "feather-sparse-bench-run/1"
#: Where a failed run leaves its traceback (the console gets one line per run).
TRACEBACK_FILE = "traceback.txt"
#: How a run records when it started and finished: UTC, to the second (ISO 8601).
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True)
class RunSpec:
    """One training run of an experiment: a table cell for one seed.

    Attributes:
        group: the row / line it belongs to (``"Feather-Global"``, ``"θ=0.5"``).
        x: its column (a sparsity, θ or p; 0 for the dense model).
        seed: the training seed.
        settings: the config fields the experiment sets for this cell.
        experiment: the experiment that planned it (for progress lines); the
            driver fills it in.
    """

    group: str
    x: float
    seed: int
    settings: Mapping[str, Any]
    experiment: str = ""


@dataclass(frozen=True)
class RunOutcome:
    """What one finished run left, as stored in ``RUNS_DIR/<key>/result.json``.

    Attributes:
        key: the run's folder name (readable prefix + config hash); people are
            shown :attr:`name`.
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
        numerics: the floating-point environment that trained it
            (:func:`feather_sparse.provenance.numerics`; empty for runs stored
            before it was recorded).
        started: when the run started, in :data:`TIME_FORMAT`
            (``2026-11-21T09:30:05Z``); empty for runs stored before it was recorded.
        finished: when it finished (or failed), likewise.
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
    numerics: str = ""
    started: str = ""
    finished: str = ""

    def to_json(self) -> dict[str, Any]:
        """The outcome as JSON-safe data (:func:`jsonable`), tagged with its format."""
        out = {"format": OUTCOME_FORMAT}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = jsonable(value)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunOutcome:
        """The outcome :meth:`to_json` wrote.

        Args:
            data: what :meth:`to_json` returned (after a JSON round trip).

        Raises:
            ValueError: if ``data`` is not a run result of this format.
        """
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
    def name(self) -> str:
        """What the run is, for people (:func:`run_name`); the key for a config without a method."""
        if self.config.get("dense") or "method" in self.config:
            return run_name(self.config)
        return self.key

    @property
    def density_macs(self) -> float:
        """Sparse over dense MACs per sample (NaN when the dense count is 0)."""
        return self.sparse_macs / self.dense_macs if self.dense_macs else math.nan


def jsonable(value: Any) -> Any:
    """JSON-safe: tuples to lists, non-finite floats to strings (strict JSON has none).

    Args:
        value: any JSON-like value.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


# ==================================================================== storage
def _config_dict(opts: BenchOptions, spec: RunSpec) -> dict[str, Any]:
    """The run's resolved config: recipe < bench/quick settings < user overrides < cell."""
    clash = sorted(set(opts.overrides) & set(spec.settings))
    if clash:
        raise ValueError(
            f"{', '.join(clash)}: set by the experiment for each run (it is what it varies); "
            "drop the override"
        )
    values = opts.base_overrides()
    values.update(spec.settings)
    values["seed"] = spec.seed
    return _canonical(load_config(opts.recipe, values)).to_dict()


_METHOD_DECIDED = ("operator", "p", "theta", "backbone")


def _canonical(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with every setting its method would choose anyway left unset.

    Two cells that train the same run (``operator="feather"`` given, or left
    to the method) get one config, hence one run key, and the run is trained
    once.
    """
    if cfg.dense:
        return cfg
    resolved = _resolved(pruner_config(cfg))
    for name in _METHOD_DECIDED:
        if getattr(cfg, name) is None:
            continue
        unset = cfg.replace(**{name: None})
        if _resolved(pruner_config(unset)) == resolved:
            cfg = unset
    return cfg


def _resolved(pc: PrunerConfig) -> PrunerConfig:
    """``pc`` with θ as the number it trains with: ``theta="auto"`` and the θ
    that the automatic rule gives at this sparsity are the same run."""
    return replace(pc, theta=pc.theta_value)


#: Config fields added after runs were stored under their keys: left out of the
#: hash while unset, so that those runs keep their keys (and are reused).
_LATER_FIELDS = ("conv_order", "init_from")


def run_key(config: Mapping[str, Any]) -> str:
    """The run's folder name: readable prefix plus a hash of its whole config.

    Args:
        config: the run's config.
    """
    config = {k: v for k, v in config.items() if not (k in _LATER_FIELDS and v is None)}
    blob = json.dumps(jsonable(config), sort_keys=True).encode()
    digest = hashlib.sha1(blob).hexdigest()[:10]
    method = "dense" if config.get("dense") else str(config.get("method"))
    sparsity = 0.0 if config.get("dense") else float(config.get("sparsity", 0.0))
    return f"{method}-s{sparsity:g}-seed{config.get('seed')}-{digest}"


#: Settings that tell runs of one method apart; :func:`run_name` names those that are set.
_NAME_FIELDS = ("pattern", "operator", "p", "theta", "backbone")


def run_name(config: Mapping[str, Any]) -> str:
    """What the run is, for people: its method, settings, sparsity and seed.

    The settings named are those in which the run departs from the method's
    own choices.

    ``feather operator=hard theta=1 s=0.99 seed 0`` is ``bench operator``'s hard
    row at 99 %; ``feather s=0.99 seed 0`` trains Feather as the method sets it
    up. The run's folder (:func:`run_key`) keeps its shorter prefix
    (``feather-s0.99-seed0-<hash>`` for all three operators): the folder name
    is the key that stored results are found under, so a longer prefix would
    leave every runs folder written before it untouched and train its runs again.

    Args:
        config: the run's config.
    """
    if config.get("dense"):
        return f"dense seed {config.get('seed')}"
    words = [str(config.get("method"))]
    words += [f"{k}={_setting(config[k])}" for k in _NAME_FIELDS if config.get(k) is not None]
    if config.get("pattern") is None:  # an N:M pattern sets the sparsity itself
        words.append(f"s={float(config.get('sparsity', 0.0)):g}")
    words.append(f"seed {config.get('seed')}")
    return " ".join(words)


def _setting(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def load_outcome(run_dir: Path) -> RunOutcome | None:
    """The stored outcome of a run folder; None if it has none (or an unreadable one).

    A ``result.json`` whose checksum does not match counts as unreadable: the
    run is repeated. One written before checksums is read as it is. So does
    one that records another run's key than the folder's name (a folder
    renamed or swapped by hand): it is never taken for the folder's run.

    Args:
        run_dir: the run's folder.
    """
    file = run_dir / "result.json"
    if not file.is_file():
        return None
    try:
        outcome = RunOutcome.from_json(read_sealed_json(file))
    except (ValueError, TypeError, KeyError) as err:
        logger.warning("ignoring unreadable %s (%s): the run is repeated", file, err)
        return None
    if outcome.key != run_dir.name:
        logger.warning(
            "ignoring %s: it is the result of run %s, not of %s (the folder's name; "
            "renamed or copied by hand?): the run is repeated",
            file,
            outcome.key,
            run_dir.name,
        )
        return None
    return outcome


# ===================================================================== one run
def _execute(config: dict[str, Any], run_dir: str, reuse: bool = True) -> dict[str, Any]:
    """Train one run and measure it; the body of every worker process.

    Module-level so that a spawned process can import and call it. Returns
    (and writes) the :class:`RunOutcome` as JSON; an exception during training
    becomes an outcome with ``ok=False``. With ``reuse`` (not ``--force``), a
    result that another process stored while this one waited is taken as it is.
    """
    path = Path(run_dir)
    if _STARTED is not None:  # in a pool: tell the parent, which names it if this process dies
        _STARTED.put(path.name)
    # Another sweep sharing this runs folder may be training the same run now:
    # wait for it and take its result, rather than clear its folder under it.
    with run_lock.hold(path.parent / f".{path.name}.lock", what=f"run {path}", wait=True):
        stored = load_outcome(path) if reuse else None
        if stored is not None and stored.ok:
            logger.info(
                "run %s (%s) was trained meanwhile by another process: reused",
                stored.name,
                path.name,
            )
            return {**stored.to_json(), REUSED: True}
        try:
            _clear_unfinished(path)
        except run_lock.RunInUseError as err:  # a `train --resume` of this folder, by hand
            return RunOutcome(key=path.name, config=config, ok=False, error=str(err)).to_json()
        return _execute_locked(config, path)


#: Key of an :func:`_execute` result that another process trained (not stored in files).
REUSED = "reused_meanwhile"

#: In a pool's worker process, the queue on which :func:`_execute` puts the key of
#: each run it starts (see :func:`_pool_worker`); None elsewhere.
_STARTED: Any = None


def _pool_worker(started: Any) -> None:
    """Initialize a pool's worker process: :func:`_execute` reports its runs on ``started``."""
    global _STARTED
    _STARTED = started


def _clear_unfinished(path: Path) -> None:
    """Empty the folder of an unfinished earlier attempt (``train`` refuses to overwrite it).

    The run's own lock is taken first, so a folder that a ``train`` process is
    using is left alone (:class:`~feather_sparse.run_lock.RunInUseError`);
    the lock file itself stays, so that every process locks the same file.
    """
    if not path.is_dir():
        return
    with run_lock.hold(path / run_lock.LOCK_NAME, what=f"run folder {path}"):
        for child in path.iterdir():
            if child.name == run_lock.LOCK_NAME:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def _now() -> str:
    """The time now as a run records it (:data:`TIME_FORMAT`)."""
    return datetime.now(timezone.utc).strftime(TIME_FORMAT)


def _execute_locked(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """:func:`_execute` once the run is this process's."""
    key = path.name
    started = time.perf_counter()
    started_at = _now()
    # Each run logs into its own RUN_DIR/train.log (train() attaches that
    # handler); keep the console for the sweep's one line per run.
    package_logger = logging.getLogger("feather_sparse")
    propagate = package_logger.propagate
    package_logger.propagate = False
    try:
        cfg = TrainConfig.from_dict(config)
        recorder = MaskStabilityRecorder(key)
        result = training.train(cfg, path, callbacks=[recorder], progress=False)
        info = read_run_info(path)
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
            numerics=str(info.get("numerics", "")),
            started=started_at,
            finished=_now(),
        )
    except Exception as err:  # one bad run must not stop a sweep; it is reported
        logger.debug("run %s failed", key, exc_info=True)
        path.mkdir(parents=True, exist_ok=True)
        (path / TRACEBACK_FILE).write_text(traceback.format_exc())
        outcome = RunOutcome(
            key=key,
            config=config,
            ok=False,
            error=f"{type(err).__name__}: {err}",
            wall_time=time.perf_counter() - started,
            started=started_at,
            finished=_now(),
        )
    finally:
        package_logger.propagate = propagate
    path.mkdir(parents=True, exist_ok=True)
    data = outcome.to_json()
    write_sealed_json(path / "result.json", data, indent=1)
    return data


def _check_names(configs: Sequence[Mapping[str, Any]]) -> None:
    """Fail before any training when a method, model or data set is unknown."""
    methods = METHODS.names()
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


#: Data and model settings this process has built once (see :func:`check_data`).
_BUILT: set[str] = set()


def check_data(configs: Sequence[Mapping[str, Any]]) -> None:
    """Check each distinct device, data set and model of ``configs`` once, before any run.

    A device that is not here, missing data or a model that does not take the
    data then stops a sweep with one error before any run starts (instead of
    failing every run). Settings built before in this process are not built again.

    Each model is built and run forward on a batch of zeros of the data's
    input shape.

    Args:
        configs: the configs of the runs to train.

    Raises:
        FileNotFoundError: when the data is not on disk (the message says how to
            provide it).
        ValueError: for a device that is not available, bad data options or
            model settings, or a model that does not take the data's input.
    """
    for device in dict.fromkeys(str(cfg.get("device", "auto")) for cfg in configs):
        try:
            resolve_device(device)
        except (RuntimeError, ValueError) as err:
            raise ValueError(f"no run started: {err}") from err
    for cfg in configs:
        keys = ("dataset", "data_dir", "data_options", "model", "model_kwargs")
        what = json.dumps(jsonable({k: cfg[k] for k in keys}), sort_keys=True)
        if what in _BUILT:
            continue
        try:
            bundle = load_dataset(
                cfg["dataset"],
                data_dir=cfg["data_dir"],
                batch_size=cfg["batch_size"],
                device="cpu",
                seed=cfg["seed"],
                **cfg["data_options"],
            )
        except (FileNotFoundError, ValueError) as err:
            raise type(err)(f"no run started: {err}") from err
        try:
            model = create_model(
                cfg["model"], num_classes=bundle.num_classes, **cfg["model_kwargs"]
            )
        except (TypeError, ValueError) as err:
            raise ValueError(f"no run started: model {cfg['model']}: {err}") from err
        try:
            check_model_takes(
                model,
                model_name=str(cfg["model"]),
                dataset=str(cfg["dataset"]),
                shape=tuple(bundle.input_shape),
                num_classes=bundle.num_classes,
                recipe=cfg.get("recipe"),
            )
        except ValueError as err:
            raise ValueError(f"no run started: {err}") from err
        _BUILT.add(what)


@dataclass(frozen=True)
class RunPlan:
    """The distinct runs of some specs, and which of them have a stored result.

    Attributes:
        keys: each spec's run key (specs with the same config share one).
        stored: key -> outcome of the runs finished earlier (reused), and of
            the runs this invocation already tried (failed ones too; see
            :func:`plan_runs`).
        todo: key -> config of the runs to train.
    """

    keys: tuple[str, ...]
    stored: Mapping[str, RunOutcome]
    todo: Mapping[str, dict[str, Any]]

    @property
    def distinct(self) -> int:
        """The number of distinct runs: stored plus still to train."""
        return len(self.stored) + len(self.todo)


def plan_runs(
    opts: BenchOptions,
    specs: Sequence[RunSpec],
    attempted: Mapping[str, RunOutcome] | None = None,
) -> RunPlan:
    """Resolve every spec's config and key, and look up the stored results.

    Args:
        opts: how the runs are run.
        specs: the runs.
        attempted: key -> outcome of the runs this invocation has already
            trained (see :func:`execute_runs`): taken as they are, failed or
            not (and with ``force`` too), so that one command trains a run at
            most once. A later command retries a failed run.

    Raises:
        ValueError: for an unknown method, model or data set, or an override
            of a field the experiment varies.
    """
    configs = [_config_dict(opts, s) for s in specs]
    _check_names(configs)
    keys = [run_key(c) for c in configs]
    stored: dict[str, RunOutcome] = {}
    todo: dict[str, dict[str, Any]] = {}
    for key, cfg in zip(keys, configs):
        if key in stored or key in todo:
            continue
        if attempted is not None and key in attempted:
            stored[key] = attempted[key]
            continue
        found = None if opts.force else load_outcome(opts.runs_path / key)
        if found is not None and found.ok:
            stored[key] = found
        else:
            todo[key] = cfg
    return RunPlan(tuple(keys), stored, todo)


def _warn_foreign(stored: Iterable[RunOutcome]) -> None:
    """Say when reused runs were trained on another floating-point environment than this one.

    They are reused as they are (the results page counts them in its
    numerics line); a run trained here from the same seed would differ.
    """
    foreign: Counter[tuple[str, str]] = Counter()
    for outcome in stored:
        if not outcome.numerics:
            continue
        try:
            here = numerics(resolve_device(str(outcome.config.get("device", "auto"))))
        except ValueError:  # its device is not here (CUDA): it cannot be this environment
            here = "a machine without its device"
        if outcome.numerics != here:
            foreign[outcome.numerics, here] += 1
    for (where, here), n in foreign.items():
        logger.warning(
            "%s %s trained on %s, not on this machine's %s: a run trained here from the "
            "same seed would differ in its bits (--force trains %s again here)",
            count(n, "reused run"),
            plural(n, "was", "were"),
            where,
            here,
            plural(n, "it", "them"),
        )


# ======================================================================= pool
ProgressFn = Callable[[int, int, RunSpec, RunOutcome], None]
#: Called as ``(runs trained, seconds, exception)`` when training stops on an exception.
StopFn = Callable[[int, float, BaseException], None]


def execute_runs(
    opts: BenchOptions,
    specs: Sequence[RunSpec],
    on_progress: ProgressFn | None = None,
    attempted: MutableMapping[str, RunOutcome] | None = None,
    on_stop: StopFn | None = None,
) -> tuple[list[tuple[RunSpec, RunOutcome]], int, float]:
    """Run every spec that has no result yet; return ``(pairs, runs trained here, seconds)``.

    ``attempted``, shared by the calls of one command (``bench all``: the pool,
    then each experiment), collects the outcome of every run trained here: a
    later call takes them as they are instead of training a failed run again.

    When training stops on an exception (Ctrl-C, a worker that died, a full
    disk), ``on_stop`` is called with the runs finished so far and the seconds
    spent, and the exception goes on (the driver logs the session in
    ``OUT/sweep.jsonl`` that way); a failing ``on_stop`` is logged, not raised.

    Runs execute in ``opts.worker_count()`` spawned processes (in this process
    when that is 1). Identical configs are trained once. Before the first run,
    each distinct data set and model is built once: missing data is one error,
    not a failure of every run.

    Args:
        opts: the bench options (runs folder, workers, ...).
        specs: the runs to have results for.
        on_progress: called as ``(done, total, spec, outcome)`` after each run trained.
        attempted: outcomes of runs already trained by this command (read and added to).
        on_stop: called as ``(runs trained, seconds, exception)`` when training stops
            on an exception.

    Raises:
        ValueError: as :func:`plan_runs`, or when the data or model cannot be built.
        FileNotFoundError: when the data is not on disk.
    """
    plan = plan_runs(opts, specs, attempted)
    keys = list(plan.keys)
    root = opts.runs_path
    outcomes: dict[str, RunOutcome] = dict(plan.stored)
    todo = plan.todo
    check_data(list(todo.values()))
    spec_of: dict[str, RunSpec] = {}
    for k, s in zip(keys, specs):
        spec_of.setdefault(k, s)
    total, done = len(todo), 0
    started = time.perf_counter()
    workers = min(opts.worker_count(), max(1, total))
    logger.info(
        "%s to train (%d reused), %s",
        count(total, "run"),
        len(outcomes),
        count(workers, "process"),
    )
    _warn_foreign(plan.stored.values())

    trained = 0  # those that another process trained meanwhile are reused, not trained

    def finished(data: dict[str, Any]) -> None:
        nonlocal done, trained
        trained += not data.get(REUSED, False)
        outcome = RunOutcome.from_json(data)
        outcomes[outcome.key] = outcome
        if attempted is not None:
            attempted[outcome.key] = outcome
        done += 1
        if on_progress is not None:
            on_progress(done, total, spec_of[outcome.key], outcome)

    if total:
        root.mkdir(parents=True, exist_ok=True)
    reuse = not opts.force  # a result another sweep stored meanwhile
    try:
        if workers <= 1:
            for key, cfg in todo.items():
                finished(_execute(cfg, str(root / key), reuse))
        elif total:
            context = multiprocessing.get_context("spawn")  # no fork of a threaded parent
            started_runs = context.SimpleQueue()  # keys of the runs the workers started
            begun: list[str] = []

            def read_started() -> None:  # often, so that the queue's pipe never fills
                while not started_runs.empty():
                    begun.append(started_runs.get())

            with futures.ProcessPoolExecutor(
                max_workers=workers,
                mp_context=context,
                initializer=_pool_worker,
                initargs=(started_runs,),
            ) as pool:
                pending = {
                    pool.submit(_execute, cfg, str(root / k), reuse): k for k, cfg in todo.items()
                }
                try:
                    for fut in futures.as_completed(pending):
                        read_started()
                        finished(fut.result())
                except BrokenProcessPool as err:
                    # A worker was killed (the out-of-memory killer, kill -9): the pool
                    # stops every run; say which, and how to go on.
                    pool.shutdown(wait=False, cancel_futures=True)
                    read_started()
                    ended = {pending[f] for f in pending if _succeeded(f)}
                    for fut in pending:  # finished just before, not yet counted
                        if pending[fut] in ended and pending[fut] not in outcomes:
                            finished(fut.result())
                    lost = [todo[k] for k in dict.fromkeys(begun) if k not in ended]
                    raise BrokenProcessPool(_died_message(lost, root)) from err
                except BaseException:
                    # Ctrl-C: start no queued run (leaving the pool would wait for them);
                    # the finished ones are stored, and the next call continues from there.
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
    except BaseException as err:
        if on_stop is not None and total:
            try:
                on_stop(trained, time.perf_counter() - started, err)
            except Exception as log_err:  # the stop itself is what the caller must see
                logger.warning("could not log the stopped session: %s", log_err)
        raise
    elapsed = time.perf_counter() - started
    return [(s, outcomes[k]) for s, k in zip(specs, keys)], trained, elapsed


def _succeeded(fut: futures.Future[Any]) -> bool:
    """Whether ``fut`` finished with a result (not cancelled, no exception)."""
    return fut.done() and not fut.cancelled() and fut.exception() is None


def _died_message(lost: Sequence[Mapping[str, Any]], root: Path) -> str:
    """What to say when a worker process of the pool died while training the runs ``lost``."""
    what = f" while training {', '.join(map(run_name, lost))}" if lost else ""
    return (
        f"a training process was killed{what} (by the out-of-memory killer when memory "
        f"runs out, or by a signal), and the pool stopped; the runs that finished are "
        f"stored in {root}: run the same command again to continue (with fewer --jobs "
        "if memory ran out)"
    )
