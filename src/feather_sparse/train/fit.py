"""Whether a model takes a data set's samples: one check for ``train`` and ``bench``.

A model built for other data (``--model resnet20`` on the 1-D MNIST-1D
samples) otherwise fails in its first training step with a shape error of
some layer deep inside it. :func:`check_model_takes` runs the model forward
once on a batch of two zero samples before anything trains, and turns a
failure into one error naming the model, the data set, the sample shape and
what would fit: the bundled recipe made for that data, or the bundled
models that take it.
"""

from __future__ import annotations

import contextlib
import itertools

import torch
from torch import nn

from feather_sparse._modes import evaluating
from feather_sparse.integrity import first_line
from feather_sparse.models import create_model
from feather_sparse.recipes import list_recipes, load_config

__all__ = ["check_model_takes", "models_taking", "recipes_for"]


def recipes_for(dataset: str | None) -> list[tuple[str, str]]:
    """``(recipe, model)`` of the bundled recipes that train on ``dataset``.

    Args:
        dataset: a data set name, or ``None`` for every bundled recipe.
    """
    found = []
    for name in list_recipes():
        try:
            cfg = load_config(name)
        except (ValueError, OSError):
            continue
        if dataset is None or cfg.dataset == dataset:
            found.append((name, str(cfg.model)))
    return found


def _has_random_state(kind: str) -> bool:
    """Whether torch can read and restore the random state of devices of type ``kind``."""
    try:
        module = torch.get_device_module(kind)
    except (RuntimeError, ValueError, AttributeError):  # no module registered for it
        return False
    return hasattr(module, "get_rng_state") and hasattr(module, "set_rng_state")


def _rng_devices(model: nn.Module) -> dict[str, list[int]]:
    """The accelerator devices ``model``'s parameters and buffers are on, by type.

    ``{"cuda": [0, 1]}`` for a model spread over two GPUs; empty for a model on
    the CPU (or the ``meta`` device), whose random state needs no device fork.
    A device type whose random state torch cannot restore is left out.
    """
    found: dict[str, set[int]] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        kind = t.device.type
        if kind not in ("cpu", "meta") and _has_random_state(kind):
            found.setdefault(kind, set()).add(t.device.index if t.device.index is not None else 0)
    return {kind: sorted(indices) for kind, indices in sorted(found.items())}


def _runs_on(model: nn.Module, shape: tuple[int, ...]) -> None:
    """Run ``model`` forward on two zero samples of ``shape`` on its device, leaving it as it was.

    Evaluation mode (no batch statistics updated, no dropout) without
    gradients, inside a forked random state (the CPU's, and that of every
    accelerator the model is on): the check changes neither the model nor what
    a seeded run draws afterwards, even for a model that draws random numbers
    in evaluation mode.
    """
    # The device of its first parameter or buffer (the CPU for a model without any).
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    device = first.device if first is not None else None
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=[]))  # the CPU's
        for kind, indices in _rng_devices(model).items():
            stack.enter_context(torch.random.fork_rng(devices=indices, device_type=kind))
        with evaluating(model), torch.no_grad():
            model(torch.zeros((2, *shape), device=device))


def models_taking(shape: tuple[int, ...], num_classes: int) -> list[str]:
    """The models of the bundled recipes that run forward on samples of ``shape``.

    Args:
        shape: one sample's shape, channels first.
        num_classes: the data set's number of classes.
    """
    found: list[str] = []
    for _, name in recipes_for(None):
        if name in found:
            continue
        try:
            _runs_on(create_model(name, num_classes=num_classes), shape)
        except Exception:  # any failure: it does not take the data
            continue
        found.append(name)
    return found


def check_model_takes(
    model: nn.Module,
    *,
    model_name: str,
    dataset: str,
    shape: tuple[int, ...],
    num_classes: int,
    recipe: str | None = None,
) -> None:
    """Raise unless ``model`` runs forward on a batch of the data set's samples.

    The model is run on two zero samples on the device it is on, in
    evaluation mode and without gradients, and left as it was (every module's
    own mode, its buffers, the random state).

    Args:
        model: the model to train, built for ``num_classes`` classes.
        model_name: its registered name, for the message.
        dataset: the data set's name, for the message and the fixes.
        shape: one sample's shape, channels first.
        num_classes: the data set's number of classes.
        recipe: the recipe the settings came from, named in the message if given.

    Raises:
        ValueError: naming the model, the data set, the sample shape, the
            forward's error, and the bundled recipe made for the data set (or
            the bundled models that take its samples).
    """
    try:
        _runs_on(model, shape)
    except (RuntimeError, ValueError, TypeError, IndexError) as err:
        fits = recipes_for(dataset)
        if fits:
            fix = (
                "use a recipe made for it ("
                + ", ".join(f"--recipe {r} trains {m}" for r, m in fits)
                + ") or a --model that takes it"
            )
        else:
            models = models_taking(shape, num_classes)
            fix = "give a --model that takes it" + (
                f" (of the bundled recipes' models: {', '.join(models)})" if models else ""
            )
        of_recipe = f" (of recipe {recipe})" if recipe is not None else ""
        raise ValueError(
            f"model {model_name!r}{of_recipe} does not take data set {dataset!r}: one sample "
            f"is {tuple(shape)} and the forward pass fails ({first_line(err)}); {fix}"
        ) from err
