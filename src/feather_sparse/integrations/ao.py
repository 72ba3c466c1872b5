"""A ``torch.ao.pruning``-style facade over the Pruner.

Code written against PyTorch's sparsifier API (``torch.ao.pruning``) drives a
sparsifier with ``prepare(model, config)``, ``step()`` and
``squash_mask()``; its ``config`` is a list of ``{"tensor_fqn": "layer.weight"}``
entries naming the tensors to sparsify. :class:`FeatherSparsifier` offers the
same calls, so such code can switch to Feather without restructuring:

    sparsifier = FeatherSparsifier(sparsity=0.9, total_steps=steps)
    sparsifier.prepare(model, config=[{"tensor_fqn": "fc1.weight"}, {"tensor_fqn": "fc2.weight"}])
    for ...:
        ...; optimizer.step(); sparsifier.step()
    sparsifier.squash_mask()   # bakes P_T(w): plain weights with exact zeros

It is a thin adapter: the pruning itself is :class:`feather_sparse.Pruner`'s
(Feather-Global by default), which never stores masks — ``squash_mask``
writes the thresholded weights, as :meth:`Pruner.finalize` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from feather_sparse.pruner import Pruner

__all__ = ["FeatherSparsifier"]


class FeatherSparsifier:
    """``prepare`` / ``step`` / ``squash_mask`` around a :class:`~feather_sparse.Pruner`.

    Args:
        sparsity: the final target sparsity over the configured tensors.
        total_steps: number of :meth:`step` calls in the whole training.
        **pruner_kwargs: any other :class:`~feather_sparse.Pruner` argument
            (``operator``, ``theta``, ``backbone``, ``schedule``, ...).
    """

    def __init__(self, sparsity: float, total_steps: int, **pruner_kwargs: Any) -> None:
        if "include" in pruner_kwargs:
            raise ValueError("name the tensors with prepare(model, config=[{'tensor_fqn': ...}])")
        self.sparsity = sparsity
        self.total_steps = total_steps
        self.pruner_kwargs = pruner_kwargs
        self.pruner: Pruner | None = None

    def prepare(self, model: nn.Module, config: Sequence[dict[str, Any]] | None = None) -> None:
        """Attach to ``model``: every Conv/Linear weight, or the tensors ``config`` names.

        Args:
            model: the model to prune.
            config: ``torch.ao``-style entries ``{"tensor_fqn": "<module>.weight"}``; None
                for every Conv/Linear weight.

        Raises:
            ValueError: for a config entry without ``tensor_fqn``, with other keys
                (a per-tensor ``sparsity_level``: Feather's threshold is global),
                a tensor other than a module's ``weight``, or a name not in the model.
            RuntimeError: when this sparsifier is prepared already (``squash_mask()``
                first): a second Pruner would leave the first one's layers behind.
        """
        if self.pruner is not None and self.pruner._ended is None:
            raise RuntimeError(
                "this FeatherSparsifier is prepared already; call squash_mask() before "
                "preparing it again, or use a new one"
            )
        kwargs = dict(self.pruner_kwargs)
        if config is not None:
            modules = dict(model.named_modules())
            names = []
            for entry in config:
                fqn = entry.get("tensor_fqn") if isinstance(entry, dict) else None
                if not isinstance(fqn, str):
                    raise ValueError(
                        f"each config entry needs a 'tensor_fqn' string, got {entry!r}"
                    )
                other = sorted(set(entry) - {"tensor_fqn"})
                if other:
                    raise ValueError(
                        f"{fqn!r}: config keys {other} are not supported: Feather prunes all "
                        "named tensors to one global threshold; give the sparsity to "
                        "FeatherSparsifier(sparsity=...) (per-layer levels: backbone='uniform' "
                        "prunes every layer to the same fraction)"
                    )
                module_name, _, tensor = fqn.rpartition(".")
                if tensor != "weight":
                    raise ValueError(f"{fqn!r}: Feather prunes a module's 'weight' only")
                if module_name not in modules:
                    raise ValueError(f"{fqn!r}: the model has no module {module_name!r}")
                names.append(module_name)
            if not names:
                raise ValueError(
                    "config is empty: it names no tensor to prune; give entries like "
                    "{'tensor_fqn': '<module>.weight'}, or config=None for every Conv/Linear weight"
                )
            kwargs["include"] = names
        self.pruner = Pruner(model, self.sparsity, self.total_steps, **kwargs)

    def _attached(self) -> Pruner:
        if self.pruner is None:
            raise RuntimeError("call prepare(model, config) first")
        return self.pruner

    def step(self) -> None:
        """One training step; call after ``optimizer.step()``."""
        self._attached().step()

    def squash_mask(self) -> float:
        """Bake ``P_T(w)`` into the weights and detach; returns the achieved sparsity."""
        return self._attached().finalize()

    def state_dict(self) -> dict[str, Any]:
        """The Pruner's state (see :meth:`Pruner.state_dict`)."""
        return self._attached().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` after :meth:`prepare` on the same model.

        Args:
            state: what :meth:`state_dict` returned.
        """
        self._attached().load_state_dict(state)
