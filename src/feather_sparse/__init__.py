"""feather-sparse: Feather sparse training for PyTorch.

Implements Feather (Glentis Georgoulakis, Retsinas, Maragos, BMVC 2023): a
straight-through estimator with the thresholding operator
``P_T(w) = sign(w)·(|w|^p − T^p)^(1/p)`` and gradient scaling ``θ`` for the
pruned weights. This module only re-exports the public API.
"""

from feather_sparse._version import __version__
from feather_sparse.backbones import (
    ASL_LR_SCALE,
    BACKBONES,
    ASLPlusBackbone,
    Backbone,
    GlobalBackbone,
    GlobalFlopsBackbone,
    UniformBackbone,
)
from feather_sparse.baselines import SpartanBackbone, ST3Operator, sinkhorn_topk, soft_topk_mask
from feather_sparse.export import (
    export_onnx,
    inspect_sparse,
    load_sparse,
    save_sparse,
    to_sparse_inference,
)
from feather_sparse.methods import METHODS, Method, make_pruner
from feather_sparse.models import ModelInfo, create_model, list_models, model_info, register_model
from feather_sparse.nm import NMBackbone, NMPattern, decode_nm, encode_nm, to_semi_structured
from feather_sparse.ops import OPERATORS, Operator, ThresholdOperator, threshold
from feather_sparse.pruner import DEFAULT_INCLUDE, LayerReport, Pruner, PrunerReport, auto_theta
from feather_sparse.registry import Registry
from feather_sparse.schedules import (
    SCHEDULES,
    ConstantSchedule,
    CubicSchedule,
    LinearSchedule,
    Schedule,
)
from feather_sparse.selection import kth_magnitude, select_threshold

__all__ = [
    "ASL_LR_SCALE",
    "BACKBONES",
    "DEFAULT_INCLUDE",
    "METHODS",
    "OPERATORS",
    "SCHEDULES",
    "ASLPlusBackbone",
    "Backbone",
    "ConstantSchedule",
    "CubicSchedule",
    "GlobalBackbone",
    "GlobalFlopsBackbone",
    "LayerReport",
    "LinearSchedule",
    "Method",
    "ModelInfo",
    "NMBackbone",
    "NMPattern",
    "Operator",
    "Pruner",
    "PrunerReport",
    "Registry",
    "ST3Operator",
    "Schedule",
    "SpartanBackbone",
    "ThresholdOperator",
    "UniformBackbone",
    "__version__",
    "auto_theta",
    "create_model",
    "decode_nm",
    "encode_nm",
    "export_onnx",
    "inspect_sparse",
    "kth_magnitude",
    "list_models",
    "load_sparse",
    "make_pruner",
    "model_info",
    "register_model",
    "save_sparse",
    "select_threshold",
    "sinkhorn_topk",
    "soft_topk_mask",
    "threshold",
    "to_semi_structured",
    "to_sparse_inference",
]
