"""Numbers about sparse models: FLOPs, per-layer sparsity, mask stability.

Everything here computes and returns frozen dataclasses; drawing them is
:mod:`feather_sparse.plots`' job and printing them the caller's. This package
only re-exports; one module per job:

- :mod:`~feather_sparse.analysis.flops`: FLOPs, dense and with zeros skipped
  (counted as multiply-accumulates, the convention of the paper's tables);
- :mod:`~feather_sparse.analysis.layers`: the sparsity of each pruned layer;
- :mod:`~feather_sparse.analysis.stability`: mask stability (Pearson) across
  epochs, and the training-loop callback that records it;
- :mod:`~feather_sparse.analysis.summary`: mean ± std over seeds, plot curves.
"""

from __future__ import annotations

from feather_sparse.analysis.flops import (
    FLOP_LAYERS,
    FlopsReport,
    LayerFlops,
    count_flops,
    reference_flops,
)
from feather_sparse.analysis.layers import (
    LayerSparsity,
    SparsityDistribution,
    layer_sparsity,
)
from feather_sparse.analysis.stability import (
    MaskCounts,
    MaskStability,
    MaskStabilityRecorder,
    PackedMask,
    current_masks,
    mask_pearson,
)
from feather_sparse.analysis.summary import (
    Curve,
    mean_std,
)

__all__ = [
    "FLOP_LAYERS",
    "Curve",
    "FlopsReport",
    "LayerFlops",
    "LayerSparsity",
    "MaskCounts",
    "MaskStability",
    "MaskStabilityRecorder",
    "PackedMask",
    "SparsityDistribution",
    "count_flops",
    "current_masks",
    "layer_sparsity",
    "mask_pearson",
    "mean_std",
    "reference_flops",
]
