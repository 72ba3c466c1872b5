"""The training loop behind ``feather-sparse train``: recipes in, a pruned model out.

Each step is the paper's recipe: forward through ``P_T(w)``, cross-entropy,
backward (straight-through, pruned-weight gradients scaled by θ), optional
gradient-norm clipping, SGD step, LR schedule step (per iteration), then
``pruner.step()`` recomputes the thresholds at the scheduled sparsity. At the
end ``pruner.finalize()`` bakes ``P_T(w)`` into the weights.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from feather_sparse import _text, models, run_lock
from feather_sparse.data import DATASETS, check_dataset_options, load_dataset
from feather_sparse.integrity import DiskFullError, first_line
from feather_sparse.methods import check_layers, check_method
from feather_sparse.models import check_model_kwargs, create_model, model_info
from feather_sparse.pruner import PrunerReport
from feather_sparse.recipes import TrainConfig
from feather_sparse.run_files import (
    CHECKPOINTS_DIR,
    MODEL_NAME,
    PLAIN_MODEL_NAME,
    LatestCheckpoint,
    _fall_back,
    read_latest_checkpoint,
)
from feather_sparse.train.checkpoint import (
    _check_resume,
    _check_resume_folder,
    _check_same_run,
    _random_state_kept,
    checkpoint_path,
    load_checkpoint,
    save_checkpoint,
)
from feather_sparse.train.dist import (
    DistContext,
    _all_reduce_sum,
    _barrier,
    _sync_buffers,
    distributed_context,
    resolve_device,
)
from feather_sparse.train.progress import (
    BAR_REFRESHES_PER_EPOCH,
    _dense_table,
    _log_epoch,
    _Progress,
    _threshold_label,
    _threshold_value,
    _use_bar,
)
from feather_sparse.train.result import (
    ProcessLost,
    TrainingInterrupted,
    TrainResult,
    resume_command,
)
from feather_sparse.train.run_dir import (
    RUN_FORMAT,
    _export_unavailable,
    _finished_run,
    _jsonable,
    _prepare,
    _report_table,
    _run_logging,
    _save_model,
    _tensorboard,
    default_run_dir,
    read_run_info,
)
from feather_sparse.train.session import _checkpoint_state, _Session, _setup, _write_run_info

logger = logging.getLogger(__name__)

#: Called at the end of every epoch, after the evaluation and before the
#: checkpoint, with (epochs completed, model, pruner or None, that epoch's
#: metrics). Keys a callback adds to the metrics go to ``metrics.jsonl``.
EpochCallback = Callable[[int, nn.Module, Any, dict[str, Any]], None]


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

    Args:
        model: the model to test (put in eval mode).
        loader: yields ``(inputs, targets)`` batches on the model's device.
        autocast: makes the context each forward pass runs in (mixed
            precision); ``None``: none.
        ctx: this process's place among data-parallel processes; ``None``:
            one process.

    Returns:
        ``(mean loss, accuracy)`` over all the samples of every process.

    Raises:
        ValueError: when the loader yields no samples.
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


# ===================================================================== the loop
def _save(s: _Session, row: dict[str, Any]) -> None:
    """Checkpoint the session (the one before kept as ``prev.pt``); a full disk says so."""
    path = checkpoint_path(s.run_dir)
    try:
        save_checkpoint(_checkpoint_state(s, row), path, keep_previous=True)
    except DiskFullError as err:
        if s.saved_epoch is None:
            kept = "no checkpoint was written yet; free some space and start the run again"
        else:
            kept = (
                f"the previous checkpoint (epoch {s.saved_epoch}) is intact; free some space, "
                "then continue with: "
                f"{resume_command(s.run_dir, s.ctx.world_size, s.ctx.local_world_size)}"
            )
        raise DiskFullError(
            f"the disk is full: the checkpoint of epoch {s.epoch} could not be written to "
            f"{path}; {kept}"
        ) from err
    s.saved_epoch = s.epoch


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
            # The forward and backward on P_T(w) put into the weights where that
            # gives the same gradients (θ = 1; see feather_sparse.swap), else as usual.
            with contextlib.nullcontext() if pruner is None else pruner.swapped():
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
                    shown[_threshold_label(pruner)] = f"{_threshold_value(pruner):.3g}"
            bar.update(i + 1, shown)
    finally:
        bar.close()
    loss_sum, correct, seen = _all_reduce_sum(stats, s.ctx).tolist()
    return loss_sum / seen, correct / seen


def _test_due(config: TrainConfig, epoch: int, end_epoch: int) -> bool:
    """Whether the model is tested after ``epoch``: every ``eval_every`` epochs and
    after the last; with ``eval_every=0`` only where training stops early (the
    final model is always tested by :func:`_finish`)."""
    every = config.eval_every
    if every and (epoch % every == 0 or epoch == config.epochs):
        return True
    return epoch == end_epoch < config.epochs


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
            logger.warning(
                "%s: the model will be saved as %s, not %s", reason, PLAIN_MODEL_NAME, MODEL_NAME
            )
    n_params = sum(p.numel() for p in s.model.parameters())
    logger.info(
        "%s: %s (%s params) on %s (%d train / %d test), %s × %s, %s, device %s",
        run_dir,
        config.model,
        f"{n_params:,}",
        config.dataset,
        s.bundle.train_size,
        s.bundle.test_size,
        _text.count(config.epochs, "epoch"),
        _text.count(s.steps_per_epoch, "step"),
        "dense" if s.pruner is None else f"{config.method} to sparsity {config.sparsity:g}",
        device,
    )
    if s.init is not None and s.epoch == 0:
        logger.info("%s: starting from the weights of %s", run_dir, s.init["path"])
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
            _log_epoch(row, config.epochs, _threshold_label(s.pruner))
            if ctx.is_main:
                _save(s, row)
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
    except KeyboardInterrupt as err:
        if isinstance(err, TrainingInterrupted):
            raise
        raise TrainingInterrupted(
            run_dir,
            s.epoch,
            s.step,
            config.epochs,
            _saved_epoch(s, run_dir),
            ctx.world_size,
            ctx.local_world_size,
        ) from None
    except Exception as err:
        saved = _saved_epoch(s, run_dir)
        if ctx.world_size > 1 and _lost_contact(err):
            raise ProcessLost(
                _backend_words(first_line(err)),
                run_dir,
                s.epoch,
                s.step,
                config.epochs,
                saved,
                ctx.world_size,
                ctx.local_world_size,
            ) from err
        if saved is not None and ctx.is_main and not isinstance(err, DiskFullError):
            # the work so far is kept: say how to go on (a full disk says so itself)
            logger.error(
                "training stopped by the error below; the last checkpoint holds epoch %d/%d: "
                "once its cause is fixed, continue with: %s",
                saved,
                config.epochs,
                resume_command(run_dir, ctx.world_size, ctx.local_world_size),
            )
        raise
    finally:
        if writer is not None:
            writer.close()


def _saved_epoch(s: _Session, run_dir: Path) -> int | None:
    """The epoch the newest checkpoint holds, when training stops abruptly.

    A stop may land after the checkpoint's rename but before the save
    returned: the file, not the counter, says what was saved.
    """
    saved = s.saved_epoch
    if saved != s.epoch and checkpoint_path(run_dir).is_file():
        with contextlib.suppress(Exception):
            saved = int(load_checkpoint(checkpoint_path(run_dir))["epoch"])
    return saved


#: What the collective backends say when another process of the run is gone.
_LOST_CONTACT = ("connection reset", "connection closed", "connection refused", "broken pipe")


def _backend_words(text: str) -> str:
    """A backend's message without its source location and its advice to the reader:
    ``[.../pair.cc:553] Connection closed by peer [::1]:13196. This is typically ...``
    gives ``Connection closed by peer [::1]:13196``."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)
    return text.split(". ", 1)[0].rstrip(".")


def _lost_contact(err: BaseException) -> bool:
    """Whether ``err`` says another process of the run stopped (killed, its node lost)."""
    text = str(err).lower()
    return isinstance(err, torch.distributed.DistError) or (
        isinstance(err, RuntimeError) and any(words in text for words in _LOST_CONTACT)
    )


def check_config(
    config: TrainConfig, *, stop_after_epoch: int | None = None, layers: bool = False
) -> None:
    """Every check of the run's settings that :func:`train` makes before any work.

    What a config alone decides, without data, a model or the machine: the
    model and data set are registered, ``model_kwargs`` leaves ``num_classes``
    to the data set, the names in ``model_kwargs`` and ``data_options`` are
    ones the model's factory and the data set take (their signatures: their
    values are checked when the model and the data are built), and the
    method accepts the pruning fields
    (:func:`~feather_sparse.methods.check_method`). ``feather-sparse train
    --print-config`` runs it too, so that it never prints a recipe that training
    refuses here. Whether the device exists (``--device cuda``, ``amp``) is
    checked by :func:`train` only: a recipe may be written on another machine
    than the one it runs on.

    Args:
        config: the run's settings.
        stop_after_epoch: as for :func:`train`.
        layers: also check what needs the model's layers (the ``include`` and
            ``exclude`` names, an N:M pattern's fit) on the model built on the
            meta device. ``--print-config`` asks for it; :func:`train` makes the
            same checks on the model it builds, and never runs the model's
            factory on the meta device (a factory that caches its model
            would hand the run a meta model).

    Raises:
        ValueError: naming the field, and the choices or the fix.
    """
    try:
        model_info(config.model)
    except ValueError as err:
        raise ValueError(f"model: {err}") from None
    if config.model_kwargs.get("num_classes") is not None:
        raise ValueError("model_kwargs: num_classes comes from the data set; do not set it")
    try:
        check_model_kwargs(config.model, **config.model_kwargs)
    except ValueError as err:
        raise ValueError(f"model_kwargs: {err}") from None
    if config.dataset not in DATASETS:
        raise ValueError(
            f"dataset: unknown dataset {config.dataset!r}; choose one of: "
            f"{', '.join(DATASETS.names())}"
        )
    try:
        check_dataset_options(config.dataset, **config.data_options)
    except ValueError as err:
        raise ValueError(f"data_options: {err}") from None
    check_method(config)
    if layers:
        _check_layers(config)
    if stop_after_epoch is not None and stop_after_epoch < 1:
        raise ValueError(f"stop_after_epoch must be >= 1, got {stop_after_epoch}")


#: The classes of the model built on the meta device for :func:`_check_layers`
#: (the data set's own number is known once it loads; no layer's name depends on it).
_CHECK_CLASSES = 10


def _check_layers(config: TrainConfig) -> None:
    """The checks that read the model's layers (``exclude`` names, an N:M pattern's fit),
    on the model built on the meta device: no memory, no initialisation.

    A model that cannot be built there (a factory that reads a file, say) is
    checked when the run builds it, by the same code.
    """
    if config.dense:
        return
    try:
        with torch.device("meta"):
            # the registry's own factory: not one a caller injected into train()
            model = models.create_model(
                config.model, num_classes=_CHECK_CLASSES, **config.model_kwargs
            )
    except Exception as err:  # any failure here is the real build's to report
        logger.debug("layer checks left to the run: %s on the meta device: %s", config.model, err)
        return
    check_layers(config, model)


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

    Resuming a run that has finished, with its saved model intact, writes
    nothing and returns that model and the run's final numbers. A damaged
    ``last.pt`` is set aside (``last.pt.damaged``) and the run resumes from
    ``prev.pt``, with one warning (also in ``train.log``). A resume is
    checked before anything in the folder changes.

    Raises:
        ValueError: for an unknown model/data set/method, a resume that
            contradicts the checkpoint, a checkpoint that belongs to another
            run than the folder's ``config.json``, a fresh run into a folder
            that already holds one or files a run would write over that
            no run wrote (a ``config.json`` or ``report.md`` of the user's),
            an empty ``run_dir``, a run folder that is a file (for a
            resume: a checkpoint given instead of its run folder), or a bad
            device.
        IntegrityError: (a ``ValueError``) when no intact checkpoint is left.
        FileNotFoundError: for missing data or a missing checkpoint.
        NotWritableError: (an ``OSError``) when the run folder cannot be written.
        DiskFullError: (an ``OSError``) when the disk fills up while saving a
            checkpoint; the previous one is intact.
        TrainingInterrupted: (a ``KeyboardInterrupt``) on Ctrl-C, saying
            where the run stopped and how to continue it.
    """
    started = time.perf_counter()
    ctx = distributed_context()

    # --- check everything cheap before any work -------------------------------
    check_config(config, stop_after_epoch=stop_after_epoch)
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
    if not str(run_dir).strip():  # an unset shell variable: not "the current folder"
        raise ValueError(
            "the run folder is an empty path (an unset shell variable?); name the folder, "
            "e.g. --run-dir runs/NAME (a new run without --run-dir gets one under runs/)"
        )
    run_path = Path(run_dir)
    if resume:
        _check_resume_folder(run_path)
    if run_path.exists() and not run_path.is_dir():
        raise ValueError(
            f"run folder {run_path} is an existing file, not a folder; "
            "choose another --run-dir (a new or an existing folder)"
        )
    if resume and not run_path.is_dir():
        read_latest_checkpoint(run_path)  # raises: nothing to resume (and nothing is created)
    created = not run_path.exists()
    lock_file = run_path / run_lock.LOCK_NAME
    lock_existed = lock_file.exists()
    # One process per run folder (rank 0 writes for all ranks): a second
    # `train` into it, fresh or resumed, stops here with the holder's name.
    with _run_folder_lock(lock_file, f"run folder {run_path}", ctx):
        ckpt_file = checkpoint_path(run_path)
        try:
            return _train_locked(
                config,
                run_path,
                resume=resume,
                device=device,
                ctx=ctx,
                stop_after_epoch=stop_after_epoch,
                callbacks=callbacks,
                progress=progress,
                started=started,
                load_dataset=load_dataset,
                create_model=create_model,
            )
        except BaseException:
            # A run that failed before its first checkpoint (bad data path, ...)
            # leaves no half-made folder behind when this call created it.
            if ctx.is_main and not ckpt_file.exists():
                if created:
                    shutil.rmtree(run_path, ignore_errors=True)
                elif not lock_existed:  # e.g. `--resume` of a folder that holds no run
                    lock_file.unlink(missing_ok=True)
            raise


@contextlib.contextmanager
def _run_folder_lock(lock_file: Path, what: str, ctx: DistContext) -> Iterator[None]:
    """Rank 0 holds the run folder's lock; every rank learns whether it got it.

    A refusal reaches all ranks as the same :class:`~feather_sparse.run_lock.RunInUseError`,
    instead of leaving the other ranks waiting in a collective for rank 0.
    """
    with contextlib.ExitStack() as stack:
        refused: str | None = None
        if ctx.is_main:
            try:
                stack.enter_context(run_lock.hold(lock_file, what=what))
            except run_lock.RunInUseError as err:
                refused = str(err)
        if ctx.world_size > 1:
            box = [refused]
            torch.distributed.broadcast_object_list(box, src=0)
            refused = box[0]
        if refused is not None:
            raise run_lock.RunInUseError(refused)
        yield


def _train_locked(
    config: TrainConfig,
    run_path: Path,
    *,
    resume: bool,
    device: torch.device,
    ctx: DistContext,
    stop_after_epoch: int | None,
    callbacks: Sequence[EpochCallback],
    progress: bool | None,
    started: float,
    load_dataset: Callable[..., Any],
    create_model: Callable[..., nn.Module],
) -> TrainResult:
    """:func:`train` once the run folder is this process's: resume or start, then train."""
    checkpoint: dict[str, Any] | None = None
    latest: LatestCheckpoint | None = None
    if resume:
        finished = _finished_run(run_path)
        if finished is not None:
            recorded = _recorded_config(run_path)
            if recorded is not None:  # a finished run is read back only as it was trained
                try:
                    _check_resume(config, recorded)
                except ValueError as err:
                    raise ValueError(
                        f"{err}. {run_path} has finished: to train its model further (more "
                        "epochs, another sparsity), start a new run from its weights: "
                        f"feather-sparse train --init-from {run_path} --run-dir NEW_FOLDER ..."
                    ) from None
            return _finished_result(config, run_path, finished, started)
        # Every check before anything in the folder changes (a damaged last.pt
        # is set aside, config.json rewritten) only once they all pass.
        latest = read_latest_checkpoint(run_path)
        checkpoint = latest.state
        _check_resume(config, TrainConfig.from_record(checkpoint["config"]))
        _check_same_run(run_path, latest, _recorded_config(run_path))
        _check_world_size(run_path, ctx.world_size)
    else:
        held = _run_work(run_path)
        if held:
            raise ValueError(
                f"{run_path} already holds a run ({', '.join(held)}); resume it with "
                "--resume, or choose another --run-dir (or delete the folder to start over)"
            )
        foreign = _not_a_runs(run_path)
        if foreign:
            raise ValueError(
                f"{run_path} holds files that no run wrote and a run would write over "
                f"({', '.join(foreign)}); choose a new or empty --run-dir, or move them away"
            )
    if ctx.is_main:
        _prepare(run_path)

    # Settings of the whole process the run changes, given back when it ends: a
    # notebook's later work must not run on one thread or deterministic kernels,
    # nor draw its random numbers from where the run's seed left them.
    threads = torch.get_num_threads()
    deterministic = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    cudnn_benchmark = torch.backends.cudnn.benchmark
    if config.threads is not None:
        # Small models train fastest on one thread; kernels of a few thousand
        # elements lose more to thread hand-offs than they gain.
        torch.set_num_threads(config.threads)
    try:
        with _random_state_kept(), _run_logging(run_path if ctx.is_main else None):
            if latest is not None and latest.problem is not None and ctx.is_main:
                _fall_back(run_path, latest, set_aside=True)  # said once, and in train.log
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
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        torch.backends.cudnn.benchmark = cudnn_benchmark


def _run_work(run_path: Path) -> list[str]:
    """What of a run's work ``run_path`` holds (a checkpoint, epochs' metrics, a saved
    model): a new run must not write over any of it. Only a ``config.json`` and a log
    (a run that failed before its first epoch ended) are nothing to keep."""
    checkpoints = run_path / CHECKPOINTS_DIR
    held = [f"{CHECKPOINTS_DIR}/{f.name}" for f in sorted(checkpoints.glob("*.pt")) if f.is_file()]
    metrics = run_path / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        held.append(metrics.name)
    held += [n for n in (MODEL_NAME, PLAIN_MODEL_NAME) if (run_path / n).is_file()]
    return held


def _not_a_runs(run_path: Path) -> list[str]:
    """The files of ``run_path`` a new run would replace although no run wrote them.

    A run writes over ``config.json`` and ``report.md``; it appends to
    ``train.log`` and adds to ``tensorboard/`` (a non-empty ``metrics.jsonl`` is
    a run's work, see :func:`_run_work`). A run that failed before its first
    epoch leaves a ``config.json`` of its own (``"format": "feather-sparse-run"``)
    that a new run may replace; any other ``config.json`` (``--run-dir .`` in a
    project's folder, say) is the user's. ``report.md`` is written only once a
    run has worked, so it is never a leftover here.
    """
    found = [n for n in ("config.json", "report.md") if _occupied(run_path / n)]
    foreign = [n for n in found if n == "report.md" or not _is_run_record(run_path / "config.json")]
    for name in (CHECKPOINTS_DIR, MODEL_NAME, PLAIN_MODEL_NAME):
        path = run_path / name
        if path.exists() and path.is_dir() != (name == CHECKPOINTS_DIR):
            foreign.append(name)
    return foreign


def _occupied(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _is_run_record(path: Path) -> bool:
    """Whether ``path`` is a run's ``config.json`` (read as JSON, not checked further)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and data.get("format") == RUN_FORMAT


def _check_world_size(run_path: Path, world_size: int) -> None:
    """Refuse to resume a run with another number of processes than trained it: the
    global batch (processes × batch size), hence the steps per epoch, depend on it.

    Raises:
        ValueError: naming both numbers and the command that fits (on several
            nodes when the run recorded its processes per node; runs recorded
            before that get the one-node command).
    """
    try:
        info = read_run_info(run_path)
        recorded = int(info["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # no record to compare with: the step count check still guards the resume
    local = info.get("local_world_size")
    per_node = local if isinstance(local, int) and not isinstance(local, bool) else None
    if recorded != world_size:
        launch = resume_command(run_path, recorded, per_node) + (
            " (one process)" if recorded == 1 else ""
        )
        raise ValueError(
            f"cannot resume: {run_path} was trained by {_text.count(recorded, 'process')}, this is "
            f"{world_size}; the global batch and the steps per epoch depend on it: resume "
            f"with {launch}"
        )


def _recorded_config(run_path: Path) -> TrainConfig | None:
    """The config a run recorded in its ``config.json``; None when it cannot be read
    (its model is handed back anyway: that file is a description, not the run)."""
    try:
        return TrainConfig.from_record(read_run_info(run_path)["config"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        logger.warning("%s: config.json unreadable (%s); the config is not compared", run_path, err)
        return None


def _finished_result(
    config: TrainConfig,
    run_dir: Path,
    finished: tuple[nn.Module, Path, dict[str, Any], list[dict[str, Any]]],
    started: float,
) -> TrainResult:
    """The result of a run that had already finished, read back; nothing is written."""
    model, model_path, final, history = finished
    logger.info(
        "%s already finished (epoch %d/%d); its model %s is intact and kept as it is",
        run_dir,
        int(final.get("epoch", config.epochs)),
        config.epochs,
        model_path,
    )
    return TrainResult(
        run_dir=run_dir,
        config=config,
        model=model,
        completed=True,
        epochs=int(final.get("epoch", config.epochs)),
        steps=int(final.get("step", 0)),
        test_accuracy=float(final["test_acc"]),
        test_loss=float(final["test_loss"]),
        sparsity=float(final["sparsity"]),
        target_sparsity=float(final["target_sparsity"]),
        report=None,
        table=_report_table(run_dir),
        model_path=model_path,
        wall_time=time.perf_counter() - started,
        history=history,
    )
