"""What the framework callbacks share: building, stepping, saving and logging a Pruner.

The callbacks differ only in *when* the framework calls them; everything they
do to the :class:`~feather_sparse.Pruner` lives here, so the two frameworks
cannot drift apart.

Checkpoint keys. While a Pruner is attached, the model's ``state_dict`` lists
each pruned layer's stored dense weight under its plain key ``<layer>.weight``
(module :mod:`~feather_sparse.plain_keys`), so a framework checkpoint of the
model taken during training loads into the plain (dense) model the framework
builds when it resumes — the Hugging Face Trainer loads non-strictly, so a
mismatch would otherwise pass silently. The checkpointed model is then the
dense model that training continues from; the thresholds, step and schedule
position travel in the Pruner's own state.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from feather_sparse.backbones import Backbone, PruneTarget
from feather_sparse.pruner import Pruner
from feather_sparse.pruner_config import PrunerConfig

__all__ = ["DrivenCallback", "PrunerDriver", "pruner_keyword_arguments"]

logger = logging.getLogger(__name__)

# Supplied by the callback from the trainer, never by the user.
_FROM_TRAINER = ("model", "total_steps")

# The Pruner's arguments that are settings (all but the process group).
_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(PrunerConfig) if f.init)


def pruner_keyword_arguments() -> list[str]:
    """The :class:`~feather_sparse.Pruner` arguments a callback accepts (all but model, steps)."""
    names = inspect.signature(Pruner.__init__).parameters
    return [n for n in names if n not in ("self", *_FROM_TRAINER)]


def _check_kwargs(kwargs: Mapping[str, Any], owner: str) -> None:
    allowed = pruner_keyword_arguments()
    for key in kwargs:
        if key in _FROM_TRAINER:
            raise ValueError(f"{owner} takes {key} from the trainer; do not pass {key}=")
        if key not in allowed:
            raise ValueError(
                f"{owner} got an unknown argument {key!r}; the Pruner accepts: {', '.join(allowed)}"
            )


def _trainable_backbone_error(owner: str, backbone: str) -> ValueError:
    return ValueError(
        f"backbone {backbone!r} has trainable parameters and a regularizer, which {owner} "
        "cannot add to the trainer's optimizer and loss; use a hand-written loop (see the "
        "Pruner docs) or another backbone"
    )


def _trainable_backbone(config: PrunerConfig) -> str | None:
    """The name of ``config``'s backbone when it trains parameters of its own (ASL+'s
    thresholds), known before any model: a fresh one is set up on a one-layer probe.

    None when it has none, or when the probe cannot tell (a custom backbone that
    needs a real model, or an object already in use): :meth:`PrunerDriver.attach`
    checks again on the real model.
    """
    backbone = config.backbone
    if isinstance(backbone, Backbone) and hasattr(backbone, "targets"):
        return None  # set up already (attach refuses a backbone serving another Pruner)
    try:
        probe = (
            copy.deepcopy(backbone) if isinstance(backbone, Backbone) else config.make_backbone()
        )
        probe.setup([PruneTarget("probe", nn.Linear(4, 4))])
        trainable = bool(probe.parameters())
    except Exception:  # the check on the real model decides then
        return None
    return probe.name if trainable else None


def _check_resumable(owner: str, pruner: Pruner, state: Mapping[str, Any]) -> None:
    """Refuse a saved Pruner state whose settings differ from the callback's, with the
    callback's remedy (the Pruner's own message advises ``Pruner.from_state_dict``,
    which a callback user does not call).

    Only what can be compared is checked here; a state without a readable config
    is left to :meth:`~feather_sparse.Pruner.load_state_dict`, which names the problem.

    Raises:
        ValueError: naming the setting, both values and the fix.
    """
    saved = state.get("config")
    if not isinstance(saved, Mapping):
        return
    mine = pruner.config()
    differing = [k for k in pruner._differing_settings(saved) if k in saved]
    if not differing:
        return
    key = differing[0]
    if key == "total_steps":
        raise ValueError(
            f"{owner}: the checkpoint's Pruner state was laid out on {saved[key]} optimizer "
            f"steps, but this run has {mine.get(key)}: the sparsity schedule cannot continue "
            "on another length; resume with the training length (epochs, max_steps) of the "
            "run that wrote the checkpoint, or start a new run from its weights without "
            "resuming"
        )
    if key == "targets" and isinstance(saved[key], (list, tuple)):
        # lists of layer names: name the first that differs
        theirs, ours = list(saved[key]), list(mine.get(key) or [])
        at = next(
            (i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b),
            min(len(theirs), len(ours)),
        )
        was = f"{len(theirs)} layers ({theirs[at] if at < len(theirs) else 'none'} at {at})"
        now = f"{len(ours)} ({ours[at] if at < len(ours) else 'none'} at {at})"
    else:
        was, now = repr(saved[key]), repr(mine.get(key))
    raise ValueError(
        f"{owner}: the checkpoint's Pruner state was saved with {key}={was}, but "
        f"this callback has {key}={now}; make the callback with the settings of "
        "the run that wrote the checkpoint, or start a new run from its weights without "
        "resuming"
    )


class PrunerDriver:
    """Owns the Pruner a callback drives; framework-neutral.

    Args:
        owner: the callback's name, for error messages.
        sparsity: the final target sparsity.
        pruner_kwargs: further :class:`~feather_sparse.Pruner` arguments.
        finalize: bake the pruned weights in at :meth:`finish` (else detach and
            leave the dense weights).
        log_layers: add each layer's sparsity and threshold to :meth:`metrics`.

    The settings are checked here, when the callback is made, by the
    :class:`~feather_sparse.pruner_config.PrunerConfig` the Pruner builds
    (the same rules and messages), not when training starts.

    A backbone with trainable parameters (ASL+) is refused here too: the
    trainer's optimizer and loss would not include them.

    Raises:
        ValueError: for an argument the Pruner does not take, a value the
            Pruner refuses, a backbone with trainable parameters, or
            ``finalize``/``log_layers`` that is not a bool.
    """

    def __init__(
        self,
        owner: str,
        sparsity: float | None,
        pruner_kwargs: Mapping[str, Any],
        finalize: bool = True,
        log_layers: bool = False,
    ) -> None:
        _check_kwargs(pruner_kwargs, owner)
        for name, value, meaning in (
            ("finalize", finalize, "False detaches and keeps the dense weights"),
            ("log_layers", log_layers, "True logs every layer"),
        ):
            if not isinstance(value, bool):
                raise ValueError(
                    f"{owner}: {name} must be True or False ({meaning}), got {value!r}"
                )
        # The Pruner's own checks, now: a bad value fails here, not after the
        # trainer has set up the model and the data.
        config = PrunerConfig(
            sparsity, **{k: v for k, v in pruner_kwargs.items() if k in _CONFIG_FIELDS}
        )
        trainable = _trainable_backbone(config)
        if trainable is not None:
            raise _trainable_backbone_error(owner, trainable)
        self.owner = owner
        self.sparsity = sparsity
        self.pruner_kwargs = dict(pruner_kwargs)
        self.finalize = finalize
        self.log_layers = log_layers
        self.pruner: Pruner | None = None
        self.final_sparsity: float | None = None
        self._pending: dict[str, Any] | None = None

    @property
    def attached(self) -> bool:
        """Whether a Pruner is attached to the model now."""
        return self.pruner is not None and self.pruner._ended is None

    def attach(self, model: nn.Module, total_steps: int) -> Pruner:
        """Attach a Pruner laid out on ``total_steps`` optimizer steps, restoring pending state.

        A Pruner this driver still has attached (training started again in the
        same process, e.g. after an interruption) is first detached without
        baking — the model keeps the dense weights the trainer has just
        loaded or left — and a new one is attached, so each training run
        starts from the trainer's own state.

        Raises:
            ValueError: for invalid Pruner arguments, a backbone with trainable
                parameters (the trainer's optimizer and loss would not include
                them), or a saved state that does not match. The model is left
                without a Pruner then.
        """
        if self.attached:
            logger.info("%s: detaching the Pruner of the previous run", self.owner)
            self.reset()
        pruner = Pruner(model, self.sparsity, total_steps, **self.pruner_kwargs)
        if pruner.parameters():
            pruner.remove()
            raise _trainable_backbone_error(self.owner, pruner.backbone.name)
        self.pruner = pruner
        self.final_sparsity = None
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                _check_resumable(self.owner, pruner, pending)
                pruner.load_state_dict(pending)
            except Exception:
                self.reset()  # leave the model as it was
                raise
        return pruner

    def reset(self) -> None:
        """Detach the Pruner without baking (dense weights back) and forget it."""
        if self.pruner is not None:
            with contextlib.suppress(RuntimeError):  # already finalized or removed
                self.pruner.remove()
        self.pruner = None

    def step(self) -> None:
        """One optimizer step happened."""
        if self.pruner is None:
            raise RuntimeError(f"{self.owner}: training stepped before the Pruner was attached")
        if not self.attached:
            how = "finalized" if self.final_sparsity is not None else "detached"
            raise RuntimeError(
                f"{self.owner}: training stepped after the Pruner was {how} at the end of "
                "training; a new fit attaches a new one when it starts"
            )
        self.pruner.step()

    def metrics(self) -> dict[str, float]:
        """Sparsity and thresholds for the trainer's loggers (one host sync per call).

        Keys: ``feather/sparsity`` (fraction of prunable weights the forward
        zeroes now), ``feather/scheduled_sparsity`` (what the schedule asks
        for now), ``feather/threshold`` when every layer shares one threshold
        (the global backbone) else ``feather/threshold_min`` and
        ``feather/threshold_max``; with ``log_layers`` also
        ``feather/sparsity/<layer>`` and ``feather/threshold/<layer>``.
        """
        if self.pruner is None or not self.attached:
            return {}
        report = self.pruner.report()
        out = {
            "feather/sparsity": report.sparsity,
            "feather/scheduled_sparsity": report.scheduled_sparsity,
        }
        values = [row.threshold for row in report.layers]
        if min(values) == max(values):
            out["feather/threshold"] = values[0]
        else:
            out["feather/threshold_min"] = min(values)
            out["feather/threshold_max"] = max(values)
        if self.log_layers:
            for row in report.layers:
                out[f"feather/sparsity/{row.name}"] = row.sparsity
                out[f"feather/threshold/{row.name}"] = row.threshold
        return out

    def state_dict(self) -> dict[str, Any]:
        """The Pruner's state (or the pending one not yet applied; empty if none)."""
        if self.attached:
            assert self.pruner is not None
            return self.pruner.state_dict()
        return dict(self._pending or {})

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Keep a saved state; :meth:`attach` restores it into the new Pruner."""
        self._pending = dict(state) if state else None

    def check_step(self, step: int, remedy: str) -> None:
        """Detach (leaving the model plain) and raise unless the attached Pruner is at the
        trainer's ``step``: a restored state must belong to the checkpoint resumed from.

        Raises:
            ValueError: naming both steps and ``remedy``.
        """
        at = self.pruner.current_step if self.pruner is not None else 0
        if at != step:
            self.reset()  # leave the model plain, as a failed attach does
            raise ValueError(f"the Pruner is at step {at} but the Trainer at {step}: {remedy}")

    @torch.no_grad()
    def bake_pending(self, model: nn.Module) -> int | None:
        """Write the pending saved state's pruned weights into ``model``, without a Pruner.

        For evaluating a checkpoint taken during training: its weights are the
        dense ones training continues from, and the forward of that moment was
        ``P_T(w)`` with the thresholds saved beside them. A Pruner is rebuilt
        from the saved state (its own settings; the callback's ``schedule``
        stands in for a custom callable one, which cannot be saved), its
        ``P_T(w)`` is baked into the weights, and it is detached: ``model``
        then computes what it computed when the checkpoint was written, with
        exact zeros. A Pruner this driver still has attached is detached first.

        Returns:
            The saved state's step, or None (and ``model`` untouched) when no
            state is pending.

        Raises:
            ValueError: for a state that is not a Pruner state or does not fit
                ``model`` (the Pruner's message); ``model`` keeps the checkpoint's
                dense weights then.
        """
        state, self._pending = self._pending, None
        if not state:
            return None
        if self.attached:
            self.reset()
        config = state.get("config")
        overrides: dict[str, Any] = {}
        if (
            isinstance(config, Mapping)
            and isinstance(config.get("schedule"), Mapping)
            and config["schedule"].get("name") == "<callable>"
            and "schedule" in self.pruner_kwargs
        ):
            overrides["schedule"] = self.pruner_kwargs["schedule"]
        pruner = Pruner.from_state_dict(model, state, **overrides)
        try:
            step, pruned = pruner.current_step, pruner.dense_state_dict(pruned=True)
        finally:
            pruner.remove()
        model.load_state_dict(pruned)
        return step

    def has_pending(self) -> bool:
        """Whether a saved state waits for :meth:`attach`."""
        return self._pending is not None

    @torch.no_grad()
    def finish(self) -> float | None:
        """Finalize (or detach) the Pruner; returns the final sparsity."""
        if self.pruner is None or not self.attached:
            return self.final_sparsity
        if self.finalize:
            self.final_sparsity = self.pruner.finalize()
            logger.info("%s: finalized at sparsity %.6f", self.owner, self.final_sparsity)
        else:
            self.pruner.remove()
            logger.info("%s: detached without finalizing (dense weights kept)", self.owner)
        return self.final_sparsity


class DrivenCallback:
    """What every framework callback is besides its event methods: a PrunerDriver's owner.

    Mixed in ahead of the framework's callback class; the callback's
    ``__init__`` calls :meth:`_drive` and its events call ``self._driver``.
    """

    _driver: PrunerDriver

    def _drive(
        self,
        sparsity: float | None,
        pruner_kwargs: Mapping[str, Any],
        *,
        finalize: bool,
        log_layers: bool,
    ) -> None:
        """Create the driver, named after the callback class for error messages.

        Raises:
            ValueError: for an argument the Pruner does not take or a value it
                refuses (see :class:`PrunerDriver`).
        """
        self._driver = PrunerDriver(
            type(self).__name__, sparsity, pruner_kwargs, finalize=finalize, log_layers=log_layers
        )

    @property
    def pruner(self) -> Pruner | None:
        """The attached Pruner (kept after training for its report and config)."""
        return self._driver.pruner

    @property
    def final_sparsity(self) -> float | None:
        """The sparsity reached by finalize (None until training ends)."""
        return self._driver.final_sparsity


def framework_missing(module: str, framework: str, extra: str, err: ImportError) -> ImportError:
    """The error of an integration module whose framework does not import: it names the
    framework (also as ``name``, as ``ModuleNotFoundError`` does) and the extra to install."""
    return ImportError(
        f"{module} needs {framework} ({err}); "
        f"install it with: pip install 'feather-sparse[{extra}]'",
        name=framework,
    )
