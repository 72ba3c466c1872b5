"""Helpers shared by the model families: the standard weight initialisation, size checks,
the residual shortcut.

Every model here is built from ordinary ``nn.Conv*``, ``nn.Linear`` and
``nn.BatchNorm*`` modules (the pruner attaches to their ``weight`` through
``torch.nn.utils.parametrize``), and initialised the same way:

- convolutions: Kaiming normal, ``fan_out``, ReLU gain (He et al. 2015, as in
  torchvision's ResNet and the DenseNet authors' code); biases zero;
- hidden linear layers (followed by ReLU): Kaiming normal, ``fan_in``; biases zero;
- batch norm: weight 1, bias 0;
- the classifier: uniform in ``±1/sqrt(fan_in)`` (PyTorch's default scale
  for ``nn.Linear``, as in torchvision's ResNet and DenseNet), bias 0. Its
  weights are then on the scale of the convs' (std ``1/sqrt(3·fan_in)``
  against Kaiming's ``sqrt(2/fan_out)``), so a *global* magnitude threshold
  does not single it out at the start of pruning, as it would the common
  std-0.01 initialisation (whose weights all lie below the first thresholds).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from torch import nn

from feather_sparse.rules import as_int

__all__ = ["init_weights", "positive_int", "positive_multiplier", "residual_shortcut"]

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def positive_int(name: str, value: Any, hint: str = "") -> int:
    """``value`` as an int if it is a whole number >= 1 (NumPy's integers too).

    A channel count, a block count or a whole-number width: a float (even
    ``2.0``) or a bool is refused here, with the option's name, instead of
    failing deep inside torch's layer constructors.

    Args:
        name: the option's name, for the message.
        value: the value given.
        hint: added after "a positive integer" in the message (e.g. what 1 means).

    Raises:
        ValueError: naming ``name``, the value and what is expected.
    """
    number = as_int(value)
    if number is None or number < 1:
        raise ValueError(f"{name} must be a positive integer{hint}, got {value!r}")
    return number


def positive_multiplier(name: str, value: Any) -> float:
    """``value`` as a float if it is a finite number > 0 (a channel multiplier).

    Args:
        name: the option's name, for the message.
        value: the value given.

    Raises:
        ValueError: for a bool, a non-number, zero, a negative number, NaN or infinity.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not 0.0 < float(value) < math.inf  # also rejects NaN
    ):
        raise ValueError(
            f"{name} must be a positive finite number (a channel multiplier, e.g. 0.5 or 2), "
            f"got {value!r}"
        )
    return float(value)


def init_weights(model: nn.Module, classifier: nn.Linear | None = None) -> None:
    """Initialise every conv, linear and batch-norm layer of ``model`` in place.

    Args:
        model: the model to initialise.
        classifier: the final linear layer, which gets the classifier
            initialisation instead of Kaiming.
    """
    for module in model.modules():
        if isinstance(module, _CONVS):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            if module is classifier:
                bound = 1.0 / math.sqrt(module.in_features)
                nn.init.uniform_(module.weight, -bound, bound)
            else:
                nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, _NORMS) and module.affine:
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


def residual_shortcut(in_channels: int, out_channels: int, stride: int) -> nn.Module:
    """A residual block's shortcut: the identity, or where the shape changes a
    1x1 strided conv followed by batch norm (He et al.'s option B).

    Args:
        in_channels: channels of the block's input.
        out_channels: channels of the block's output.
        stride: the block's stride.
    """
    if stride != 1 or in_channels != out_channels:
        return nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
            nn.BatchNorm2d(out_channels),
        )
    return nn.Identity()
