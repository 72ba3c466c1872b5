"""The ``export`` and ``inspect`` commands: arguments in, library calls out, results printed."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from torch import nn

from feather_sparse import models
from feather_sparse.export.codec import _VALUE_DTYPES
from feather_sparse.export.files import SUFFIXES, check_writable
from feather_sparse.export.fsp import inspect_sparse, save_sparse
from feather_sparse.export.header import (
    MODEL_SPEC_ATTR,
    SparseFileInfo,
    format_info,
    human_bytes,
    smaller_or_larger,
)
from feather_sparse.export.onnx import (
    _NoKernel,
    _NoOnnxRuntime,
    _verify_onnx,
    check_example_input,
    export_onnx,
    onnx_opset,
)
from feather_sparse.export.run import (
    NO_ARCHITECTURE,
    NoModelSpecError,
    PatternSparsityError,
    load_export_source,
    reencode_sparse,
    source_paths,
)


def add_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    """Arguments of ``feather-sparse export`` and ``feather-sparse inspect``.

    Args:
        command: ``"export"`` or ``"inspect"``: which command's arguments to add.
        parser: the command's subparser, to add the arguments to.
    """
    if command == "inspect":
        parser.add_argument("file", type=Path, help="a sparse checkpoint (.fsp)")
        return
    parser.add_argument(
        "source",
        type=Path,
        help="a training run folder, a training checkpoint (.pt) or a sparse checkpoint (.fsp)",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=str,  # as typed: Path("out/") drops the separator that makes it a folder
        help="sparse checkpoint to write (.fsp; a name ending in .onnx is refused: use --onnx)",
    )
    parser.add_argument(
        "--values",
        choices=sorted(_VALUE_DTYPES),
        default=None,
        help="precision of the stored non-zeros (fp32 is lossless; default: a .fsp source's "
        "own precision, fp32 for a training checkpoint)",
    )
    parser.add_argument(
        "--sparsity",
        type=float,
        help="finalize a training checkpoint at this sparsity instead of where the run is "
        "(a finished run: its target; an unfinished one: the thresholds in use); "
        "warns when the weights were not trained for it",
    )
    parser.add_argument("--onnx", type=str, help="also write the dense-format model as ONNX")
    parser.add_argument("--opset", type=int, help="ONNX opset (default: newest supported)")
    parser.add_argument(
        "--input-shape",
        help="shape of one input sample for ONNX, e.g. 1,40 (default: the model's own)",
    )


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(",") if part.strip())
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise ValueError(f"--input-shape must be positive sizes like 1,40; got {text!r}")
    return shape


def _input_shape(model: nn.Module, shape: tuple[int, ...] | None) -> tuple[int, ...]:
    if shape:
        return shape
    spec = getattr(model, MODEL_SPEC_ATTR, None)
    if spec:
        return tuple(models.model_info(str(spec["name"])).input_shape)
    raise ValueError("the model has no registered input shape; pass --input-shape")


def _example_input(model: nn.Module, shape: tuple[int, ...]) -> torch.Tensor:
    """A batch of 2 random samples in the dtype of the model's weights (float32 if none)."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return torch.randn(2, *shape, dtype=dtype)


def _file_arg(flag: str, raw: str | None, example: str) -> Path | None:
    """The file a flag names; a name ending in a path separator names a folder.

    Raises:
        ValueError: for ``out/``, naming the flag and a file name in that folder.
    """
    if raw is None:
        return None
    if raw.endswith(tuple(sep for sep in (os.sep, os.altsep) if sep)) and raw.strip("/\\"):
        raise ValueError(
            f"{flag} {raw} names a folder (it ends in a path separator); give a file name, "
            f"e.g. {flag} {Path(raw) / example}"
        )
    return Path(raw)


def _same_file(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve() or (a.exists() and b.exists() and a.samefile(b))


def _onnx_needs_a_model(path: Path, with_output: bool) -> str:
    """Why a ``.fsp`` without a model spec has no ONNX export here, and what to do instead."""
    message = (
        f"{path} {NO_ARCHITECTURE}, and ONNX needs the model itself; "
        "in Python, load the weights into the model they were saved from and export that: "
        "model = feather_sparse.load_sparse(path, model), then "
        "feather_sparse.export_onnx(model, 'model.onnx', example_input)"
    )
    if with_output:
        message += "; drop --onnx to write the .fsp alone (its tensors need no model)"
    return message


def _warn_of_name(target: Path, kind: str) -> None:
    """Warn when ``target``'s name does not say what it will hold (``-o model.pt``, say).

    A name that says the other format (``-o model.onnx``) is refused before
    this, by :func:`~feather_sparse.export.files.check_writable`.
    """
    suffixes = SUFFIXES[kind]
    if target.suffix.lower() in suffixes:
        return
    what = "a sparse checkpoint (.fsp)" if kind == "safetensors" else "an ONNX model"
    print(
        f"feather-sparse export: warning: {target} will hold {what}, though its name does not "
        f"say so ({target.with_suffix(suffixes[0]).name} would)",
        file=sys.stderr,
    )


def _onnx_tolerance(out: torch.Tensor) -> float:
    """The largest difference from PyTorch's output ``out`` taken as onnxruntime matching it.

    1000 machine epsilons of the output's dtype, times its largest magnitude
    (at least 1): about 1e-4 relative in float32, where the two runtimes
    differ by rounding alone (their kernels sum in other orders).
    """
    eps = torch.finfo(out.dtype).eps if out.is_floating_point() else 0.0
    scale = float(out.abs().max()) if out.numel() else 0.0
    return 1000 * eps * max(1.0, scale)


def _print_written(info: SparseFileInfo) -> None:
    print(
        f"wrote {info.path}: {human_bytes(info.file_bytes)} "
        f"({smaller_or_larger(info.dense_bytes, info.file_bytes)} than dense, "
        f"sparsity {info.sparsity:.4f})"
    )


def run(command: str, args: argparse.Namespace) -> int:
    """Run ``feather-sparse export`` or ``feather-sparse inspect``; returns the exit code.

    Errors (bad input, a damaged file, a full disk) propagate as exceptions;
    :func:`feather_sparse.cli.main` prints them in one line.

    Args:
        command: ``"export"`` or ``"inspect"``.
        args: the parsed command line.
    """
    if command == "inspect":
        print(format_info(inspect_sparse(args.file)))
        return 0
    if args.output is None and args.onnx is None:
        raise ValueError("nothing to write: give -o model.fsp and/or --onnx model.onnx")
    args.output = _file_arg("-o", args.output, "model.fsp")
    args.onnx = _file_arg("--onnx", args.onnx, "model.onnx")
    if args.output is not None and args.onnx is not None and _same_file(args.output, args.onnx):
        raise ValueError(
            f"-o and --onnx both name {args.output}: the ONNX model would replace the .fsp; "
            "give two files, e.g. -o model.fsp --onnx model.onnx"
        )
    # Every option is checked before anything is written (and before the slow part).
    shape = opset = None
    if args.onnx is None:
        given = [
            flag
            for flag, value in (("--opset", args.opset), ("--input-shape", args.input_shape))
            if value is not None
        ]
        if given:
            flags = " and ".join(given)
            raise ValueError(
                f"{flags} {'apply' if len(given) > 1 else 'applies'} to the ONNX model only: "
                f"add --onnx model.onnx, or drop {flags}"
            )
    else:
        shape = _parse_shape(args.input_shape) if args.input_shape is not None else None
        opset = onnx_opset(args.opset)  # the onnx package is there, the opset one it writes
    # Before the slow part, not after it: a target that cannot be written, the
    # file being exported or the run's checkpoints, or a file of another kind.
    reads = source_paths(args.source)
    for target, suggestion, kind in (
        (args.output, "model.fsp", "safetensors"),
        (args.onnx, "model.onnx", "onnx"),
    ):
        if target is not None:
            check_writable(target, suggestion, kind=kind, reads=reads)
            _warn_of_name(target, kind)
    try:
        source = load_export_source(args.source, sparsity=args.sparsity)
    except PatternSparsityError as err:
        raise ValueError(
            f"{err.reason}; drop --sparsity: an N:M run is exported at its pattern's sparsity"
        ) from None
    except NoModelSpecError as err:
        # A weight format needs no architecture: the tensors are written again as they are.
        if args.onnx is not None:
            raise ValueError(_onnx_needs_a_model(err.path, args.output is not None)) from None
        info = reencode_sparse(err.path, args.output, values=args.values)
        _print_written(info)
        sys.stdout.flush()
        return 0
    model = source.model
    example = None
    if args.onnx is not None:  # a shape the model cannot take fails before -o is written
        example = _example_input(model, _input_shape(model, shape))
        try:
            check_example_input(model, example)
        except ValueError as err:
            raise ValueError(f"{err} (--input-shape, without the batch size)") from None
    if source.warning:
        print(f"feather-sparse export: warning: {source.warning}", file=sys.stderr)
    if source.baked == "current":
        print(
            f"the run has not finished ({source.progress}): exported as it "
            f"is, with the thresholds in use, sparsity {source.sparsity:.4f} "
            f"(target {source.target:g}; --sparsity {source.target:g} forces the target)"
        )
    if args.output is not None:
        _print_written(
            save_sparse(
                model,
                args.output,
                values=args.values or source.values,
                metadata=source.metadata,
            )
        )
    if args.onnx is not None:
        assert example is not None
        opset = export_onnx(model, args.onnx, example, opset=opset)
        message = f"wrote {args.onnx} (opset {opset})"
        try:
            diff, reference = _verify_onnx(model, args.onnx, example)
        except (_NoOnnxRuntime, _NoKernel) as err:  # a valid file (onnx.checker passed it)
            message += f"; not verified: {err}"
        except ValueError as err:  # onnxruntime cannot load or run a file onnx.checker passed
            print(message)
            print(
                f"feather-sparse export: error: {err}; the file is left for inspection, "
                "do not deploy it",
                file=sys.stderr,
            )
            return 1
        else:
            tolerance = _onnx_tolerance(reference)
            if not diff <= tolerance:  # NaN too
                print(message)
                print(
                    f"feather-sparse export: error: {args.onnx} does not compute what the "
                    f"model computes: onnxruntime's output differs from PyTorch's by up to "
                    f"{diff:.3g}, above the tolerance {tolerance:.3g} (1000 float epsilons of "
                    "the output's scale); the file is left for inspection, do not deploy it",
                    file=sys.stderr,
                )
                return 1
            message += f"; onnxruntime matches PyTorch to {diff:.2e}"
        print(message)
    sys.stdout.flush()
    return 0
