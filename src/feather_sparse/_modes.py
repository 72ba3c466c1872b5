"""Run a model in eval mode for a moment and give every module its own mode back.

``was_training = model.training; model.eval(); ...; model.train(was_training)``
restores the root's mode only: ``model.train(True)`` switches every submodule
to training, so a BatchNorm a user froze in eval mode under a model that
trains (the usual fine-tuning setup) would come back training, and its
running statistics would silently change from then on. :func:`evaluating`
records each module's own ``training`` flag and restores each exactly, also
when the block raises.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

__all__ = ["evaluating"]


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode inside the block; every module's own mode restored after it.

    The flags are set back directly (``module.training = flag``), not through
    ``train()``, so a module whose ``train()`` is overridden (one that keeps
    its BatchNorm frozen, say) gets exactly the flags it had.

    Args:
        model: the model; its submodules may be in different modes.

    Yields:
        ``model``, in eval mode.

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        >>> _ = model[1].eval()  # a frozen BatchNorm under a model that trains
        >>> with evaluating(model):
        ...     model.training, model[1].training
        (False, False)
        >>> model.training, model[1].training
        (True, False)
    """
    modes = [(module, module.training) for module in model.modules()]
    try:
        model.eval()
        yield model
    finally:
        for module, training in modes:
            module.training = training
