"""ONNX export of a finalized (dense-format) model, and its check in onnxruntime.

The model is exported in memory and written atomically
(:func:`feather_sparse.integrity.write_atomic`): a failed export never leaves
half a file where a good one was. :func:`onnx_opset` and
:func:`check_example_input` are the checks :func:`export_onnx` makes before
the slow part, for callers that must make them before writing anything else.
A model whose Pruner is still attached is exported from a copy with its
pruned weights as plain tensors (:func:`_without_pruner`), never with the
thresholding in the graph.
"""

from __future__ import annotations

import copy
import importlib
import logging
import numbers
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from feather_sparse._modes import evaluating
from feather_sparse.export.files import ONNX_DATA, check_writable
from feather_sparse.export.fsp import _attached_message, _pruned_weights, _zero_fraction
from feather_sparse.integrity import (
    DiskFullError,
    NotWritableError,
    _os_error,
    _temp_in,
    first_line,
    remove_stale_temps,
    write_atomic,
)

__all__ = ["check_example_input", "export_onnx", "onnx_opset", "verify_onnx"]

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
    try:
        importlib.import_module("onnxscript")
    except ImportError:
        return "legacy", _newest_opset("legacy")
    return "dynamo", _newest_opset("dynamo")


def _newest_opset(exporter: str) -> int:
    """The highest opset ``exporter`` (``"legacy"`` or ``"dynamo"``) writes with this torch."""
    constants = importlib.import_module("torch.onnx._constants")
    if exporter == "dynamo":
        return int(getattr(constants, "ONNX_MAX_OPSET", _DYNAMO_MAX_OPSET))
    return int(getattr(constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", _LEGACY_MAX_OPSET))


def _oldest_opset(exporter: str) -> int:
    if exporter == "dynamo":
        try:
            constants = importlib.import_module("torch.onnx._internal.exporter._constants")
        except ImportError:
            return _DYNAMO_MIN_OPSET
        return int(getattr(constants, "TORCHLIB_OPSET", _DYNAMO_MIN_OPSET))
    constants = importlib.import_module("torch.onnx._constants")
    return int(getattr(constants, "ONNX_MIN_OPSET", _LEGACY_MIN_OPSET))


def _onnxscript_remedy(onnx: Any, exporter: str, opset: int, newest: int) -> str:
    """How to get ``opset`` when only the legacy exporter's cap (``newest``) refuses it.

    The legacy exporter runs where onnxscript is not installed; the
    torch.export-based one, which onnxscript brings, writes newer opsets.
    ``""`` where the opset is beyond that one's too.
    """
    if exporter != "legacy":
        return ""
    highest = min(int(onnx.defs.onnx_opset_version()), _newest_opset("dynamo"))
    if opset > highest:
        return ""
    return (
        f"; opsets {newest + 1} to {highest} need onnxscript (torch's torch.export-based "
        "exporter); install it with: pip install 'feather-sparse[onnx]'"
    )


def _opset_of(proto: Any) -> int:
    """The default-domain opset an ONNX ``ModelProto`` declares."""
    return max(int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx"))


def _check_opset(opset: object) -> None:
    """Raise unless ``opset`` is ``None`` or an int (NumPy's too; not a bool, a float or a str)."""
    if opset is not None and (isinstance(opset, bool) or not isinstance(opset, numbers.Integral)):
        raise TypeError(
            f"opset must be an int, an ONNX opset version such as 18 (or None for the newest), "
            f"got {opset!r}"
        )


def _onnx_setup(opset: int | None) -> tuple[Any, str, int]:
    """The ``onnx`` module, the exporter that will run, and the opset it will write.

    Raises:
        TypeError: if ``opset`` is not an int or ``None``.
        ValueError: if ``onnx`` is not installed or ``opset`` is outside what
            the exporter writes.
    """
    _check_opset(opset)
    try:
        onnx = importlib.import_module("onnx")
    except ImportError:
        raise ValueError(
            "ONNX export needs the onnx package: pip install 'feather-sparse[onnx]'"
        ) from None
    exporter, exporter_max = _onnx_exporter()
    newest = min(int(onnx.defs.onnx_opset_version()), exporter_max)
    opset = newest if opset is None else int(opset)  # an int, checked by _check_opset
    if opset > newest:
        raise ValueError(
            f"opset {opset} is newer than this setup exports ({exporter}: {newest})"
            + _onnxscript_remedy(onnx, exporter, opset, newest)
        )
    oldest = _oldest_opset(exporter)
    if opset < oldest:
        raise ValueError(
            f"opset {opset} is older than this setup exports ({exporter}: {oldest} to {newest})"
        )
    return onnx, exporter, opset


def onnx_opset(opset: int | None = None) -> int:
    """The opset :func:`export_onnx` writes for ``opset`` here; checks the setup, writes nothing.

    What ``feather-sparse export --onnx`` checks before it writes any file.

    Args:
        opset: the opset asked for; ``None`` for the default (see :func:`export_onnx`).

    Returns:
        The opset that will be written.

    Raises:
        TypeError: if ``opset`` is not an int (a bool, a float or a string) or ``None``.
        ValueError: if ``onnx`` is not installed, or ``opset`` is outside what
            the exporter writes.
    """
    return _onnx_setup(opset)[2]


def _check_is_tensor(example_input: object) -> None:
    if not isinstance(example_input, Tensor):
        raise TypeError(
            "example_input must be one tensor, an input batch of at least 2 samples "
            f"(e.g. torch.randn(2, 1, 40)), got {type(example_input).__name__}; "
            "export_onnx exports models that take a single input"
        )


def _wrong_float_dtype(model: nn.Module, example_input: Tensor) -> str | None:
    """The dtype of ``model``'s weights when a floating ``example_input`` fails for its dtype alone.

    That is, the weights have one floating dtype, the input another, and the
    model runs on the input cast to the weights' dtype; else None.
    """
    dtypes = {t.dtype for t in model.parameters() if t.is_floating_point()}
    if len(dtypes) != 1 or not example_input.is_floating_point() or example_input.dtype in dtypes:
        return None
    (dtype,) = dtypes
    try:
        with evaluating(model), torch.inference_mode():
            model(example_input.to(dtype))
    except (RuntimeError, ValueError, IndexError, TypeError):
        return None
    return str(dtype).removeprefix("torch.")


def check_example_input(model: nn.Module, example_input: Tensor) -> None:
    """Raise unless ``model`` (in eval mode) runs on ``example_input``; writes nothing.

    The first check of :func:`export_onnx`, so that a wrong input shape fails
    in one line rather than deep in the exporter (and, from the command line,
    before any file is written). Every module's own train/eval mode is restored,
    also when the model fails.

    Args:
        model: the model to export.
        example_input: one input tensor for it (a batch).

    Raises:
        TypeError: if ``example_input`` is not one tensor.
        ValueError: if the model does not run on it, naming its dtype when
            that is not the dtype of the model's weights, its shape otherwise.
    """
    _check_is_tensor(example_input)
    try:
        with evaluating(model), torch.inference_mode():
            model(example_input)
    except (RuntimeError, ValueError, IndexError, TypeError) as err:
        weights = _wrong_float_dtype(model, example_input)
        if weights is not None:
            raise ValueError(
                f"the model does not run on an input of dtype "
                f"{str(example_input.dtype).removeprefix('torch.')} ({first_line(err)}); its "
                f"weights are {weights}: give the input in their dtype "
                f"(example_input.to(torch.{weights}))"
            ) from None
        raise ValueError(
            f"the model does not run on an input of shape {tuple(example_input.shape)} "
            f"and dtype {str(example_input.dtype).removeprefix('torch.')} ({first_line(err)}); "
            "give the shape of one sample the model takes"
        ) from None


# Above this many bytes of weights, torch's torch.export-based exporter saves
# them to a separate "<file>.data" (protobuf caps one message at 2 GiB).
_LARGE_MODEL_BYTES = 1_610_612_736
# What one ONNX file (a protobuf message) holds at most.
_PROTOBUF_LIMIT = 2**31


def _large_model_bytes() -> int:
    try:
        program = importlib.import_module("torch.onnx._internal.exporter._onnx_program")
    except ImportError:
        return _LARGE_MODEL_BYTES
    return int(getattr(program, "_LARGE_MODEL_THRESHOLD", _LARGE_MODEL_BYTES))


def _weights_bytes(model: nn.Module) -> int:
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _unchanged(err: OSError, target: Path) -> OSError:
    """``err`` as one line naming ``target`` and saying it is unchanged (a full disk, say)."""
    out = _os_error(err, target, "writing")  # DiskFullError, NotWritableError
    if out is err:
        out = OSError(
            err.errno,
            f"could not write {target} ({err.strerror or err}); {target.name} is unchanged",
        )
    return out


def _write(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` atomically; an error names the file and says it is unchanged."""
    try:
        write_atomic(target, data)
    except (DiskFullError, NotWritableError):
        raise  # their messages name the file and the fix
    except OSError as err:
        raise _unchanged(err, target) from err


def _new_temp(target: Path) -> str:
    """An empty temporary file beside ``target`` (named as ``write_atomic`` names its own).

    Raises:
        OSError: naming ``target`` and saying it is unchanged.
    """
    try:
        fd, tmp = _temp_in(target.parent, target.name)
    except OSError as err:
        raise _unchanged(err, target) from err
    os.close(fd)
    return tmp


def _save_with_external_data(program: Any, target: Path) -> None:
    """Save a large exported program as ``target`` plus its weights in ``<target>.data``.

    Each file is written to a temporary file and renamed into place, the
    weights first: a failure (a full disk) while writing either leaves the
    old ``.onnx`` as it was; only a kill between the two renames leaves an old
    ``.onnx`` beside the new weights.
    """
    ir = importlib.import_module("onnx_ir")
    data_name = f"{target.name}.data"
    check_writable(target.with_name(data_name), "model.onnx.data", kind=ONNX_DATA)
    tmp = _new_temp(target)
    try:
        # onnx_ir writes the weights to a temporary file and renames it over
        # <target>.data; the graph goes to our temporary file, then over target.
        ir.save(program.model, tmp, external_data=data_name)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise _unchanged(err, target) from err
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    remove_stale_temps(target)


@torch.no_grad()
def _without_pruner(model: nn.Module) -> tuple[nn.Module, list[str]]:
    """``model``, or a copy of it with each weight a Pruner's parametrization holds made plain.

    The copy's weight is ``P_T(w)`` at the thresholds in use — what the
    forward computes now, exact zeros — in a ``Parameter`` of its own, so the
    graph holds the pruned weights and no thresholding. ``model`` itself is
    not changed: ``parametrize.remove_parametrizations`` on a deep copy would
    change the class the copy shares with the original, so the copy is made
    without the parametrizations and its layers given back their own class.

    Returns:
        The model to export, and the plain names of the weights made plain
        (empty, with ``model`` itself, when no Pruner is attached).

    Raises:
        ValueError: naming ``pruner.finalize()``, when a layer also carries
            another parametrization, or the model cannot be copied.
    """
    pruned = _pruned_weights(model)
    if not pruned:
        return model, []
    layers: dict[int, tuple[nn.Module, dict[str, Tensor]]] = {}
    for plain, (module, tensor_name) in pruned.items():
        plists: Any = module.parametrizations
        if set(plists.keys()) != {tensor_name}:
            raise ValueError(
                f"{_attached_message(list(pruned))}, and layer {plain.rpartition('.')[0]!r} "
                f"also has its {sorted(set(plists.keys()) - {tensor_name})} parametrized: call "
                "pruner.finalize() first, which leaves a model that exports as a dense graph"
            )
        # a tensor of its own: the operator may reuse its output memory
        value = getattr(module, tensor_name).detach().clone()
        layers.setdefault(id(module), (module, {}))[1][tensor_name] = value
    memo: dict[int, Any] = {id(m.parametrizations): None for m, _ in layers.values()}
    try:
        plain_model = copy.deepcopy(model, memo)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"{_attached_message(list(pruned))}, and the model cannot be copied to export it "
            f"as it computes now ({first_line(err)[:200]}): call pruner.finalize() first"
        ) from err
    for module, values in layers.values():
        replica = memo[id(module)]
        del replica._modules["parametrizations"]
        replica.__class__ = type(module).__bases__[0]  # the class before parametrize's
        for tensor_name, value in values.items():
            replica.register_parameter(tensor_name, nn.Parameter(value, requires_grad=False))
    return plain_model, list(pruned)


def _check_dense(model: nn.Module) -> None:
    """Raise unless every tensor of ``model`` is dense (torch's exporters export no sparse one).

    Raises:
        ValueError: naming the first sparse layers (from
            :func:`~feather_sparse.export.to_sparse_inference`) and the fix.
    """
    sparse = [
        f"{type(module).__name__} {name or 'the model itself'!r}"
        for name, module in model.named_modules()
        if any(
            t is not None and t.layout != torch.strided
            for t in [*module._parameters.values(), *module._buffers.values()]
        )
    ]
    if sparse:
        raise ValueError(
            f"the model holds sparse tensors ({', '.join(sparse[:3])}"
            f"{', …' if len(sparse) > 3 else ''}), which ONNX export does not take: a model "
            "converted by to_sparse_inference is for PyTorch inference only; export the "
            "finalized model before converting it (export_onnx(model, ...), then "
            "to_sparse_inference(model))"
        )


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike[str],
    example_input: Tensor,
    *,
    opset: int | None = None,
) -> int:
    """Write the (finalized, dense-format) model to ONNX with a dynamic batch size.

    Call ``Pruner.finalize()`` first. A model whose Pruner is still attached
    is exported as its forward computes now, with a warning: each pruned
    weight is ``P_T(w)`` at the thresholds in use, stored as a plain weight
    (the graph has no thresholding ops), as :func:`save_sparse` saves it;
    ``model`` itself is not changed.

    Uses torch's ``torch.export``-based exporter when ``onnxscript`` is
    installed and the legacy TorchScript exporter (``dynamo=False``) otherwise;
    both work offline. The default opset is the newest that both the
    installed ``onnx`` package and the chosen exporter support (onnx 1.23
    knows opset 28; torch 2.13 exports at most 23, or 20 with the legacy
    exporter).

    The model is exported first (in memory, or to a temporary file beside
    ``path`` for the legacy exporter) and ``path`` then written atomically (a
    temporary file renamed over it), so a failure, a full disk or a kill
    leaves an existing file at ``path`` as it was. The exported model is
    checked with ``onnx.checker`` (its full check) before ``path`` is written,
    and refused when invalid. A model with more
    than 1.5 GiB of weights is written as torch writes it, in two files:
    ``path`` and its weights in ``<path>.data``, each atomically, the weights
    first (that needs ``onnxscript``: the legacy exporter cannot write it).

    Args:
        model: the model (in eval mode for the export; every module's own mode is
            restored after it).
        path: the ``.onnx`` file to write.
        example_input: an input batch with a batch size of at least 2 (the
            batch dimension is exported as dynamic).
        opset: the ONNX opset; ``None`` picks the default above.

    Returns:
        The opset written.

    Raises:
        TypeError: if ``example_input`` is not one tensor, or ``opset`` not an int.
        ValueError: if the model holds sparse tensors (converted by
            :func:`~feather_sparse.export.to_sparse_inference`: export it
            before converting), ``onnx`` is not installed, ``opset`` is outside what
            the exporter writes, the model does not run on ``example_input``,
            it is too large for the legacy exporter (over 2 GiB of weights),
            ``path`` is named as a sparse checkpoint (``*.fsp``,
            ``*.safetensors``), a Pruner is attached to a layer that also
            carries another parametrization (call ``pruner.finalize()`` first),
            or the exported model is not valid ONNX (``onnx.checker``'s full
            check rejects it, as it does torch's export of a bfloat16 model
            with BatchNorm): nothing is written then.
        OSError: if ``path`` is a folder, holds a file that is not an ONNX
            model (``FileExistsError``: a ``.fsp``, a training checkpoint, a
            text file, a file of unknown kind; an empty file is replaced), or
            cannot be written (a full disk:
            :class:`~feather_sparse.integrity.DiskFullError`); an existing
            file at ``path`` is then left as it was.
    """
    _check_is_tensor(example_input)
    _check_dense(model)
    check_writable(path, "model.onnx", kind="onnx")  # the name as given: "out/" is a folder
    target = Path(path)
    onnx, exporter, opset = _onnx_setup(opset)
    if exporter == "legacy" and _weights_bytes(model) >= _PROTOBUF_LIMIT:
        raise ValueError(
            f"the model's weights ({_weights_bytes(model) / 2**30:.1f} GiB) do not fit in one ONNX "
            "file (2 GiB) and the legacy exporter cannot write them beside it: install "
            "onnxscript (pip install 'feather-sparse[onnx]'), whose exporter writes them to "
            f"{target.name}.data"
        )
    check_example_input(model, example_input)  # a wrong shape fails here, in one line
    model, pruned = _without_pruner(model)  # a copy, when a Pruner is attached
    if pruned:
        logger.warning(
            "%s: %s; exported as its forward computes now: P_T(w) at the thresholds in use "
            "(sparsity %.4f of those weights) as plain weights (pruner.finalize() first bakes "
            "the target sparsity)",
            target,
            _attached_message(pruned),
            _zero_fraction([p for n, p in model.named_parameters() if n in pruned]),
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    program: Any = None
    data: bytes | None = None
    try:
        with evaluating(model), warnings.catch_warnings():
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
            else:
                data = _legacy_export(model, example_input, opset, target)
    except Exception as err:
        attached = [n for n, m in model.named_modules() if parametrize.is_parametrized(m)]
        if not attached:
            raise
        raise ValueError(
            f"ONNX export failed ({first_line(err)[:200]}) on a model whose layers "
            f"{', '.join(attached[:3])}{', …' if len(attached) > 3 else ''} carry a "
            "parametrization: remove it first (torch.nn.utils.parametrize."
            "remove_parametrizations, leave_parametrized=True), which leaves plain weights "
            "that export as a dense graph"
        ) from err
    large = program is not None and _initializer_bytes(program) > _large_model_bytes()
    if large:
        written = int(program.model.opset_imports.get("", opset))
    else:
        proto = program.model_proto if program is not None else onnx.load_model_from_string(data)
        written = _opset_of(proto)
        if program is not None:
            data = proto.SerializeToString()
    if written != opset:  # checked before the file is written: a wrong one never lands
        raise ValueError(f"asked for opset {opset}, but the {exporter} exporter wrote {written}")
    if large:
        _save_with_external_data(program, target)
        _check_valid(onnx, target, target, model, exporter, written=True)
    else:
        assert data is not None
        _check_valid(onnx, proto, target, model, exporter, written=False)
        _write(target, data)
    logger.info("wrote %s (opset %d, %s exporter)", target, written, exporter)
    return written


def _check_valid(
    onnx: Any, proto: Any, target: Path, model: nn.Module, exporter: str, *, written: bool
) -> None:
    """Raise unless ``onnx.checker`` (full check, shape inference too) accepts the exported model.

    torch's exporters can write a model that is not valid ONNX (a bfloat16
    model with BatchNorm gets a float32 Gemm weight, which no runtime loads).
    ``proto`` is the model in memory, checked before ``target`` is written;
    or, for a model written with its weights beside it (``written``), the
    path of the file, which is then removed with its ``.data``: a broken file
    is never left where a good one is expected.

    Raises:
        ValueError: naming the checker's first complaint, and saying what
            became of ``target``.
    """
    try:
        onnx.checker.check_model(proto if not written else str(proto), full_check=True)
    except Exception as err:  # onnx's checker and shape-inference errors derive from Exception
        if written:
            target.unlink(missing_ok=True)
            target.with_name(f"{target.name}.data").unlink(missing_ok=True)
            fate = f"{target} and its .data were removed"
        else:
            fate = f"nothing was written to {target}"
        hint = ""
        if any(t.dtype == torch.bfloat16 for t in [*model.parameters(), *model.buffers()]):
            hint = (
                "; torch's exporter does not write bfloat16 models reliably: export a float32 "
                "copy, export_onnx(copy.deepcopy(model).float(), path, example_input.float())"
            )
        raise ValueError(
            f"the {exporter} exporter wrote an ONNX model that onnx.checker rejects "
            f"({first_line(err)[:300]}); {fate}{hint}"
        ) from err


def _legacy_export(model: nn.Module, example_input: Tensor, opset: int, target: Path) -> bytes:
    """The bytes of the legacy exporter's ONNX file, exported to a temporary file beside ``target``.

    The temporary file (named as :func:`~feather_sparse.integrity.write_atomic`
    names its own, so that one a killed process leaves is removed by the next
    write) is removed afterwards; ``target`` is not touched.
    """
    tmp = _new_temp(target)
    try:
        torch.onnx.export(
            model,
            (example_input,),
            tmp,
            dynamo=False,
            opset_version=opset,
            input_names=["input"],
            output_names=["output"],
            dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        )
        return Path(tmp).read_bytes()
    except OSError as err:
        raise _unchanged(err, target) from err
    finally:
        Path(tmp).unlink(missing_ok=True)


def _initializer_bytes(program: Any) -> int:
    """Bytes of the weights stored in an exported program's graph."""
    return sum(
        int(v.const_value.nbytes)
        for v in program.model.graph.initializers.values()
        if v.const_value is not None
    )


class _NoOnnxRuntime(ValueError):
    """:func:`verify_onnx` could not check the file: ``onnxruntime`` is not installed."""


class _NoKernel(ValueError):
    """``onnxruntime`` has no kernel for an operator of the file (a float64 convolution on CPU).

    The file itself is valid ONNX (:func:`export_onnx` checks it with
    ``onnx.checker``); this onnxruntime build cannot run it, so it is not verified.
    """


def verify_onnx(model: nn.Module, path: str | os.PathLike[str], inputs: Tensor) -> float:
    """Run the ONNX file in ``onnxruntime`` and compare with the PyTorch model.

    Args:
        model: the PyTorch model the file was exported from (run in eval mode; every
            module's own mode is restored after it).
        path: the ONNX file.
        inputs: the input tensor to run both on.

    Returns:
        The largest absolute difference between the two outputs.

    Raises:
        ValueError: if ``onnxruntime`` is not installed, has no CPU kernel
            for some operator of the file (a float64 convolution, say), or
            cannot run it otherwise.
    """
    return _verify_onnx(model, path, inputs)[0]


def _verify_onnx(
    model: nn.Module, path: str | os.PathLike[str], inputs: Tensor
) -> tuple[float, Tensor]:
    """:func:`verify_onnx`'s difference, and the PyTorch output it was measured against."""
    try:
        ort = importlib.import_module("onnxruntime")
    except ImportError:
        raise _NoOnnxRuntime(
            "verifying ONNX needs onnxruntime: pip install 'feather-sparse[onnx]'"
        ) from None
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: inputs.detach().cpu().numpy()}
        onnx_out = torch.from_numpy(session.run(None, feed)[0])
    except Exception as err:  # onnxruntime's errors derive from Exception alone
        message = f"onnxruntime cannot run {path} ({first_line(err)[:300]})"
        if type(err).__name__ == "NotImplemented" or "NOT_IMPLEMENTED" in str(err):
            raise _NoKernel(message) from err
        raise ValueError(message) from err
    with evaluating(model), torch.inference_mode():
        torch_out = model(inputs).detach().cpu()
    if onnx_out.shape != torch_out.shape:
        raise ValueError(f"ONNX output shape {tuple(onnx_out.shape)} != {tuple(torch_out.shape)}")
    if not onnx_out.numel():
        return 0.0, torch_out
    # in the outputs' own precision: float64 differences of 1e-11 vanish in float32
    common = torch.float64 if torch.float64 in (onnx_out.dtype, torch_out.dtype) else torch.float32
    return float((onnx_out.to(common) - torch_out.to(common)).abs().max()), torch_out
