"""Deployment of pruned models: compressed sparse checkpoints, sparse inference, ONNX.

The paper's selling point is "the lightness of the resulting pruned networks"
(Glentis Georgoulakis et al., BMVC 2023, §1). This package makes that lightness
real on disk and at inference time, one module per job:

* :mod:`~feather_sparse.export.codec`: the bit-level codecs (sparsity patterns,
  non-zero values);
* :mod:`~feather_sparse.export.header`: what a ``.fsp`` file holds, read from its
  header (:class:`TensorRecord`, :class:`SparseFileInfo`);
* :mod:`~feather_sparse.export.files`: targets checked before the slow part,
  file kinds by their first bytes;
* :mod:`~feather_sparse.export.fsp`: the ``.fsp`` file itself —
  :func:`save_sparse`, :func:`load_sparse`, :func:`inspect_sparse`, and the
  format's description;
* :mod:`~feather_sparse.export.inference`: CSR-backed layers and
  :func:`to_sparse_inference`;
* :mod:`~feather_sparse.export.onnx`: :func:`export_onnx` and :func:`verify_onnx`;
* :mod:`~feather_sparse.export.run`: the model to export from a run folder, a
  training checkpoint or a ``.fsp``.

The ``feather-sparse export`` and ``inspect`` commands are in
:mod:`feather_sparse.cli.export`. This module only re-exports.
"""

from __future__ import annotations

from typing import Any

from feather_sparse.export.codec import PATTERN_CODECS, PatternCodec
from feather_sparse.export.fsp import (
    inspect_sparse,
    load_sparse,
    load_sparse_state_dict,
    save_sparse,
)
from feather_sparse.export.header import (
    BASE_FORMAT_VERSION,
    FORMAT_NAME,
    FORMAT_VERSION,
    SparseFileInfo,
    TensorRecord,
    format_info,
)
from feather_sparse.export.inference import (
    SparseLinear,
    SparsePointwiseConv,
    to_sparse_inference,
)
from feather_sparse.export.onnx import export_onnx, verify_onnx
from feather_sparse.export.run import (
    ExportSource,
    NoModelSpecError,
    load_export_source,
    reencode_sparse,
)

__all__ = [
    "BASE_FORMAT_VERSION",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "PATTERN_CODECS",
    "ExportSource",
    "NoModelSpecError",
    "PatternCodec",
    "SparseFileInfo",
    "SparseLinear",
    "SparsePointwiseConv",
    "TensorRecord",
    "add_cli_arguments",  # forwarded to the CLI layer by __getattr__
    "export_onnx",
    "format_info",
    "inspect_sparse",
    "load_export_source",
    "load_sparse",
    "load_sparse_state_dict",
    "reencode_sparse",
    "run_cli",  # forwarded to the CLI layer by __getattr__
    "save_sparse",
    "to_sparse_inference",
    "verify_onnx",
]

# Names that lived here before the CLI became its own layer; resolved on first
# use so that importing the library never imports the CLI (and argparse).
_CLI_NAMES = {"add_cli_arguments": "add_arguments", "run_cli": "run"}


def __getattr__(name: str) -> Any:
    if name in _CLI_NAMES:
        # Lazy: importing the library never imports the CLI (and argparse).
        from feather_sparse.cli import export as cli_export

        return getattr(cli_export, _CLI_NAMES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
