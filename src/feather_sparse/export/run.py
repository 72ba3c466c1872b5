"""The model to export, from a run folder, a training checkpoint or a ``.fsp`` file.

What ``feather-sparse export`` reads, without the command line: find the file
in a run folder, tell a ``.fsp`` from a training checkpoint by its first bytes,
and rebuild the model with its pruning baked in. A ``.fsp`` that names no
model (no model spec) is written again from its tensors alone
(:func:`reencode_sparse`): a weight format needs no architecture.

Export means what the run is: a finished run is finalized at its target
sparsity (what ``model.fsp`` holds); a run that stopped early keeps the
thresholds its forward uses at that point (the schedule's current sparsity),
never the final target unless one is asked for explicitly.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from torch import nn

from feather_sparse import models
from feather_sparse.export.files import check_writable, sniff
from feather_sparse.export.fsp import (
    inspect_sparse,
    load_sparse,
    load_sparse_state_dict,
    save_sparse,
)
from feather_sparse.export.header import SparseFileInfo, _describe_spec
from feather_sparse.integrity import IntegrityError, first_line
from feather_sparse.nm import NMBackbone
from feather_sparse.pruner import Pruner
from feather_sparse.run_files import (
    CHECKPOINTS_DIR,
    LAST_NAME,
    MODEL_NAME,
    PREVIOUS_NAME,
    checkpoint_path,
    load_checkpoint,
    previous_checkpoint_path,
    read_latest_checkpoint,
)

__all__ = [
    "ExportSource",
    "NoModelSpecError",
    "PatternSparsityError",
    "load_export_source",
    "reencode_sparse",
    "resolve_source",
    "source_paths",
]

logger = logging.getLogger(__name__)


def resolve_source(source: Path) -> Path:
    """The file to export from a run folder or a file path.

    Args:
        source: a training run folder, or a checkpoint or model file.

    Raises:
        FileNotFoundError: if ``source`` does not exist, or is a folder with neither
            a last checkpoint nor a model file.
    """
    if source.is_dir():
        last = checkpoint_path(source)
        for candidate in (last, source / MODEL_NAME, previous_checkpoint_path(last)):
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(
            f"{source} is not a training run folder: "
            f"neither {CHECKPOINTS_DIR}/{LAST_NAME} nor {MODEL_NAME} exists"
        )
    if not source.is_file():
        raise FileNotFoundError(f"{source} does not exist")
    return source


def source_paths(source: Path) -> list[Path]:
    """What an export of ``source`` reads, and so must never write over.

    The file :func:`resolve_source` picks and, for a training run (a run
    folder, or its ``checkpoints/last.pt`` or ``prev.pt``), the run's
    ``checkpoints`` folder: a resume, and an export that falls back from a
    damaged ``last.pt``, read what is there. For a run folder, its final
    model ``model.fsp`` too, when there: an export of the run reads it in
    place of a damaged ``last.pt``.

    Args:
        source: a training run folder, or a checkpoint or model file.

    Raises:
        FileNotFoundError: as :func:`resolve_source`.
    """
    source = Path(source)
    path = resolve_source(source)
    folder = checkpoint_path(source).parent if source.is_dir() else path.parent
    in_run = source.is_dir() or path.name in (LAST_NAME, PREVIOUS_NAME)
    if in_run and folder.name == CHECKPOINTS_DIR and folder.is_dir():
        final = source / MODEL_NAME
        return [folder, path, final] if source.is_dir() and final.is_file() else [folder, path]
    return [path]


@dataclass(frozen=True)
class ExportSource:
    """A model ready to export, and what its user should know about it.

    Attributes:
        model: the model in eval mode, pruning baked in (plain exact zeros).
        metadata: JSON-able facts to store in the ``.fsp`` header.
        path: the file it was read from.
        epoch: epochs the run had done (``None`` when unknown).
        epochs: epochs the run was planned for (``None`` when unknown).
        finished: whether the run had finished (a ``.fsp`` always has).
        progress: where the run stopped, for people: ``"epoch 3 of 20"`` (or
            ``"step 40 of 400"`` when the epochs are unknown).
        baked: which thresholds were baked: ``"target"`` (finished run, its
            target sparsity), ``"current"`` (unfinished run, the thresholds
            in use), ``"requested"`` (an explicit sparsity), or ``None`` (no
            Pruner to bake: a dense run or a ``.fsp``).
        sparsity: fraction of zeros in the pruned weights after baking
            (``None`` when nothing was baked).
        target: the run's final target sparsity (``None`` without a Pruner).
        warning: one line the user must see, or ``None``.
        values: the precision to store its non-zeros at unless told otherwise:
            a ``.fsp``'s own (at fp32 a re-export of an fp16 file would only
            grow), ``"fp32"`` (lossless) for a training checkpoint.
    """

    model: nn.Module
    metadata: dict[str, Any]
    path: Path
    epoch: int | None = None
    epochs: int | None = None
    finished: bool = True
    progress: str | None = None
    baked: Literal["target", "current", "requested"] | None = None
    sparsity: float | None = None
    target: float | None = None
    warning: str | None = None
    values: str = "fp32"


def _check_training_checkpoint(path: Path, ckpt: dict[str, Any]) -> None:
    if "model" not in ckpt or "config" not in ckpt:
        raise ValueError(f"{path} is not a feather-sparse training checkpoint (no model/config)")


def _optional_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _from_training_checkpoint(
    path: Path, ckpt: dict[str, Any], sparsity: float | None, fallback: str | None = None
) -> ExportSource:
    """Rebuild the model of a verified training checkpoint and bake its pruning in.

    ``fallback`` says why ``last.pt`` was passed over when ``path`` is ``prev.pt``.
    """
    _check_training_checkpoint(path, ckpt)
    config = ckpt["config"] or {}
    spec = config.get("model")
    if not isinstance(spec, dict) or "name" not in spec:
        raise ValueError(f"{path}: its config has no model entry {{'name', 'kwargs'}}")
    state = ckpt.get("pruner")
    if state is None and sparsity is not None:
        raise ValueError(
            f"{path} is a dense run (no Pruner): a sparsity can only be chosen for a sparse run"
        )
    epoch, epochs = _optional_int(ckpt.get("epoch")), _optional_int(config.get("epochs"))
    progress = None
    if epoch is not None and epochs is not None:
        finished, progress = epoch >= epochs, f"epoch {epoch} of {epochs}"
    elif state is not None:  # no epoch count: the Pruner's own step count says
        try:
            step, total = int(state["step"]), int(state["config"]["total_steps"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: its Pruner state is damaged (no step count)") from None
        finished, progress = step >= total, f"step {step} of {total}"
    else:
        finished = True  # nothing says otherwise

    model = models.create_model(str(spec["name"]), **dict(spec.get("kwargs") or {}))
    try:
        model.load_state_dict(ckpt["model"], strict=True)
    except RuntimeError as err:  # torch lists every key on many lines
        raise ValueError(
            f"{path}: its weights do not fit its model spec ({first_line(err)})"
        ) from None

    baked: Literal["target", "current", "requested"] | None = None
    achieved = target = None
    warning = None
    if state is not None:
        try:
            pruner = Pruner.from_state_dict(model, state)
        except (KeyError, TypeError) as err:
            raise ValueError(f"{path}: its Pruner state is damaged ({err!r})") from None
        target = float(pruner.sparsity)
        if sparsity is not None:
            _check_pattern_sparsity(path, pruner, sparsity)
            trained = f"trained at sparsity {pruner.sparsity_achieved():.4f}"
            if progress is not None:
                trained += f" to {progress}"
            baked, achieved = "requested", pruner.finalize(sparsity)
            pattern = pruner.backbone.pattern if isinstance(pruner.backbone, NMBackbone) else None
            if pattern is not None:
                # The pattern fixes the sparsity (checked above, within its tolerance): it is
                # the run's target, so only an unfinished run was not trained for it.
                sparsity = target
            if not finished or sparsity != target:
                warning = (
                    f"exported at sparsity {sparsity:g}, but the weights were not trained for it "
                    f"(target {target:g}; {trained}); check the accuracy before using it"
                    if pattern is None
                    # (an unfinished N:M run may not even have reached its pattern yet)
                    else f"exported at the {pattern} pattern's sparsity {target:g}, but the run "
                    f"has not finished ({trained}); check the accuracy before using it"
                )
        elif finished:
            # finalize() recomputes T at the target and writes P_T(w): what model.fsp holds.
            baked, achieved = "target", pruner.finalize()
        else:
            # The thresholds the forward uses now, baked as they are: the model
            # is exported as it stands, not pruned further than it was trained.
            baked, achieved = "current", pruner.sparsity_achieved()
            pruned = pruner.dense_state_dict(pruned=True)
            pruner.remove()
            model.load_state_dict(pruned, strict=True)
    metadata: dict[str, Any] = {
        "source": str(path),
        "epoch": ckpt.get("epoch"),
        "step": ckpt.get("step"),
        "finished": finished,
        "baked": baked,
        "sparsity": achieved,
        "config": ckpt["config"],
    }
    try:
        json.dumps(metadata)
    except (TypeError, ValueError):
        metadata["config"] = None
    if fallback is not None:
        previous = f"{fallback}; exported the previous checkpoint {path} ({progress or 'as saved'})"
        warning = previous if warning is None else f"{previous}; {warning}"
    return ExportSource(
        model=model.eval(),
        metadata=metadata,
        path=path,
        epoch=epoch,
        epochs=epochs,
        finished=finished,
        progress=progress,
        baked=baked,
        sparsity=achieved,
        target=target,
        warning=warning,
    )


class PatternSparsityError(ValueError):
    """An N:M run asked to be exported at another sparsity than its pattern's.

    Attributes:
        reason: what is wrong, without the remedy (which depends on how the
            sparsity was given: ``sparsity=`` here, ``--sparsity`` on the
            command line).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason}; export it at its pattern's sparsity (sparsity=None)")
        self.reason = reason


def _check_pattern_sparsity(path: Path, pruner: Pruner, sparsity: float) -> None:
    """Raise :class:`PatternSparsityError` for an N:M ``pruner`` and another sparsity than its own.

    Checked before anything is baked: ``finalize`` would refuse it in terms
    of its own arguments.
    """
    backbone = pruner.backbone
    if not isinstance(backbone, NMBackbone):
        return
    pattern = backbone.pattern
    if not math.isclose(sparsity, pattern.sparsity, abs_tol=1e-9):
        raise PatternSparsityError(
            f"{path} was pruned to the {pattern} N:M pattern, which sets its sparsity to "
            f"{pattern.sparsity:g}: it cannot be exported at sparsity {sparsity:g}"
        )


#: Why a ``.fsp`` without a model spec cannot give back its model (what it lacks, and why).
NO_ARCHITECTURE = (
    "holds no model architecture (no create_model spec: it was saved from a model "
    "feather-sparse did not build, or one changed since)"
)


class NoModelSpecError(ValueError):
    """A ``.fsp`` that names no model (no ``create_model`` spec), so none can be rebuilt.

    Its tensors can still be written again without one (:func:`reencode_sparse`);
    what needs the model itself (ONNX) needs it loaded in Python.

    Attributes:
        path: the file.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(
            f"{path} {NO_ARCHITECTURE}, so the model cannot be "
            "rebuilt from the file alone; in Python, load it into the model it was saved "
            "from: feather_sparse.load_sparse(path, model), then save_sparse(model, ...) or "
            "export_onnx(model, ...); feather_sparse.export.reencode_sparse(path, output) "
            "writes its tensors again without the model"
        )
        self.path = path


def _has_spec(info: SparseFileInfo) -> bool:
    return bool(info.model_spec and "name" in info.model_spec)


def reencode_sparse(
    source: str | os.PathLike[str], output: str | os.PathLike[str], *, values: str | None = None
) -> SparseFileInfo:
    """Write the tensors of a ``.fsp`` that names no model to ``output``, as a ``.fsp`` again.

    What ``feather-sparse export x.fsp -o y.fsp`` does for a file without a
    model spec (:class:`NoModelSpecError`): a weight format needs no
    architecture. Each tensor is decoded and handed to :func:`save_sparse`,
    which chooses its encoding anew, so an N:M weight keeps its ``nm+lzma``
    encoding, and at the file's own precision (the default) or ``"fp32"``
    every tensor comes back bit for bit in its own dtype (a file this
    version wrote is written again byte for byte at its own precision). The
    header's metadata is kept; the write is atomic.

    Args:
        source: a ``.fsp`` without a model spec.
        output: the file to write; never ``source`` itself, nor a safetensors
            file another program wrote.
        values: precision of the stored non-zeros, as for :func:`save_sparse`;
            default: the source file's own.

    Returns:
        The description of the written file.

    Raises:
        FileExistsError: ``output`` is ``source``, or a file of another kind
            (a training checkpoint, a Hugging Face ``model.safetensors``);
            both are left as they are.
        ValueError: ``source`` is not a readable ``.fsp``, or has a model
            spec: export it with :func:`load_export_source`, which rebuilds
            the model and keeps the spec (writing its tensors alone would drop it).
    """
    path, target = Path(source), Path(output)
    check_writable(output, reads=[path])  # the name as given: "out/" names a folder
    info = inspect_sparse(path)  # the header alone: a file with a spec is refused before decoding
    if _has_spec(info):
        raise ValueError(
            f"{path} has a model spec ({_describe_spec(info.model_spec)}), which writing its "
            "tensors alone would drop; export it with load_export_source (as feather-sparse "
            "export does), which rebuilds the model and keeps the spec"
        )
    state, info = load_sparse_state_dict(path)
    return save_sparse(state, target, values=values or info.values, metadata=info.metadata)


def _from_sparse_file(path: Path, warning: str | None = None) -> ExportSource:
    """The model a ``.fsp`` rebuilds (read whole: each tensor's checksum is verified)."""
    info = inspect_sparse(path)
    if not _has_spec(info):
        raise NoModelSpecError(path)
    model = load_sparse(path)
    source = ExportSource(
        model=model.eval(), metadata=dict(info.metadata), path=path, values=info.values
    )
    return source if warning is None else dataclasses.replace(source, warning=warning)


def _step_of(value: Any) -> int | None:
    return _optional_int(value.get("step")) if isinstance(value, dict) else None


def _from_run_checkpoints(run: Path, sparsity: float | None) -> ExportSource:
    """The model of a run folder whose ``last.pt`` is there (intact or not).

    An intact ``last.pt`` is exported. A damaged one is passed over for the
    run's final model, ``model.fsp``, when the run wrote one (it finished) and
    no checkpoint is newer than it, and that file is intact; else for
    ``prev.pt``, as a resume would. ``model.fsp`` is finalized already: with
    ``sparsity`` it cannot serve, and an error points to it instead.
    """
    final = run / MODEL_NAME
    try:
        latest = read_latest_checkpoint(run)
    except IntegrityError as err:  # no intact checkpoint left
        if not final.is_file():
            raise
        if sparsity is not None:
            raise IntegrityError(
                f"{err}; the run's final model {final} is intact only as a finished model: "
                f"export it without a sparsity (feather-sparse export {final})"
            ) from err
        problem = str(err.__cause__ if err.__cause__ is not None else err)
        try:
            return _from_sparse_file(final, _final_instead(final, problem))
        except ValueError as damaged:
            raise IntegrityError(
                f"{err}; and the run's final model {final} cannot be read either "
                f"({first_line(damaged)})"
            ) from None
    if latest.problem is None or sparsity is not None or not final.is_file():
        return _from_training_checkpoint(latest.path, latest.state, sparsity, latest.problem)
    try:
        info = inspect_sparse(final)
        saved, newest = _step_of(info.metadata), _step_of(latest.state)
        if saved is None or newest is None or saved >= newest:  # not older than prev.pt
            return _from_sparse_file(final, _final_instead(final, latest.problem))
        passed_over = f"{final} is older (step {saved}, the checkpoint's {newest})"
    except NoModelSpecError:
        passed_over = f"{final} holds no model spec"
    except ValueError as damaged:
        passed_over = f"{final} is damaged too ({first_line(damaged)})"
    return _from_training_checkpoint(
        latest.path, latest.state, sparsity, f"{latest.problem}; {passed_over}"
    )


def _final_instead(final: Path, problem: str) -> str:
    """The warning of an export that took the run's ``model.fsp`` for a damaged ``last.pt``."""
    return (
        f"{problem}; exported the run's final model {final} instead (written when the run "
        "finished, and verified intact)"
    )


def _check_sparsity(sparsity: float | None) -> None:
    if sparsity is not None and not 0.0 <= sparsity < 1.0:
        raise ValueError(f"the sparsity to export at must be in [0, 1), got {sparsity}")


def load_export_source(source: Path, sparsity: float | None = None) -> ExportSource:
    """The model to export from a run folder, a ``.fsp`` or a training checkpoint.

    A training checkpoint is verified against its SHA-256 first
    (:func:`feather_sparse.run_files.load_checkpoint`): a damaged one is
    refused, never exported. Given a run folder, a damaged ``last.pt`` falls
    back to the run's final model ``model.fsp`` when the run finished (and no
    checkpoint is newer than that file, which is verified intact), else to
    ``prev.pt``; :attr:`ExportSource.warning` says which, and why.

    A finished run is finalized at its target sparsity. A run that stopped
    early is exported with the thresholds its forward uses at that point (the
    schedule's current sparsity): :attr:`ExportSource.finished` is ``False``
    and :attr:`ExportSource.sparsity` says what it reached.

    Args:
        source: a run folder, a ``.fsp`` file or a training checkpoint (see
            :func:`resolve_source`).
        sparsity: finalize a training checkpoint at this sparsity instead;
            :attr:`ExportSource.warning` says so when the weights were not
            trained for it (an unfinished run, or another sparsity than the
            target).

    Raises:
        FileNotFoundError: if ``source`` does not exist or is a folder without a run.
        ValueError: if ``source`` is neither kind of file, is damaged
            (:class:`~feather_sparse.integrity.IntegrityError`), is a ``.fsp``
            without a model spec (:class:`NoModelSpecError`: nothing to
            rebuild the model from; :func:`reencode_sparse` writes its
            tensors again without it), or
            ``sparsity`` does not apply to it (:class:`PatternSparsityError`
            for an N:M run and another sparsity than its pattern's).
    """
    source = Path(source)
    path = resolve_source(source)
    if source.is_dir() and path.parent == checkpoint_path(source).parent:
        # A run's checkpoint, whatever its first bytes: a damaged last.pt falls back.
        _check_sparsity(sparsity)
        return _from_run_checkpoints(source, sparsity)
    kind = sniff(path)
    if kind == "zip":
        _check_sparsity(sparsity)
        return _from_training_checkpoint(path, load_checkpoint(path), sparsity)
    if kind == "safetensors":
        if sparsity is not None:
            raise ValueError(
                f"{path} is a finalized sparse checkpoint: a sparsity can only be chosen "
                "when exporting a training checkpoint"
            )
        return _from_sparse_file(path)
    raise ValueError(
        f"{path} is not a feather-sparse file: neither a sparse checkpoint (.fsp) nor a "
        "training checkpoint (.pt); it is damaged or another kind of file"
    )
