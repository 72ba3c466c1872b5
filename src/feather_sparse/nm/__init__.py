"""Feather for N:M structured sparsity (2:4, 4:8, …): re-exports of the subpackage.

- :mod:`~feather_sparse.nm.operator`: the pattern, the group layout, the per-group operator;
- :mod:`~feather_sparse.nm.backbone`: the Pruner's N:M backbone (``Pruner(pattern="2:4")``).
"""

from feather_sparse.nm.backbone import DEFAULT_NM_SCHEDULE, NMBackbone, nm_pruner_settings
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
    "NMBackbone",
    "NMPattern",
    "check_layout",
    "group_view",
    "nm_keep_mask",
    "nm_pruner_settings",
    "nm_threshold",
    "nm_thresholds",
    "reduction_size",
]
