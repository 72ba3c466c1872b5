"""Helpers shared by the model families: the standard weight initialisation.

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

from torch import nn

__all__ = ["init_weights"]

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


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
