"""Feather for Lightning (``lightning.pytorch.Trainer``).

Install with ``pip install "feather-sparse[lightning]"``. Pass the callback to
the Trainer; the Pruner's arguments go to the callback::

    from feather_sparse.integrations.lightning import FeatherCallback

    callback = FeatherCallback(sparsity=0.9, exclude=["net.head"])
    trainer = L.Trainer(max_epochs=10, callbacks=[callback])
    trainer.fit(module, loader)     # the module comes back finalized: exact zeros
    callback.final_sparsity         # 0.9, to within one weight

The Pruner is attached to the ``LightningModule`` itself, so layer names in
``include``/``exclude`` are as ``module.named_modules()`` gives them
(``"net.head"`` for ``self.net = ...``).

What the callback does, hook by hook:

- ``on_train_start``: attaches a :class:`~feather_sparse.Pruner` with
  ``total_steps = trainer.estimated_stepping_batches`` (optimizer steps, so
  ``accumulate_grad_batches`` is already divided out), and restores the state
  loaded from a checkpoint when the fit resumes.
- ``on_train_batch_end``: ``pruner.step()`` when this batch ended with an
  optimizer step (``trainer.global_step`` moved), so with gradient
  accumulation the Pruner steps once per optimizer step. Every
  ``log_every_n_steps`` Pruner steps it logs ``feather/sparsity``,
  ``feather/scheduled_sparsity`` and ``feather/threshold`` through
  ``LightningModule.log_dict`` (to every attached logger).
- ``state_dict`` / ``load_state_dict``: the Pruner's state travels in the
  checkpoint under ``checkpoint["callbacks"]``. While attached, the module's
  ``state_dict`` uses the plain keys of the dense model, so the checkpoint
  loads strictly into the plain module Lightning restores first on resume.
- ``on_train_end``: :meth:`~feather_sparse.Pruner.finalize` — the module holds
  plain weights with exact zeros at the target sparsity.
- ``on_validation_start`` / ``on_test_start`` / ``on_predict_start`` outside a
  fit (``trainer.validate/test/predict(ckpt_path=...)``): a checkpoint this
  callback wrote holds the dense weights training continues from; the callback
  bakes its saved thresholds into them (``P_T(w)``), so the module evaluates,
  and keeps, the model the fit validated at that step.

Checkpoints written with ``ModelCheckpoint(save_weights_only=True)`` hold the
dense weights without the Pruner's state (Lightning leaves callbacks out of
them): they neither resume the pruning nor hold the pruned model, and the
callback warns about them when training starts.

Manual optimization (``self.automatic_optimization = False``). There
``trainer.global_step`` counts every ``optimizer.step()`` call of every
optimizer (two per batch for a GAN stepping a generator and a discriminator)
and ``estimated_stepping_batches`` counts training batches. The Pruner steps
once per training batch in which at least one optimizer stepped, after all of
them, and its schedule is laid out on ``estimated_stepping_batches`` batches:
right when every batch steps. Without ``total_steps=`` the callback checks
that, and raises a ``ValueError`` saying to pass ``total_steps=N`` (N = the
number of batches in which an optimizer steps) at the first batch that shows
otherwise, after detaching the Pruner (the module keeps its dense weights):

- a batch with no optimizer step, in any epoch (manual gradient accumulation
  over ``k`` batches, even one that starts in a later epoch: pass
  ``total_steps = max_epochs * (batches per epoch // k)``). The callback
  cannot tell accumulation from a step skipped on a NaN loss; a module that
  skips now and then passes ``total_steps=`` the training batches (the
  number the message gives), which keeps the schedule on the batches and
  lets it fall one step behind per skipped batch. A fit stopped by this
  error resumes from its last checkpoint with that ``total_steps=``;
- a batch with several optimizer steps while ``Trainer(max_steps=M)`` may end
  the fit before its last batch (``max_steps`` counts every optimizer's
  steps, so the fit runs ``ceil(M / steps per batch)`` batches).

The checkpoint then also records ``trainer.global_step`` beside the Pruner's
step (key ``"lightning_global_step"``), and resuming from a state saved at
another trainer step is refused. Logging every ``log_every_n_steps`` Pruner
steps matches Lightning's own cadence here (every ``log_every_n_steps``
batches) when every batch steps.

In every mode, a fit that ends before the schedule reaches the target (early
stopping, ``max_time``, a ``total_steps=`` larger than the steps run) logs a
warning before ``finalize`` prunes to the target in one jump.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from feather_sparse.integrations._common import DrivenCallback, framework_missing

try:
    import lightning.pytorch as pl
    from lightning.pytorch.trainer.states import TrainerFn
except ImportError as err:
    raise framework_missing(__name__, "lightning", "lightning", err) from err

__all__ = ["FeatherCallback"]

logger = logging.getLogger(__name__)

# Manual optimization only: ``trainer.global_step`` when the Pruner state was
# saved (it differs from the Pruner's step when a batch steps several optimizers).
_GLOBAL_STEP_KEY = "lightning_global_step"

_RESUME_REMEDY = (
    "the checkpoint holds no Pruner state (saved without FeatherCallback) or another "
    "run's; resume from a checkpoint this callback wrote, or start a new fit"
)


class FeatherCallback(DrivenCallback, pl.Callback):
    """Prune a ``LightningModule`` with Feather during ``trainer.fit``.

    Args:
        sparsity: final target sparsity ``S`` in ``[0, 1)``; leave it out with
            ``pattern="N:M"``, which implies it.
        total_steps: optimizer steps the schedule is laid out on; default
            ``trainer.estimated_stepping_batches`` (give it when the Trainer
            cannot tell it: an iterable data set with ``max_steps=-1``). Under
            manual optimization: the number of training batches in which an
            optimizer steps (give it for manual gradient accumulation).
        finalize: at the end of training, bake ``P_T(w)`` into the weights and
            remove the parametrizations (default); False detaches and leaves
            the dense weights.
        log_layers: also log each layer's sparsity and threshold.
        **pruner_kwargs: any other :class:`~feather_sparse.Pruner` argument
            (``operator``, ``p``, ``theta``, ``backbone``, ``schedule``,
            ``include``, ``exclude``, ``min_params``, ...).

    Attributes:
        pruner: the attached :class:`~feather_sparse.Pruner` (None before training;
            after it, finalized, it still answers ``report()``).
        final_sparsity: the sparsity :meth:`~feather_sparse.Pruner.finalize`
            achieved (None before the end).

    Raises:
        ValueError: for an argument the Pruner does not take, a value it refuses
            (checked here, with the Pruner's messages), a backbone with trainable
            parameters (``"asl+"``), or a ``finalize`` or
            ``log_layers`` that is not a bool; during ``fit``, under manual
            optimization without ``total_steps``, when the batches do not step
            as the default count assumes (see the module docstring).
    """

    def __init__(
        self,
        sparsity: float | None = None,
        *,
        total_steps: int | None = None,
        finalize: bool = True,
        log_layers: bool = False,
        **pruner_kwargs: Any,
    ) -> None:
        super().__init__()
        if total_steps is not None and (
            isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps <= 0
        ):
            raise ValueError(f"total_steps must be a positive int or None, got {total_steps!r}")
        self.total_steps = total_steps
        self._drive(sparsity, pruner_kwargs, finalize=finalize, log_layers=log_layers)
        self._seen_global_step = 0
        self._manual = False  # the module uses manual optimization (set when training starts)
        self._batches: float = math.inf  # training batches the fit runs if max_steps allows
        self._pending_global_step: int | None = None  # from a manual-optimization checkpoint

    # ------------------------------------------------------------------ hooks
    def _total(self, trainer: pl.Trainer) -> int:
        if self.total_steps is not None:
            return self.total_steps
        estimated = trainer.estimated_stepping_batches
        # Infinite data: inf with max_epochs=-1, else max_steps, which is -1 (unset).
        if not math.isfinite(estimated) or estimated < 0:
            raise ValueError(
                "the Trainer cannot tell how many optimizer steps this fit runs (infinite "
                "data and max_steps=-1); pass FeatherCallback(..., total_steps=N)"
            )
        return int(estimated)

    @staticmethod
    def _batches_without_max_steps(trainer: pl.Trainer) -> float:
        """The training batches of the whole fit as ``max_epochs`` sets them (inf if unbounded)."""
        per_epoch = trainer.num_training_batches
        if trainer.max_epochs is None or trainer.max_epochs == -1 or not math.isfinite(per_epoch):
            return math.inf
        return int(per_epoch) * max(trainer.max_epochs, 1)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Attach the Pruner to ``pl_module`` (applying a restored state when resuming).

        Args:
            trainer: the Lightning Trainer (its step counts set the schedule's length).
            pl_module: the module being trained.

        Raises:
            ValueError: when resuming, if the Pruner state belongs to another step.
        """
        self._manual = not pl_module.automatic_optimization
        self._batches = self._batches_without_max_steps(trainer)
        self._driver.attach(pl_module, self._total(trainer))
        saved_at, self._pending_global_step = self._pending_global_step, None
        if self._manual and saved_at is not None:
            # The Pruner counts batches that stepped, the Trainer every optimizer's steps.
            if saved_at != trainer.global_step:
                self._driver.reset()  # leave the model plain, as a failed attach does
                raise ValueError(
                    f"the Pruner state was saved at trainer step {saved_at} but the Trainer "
                    f"resumes at {trainer.global_step}: {_RESUME_REMEDY}"
                )
        else:
            self._driver.check_step(trainer.global_step, _RESUME_REMEDY)
        self._seen_global_step = trainer.global_step
        self._warn_weights_only(trainer)

    def _warn_weights_only(self, trainer: pl.Trainer) -> None:
        """Warn about checkpoints that will hold neither the Pruner's state nor its zeros."""
        for checkpoint in trainer.checkpoint_callbacks:
            if getattr(checkpoint, "save_weights_only", False):
                logger.warning(
                    "%s: %s(save_weights_only=True) writes the dense weights training "
                    "continues from, without the Pruner's state: its checkpoints neither "
                    "resume the pruning nor hold the pruned model. Save full checkpoints "
                    "(validate/test/predict(ckpt_path=...) then evaluate their pruned "
                    "weights), or the finalized module after fit "
                    "(trainer.save_checkpoint(path, weights_only=True), fs.save_sparse)",
                    type(self).__name__,
                    type(checkpoint).__name__,
                )
                return

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Apply a finished fit's Pruner state when Lightning resumed it without training.

        Args:
            trainer: the Lightning Trainer.
            pl_module: the module that was trained.
        """
        # Resumed from a checkpoint of a finished fit, Lightning trains nothing and calls
        # neither on_train_start nor on_train_end: hand back the model the fit ended with.
        if self._driver.pruner is None and self._driver.has_pending():
            logger.info("the checkpoint's fit had finished: applying its Pruner state")
            self.on_train_start(trainer, pl_module)
            self._driver.finish()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Drop a restored Pruner state that this run did not apply.

        Args:
            trainer: the Lightning Trainer (unused).
            pl_module: the module (unused).
            stage: the stage that ends (unused).
        """
        # A state restored for this run and not applied (validate/test/predict without
        # an evaluation loop, a fit that failed before training) belongs to no later run.
        self.load_state_dict({})

    def _evaluate_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """``validate``/``test``/``predict(ckpt_path=...)`` of a checkpoint this callback
        wrote: Lightning has loaded its dense weights; bake the saved thresholds' ``P_T(w)``
        into them, so the module computes what it computed when the checkpoint was written."""
        if trainer.state.fn == TrainerFn.FITTING:
            return  # the fit's own validation: the attached Pruner's forward is the one
        self._pending_global_step = None
        step = self._driver.bake_pending(pl_module)
        if step is not None:
            logger.info(
                "%s: %s evaluates the checkpoint's pruned weights (Pruner step %d)",
                type(self).__name__,
                trainer.state.fn,
                step,
            )

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Bake a checkpoint's pruned weights in before validating it (not during a fit).

        Args:
            trainer: the Lightning Trainer.
            pl_module: the module to validate.
        """
        self._evaluate_checkpoint(trainer, pl_module)

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Bake a checkpoint's pruned weights in before testing it.

        Args:
            trainer: the Lightning Trainer.
            pl_module: the module to test.
        """
        self._evaluate_checkpoint(trainer, pl_module)

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Bake a checkpoint's pruned weights in before predicting with it.

        Args:
            trainer: the Lightning Trainer.
            pl_module: the module to predict with.
        """
        self._evaluate_checkpoint(trainer, pl_module)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Step the Pruner after a batch that stepped the optimizer, and log its metrics.

        Args:
            trainer: the Lightning Trainer.
            pl_module: the module being trained (logs the metrics).
            outputs: what the training step returned (unused).
            batch: the batch (unused).
            batch_idx: the batch's index in the epoch.

        Raises:
            ValueError: under manual optimization with the default ``total_steps``, for a
                batch that keeps the Pruner's steps out of line with the training batches.
        """
        moved = trainer.global_step - self._seen_global_step
        if self._manual and self.total_steps is None:
            self._check_manual_batch(trainer, moved, batch_idx)
        if moved == 0:
            return  # accumulating gradients: no optimizer step in this batch
        self._seen_global_step = trainer.global_step
        self._driver.step()
        pruner = self._driver.pruner
        assert pruner is not None  # step() raises otherwise
        # Set by the Trainer's logger connector at runtime (not a declared attribute).
        every = int(getattr(trainer, "log_every_n_steps", 1))
        # The Pruner's step, not global_step: under manual optimization one batch may
        # move global_step by several, and Lightning logs every `every` batches.
        if every > 0 and pruner.current_step % every == 0:
            pl_module.log_dict(self._driver.metrics(), on_step=True, on_epoch=False)

    def _check_manual_batch(self, trainer: pl.Trainer, moved: int, batch_idx: int) -> None:
        """Under manual optimization with the default ``total_steps`` (the training
        batches), raise unless this batch keeps the Pruner's steps in line with them.

        Raises:
            ValueError: for a batch without an optimizer step, or with several while
                ``max_steps`` may end the fit early; the Pruner is detached first.
        """
        where = f"training batch {batch_idx} of epoch {trainer.current_epoch}"
        pruner = self._driver.pruner
        assert pruner is not None  # attached in on_train_start
        if moved == 0:
            # Checked in every epoch: accumulation may start late, and the callback
            # cannot tell it from a step skipped on a bad loss; only the user can.
            problem = (
                f"with manual optimization, {where} ended without an optimizer step (manual "
                "gradient accumulation, or a step skipped on a bad loss?), so the Pruner would "
                f"step fewer times than the {pruner.total_steps} training batches its schedule "
                "is laid out on and end short of the target"
            )
            example = "max_epochs * (batches per epoch // k) for accumulation over k batches"
            note = (
                f"; or, to keep the schedule on the training batches and let it fall one step "
                f"behind per batch without a step, pass total_steps={pruner.total_steps}, with "
                "which this fit also resumes from its last checkpoint"
            )
        elif moved != 1 and trainer.max_steps != -1 and self._batches * moved > trainer.max_steps:
            problem = (
                f"with manual optimization, Trainer(max_steps={trainer.max_steps}) counts every "
                f"optimizer's steps and {where} made {moved}, so the fit may end before the "
                "training batches the Pruner's schedule is laid out on"
            )
            batches = math.ceil(trainer.max_steps / moved)
            example = (
                f"{batches} = max_steps / {moved}, rounded up, for {moved} steps in every batch"
            )
            note = ""
        else:
            return
        self._driver.reset()  # the module keeps its dense weights
        raise ValueError(
            f"{problem}; pass FeatherCallback(..., total_steps=N) with N the number of "
            f"training batches in which an optimizer steps (e.g. {example}){note}"
        )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Finalize the Pruner (or detach it, with ``finalize=False``).

        Warns (in the log) when training ended before the schedule reached its target.

        Args:
            trainer: the Lightning Trainer (unused).
            pl_module: the module that was trained (unused).
        """
        pruner = self._driver.pruner
        if self._driver.attached and self._driver.finalize and pruner is not None:
            scheduled = pruner.scheduled_sparsity()
            if scheduled < pruner.sparsity:
                logger.warning(
                    "%s: training ended after %d of the schedule's %d steps, at scheduled "
                    "sparsity %.4f; finalize prunes to the target %.4f in one jump (pass "
                    "total_steps= the number of steps the fit runs)",
                    type(self).__name__,
                    pruner.current_step,
                    pruner.total_steps,
                    scheduled,
                    pruner.sparsity,
                )
        self._driver.finish()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The Pruner's state, stored in Lightning checkpoints.

        With manual optimization, also ``trainer.global_step`` under
        ``"lightning_global_step"``.
        """
        state = self._driver.state_dict()
        if not state:
            return state
        if self._driver.attached:
            if self._manual:
                state = {**state, _GLOBAL_STEP_KEY: self._seen_global_step}
        elif self._pending_global_step is not None:
            state = {**state, _GLOBAL_STEP_KEY: self._pending_global_step}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a checkpoint's Pruner state (applied when training starts).

        Args:
            state_dict: what :meth:`state_dict` returned.
        """
        state = dict(state_dict)
        saved_at = state.pop(_GLOBAL_STEP_KEY, None)
        self._pending_global_step = None if saved_at is None else int(saved_at)
        self._driver.load_state_dict(state)
