"""feather-sparse: Feather sparse training for PyTorch.

Implements Feather (Glentis Georgoulakis, Retsinas, Maragos, BMVC 2023): a
straight-through estimator with the thresholding operator
``P_T(w) = sign(w)·(|w|^p − T^p)^(1/p)`` and gradient scaling ``θ`` for the
pruned weights. This module only re-exports the public API.
"""

from feather_sparse._version import __version__
from feather_sparse.models import ModelInfo, create_model, list_models, model_info, register_model
from feather_sparse.registry import Registry

__all__ = [
    "ModelInfo",
    "Registry",
    "__version__",
    "create_model",
    "list_models",
    "model_info",
    "register_model",
]
