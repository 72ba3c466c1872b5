"""Feather for the Hugging Face ``transformers.Trainer``.

Install with ``pip install "feather-sparse[hf]"``. Pass the callback to the
Trainer; the Pruner's arguments go to the callback::

    from feather_sparse.integrations.hf import FeatherCallback

    callback = FeatherCallback(sparsity=0.9, exclude=["classifier"])
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()                 # the model comes back finalized: exact zeros
    callback.final_sparsity         # 0.9, to within one weight

What the callback does, event by event:

- ``on_train_begin``: attaches a :class:`~feather_sparse.Pruner` to the model
  with ``total_steps = state.max_steps`` (optimizer steps, so gradient
  accumulation is already divided out); when the Trainer resumes from a
  checkpoint, restores the Pruner's state saved in it.
- ``on_step_end`` (once per optimizer step, after ``optimizer.step()``):
  ``pruner.step()``. The Pruner's step count equals ``state.global_step``.
- ``on_log``: adds ``feather/sparsity`` (the fraction of prunable weights
  the forward zeroes now), ``feather/scheduled_sparsity`` and
  ``feather/threshold`` (``feather/threshold_min`` and ``_max`` for per-layer
  backbones) to the logged values and to ``state.log_history``.
- ``on_save``: writes the Pruner's state to ``feather_pruner.pt`` in the
  checkpoint folder. While attached, the model's ``state_dict`` uses the plain
  keys of the dense model, so the Trainer's checkpoint loads into the plain
  model it builds on resume.
- ``on_train_end``: :meth:`~feather_sparse.Pruner.finalize` — the model is a
  plain ``nn.Module`` with exact zeros at the target sparsity; save it with
  ``trainer.save_model()``.

Loggers. The Trainer calls user callbacks after its reporting integrations
(TensorBoard, W&B, ...), so values added in ``on_log`` would reach only the
callbacks after this one. :meth:`FeatherCallback.install` puts the callback
first, so every logger sees the Feather values.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch import nn

from feather_sparse.integrations._common import DrivenCallback, framework_missing

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
except ImportError as err:
    raise framework_missing(__name__, "transformers", "hf", err) from err

from feather_sparse.run_files import load_torch_bytes

__all__ = ["PRUNER_STATE_NAME", "FeatherCallback"]

logger = logging.getLogger(__name__)

#: File name of the Pruner's state inside a Trainer checkpoint folder.
PRUNER_STATE_NAME = "feather_pruner.pt"


class FeatherCallback(DrivenCallback, TrainerCallback):
    """Prune the Trainer's model with Feather during training.

    Args:
        sparsity: final target sparsity ``S`` in ``[0, 1)``; leave it out with
            ``pattern="N:M"``, which implies it.
        finalize: at the end of training, bake ``P_T(w)`` into the weights and
            remove the parametrizations (default); False detaches and leaves
            the dense weights.
        log_layers: also log each layer's sparsity and threshold.
        resume_from: checkpoint folder to read the Pruner's state from when the
            Trainer resumes; default: ``<output_dir>/checkpoint-<global_step>``,
            the folder ``trainer.train(resume_from_checkpoint=...)`` uses for
            checkpoints the same run wrote.
        **pruner_kwargs: any other :class:`~feather_sparse.Pruner` argument
            (``operator``, ``p``, ``theta``, ``backbone``, ``schedule``,
            ``include``, ``exclude``, ``min_params``, ...). ``model`` and
            ``total_steps`` come from the Trainer.

    Attributes:
        pruner: the attached :class:`~feather_sparse.Pruner` (None before training;
            after it, finalized, it still answers ``report()``).
        final_sparsity: the sparsity :meth:`~feather_sparse.Pruner.finalize`
            achieved (None before the end).

    Raises:
        ValueError: for an argument the Pruner does not take, a value it refuses
            (checked here, with the Pruner's messages), a backbone with trainable
            parameters (``"asl+"``), or a ``finalize`` or
            ``log_layers`` that is not a bool.
    """

    def __init__(
        self,
        sparsity: float | None = None,
        *,
        finalize: bool = True,
        log_layers: bool = False,
        resume_from: str | os.PathLike[str] | None = None,
        **pruner_kwargs: Any,
    ) -> None:
        self._drive(sparsity, pruner_kwargs, finalize=finalize, log_layers=log_layers)
        self.resume_from = resume_from

    def install(self, trainer: Any) -> FeatherCallback:
        """Add this callback to ``trainer`` ahead of its reporting integrations; returns self.

        Use instead of ``Trainer(callbacks=[...])`` when the Feather values
        should reach the loggers named in ``report_to``.

        Args:
            trainer: the ``transformers.Trainer``.
        """
        trainer.callback_handler.callbacks.insert(0, self)
        return self

    # ------------------------------------------------------------------ events
    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: nn.Module | None = None,
        **kwargs: Any,
    ) -> None:
        """Attach the Pruner to ``model`` (restoring its state when the Trainer resumes).

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state (``max_steps`` sets the schedule's length).
            control: the Trainer's control flags (unused).
            model: the model being trained.
            **kwargs: the other values the Trainer passes (unused).

        Raises:
            RuntimeError: if the Trainer passes no model.
            FileNotFoundError: when resuming, if the checkpoint holds no Pruner state.
            ValueError: when resuming, if the Pruner state belongs to another step.
        """
        if model is None:
            raise RuntimeError("FeatherCallback: the Trainer passed no model to on_train_begin")
        if state.global_step > 0:  # resuming: the checkpoint holds the Pruner's state
            self._driver.load_state_dict(self._load(args, state))
        self._driver.attach(model, int(state.max_steps))
        self._driver.check_step(
            state.global_step,
            "the checkpoint's Pruner state does not belong to it; "
            "pass FeatherCallback(..., resume_from=<the folder the Trainer resumes from>)",
        )

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Step the Pruner after the optimizer step.

        Args:
            args: the Trainer's arguments (unused).
            state: the Trainer's state (unused).
            control: the Trainer's control flags (unused).
            **kwargs: the other values the Trainer passes (unused).
        """
        self._driver.step()

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        """Add the Pruner's metrics (scheduled and achieved sparsity) to ``logs``.

        Args:
            args: the Trainer's arguments (unused).
            state: the Trainer's state; its last history entry gets the metrics too.
            control: the Trainer's control flags (unused).
            logs: the values being logged, updated in place.
            **kwargs: the other values the Trainer passes (unused).
        """
        metrics = self._driver.metrics()
        if not metrics or logs is None:
            return
        logs.update(metrics)
        # The Trainer appended a copy of ``logs`` to the history before this event.
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(metrics)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Save the Pruner's state into the checkpoint folder the Trainer just wrote.

        Args:
            args: the Trainer's arguments (``should_save``, ``output_dir``).
            state: the Trainer's state (its step names the folder).
            control: the Trainer's control flags (unused).
            **kwargs: the other values the Trainer passes (unused).
        """
        if not args.should_save or not self._driver.attached:
            return
        folder = _checkpoint_folder(args, state)
        if not os.path.isdir(folder):
            logger.warning(
                "FeatherCallback: checkpoint folder %s not found; Pruner not saved", folder
            )
            return
        torch.save(self._driver.state_dict(), os.path.join(folder, PRUNER_STATE_NAME))

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Finalize the Pruner (or detach it, with ``finalize=False``).

        Args:
            args: the Trainer's arguments (unused).
            state: the Trainer's state (unused).
            control: the Trainer's control flags (unused).
            **kwargs: the other values the Trainer passes (unused).
        """
        self._driver.finish()

    # ------------------------------------------------------------------ helpers
    def _load(self, args: TrainingArguments, state: TrainerState) -> dict[str, Any]:
        folder = self.resume_from or _checkpoint_folder(args, state)
        path = os.path.join(folder, PRUNER_STATE_NAME)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"the Trainer resumes at step {state.global_step} but there is no Pruner state "
                f"at {path}; pass FeatherCallback(..., resume_from=<checkpoint folder>) when "
                "resuming from a checkpoint outside output_dir"
            )
        fix = (
            "resume from another checkpoint folder (trainer.train(resume_from_checkpoint=...) "
            "and FeatherCallback(..., resume_from=...)), or start the training again"
        )
        with open(path, "rb") as f:
            loaded = load_torch_bytes(f.read(), f"the Pruner state {path}", fix)
        if not isinstance(loaded, dict):
            raise ValueError(
                f"the Pruner state {path} holds a {type(loaded).__name__}, not a Pruner "
                f"state_dict: it is damaged or was not written by FeatherCallback; {fix}"
            )
        return loaded


def _checkpoint_folder(args: TrainingArguments, state: TrainerState) -> str:
    """Where the Trainer writes (and by default resumes from) the checkpoint of this step."""
    return os.path.join(args.output_dir or ".", f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
