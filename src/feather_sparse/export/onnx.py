"""ONNX export of a finalized (dense-format) model, and its check in onnxruntime."""

from __future__ import annotations

import importlib
import logging
import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from feather_sparse.export.files import check_writable

__all__ = ["export_onnx", "verify_onnx"]

logger = logging.getLogger(__name__)

# torch's exporters cap the opset below the newest the onnx package knows:
# the torch.export-based one (needs onnxscript) at 23, the legacy TorchScript
# one at 20 in torch 2.13. Fallbacks in case the private constants move.
_DYNAMO_MAX_OPSET = 23
_LEGACY_MAX_OPSET = 20
# The oldest opset each writes reliably: the torch.export-based exporter builds
# at 18 (torchlib) and only tries to convert down, keeping 18 when that fails;
# the legacy exporter goes down to 7.
_DYNAMO_MIN_OPSET = 18
_LEGACY_MIN_OPSET = 7


def _onnx_exporter() -> tuple[str, int]:
    """Which torch ONNX exporter works offline here, and its highest opset."""
    constants = importlib.import_module("torch.onnx._constants")
    try:
        importlib.import_module("onnxscript")
    except ImportError:
        return "legacy", int(
            getattr(constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", _LEGACY_MAX_OPSET)
        )
    return "dynamo", int(getattr(constants, "ONNX_MAX_OPSET", _DYNAMO_MAX_OPSET))


def _oldest_opset(exporter: str) -> int:
    if exporter == "dynamo":
        try:
            constants = importlib.import_module("torch.onnx._internal.exporter._constants")
        except ImportError:
            return _DYNAMO_MIN_OPSET
        return int(getattr(constants, "TORCHLIB_OPSET", _DYNAMO_MIN_OPSET))
    constants = importlib.import_module("torch.onnx._constants")
    return int(getattr(constants, "ONNX_MIN_OPSET", _LEGACY_MIN_OPSET))


def _opset_of(onnx: Any, path: Path) -> int:
    """The default-domain opset a written ONNX file declares."""
    proto = onnx.load(str(path), load_external_data=False)
    return max(int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx"))


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike[str],
    example_input: Tensor,
    *,
    opset: int | None = None,
) -> int:
    """Write the (finalized, dense-format) model to ONNX with a dynamic batch size.

    Uses torch's ``torch.export``-based exporter when ``onnxscript`` is
    installed and the legacy TorchScript exporter (``dynamo=False``) otherwise;
    both work offline. The default opset is the newest that both the
    installed ``onnx`` package and the chosen exporter support (onnx 1.23
    knows opset 28; torch 2.13 exports at most 23, or 20 with the legacy
    exporter).

    Args:
        model: the model (put in eval mode for the export).
        path: the ``.onnx`` file to write.
        example_input: an input batch with a batch size of at least 2 (the
            batch dimension is exported as dynamic).
        opset: the ONNX opset; ``None`` picks the default above.

    Returns:
        The opset written (read back from the file).

    Raises:
        TypeError: if ``example_input`` is not one tensor.
        ValueError: if ``onnx`` is not installed, ``opset`` is outside what
            the exporter writes, or the model does not run on ``example_input``.
        OSError: if ``path`` is a folder, or holds a file of another kind (a
            ``.fsp`` or a training checkpoint: ``FileExistsError``), which is
            then left as it was.
    """
    if not isinstance(example_input, Tensor):
        raise TypeError(
            "example_input must be one tensor, an input batch of at least 2 samples "
            f"(e.g. torch.randn(2, 1, 40)), got {type(example_input).__name__}; "
            "export_onnx exports models that take a single input"
        )
    target = Path(path)
    check_writable(target, "model.onnx", kind="onnx")
    try:
        onnx = importlib.import_module("onnx")
    except ImportError:
        raise ValueError(
            "ONNX export needs the onnx package: pip install 'feather-sparse[onnx]'"
        ) from None
    exporter, exporter_max = _onnx_exporter()
    newest = min(int(onnx.defs.onnx_opset_version()), exporter_max)
    opset = newest if opset is None else int(opset)
    if opset > newest:
        raise ValueError(f"opset {opset} is newer than this setup exports ({exporter}: {newest})")
    oldest = _oldest_opset(exporter)
    if opset < oldest:
        raise ValueError(
            f"opset {opset} is older than this setup exports ({exporter}: {oldest} to {newest})"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    try:
        try:  # a wrong input shape fails here in one line, not deep in the exporter
            with torch.inference_mode():
                model(example_input)
        except (RuntimeError, ValueError, IndexError, TypeError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(
                f"the model does not run on an input of shape {tuple(example_input.shape)} "
                f"({first}); give the shape of one sample the model takes"
            ) from None
        with warnings.catch_warnings():
            # Noise from torch's own exporter internals (torch 2.13), not actionable here.
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            if exporter == "legacy":  # the fallback is deprecated in torch; we know
                warnings.simplefilter("ignore", DeprecationWarning)
            if exporter == "dynamo":
                program = torch.onnx.export(
                    model,
                    (example_input,),
                    dynamo=True,
                    opset_version=opset,
                    input_names=["input"],
                    output_names=["output"],
                    dynamic_shapes=({0: torch.export.Dim("batch")},),
                    verbose=False,
                )
                assert program is not None
                program.save(str(target))
            else:
                torch.onnx.export(
                    model,
                    (example_input,),
                    str(target),
                    dynamo=False,
                    opset_version=opset,
                    input_names=["input"],
                    output_names=["output"],
                    dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                )
    except Exception as err:
        attached = [n for n, m in model.named_modules() if parametrize.is_parametrized(m)]
        if not attached:
            raise
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip()  # the exporter's colours
        first = text.splitlines()[0] if text else type(err).__name__
        raise ValueError(
            f"ONNX export failed ({first[:200]}) on a model whose layers "
            f"{', '.join(attached[:3])}{', …' if len(attached) > 3 else ''} still carry a "
            "parametrization (a Pruner is attached): call pruner.finalize() first, which "
            "leaves a plain model with exact zeros that exports as a dense graph"
        ) from err
    finally:
        model.train(was_training)
    written = _opset_of(onnx, target)
    if written != opset:
        raise ValueError(f"asked for opset {opset}, but the {exporter} exporter wrote {written}")
    logger.info("wrote %s (opset %d, %s exporter)", target, written, exporter)
    return written


def verify_onnx(model: nn.Module, path: str | os.PathLike[str], inputs: Tensor) -> float:
    """Run the ONNX file in ``onnxruntime`` and compare with the PyTorch model.

    Returns:
        The largest absolute difference between the two outputs.

    Raises:
        ValueError: if ``onnxruntime`` is not installed.
    """
    try:
        ort = importlib.import_module("onnxruntime")
    except ImportError:
        raise ValueError(
            "verifying ONNX needs onnxruntime: pip install 'feather-sparse[onnx]'"
        ) from None
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: inputs.detach().cpu().numpy()}
    onnx_out = torch.from_numpy(session.run(None, feed)[0])
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            torch_out = model(inputs).detach().cpu()
    finally:
        model.train(was_training)
    if onnx_out.shape != torch_out.shape:
        raise ValueError(f"ONNX output shape {tuple(onnx_out.shape)} != {tuple(torch_out.shape)}")
    return float((onnx_out.float() - torch_out.float()).abs().max()) if onnx_out.numel() else 0.0
