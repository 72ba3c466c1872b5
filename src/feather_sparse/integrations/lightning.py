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
  ``log_every_n_steps`` optimizer steps it logs ``feather/sparsity``,
  ``feather/scheduled_sparsity`` and ``feather/threshold`` through
  ``LightningModule.log_dict`` (to every attached logger).
- ``state_dict`` / ``load_state_dict``: the Pruner's state travels in the
  checkpoint under ``checkpoint["callbacks"]``. While attached, the module's
  ``state_dict`` uses the plain keys of the dense model, so the checkpoint
  loads strictly into the plain module Lightning restores first on resume.
- ``on_train_end``: :meth:`~feather_sparse.Pruner.finalize` — the module holds
  plain weights with exact zeros at the target sparsity.

Only the automatic-optimization flow with one optimizer is covered by the
tests; with manual optimization the Pruner steps once per training batch in
which at least one optimizer stepped.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning.pytorch as pl

from feather_sparse.integrations._common import DrivenCallback

__all__ = ["FeatherCallback"]

logger = logging.getLogger(__name__)


class FeatherCallback(DrivenCallback, pl.Callback):
    """Prune a ``LightningModule`` with Feather during ``trainer.fit``.

    Args:
        sparsity: final target sparsity ``S`` in ``[0, 1)``; leave it out with
            ``pattern="N:M"``, which implies it.
        total_steps: optimizer steps the schedule is laid out on; default
            ``trainer.estimated_stepping_batches`` (give it when that is
            infinite, e.g. an iterable data set with ``max_steps=-1``).
        finalize: at the end of training, bake ``P_T(w)`` into the weights and
            remove the parametrizations (default); False detaches and leaves
            the dense weights.
        log_layers: also log each layer's sparsity and threshold.
        **pruner_kwargs: any other :class:`~feather_sparse.Pruner` argument
            (``operator``, ``p``, ``theta``, ``backbone``, ``schedule``,
            ``include``, ``exclude``, ``min_params``, ...).

    Attributes:
        pruner: the attached :class:`~feather_sparse.Pruner` (None before training).
        final_sparsity: the sparsity :meth:`~feather_sparse.Pruner.finalize`
            achieved (None before the end).

    Raises:
        ValueError: for an argument the Pruner does not take, a value it refuses
            (checked here, with the Pruner's messages), or a ``finalize`` or
            ``log_layers`` that is not a bool.
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

    # ------------------------------------------------------------------ hooks
    def _total(self, trainer: pl.Trainer) -> int:
        if self.total_steps is not None:
            return self.total_steps
        estimated = trainer.estimated_stepping_batches
        if not math.isfinite(estimated):
            raise ValueError(
                "the Trainer cannot tell how many optimizer steps this fit runs (infinite "
                "data and max_steps=-1); pass FeatherCallback(..., total_steps=N)"
            )
        return int(estimated)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._driver.attach(pl_module, self._total(trainer))
        self._driver.check_step(
            trainer.global_step,
            "the checkpoint holds no Pruner state (saved without FeatherCallback) or another "
            "run's; resume from a checkpoint this callback wrote, or start a new fit",
        )
        self._seen_global_step = trainer.global_step

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Resumed from a checkpoint of a finished fit, Lightning trains nothing and calls
        # neither on_train_start nor on_train_end: hand back the model the fit ended with.
        if self._driver.pruner is None and self._driver.has_pending():
            logger.info("the checkpoint's fit had finished: applying its Pruner state")
            self.on_train_start(trainer, pl_module)
            self._driver.finish()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":  # validate/test/predict(ckpt_path=...) restored a state: not for a fit
            self._driver.load_state_dict({})

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if trainer.global_step == self._seen_global_step:
            return  # accumulating gradients: no optimizer step in this batch
        self._seen_global_step = trainer.global_step
        self._driver.step()
        # Set by the Trainer's logger connector at runtime (not a declared attribute).
        every = int(getattr(trainer, "log_every_n_steps", 1))
        if every > 0 and trainer.global_step % every == 0:
            pl_module.log_dict(self._driver.metrics(), on_step=True, on_epoch=False)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._driver.finish()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The Pruner's state, stored in Lightning checkpoints."""
        return self._driver.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a checkpoint's Pruner state (applied when training starts)."""
        self._driver.load_state_dict(state_dict)
