"""Feather for N:M structured sparsity (2:4, 4:8, …): re-exports of the subpackage.

- :mod:`~feather_sparse.nm.operator`: the pattern, the group layout, the per-group operator;
- :mod:`~feather_sparse.nm.backbone`: the Pruner's N:M backbone (``Pruner(pattern="2:4")``);
- :mod:`~feather_sparse.nm.export`: compact N:M encoding, semi-structured GPU tensors;
- :mod:`~feather_sparse.nm.methods`: the N:M methods' formulas and constants (registered
  in :data:`feather_sparse.methods.METHODS`).
"""

from feather_sparse.nm.backbone import (
    DEFAULT_NM_SCHEDULE,
    DEFAULT_PATTERN,
    NMBackbone,
    NMSettings,
    nm_settings,
)
from feather_sparse.nm.export import decode_nm, encode_nm, nm_encoded_bytes, to_semi_structured
from feather_sparse.nm.operator import (
    NMPattern,
    check_layout,
    group_view,
    nm_keep_mask,
    nm_threshold,
    nm_thresholds,
    reduction_size,
)

__all__ = [
    "DEFAULT_NM_SCHEDULE",
    "DEFAULT_PATTERN",
    "NMBackbone",
    "NMPattern",
    "NMSettings",
    "check_layout",
    "decode_nm",
    "encode_nm",
    "group_view",
    "nm_encoded_bytes",
    "nm_keep_mask",
    "nm_settings",
    "nm_threshold",
    "nm_thresholds",
    "reduction_size",
    "to_semi_structured",
]
