"""The training loop behind ``feather-sparse train``: recipes in, a pruned model out.

One call trains a registered model on a registered data set with the Feather
Pruner (Glentis Georgoulakis, Retsinas & Maragos, BMVC 2023) or, with
``dense``, without it::

    from feather_sparse.recipes import load_config
    from feather_sparse.train import train

    result = train(load_config("cifar100", sparsity=0.98), "runs/r20-s98")
    result.test_accuracy, result.sparsity

Each step is the paper's recipe: forward through ``P_T(w)``, cross-entropy,
backward (straight-through, pruned-weight gradients scaled by θ), optional
gradient-norm clipping, SGD step, LR schedule step (per iteration), then
``pruner.step()`` recomputes the thresholds at the scheduled sparsity. At the
end ``pruner.finalize()`` bakes ``P_T(w)`` into the weights.

The run folder::

    RUN_DIR/config.json          resolved config, model spec {"name", "kwargs"}, data facts
    RUN_DIR/train.log            the log of every (resumed) session
    RUN_DIR/metrics.jsonl        one JSON object per epoch (with test metrics if tested), then final
    RUN_DIR/checkpoints/last.pt  written atomically every epoch
    RUN_DIR/report.md            the final per-layer table
    RUN_DIR/model.fsp            the compressed model (``model.pt`` when export is missing)
    RUN_DIR/tensorboard/         when tensorboard is installed

Resuming (``resume=True`` / ``--resume RUN_DIR``) continues from the last
checkpoint so that, on CPU, the weights are bit-identical to an uninterrupted
run: model, optimizer, LR schedule, Pruner and every RNG state are restored,
and the data loaders shuffle as a pure function of ``(seed, epoch)``.

Distributed data parallel (DDP): under ``torchrun --nproc_per_node=N -m
feather_sparse train ...`` the CLI joins the process group from the
environment (``nccl`` on CUDA, one GPU per process by ``LOCAL_RANK``;
``gloo`` on CPU). The rank and world size come from ``distributed_context()``
(one place) and are handed to the data loaders, which give each rank its own
shard of every epoch; the Pruner is attached to the bare model, which is then
wrapped in ``DistributedDataParallel``, so every rank computes the identical
threshold locally (see ``docs/distributed.md``). Evaluation sums are
all-reduced; only rank 0 logs to the run folder and writes files, and the
other ranks wait for each checkpoint (a barrier) before going on.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from feather_sparse._version import __version__
from feather_sparse.backbones import ASL_LR_SCALE
from feather_sparse.baselines import METHODS, make_pruner
from feather_sparse.pruner import DEFAULT_INCLUDE, PrunerReport
from feather_sparse.recipes import (
    DEFAULT_RECIPE,
    TrainConfig,
    config_fields,
    list_recipes,
    load_config,
    parse_override,
)
from feather_sparse.registry import Registry

__all__ = [
    "CHECKPOINT_FORMAT",
    "RESUME_FREE_FIELDS",
    "SUPPORTED_METHODS",
    "DistContext",
    "EpochCallback",
    "TrainResult",
    "add_cli_arguments",
    "build_lr_scheduler",
    "build_optimizer",
    "build_pruner",
    "checkpoint_path",
    "default_run_dir",
    "distributed_context",
    "evaluate",
    "init_distributed",
    "load_checkpoint",
    "lr_factor",
    "resolve_device",
    "resume_config",
    "run_cli",
    "save_checkpoint",
    "train",
]

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "feather-sparse-checkpoint"
CHECKPOINT_VERSION = 1
RUN_FORMAT = "feather-sparse-run"

#: Config fields a resumed run may change: they move the run, not its numbers.
RESUME_FREE_FIELDS = frozenset(
    {
        "device",
        "threads",
        "data_dir",
        "num_workers",
        "eval_batch_size",
        "eval_every",
        "tensorboard",
        "recipe",
    }
)

#: Where runs go when no run folder is given: ``runs/<recipe>-<method>-s<S>-<time>``.
DEFAULT_RUNS_ROOT = Path("runs")

#: Without a progress bar, log an in-epoch line at most this often (seconds).
LOG_INTERVAL_S = 30.0

#: Refresh the bar's loss/accuracy (a host sync) this many times per epoch.
BAR_REFRESHES_PER_EPOCH = 20

#: Called at the end of every epoch, after the evaluation and before the
#: checkpoint, with (epochs completed, model, pruner or None, that epoch's
#: metrics). Keys a callback adds to the metrics go to ``metrics.jsonl``.
EpochCallback = Callable[[int, nn.Module, Any, dict[str, Any]], None]


# ============================================================ distributed plumbing
@dataclass(frozen=True)
class DistContext:
    """This process's place among data-parallel processes (1 process without DDP)."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Only the main process writes files and logs."""
        return self.rank == 0


def distributed_context() -> DistContext:
    """Rank and world size from ``torch.distributed`` when it is initialised.

    The single place the training loop learns about other processes; the
    DDP launcher initialises the process group before calling :func:`train`.
    """
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size())
    return DistContext()


def _all_reduce_sum(tensor: Tensor, ctx: DistContext) -> Tensor:
    """Sum over processes (evaluation counts); the identity with one process."""
    if ctx.world_size > 1:
        torch.distributed.all_reduce(tensor)
    return tensor


def _barrier(ctx: DistContext) -> None:
    """Wait for every process (after rank 0 wrote a checkpoint); nothing with one process."""
    if ctx.world_size > 1:
        torch.distributed.barrier()


def _sync_buffers(model: nn.Module, ctx: DistContext) -> None:
    """Rank 0's buffers (BatchNorm statistics) on every rank, as DDP does before a forward.

    Each rank's last training forward updated its running statistics from its
    own batch; evaluating with rank 0's makes every rank evaluate the model
    that rank 0 checkpoints.
    """
    if ctx.world_size > 1:
        for buf in model.buffers():
            torch.distributed.broadcast(buf, src=0)


def init_distributed(device: str = "auto") -> bool:
    """Join the process group described by ``torchrun``'s environment, if any.

    Does nothing with one process (``WORLD_SIZE`` unset or 1) or when a group
    exists already. The backend is ``nccl`` when ``device`` resolves to CUDA
    (each process then uses GPU ``LOCAL_RANK``), else ``gloo``.

    Returns:
        Whether this call initialised the group (the caller then destroys it).
    """
    dist = torch.distributed
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    cuda = resolve_device(device).type == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    return True


# ====================================================================== methods
#: The sparsification methods ``build_pruner`` knows (``config.method``): the
#: registry of :mod:`feather_sparse.baselines`.
SUPPORTED_METHODS = tuple(METHODS.names())

#: Config fields a method other than ``feather`` decides itself unless the run
#: sets them (GMP fixes the operator, Spartan its schedule, ...).
_METHOD_FIELDS = ("operator", "p", "theta", "backbone")
_SCHEDULE_FIELDS = ("schedule", "schedule_start", "schedule_end")


#: Extension point: more named sparsifiers, ``builder(config, model, total_steps) -> pruner``,
#: consulted before :data:`~feather_sparse.baselines.METHODS` (the experiments register
#: their variants here: Feather on the GMP and ASL+ backbones, ASL+ alone).
PRUNER_BUILDERS: Registry[Callable[[TrainConfig, nn.Module, int], Any]] = Registry("method")


def _check_method(config: TrainConfig) -> None:
    if config.dense or config.method in SUPPORTED_METHODS or config.method in PRUNER_BUILDERS:
        return
    names = sorted({*SUPPORTED_METHODS, *PRUNER_BUILDERS.names()})
    raise ValueError(f"method: unknown method {config.method!r}; choose one of: {', '.join(names)}")


def build_pruner(config: TrainConfig, model: nn.Module, total_steps: int) -> Any | None:
    """The sparsifier a config asks for, attached to ``model``; ``None`` when dense.

    The one place that turns a config into a pruner. For ``feather``, the
    paper's method, the config's sparsity options map one to one onto the
    :class:`~feather_sparse.pruner.Pruner`'s arguments. The other methods
    (:data:`~feather_sparse.baselines.METHODS`: hard, soft, nonste, gmp, st3,
    spartan) set their own operator, θ, backbone and schedule: those fields
    left at their defaults are the method's to decide; one set to another
    value is passed on, and the method refuses a value that contradicts it
    (``--method st3 --backbone global-flops`` is ST-3σ; ``--method gmp
    --operator soft`` is an error).
    What is returned has the ``Pruner`` interface: ``step``, ``report``,
    ``finalize``, ``state_dict``, ``dense_state_dict``, ...

    Raises:
        ValueError: for an unknown method (naming the field and the choices),
            or a field that contradicts the method.
    """
    if config.dense:
        return None
    _check_method(config)
    if config.method in PRUNER_BUILDERS:
        return PRUNER_BUILDERS.get(config.method)(config, model, total_steps)
    chosen: dict[str, Any] = {name: getattr(config, name) for name in _METHOD_FIELDS}
    schedule: dict[str, Any] | None = {
        "name": config.schedule,
        "start": config.schedule_start,
        "end": config.schedule_end,
    }
    if config.method != "feather":
        default = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
        chosen = {k: v for k, v in chosen.items() if v != default[k]}
        if all(getattr(config, k) == default[k] for k in _SCHEDULE_FIELDS):
            schedule = None  # the method's own schedule (Spartan's linear ramp)
    if schedule is not None:
        chosen["schedule"] = schedule
    return make_pruner(
        model,
        config.method,
        sparsity=config.sparsity,
        total_steps=total_steps,
        theta_rule=config.theta_rule,
        update_every=config.update_every,
        exclude=config.exclude,
        max_layer_sparsity=config.max_layer_sparsity,
        **chosen,
    )


# ================================================================= optimisation
def _param_groups(
    model: nn.Module, pruner: Any | None, weight_decay: float, pruner_lr: float | None = None
) -> list[dict[str, Any]]:
    """Weight decay on weights only: norm parameters and biases are 1-D and get none.

    The paper's CIFAR recipe (and its released code) exempts BatchNorm
    parameters and biases; every such parameter is a vector, so the rule is
    ``ndim <= 1``. A pruner's own parameters (ASL+ thresholds) get no decay,
    and ``pruner_lr`` as their learning rate when given.
    """
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    seen: set[int] = set()
    for param in model.parameters():
        if not param.requires_grad or id(param) in seen:
            continue
        seen.add(id(param))
        (no_decay if param.ndim <= 1 else decay).append(param)
    extra = [p for p in (pruner.parameters() if pruner is not None else []) if id(p) not in seen]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
        {"params": extra, "weight_decay": 0.0} | ({} if pruner_lr is None else {"lr": pruner_lr}),
    ]
    return [g for g in groups if g["params"]]


def build_optimizer(
    config: TrainConfig, model: nn.Module, pruner: Any | None = None
) -> torch.optim.Optimizer:
    """SGD (momentum, optional Nesterov) or AdamW (β1 = momentum) over the model and pruner."""
    # ASL trains its thresholds at lr/100 (ASL_LR_SCALE).
    groups = _param_groups(model, pruner, config.weight_decay, config.lr * ASL_LR_SCALE)
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            groups, lr=config.lr, momentum=config.momentum, nesterov=config.nesterov
        )
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.momentum, 0.999))


def lr_factor(
    step: int,
    *,
    total_steps: int,
    warmup_steps: int = 0,
    schedule: str = "cosine",
    min_ratio: float = 0.0,
) -> float:
    """The learning rate at ``step`` as a fraction of the peak rate.

    Phases (every iteration, as in the paper's code):

    1. warm-up, ``step < warmup_steps``: linear, ``(step + 1) / warmup_steps``;
    2. ``"cosine"``: from 1 down to ``min_ratio`` over the remaining steps,
       ``min_ratio + (1 - min_ratio)·(1 + cos(π·progress))/2``;
       ``"constant"``: 1.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_lr_scheduler(
    config: TrainConfig, optimizer: torch.optim.Optimizer, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` stepped every iteration with :func:`lr_factor`."""
    total = config.epochs * steps_per_epoch
    warmup = round(config.warmup_epochs * steps_per_epoch)
    min_ratio = config.min_lr / config.lr

    def factor(step: int) -> float:
        return lr_factor(
            step,
            total_steps=total,
            warmup_steps=warmup,
            schedule=config.lr_schedule,
            min_ratio=min_ratio,
        )

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# ======================================================================= device
def resolve_device(name: str) -> torch.device:
    """``"auto"`` is CUDA when available, else CPU; anything else must exist.

    Raises:
        ValueError: when CUDA (or MPS) is asked for but not available.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: CUDA is not available here; use --device cpu or auto")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(
            f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) present"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r}: MPS is not available here; use --device cpu or auto")
    return device


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


# ================================================================== checkpoints
def _rng_state() -> dict[str, Any]:
    """Every global RNG state, in types that ``torch.load(weights_only=True)`` reads."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, cached],
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if state["cuda"] and torch.cuda.is_available():
        if len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])
        else:
            logger.warning(
                "checkpoint holds RNG states of %d CUDA devices, %d present: not restored",
                len(state["cuda"]),
                torch.cuda.device_count(),
            )


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def checkpoint_path(run_dir: str | os.PathLike[str]) -> Path:
    """``RUN_DIR/checkpoints/last.pt``."""
    return Path(run_dir) / "checkpoints" / "last.pt"


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``state`` with ``torch.save`` so that ``path`` is always a whole checkpoint.

    The bytes go to a temporary file in the same folder, are flushed to disk,
    and the file is renamed over ``path`` (``os.replace`` is atomic on one file
    system): until the rename, the previous checkpoint stays in place, so a
    crash mid-write leaves it untouched. The temporary file is removed on an
    exception; one left by a killed process is removed by the next save.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp_name, 0o666 & ~_umask())  # mkstemp makes it private (0600)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a killed process
        stale.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # persist the rename itself (POSIX; best effort)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a training checkpoint (tensors on the CPU).

    ``path`` may be the file or the run folder holding ``checkpoints/last.pt``.

    Raises:
        FileNotFoundError: when there is no checkpoint.
        ValueError: when the file is unreadable or not a training checkpoint.
    """
    path = Path(path)
    if path.is_dir():
        path = checkpoint_path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no checkpoint at {path}: a run folder to resume holds checkpoints/last.pt, "
            "written at the end of every epoch"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(f"checkpoint {path} is unreadable ({type(err).__name__}: {err})") from err
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a feather-sparse training checkpoint")
    return state


# ====================================================================== run dir
def default_run_dir(config: TrainConfig, root: str | os.PathLike[str] = DEFAULT_RUNS_ROOT) -> Path:
    """``root/<recipe>-<method>-s<sparsity>-<YYYYmmdd-HHMMSS>`` (method ``dense`` when dense)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    sparsity = "0" if config.dense else f"{config.sparsity:g}"
    base = Path(root) / f"{config.recipe}-{config.run_method}-s{sparsity}-{stamp}"
    candidate, n = base, 1
    while candidate.exists():  # two runs started in the same second
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def _jsonable(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` through a JSON round trip (odd values become strings)."""
    out: dict[str, Any] = json.loads(json.dumps(payload, default=str))
    return out


def _write_json(path: Path, payload: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    os.replace(tmp, path)


# ===================================================================== progress
class _Progress:
    """A per-epoch tqdm bar on a terminal; otherwise an occasional log line."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self.total = total
        self.desc = desc
        self.bar: Any = None
        self.last_log = time.monotonic()
        if enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(
                    total=total, desc=desc, leave=False, dynamic_ncols=True, file=sys.stderr
                )

    def update(self, done: int, stats: dict[str, str] | None) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if stats is not None:
                self.bar.set_postfix(stats, refresh=False)
        elif stats is not None and time.monotonic() - self.last_log >= LOG_INTERVAL_S:
            self.last_log = time.monotonic()
            text = " ".join(f"{k} {v}" for k, v in stats.items())
            logger.info("%s step %d/%d %s", self.desc, done, self.total, text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _use_bar(progress: bool | None) -> bool:
    if progress is not None:
        return progress
    return sys.stderr.isatty()


# =================================================================== evaluation
@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Any,
    *,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    ctx: DistContext | None = None,
) -> tuple[float, float]:
    """Mean cross-entropy and top-1 accuracy of ``model`` over ``loader``.

    Parametrized (pruned) weights are computed once for the whole pass, and
    the sums are added over processes when there are several.
    """
    ctx = ctx or DistContext()
    model.eval()
    device = next(model.parameters()).device
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    with parametrize.cached():
        for x, y in loader:
            with autocast() if autocast is not None else contextlib.nullcontext():
                out = model(x)
            totals[0] += F.cross_entropy(out.float(), y, reduction="sum")
            totals[1] += (out.argmax(dim=1) == y).sum()
            totals[2] += y.numel()
    loss_sum, correct, count = _all_reduce_sum(totals, ctx).tolist()
    if count == 0:
        raise ValueError("the test loader yielded no samples")
    return loss_sum / count, correct / count


def _threshold_value(pruner: Any) -> float:
    """One number for the bar: the global threshold (the mean over layers otherwise)."""
    thresholds = pruner.thresholds()
    device = thresholds[0].device
    values = [t.detach().double().reshape(()).to(device) for t in thresholds]
    return float(torch.stack(values).mean())  # one host sync


def _dense_table(model: nn.Module) -> str:
    """A per-layer table of the dense model's prunable-type weights (for ``--dense``)."""
    lines = ["| layer | shape | params | sparsity |", "|---|---|---:|---:|"]
    total = zeros = 0
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, DEFAULT_INCLUDE) or not isinstance(weight, Tensor):
            continue
        n, z = weight.numel(), int((weight == 0).sum())
        total, zeros = total + n, zeros + z
        shape = "×".join(map(str, weight.shape))
        lines.append(f"| {name} | {shape} | {n:,} | {z / n:.2%} |")
    lines.append(f"| **total** | | {total:,} | {zeros / max(1, total):.2%} |")
    return "\n".join(lines)


# ======================================================================= result
@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` hands back.

    Attributes:
        run_dir: the run folder.
        config: the config the run used.
        model: the trained model; after a completed run the weights hold
            ``P_T(w)`` (exact zeros) and no parametrization is attached.
        completed: False when stopped early (``stop_after_epoch``); the run
            can be resumed then, and nothing was finalized or exported.
        epochs: epochs completed.
        steps: optimizer steps completed.
        test_accuracy: top-1 accuracy of the final (finalized) model, or of the
            last epoch when not completed.
        test_loss: its mean cross-entropy.
        sparsity: fraction of zeros among the prunable weights (0 when dense).
        target_sparsity: the requested sparsity (0 when dense).
        report: the Pruner's per-layer report before finalizing (None when dense).
        table: the per-layer table printed at the end (Markdown).
        model_path: the saved model (``model.fsp`` or ``model.pt``), if any.
        wall_time: seconds spent in this call.
        history: the per-epoch metrics of this and earlier sessions.
    """

    run_dir: Path
    config: TrainConfig
    model: nn.Module
    completed: bool
    epochs: int
    steps: int
    test_accuracy: float
    test_loss: float
    sparsity: float
    target_sparsity: float
    report: PrunerReport | None
    table: str
    model_path: Path | None
    wall_time: float
    history: list[dict[str, Any]] = field(default_factory=list)


# ===================================================================== the loop
@contextlib.contextmanager
def _run_logging(run_dir: Path | None) -> Iterator[None]:
    """Send the package's log records (INFO and up) to ``RUN_DIR/train.log`` for the run."""
    pkg = logging.getLogger("feather_sparse")
    old_level = pkg.level
    if pkg.getEffectiveLevel() > logging.INFO:
        pkg.setLevel(logging.INFO)
    handler: logging.Handler | None = None
    if run_dir is not None:
        handler = logging.FileHandler(run_dir / "train.log", encoding="utf-8")
        handler.setLevel(logging.INFO)
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        )
        pkg.addHandler(handler)
    try:
        yield
    except BaseException as err:
        if handler is not None:  # the console shows the error; the file keeps it too
            handler.handle(
                logger.makeRecord(
                    logger.name, logging.ERROR, __file__, 0, "run failed: %r", (err,), None
                )
            )
        raise
    finally:
        if handler is not None:
            pkg.removeHandler(handler)
            handler.close()
        pkg.setLevel(old_level)


def _tensorboard(run_dir: Path, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.debug("tensorboard is not installed: no TensorBoard logs")
        return None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))


def _check_resume(config: TrainConfig, saved: TrainConfig) -> None:
    """Refuse a resume whose config contradicts the checkpoint's, naming the fields."""
    diff = {k: v for k, v in saved.diff(config).items() if k not in RESUME_FREE_FIELDS}
    if diff:
        parts = [f"{k}={old!r} in the checkpoint but {new!r} now" for k, (old, new) in diff.items()]
        raise ValueError(
            "cannot resume: the config contradicts the checkpoint: "
            + "; ".join(parts)
            + " (drop these overrides, or start a new run)"
        )


def _trim_metrics(path: Path, epochs_done: int) -> list[dict[str, Any]]:
    """Keep the per-epoch lines up to the checkpoint (a crash may have left later ones)."""
    if not path.is_file():
        return []
    kept = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if not row.get("final") and int(row.get("epoch", 0)) <= epochs_done:
            kept.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return kept


def _export_unavailable() -> str | None:
    """Why the compressed ``model.fsp`` cannot be written here, or None if it can."""
    try:
        import feather_sparse.export  # noqa: F401
    except ImportError as err:
        return f"feather_sparse.export does not import ({err})"
    if importlib.util.find_spec("safetensors") is None:
        return "safetensors is not installed (pip install 'feather-sparse[export]')"
    return None


def _save_model(
    model: nn.Module, spec: dict[str, Any], run_dir: Path, metadata: dict[str, Any]
) -> Path:
    """``model.fsp`` (compressed, ``feather_sparse.export``), else a plain ``model.pt``.

    A missing optional dependency at the end of a long run must not lose the
    model: it is saved uncompressed instead, with a warning.
    """
    reason = _export_unavailable()
    if reason is None:
        from feather_sparse.export import save_sparse

        path = run_dir / "model.fsp"
        try:
            save_sparse(model, path, metadata=metadata)
            return path
        except (ImportError, ValueError, RuntimeError) as err:
            reason = f"save_sparse failed ({err})"
    logger.warning("%s: saving the plain state_dict as model.pt instead of model.fsp", reason)
    path = run_dir / "model.pt"
    torch.save(
        {"format": "feather-sparse-model", "model": spec, "state_dict": model.state_dict()}, path
    )
    return path


@dataclass
class _Session:
    """Everything one training session works with (built by ``_setup``)."""

    config: TrainConfig
    run_dir: Path
    ctx: DistContext
    device: torch.device
    bundle: Any
    model: nn.Module
    forward_model: nn.Module  # `model`, or its DistributedDataParallel wrapper
    spec: dict[str, Any]
    pruner: Any | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    amp_dtype: torch.dtype
    steps_per_epoch: int
    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps completed
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def metrics_file(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Mixed precision when the config asks for it (CUDA only), else a no-op."""
        return torch.autocast(
            device_type=self.device.type, dtype=self.amp_dtype, enabled=self.config.amp
        )


def _setup(
    config: TrainConfig,
    run_dir: Path,
    *,
    device: torch.device,
    ctx: DistContext,
    checkpoint: dict[str, Any] | None,
    load_dataset: Callable[..., Any],
    create_model: Callable[..., nn.Module],
) -> _Session:
    """Seed, load the data, build model, pruner, optimizer, LR schedule; restore a checkpoint."""
    _seed_everything(config.seed)
    if config.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = not config.deterministic

    bundle = load_dataset(
        config.dataset,
        data_dir=config.data_dir,
        batch_size=config.batch_size,
        eval_batch_size=config.eval_batch_size,
        device=device,
        seed=config.seed,
        rank=ctx.rank,
        world_size=ctx.world_size,
        num_workers=config.num_workers,
        **config.data_options,
    )
    model = create_model(config.model, num_classes=bundle.num_classes, **config.model_kwargs)
    fallback_spec = {"name": config.model, "kwargs": {"num_classes": bundle.num_classes}}
    spec = dict(getattr(model, "feather_model_spec", fallback_spec))
    model.to(device)
    if checkpoint is not None:
        # The checkpoint holds plain (dense) keys: load them before attaching the Pruner.
        model.load_state_dict(checkpoint["model"])
    steps_per_epoch = len(bundle.train)
    pruner = build_pruner(config, model, config.epochs * steps_per_epoch)
    if checkpoint is not None and pruner is not None:
        if checkpoint["pruner"] is None:
            raise ValueError("cannot resume: the checkpoint is of a dense run")
        pruner.load_state_dict(checkpoint["pruner"])
    # The Pruner keeps the bare module; training runs through the DDP wrapper.
    forward_model: nn.Module = model
    if ctx.world_size > 1:
        forward_model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    optimizer = build_optimizer(config, model, pruner)
    amp_dtype = torch.bfloat16 if config.amp_dtype == "bfloat16" else torch.float16
    session = _Session(
        config=config,
        run_dir=run_dir,
        ctx=ctx,
        device=device,
        bundle=bundle,
        model=model,
        forward_model=forward_model,
        spec=spec,
        pruner=pruner,
        optimizer=optimizer,
        scheduler=build_lr_scheduler(config, optimizer, steps_per_epoch),
        # float16 needs loss scaling; bfloat16 has float32's range and does not.
        scaler=torch.amp.GradScaler(
            "cuda", enabled=config.amp and amp_dtype == torch.float16 and device.type == "cuda"
        ),
        amp_dtype=amp_dtype,
        steps_per_epoch=steps_per_epoch,
    )
    if checkpoint is not None:
        _restore(session, checkpoint)
    return session


def _restore(session: _Session, checkpoint: dict[str, Any]) -> None:
    """Optimizer, LR schedule, loss scaler, counters and RNG states from a checkpoint."""
    session.optimizer.load_state_dict(checkpoint["optimizer"])
    session.scheduler.load_state_dict(checkpoint["lr_scheduler"])
    if checkpoint.get("scaler"):
        session.scaler.load_state_dict(checkpoint["scaler"])
    session.epoch, session.step = int(checkpoint["epoch"]), int(checkpoint["step"])
    if session.step != session.epoch * session.steps_per_epoch:
        raise ValueError(
            f"cannot resume: the checkpoint is at step {session.step} after {session.epoch} "
            f"epochs, but an epoch now has {session.steps_per_epoch} steps "
            "(did the data set change?)"
        )
    _set_rng_state(checkpoint["rng"])
    if session.ctx.is_main:
        session.history = _trim_metrics(session.metrics_file, session.epoch)
    logger.info(
        "resuming %s after epoch %d (step %d)", session.run_dir, session.epoch, session.step
    )


def _write_run_info(s: _Session) -> None:
    """``config.json``: the resolved config, the model spec, data facts and the Pruner's config."""
    bundle = s.bundle
    _write_json(
        s.run_dir / "config.json",
        {
            "format": RUN_FORMAT,
            "version": __version__,
            "torch": torch.__version__,
            "config": s.config.to_dict(s.spec),
            "model": s.spec,
            "data": {
                "name": bundle.name,
                "num_classes": bundle.num_classes,
                "input_shape": list(bundle.input_shape),
                "train_size": bundle.train_size,
                "test_size": bundle.test_size,
            },
            "pruner": s.pruner.config() if s.pruner is not None else None,
            "device": str(s.device),
            "world_size": s.ctx.world_size,
            "steps_per_epoch": s.steps_per_epoch,
            "total_steps": s.config.epochs * s.steps_per_epoch,
        },
    )


def _train_epoch(s: _Session, progress: bool) -> tuple[float, float]:
    """One pass over the training data; returns its mean loss and accuracy."""
    config, pruner = s.config, s.pruner
    s.bundle.train.set_epoch(s.epoch)
    s.model.train()
    params = [p for group in s.optimizer.param_groups for p in group["params"]]
    refresh = max(1, s.steps_per_epoch // BAR_REFRESHES_PER_EPOCH)
    stats = torch.zeros(3, dtype=torch.float64, device=s.device)  # loss sum, correct, samples
    bar = _Progress(s.steps_per_epoch, f"epoch {s.epoch + 1}/{config.epochs}", progress)
    try:
        for i, (x, y) in enumerate(s.bundle.train):
            with s.autocast():
                out = s.forward_model(x)
                loss = F.cross_entropy(out, y, label_smoothing=config.label_smoothing)
            # The backbone's extra loss term (ASL+'s sparsity loss; 0 for global).
            total = loss if pruner is None else loss + pruner.regularizer()
            s.optimizer.zero_grad(set_to_none=True)
            s.scaler.scale(total).backward()
            if config.grad_clip is not None:
                s.scaler.unscale_(s.optimizer)
                torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
            s.scaler.step(s.optimizer)
            s.scaler.update()
            s.scheduler.step()
            if pruner is not None:
                pruner.step()  # new thresholds from the updated weights
            s.step += 1
            with torch.no_grad():
                stats[0] += loss.detach().double() * y.numel()
                stats[1] += (out.argmax(dim=1) == y).sum()
                stats[2] += y.numel()
            shown = None
            if (i + 1) % refresh == 0 or i + 1 == s.steps_per_epoch:  # one host sync
                loss_sum, correct, seen = stats.tolist()
                shown = {"loss": f"{loss_sum / seen:.4f}", "acc": f"{correct / seen:.2%}"}
                if pruner is not None:
                    shown["sparsity"] = f"{pruner.scheduled_sparsity():.3f}"
                    shown["thr"] = f"{_threshold_value(pruner):.3g}"
            bar.update(i + 1, shown)
    finally:
        bar.close()
    loss_sum, correct, seen = _all_reduce_sum(stats, s.ctx).tolist()
    return loss_sum / seen, correct / seen


def _checkpoint_state(s: _Session, metrics: dict[str, Any]) -> dict[str, Any]:
    """What ``checkpoints/last.pt`` holds after ``s.epoch`` epochs."""
    pruner = s.pruner
    return {
        "format": CHECKPOINT_FORMAT,
        "checkpoint_version": CHECKPOINT_VERSION,
        "version": __version__,
        "epoch": s.epoch,
        "step": s.step,
        # The model entry is the spec {"name", "kwargs"}: enough to rebuild it.
        "config": s.config.to_dict(s.spec),
        # Plain keys, loadable into the freshly created dense model.
        "model": pruner.dense_state_dict() if pruner is not None else s.model.state_dict(),
        "pruner": pruner.state_dict() if pruner is not None else None,
        "optimizer": s.optimizer.state_dict(),
        "lr_scheduler": s.scheduler.state_dict(),
        "scaler": s.scaler.state_dict() if s.scaler.is_enabled() else None,
        "rng": _rng_state(),
        "metrics": metrics,
    }


def _test_due(config: TrainConfig, epoch: int, end_epoch: int) -> bool:
    """Whether the model is tested after ``epoch``: every ``eval_every`` epochs and
    after the last; with ``eval_every=0`` only where training stops early (the
    final model is always tested by :func:`_finish`)."""
    every = config.eval_every
    if every and (epoch % every == 0 or epoch == config.epochs):
        return True
    return epoch == end_epoch < config.epochs


def _log_epoch(row: dict[str, Any], epochs: int) -> None:
    test = (
        f"test loss {row['test_loss']:.4f} acc {100 * row['test_acc']:.2f}%"
        if "test_acc" in row
        else "test -"
    )
    logger.info(
        "epoch %d/%d  train loss %.4f acc %.2f%%  %s  sparsity %.4f  thr %.4g  lr %.4g  %.1fs",
        row["epoch"],
        epochs,
        row["train_loss"],
        100 * row["train_acc"],
        test,
        row["sparsity"],
        row["threshold"],
        row["lr"],
        row["epoch_time"],
    )


def _finish(s: _Session, writer: Any, started: float) -> TrainResult:
    """Finalize the Pruner, evaluate the plain model, write the report and the model."""
    config, pruner = s.config, s.pruner
    report: PrunerReport | None = None
    if pruner is not None:
        pruner.update(pruner.sparsity)  # the thresholds finalize() bakes, for the report
        report = pruner.report()
        sparsity = pruner.finalize()
        table = report.table()
    else:
        sparsity = 0.0
        table = _dense_table(s.model)
    target = 0.0 if config.dense else config.sparsity
    _sync_buffers(s.model, s.ctx)
    test_loss, test_acc = evaluate(s.model, s.bundle.test, autocast=s.autocast, ctx=s.ctx)
    model_path: Path | None = None
    if s.ctx.is_main:
        final = {
            "final": True,
            "epoch": s.epoch,
            "step": s.step,
            "test_loss": test_loss,
            "test_acc": test_acc,
            "sparsity": sparsity,
            "target_sparsity": target,
        }
        with s.metrics_file.open("a") as f:
            f.write(json.dumps(final) + "\n")
        title = "dense" if config.dense else f"{config.method}, target sparsity {target:g}"
        (s.run_dir / "report.md").write_text(
            f"# {config.recipe}: {config.model} on {config.dataset} ({title})\n\n"
            f"- final test accuracy: {test_acc:.2%} (loss {test_loss:.4f})\n"
            f"- achieved sparsity: {sparsity:.2%} of the prunable weights\n"
            f"- epochs: {s.epoch}, steps: {s.step}\n\n"
            f"{table}\n"
        )
        metadata = {
            "source": "feather-sparse train",
            "epoch": s.epoch,
            "step": s.step,
            "test_accuracy": test_acc,
            "sparsity": sparsity,
            "config": config.to_dict(s.spec),
        }
        model_path = _save_model(s.model, s.spec, s.run_dir, _jsonable(metadata))
        if writer is not None:
            writer.add_scalar("final/test_acc", test_acc, s.epoch)
            writer.add_scalar("final/sparsity", sparsity, s.epoch)
    _barrier(s.ctx)
    logger.info(
        "final: test accuracy %.2f%%, sparsity %.4f (target %.4g)", 100 * test_acc, sparsity, target
    )
    return TrainResult(
        run_dir=s.run_dir,
        config=config,
        model=s.model,
        completed=True,
        epochs=s.epoch,
        steps=s.step,
        test_accuracy=test_acc,
        test_loss=test_loss,
        sparsity=sparsity,
        target_sparsity=target,
        report=report,
        table=table,
        model_path=model_path,
        wall_time=time.perf_counter() - started,
        history=s.history,
    )


def _train(
    config: TrainConfig,
    run_dir: Path,
    *,
    device: torch.device,
    ctx: DistContext,
    checkpoint: dict[str, Any] | None,
    stop_after_epoch: int | None,
    callbacks: Sequence[EpochCallback],
    progress: bool,
    started: float,
    load_dataset: Callable[..., Any],
    create_model: Callable[..., nn.Module],
) -> TrainResult:
    s = _setup(
        config,
        run_dir,
        device=device,
        ctx=ctx,
        checkpoint=checkpoint,
        load_dataset=load_dataset,
        create_model=create_model,
    )
    if ctx.is_main:
        _write_run_info(s)
        reason = _export_unavailable()
        if reason is not None:
            logger.warning("%s: the model will be saved as model.pt, not model.fsp", reason)
    n_params = sum(p.numel() for p in s.model.parameters())
    logger.info(
        "%s: %s (%s params) on %s (%d train / %d test), %d epochs × %d steps, %s, device %s",
        run_dir,
        config.model,
        f"{n_params:,}",
        config.dataset,
        s.bundle.train_size,
        s.bundle.test_size,
        config.epochs,
        s.steps_per_epoch,
        "dense" if s.pruner is None else f"{config.method} to sparsity {config.sparsity:g}",
        device,
    )
    end_epoch = config.epochs if stop_after_epoch is None else min(config.epochs, stop_after_epoch)
    writer = _tensorboard(run_dir, config.tensorboard) if ctx.is_main else None
    try:
        while s.epoch < end_epoch:
            epoch_start = time.perf_counter()
            train_loss, train_acc = _train_epoch(s, progress)
            s.epoch += 1
            _sync_buffers(s.model, ctx)
            pruner = s.pruner
            row: dict[str, Any] = {
                "epoch": s.epoch,
                "step": s.step,
                "lr": s.optimizer.param_groups[0]["lr"],
                "train_loss": train_loss,
                "train_acc": train_acc,
            }
            if _test_due(config, s.epoch, end_epoch):
                test_loss, test_acc = evaluate(s.model, s.bundle.test, autocast=s.autocast, ctx=ctx)
                row.update(test_loss=test_loss, test_acc=test_acc)
            row |= {
                "sparsity": pruner.sparsity_achieved() if pruner is not None else 0.0,
                "scheduled_sparsity": pruner.scheduled_sparsity() if pruner is not None else 0.0,
                "threshold": _threshold_value(pruner) if pruner is not None else 0.0,
                "epoch_time": time.perf_counter() - epoch_start,
            }
            # Callbacks run before the checkpoint, so that what they change
            # (weights, RNG draws, keys added to `row`) is saved and resumed.
            for callback in callbacks:
                callback(s.epoch, s.model, s.pruner, row)
            s.history.append(row)
            _log_epoch(row, config.epochs)
            if ctx.is_main:
                save_checkpoint(_checkpoint_state(s, row), checkpoint_path(run_dir))
                with s.metrics_file.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                if writer is not None:
                    for key, value in row.items():
                        if key not in ("epoch", "step") and isinstance(value, (int, float)):
                            writer.add_scalar(key, value, s.epoch)
                    writer.flush()
            _barrier(ctx)  # nobody runs ahead of (or resumes from) a half-written checkpoint

        if s.epoch < config.epochs:
            logger.info("stopped after epoch %d of %d (resumable)", s.epoch, config.epochs)
            last = s.history[-1] if s.history else {}
            return TrainResult(
                run_dir=run_dir,
                config=config,
                model=s.model,
                completed=False,
                epochs=s.epoch,
                steps=s.step,
                test_accuracy=last.get("test_acc", float("nan")),
                test_loss=last.get("test_loss", float("nan")),
                sparsity=s.pruner.sparsity_achieved() if s.pruner is not None else 0.0,
                target_sparsity=0.0 if config.dense else config.sparsity,
                report=None,
                table="",
                model_path=None,
                wall_time=time.perf_counter() - started,
                history=s.history,
            )
        return _finish(s, writer, started)
    finally:
        if writer is not None:
            writer.close()


def train(
    config: TrainConfig,
    run_dir: str | os.PathLike[str] | None = None,
    *,
    resume: bool = False,
    stop_after_epoch: int | None = None,
    callbacks: Sequence[EpochCallback] = (),
    progress: bool | None = None,
) -> TrainResult:
    """Train ``config``'s model on its data set, pruning with its method.

    Args:
        config: the run's settings (``feather_sparse.recipes.load_config``).
        run_dir: the run folder; default ``runs/<recipe>-<method>-s<S>-<time>``.
        resume: continue the run in ``run_dir`` from its last checkpoint. The
            config must agree with the checkpoint's except for
            ``RESUME_FREE_FIELDS`` (device, data_dir, ...).
        stop_after_epoch: stop once this many epochs are done (checkpointed,
            not finalized), to be resumed later.
        callbacks: called at every epoch end, see ``EpochCallback``.
        progress: show a tqdm bar per epoch; default: when stderr is a terminal.

    Returns:
        The trained model and its numbers; see :class:`TrainResult`.

    Raises:
        ValueError: for an unknown model/data set/method, a resume that
            contradicts the checkpoint, a fresh run into a folder that already
            holds one, or a bad device.
        FileNotFoundError: for missing data or a missing checkpoint.
    """
    from feather_sparse.data import DATASETS, load_dataset
    from feather_sparse.models import create_model, model_info

    started = time.perf_counter()
    ctx = distributed_context()

    # --- check everything cheap before any work -------------------------------
    try:
        model_info(config.model)
    except ValueError as err:
        raise ValueError(f"model: {err}") from None
    if config.model_kwargs.get("num_classes") is not None:
        raise ValueError("model_kwargs: num_classes comes from the data set; do not set it")
    if config.dataset not in DATASETS:
        raise ValueError(
            f"dataset: unknown dataset {config.dataset!r}; choose one of: "
            f"{', '.join(DATASETS.names())}"
        )
    _check_method(config)
    if stop_after_epoch is not None and stop_after_epoch < 1:
        raise ValueError(f"stop_after_epoch must be >= 1, got {stop_after_epoch}")
    device = resolve_device(config.device)
    if ctx.world_size > 1 and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())  # this rank's GPU
    if config.amp and device.type != "cuda":
        raise ValueError(f"amp: mixed precision needs a CUDA device, this run uses {device}")

    if run_dir is None:
        if resume:
            raise ValueError("resume needs the run folder to continue")
        run_dir = default_run_dir(config)
        if ctx.world_size > 1:  # the time stamp of rank 0's clock, on every rank
            names = [str(run_dir)]
            torch.distributed.broadcast_object_list(names, src=0)
            run_dir = names[0]
    run_path = Path(run_dir)
    ckpt_file = checkpoint_path(run_path)
    checkpoint: dict[str, Any] | None = None
    if resume:
        checkpoint = load_checkpoint(ckpt_file)
        _check_resume(config, TrainConfig.from_dict(checkpoint["config"]))
    elif ckpt_file.exists():
        raise ValueError(
            f"{run_path} already holds a run (checkpoints/last.pt); resume it with "
            "--resume, or choose another --run-dir"
        )
    created = not run_path.exists()
    if ctx.is_main:
        run_path.mkdir(parents=True, exist_ok=True)

    threads = torch.get_num_threads()
    if config.threads is not None:
        # Small models train fastest on one thread; kernels of a few thousand
        # elements lose more to thread hand-offs than they gain.
        torch.set_num_threads(config.threads)
    try:
        with _run_logging(run_path if ctx.is_main else None):
            return _train(
                config,
                run_path,
                device=device,
                ctx=ctx,
                checkpoint=checkpoint,
                stop_after_epoch=stop_after_epoch,
                callbacks=callbacks,
                progress=_use_bar(progress) and ctx.is_main,
                started=started,
                load_dataset=load_dataset,
                create_model=create_model,
            )
    except BaseException:
        # A run that failed before its first checkpoint (bad data path, ...)
        # leaves no half-made folder behind when this call created it.
        if created and ctx.is_main and not ckpt_file.exists():
            shutil.rmtree(run_path, ignore_errors=True)
        raise
    finally:
        torch.set_num_threads(threads)


def resume_config(
    run_dir: str | os.PathLike[str], overrides: dict[str, Any] | None = None
) -> TrainConfig:
    """The config saved in ``run_dir``'s checkpoint, with ``overrides`` applied.

    Raises:
        FileNotFoundError: when the folder holds no checkpoint.
        ValueError: for an unknown field or bad value in ``overrides``.
    """
    saved = TrainConfig.from_dict(load_checkpoint(run_dir)["config"])
    return saved.replace(**(overrides or {}))


# ========================================================================== CLI
def add_cli_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    """``feather-sparse train``: a recipe, then any field overridden by a flag of its name."""
    parser.description = (
        "Train a model with Feather sparsity (the paper's method) or dense. With no arguments: "
        f"the {DEFAULT_RECIPE!r} recipe. Every recipe field has a flag (--epochs 5, "
        "--sparsity 0.98, ...) and can also be set with --set field=value."
    )
    run = parser.add_argument_group("run")
    run.add_argument(
        "--recipe",
        default=None,
        help=f"bundled recipe ({', '.join(list_recipes())}) or a .toml path [{DEFAULT_RECIPE}]",
    )
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override any recipe field (repeatable), e.g. --set exclude=fc,conv1",
    )
    run.add_argument(
        "--run-dir", default=None, help="run folder [runs/<recipe>-<method>-s<S>-<time>]"
    )
    run.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue this run")
    run.add_argument(
        "--stop-after-epoch",
        type=int,
        default=None,
        metavar="K",
        help="stop (checkpointed, resumable) once K epochs are done",
    )
    run.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar per epoch [on when stderr is a terminal]",
    )
    run.add_argument(
        "--print-config", action="store_true", help="print the resolved config and exit"
    )
    fields = parser.add_argument_group(
        "recipe fields", "each overrides the recipe's value (see --print-config)"
    )
    for f in config_fields():
        if f.name == "recipe":
            continue  # chosen with --recipe
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        if f.type in ("bool", bool):
            fields.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        else:
            fields.add_argument(
                flag,
                dest=f.name,
                default=None,
                metavar=f.name.split("_")[-1].upper(),
                help=help_text,
            )


def _cli_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for text in args.set:
        key, value = parse_override(text)
        overrides[key] = value
    for f in config_fields():
        flag_value = getattr(args, f.name, None)
        if f.name != "recipe" and flag_value is not None:
            overrides[f.name] = flag_value
    return overrides


@contextlib.contextmanager
def _console_logging(verbose: int, quiet: bool = False) -> Iterator[None]:
    """Show the package's INFO lines (epoch summaries) on stderr, without prefixes.

    ``quiet`` (the non-zero ranks of a distributed run) shows warnings and errors only.
    """
    pkg = logging.getLogger("feather_sparse")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_ConsoleFormatter())
    if quiet:
        handler.setLevel(logging.WARNING)
    old = (pkg.level, pkg.propagate)
    pkg.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO)
    pkg.propagate = False
    pkg.addHandler(handler)
    try:
        yield
    finally:
        pkg.removeHandler(handler)
        pkg.setLevel(old[0])
        pkg.propagate = old[1]


class _ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            return f"{record.levelname.lower()}: {message}"
        return message


def run_cli(command: str, args: argparse.Namespace) -> int:
    """Run ``feather-sparse train``; prints the per-layer table and the final numbers."""
    overrides = _cli_overrides(args)
    resume_dir = args.resume
    if resume_dir is not None:
        if args.run_dir is not None and Path(args.run_dir) != Path(resume_dir):
            raise ValueError("--resume RUN_DIR already names the run folder; drop --run-dir")
        if args.recipe is not None:
            config = load_config(args.recipe, overrides)
        else:
            config = resume_config(resume_dir, overrides)
        run_dir: str | None = resume_dir
    else:
        config = load_config(args.recipe or DEFAULT_RECIPE, overrides)
        run_dir = args.run_dir
    if args.print_config:
        for key, value in config.to_dict().items():
            print(f"{key} = {json.dumps(value)}")
        return 0

    initialised = init_distributed(config.device)  # under torchrun: join the group
    try:
        main = distributed_context().is_main
        with _console_logging(getattr(args, "verbose", 0), quiet=not main):
            result = train(
                config,
                run_dir,
                resume=resume_dir is not None,
                stop_after_epoch=args.stop_after_epoch,
                progress=args.progress,
            )
        if initialised:
            # Leave together: a rank that tears gloo down while another still
            # finishes its last collective aborts the process (seen under load).
            # Not in `finally`: after a failure on one rank the others must not wait.
            torch.distributed.barrier()
    finally:
        if initialised:
            torch.distributed.destroy_process_group()
    if not main:  # rank 0 prints the results
        return 0
    if not result.completed:
        print(
            f"stopped after epoch {result.epochs}/{config.epochs}: test accuracy "
            f"{result.test_accuracy:.2%}; continue with: "
            f"feather-sparse train --resume {result.run_dir}"
        )
        return 0
    print()
    print(result.table)
    print()
    target = "dense" if config.dense else f"target {config.sparsity:.2%}"
    print(f"final test accuracy: {result.test_accuracy:.2%}")
    print(f"achieved sparsity:   {result.sparsity:.2%} ({target})")
    print(f"run folder:          {result.run_dir}")
    if result.model_path is not None:
        print(f"model:               {result.model_path}")
    print(f"wall time:           {result.wall_time:.1f} s")
    return 0
