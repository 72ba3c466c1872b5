"""The ``train`` command: arguments in, :func:`feather_sparse.train.train` out, results printed.

``feather-sparse train`` takes a recipe, then any recipe field overridden by a
flag of its name; the library's log lines (one per epoch) go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import re
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from feather_sparse.recipes import (
    DEFAULT_RECIPE,
    TrainConfig,
    config_fields,
    field_help,
    list_recipes,
    load_config,
    parse_override,
)
from feather_sparse.train import (
    TrainingInterrupted,
    check_config,
    distributed_context,
    init_distributed,
    resume_config,
    train,
)
from feather_sparse.train.checkpoint import _check_resume
from feather_sparse.train.result import resume_command

#: The shell's code for a process ended by SIGINT (128 + 2).
INTERRUPTED_EXIT_CODE = 130
#: The exit code of a run stopped by SIGTERM (128 + 15, as the shell reports a kill by it).
TERMINATED_EXIT_CODE = 143


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[list[int]]:
    """Let SIGTERM stop training as Ctrl-C does, while the command runs.

    Schedulers, ``docker stop``, Kubernetes and ``timeout`` send SIGTERM: by
    default the process then died without a word (its last checkpoint still
    resumed). Here it raises ``KeyboardInterrupt`` in the main thread, so the
    run ends as on Ctrl-C: the checkpoint being written is finished or left
    as it was, and the command says where the run stopped and how to resume.
    The yielded list records the signal. Only where SIGTERM still has its
    default action and this is the main thread: a handler someone else set
    (a launcher, the user's own code) is left alone.
    """
    got: list[int] = []
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield got
        return

    def stop(signum: int, frame: Any) -> None:
        got.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, previous)


def add_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    """``feather-sparse train``: a recipe, then any field overridden by a flag of its name.

    Args:
        command: the command's name, as :data:`feather_sparse.cli.COMMANDS` registers it.
        parser: the command's subparser, to add the arguments to.
    """
    parser.description = (
        "Train a model with Feather sparsity (the paper's method) or dense. With no arguments: "
        f"the {DEFAULT_RECIPE!r} recipe. Every recipe field has a flag (--epochs 5, "
        "--sparsity 0.98, ...) and can also be set with --set field=value."
    )
    run_group = parser.add_argument_group("run")
    run_group.add_argument(
        "--recipe",
        default=None,
        help=f"bundled recipe ({', '.join(list_recipes())}) or a .toml path [{DEFAULT_RECIPE}]; "
        "a field a .toml file leaves out takes TrainConfig's default, not the "
        f"{DEFAULT_RECIPE} recipe's (start from --print-config for a complete file)",
    )
    run_group.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override any recipe field (repeatable), e.g. --set exclude=fc,conv1",
    )
    run_group.add_argument(
        "--run-dir", default=None, help="run folder [runs/<recipe>-<method>-s<S>-<time>]"
    )
    run_group.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="continue the run in this folder (the folder, not a checkpoint file in it), "
        "with the config of its checkpoint",
    )
    run_group.add_argument(
        "--stop-after-epoch",
        type=int,
        default=None,
        metavar="K",
        help="stop (checkpointed, resumable) once K epochs are done",
    )
    run_group.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar per epoch [on when stderr is a terminal]",
    )
    run_group.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config as a TOML recipe (--recipe reads it back) and exit; "
        "a config training would refuse is refused here with the same error",
    )
    fields = parser.add_argument_group(
        "recipe fields", "each overrides the recipe's value (see --print-config)"
    )
    for f in config_fields():
        if f.name == "recipe":
            continue  # chosen with --recipe
        flag = "--" + f.name.replace("_", "-")
        help_text = field_help(f)
        if f.type in ("bool", bool):
            fields.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        else:
            fields.add_argument(
                flag,
                dest=f.name,
                default=None,
                metavar=f.name.split("_")[-1].upper(),
                help=help_text,
            )


def _cli_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for text in args.set:
        key, value = parse_override(text)
        overrides[key] = value
    for f in config_fields():
        flag_value = getattr(args, f.name, None)
        if f.name != "recipe" and flag_value is not None:
            overrides[f.name] = flag_value
    return overrides


#: Config fields that only a pruned run reads: given with ``--dense`` they would do nothing.
_PRUNING_FIELDS = (
    "method",
    "sparsity",
    "pattern",
    "conv_order",
    "operator",
    "p",
    "theta",
    "theta_rule",
    "backbone",
    "schedule",
    "schedule_start",
    "schedule_end",
    "update_every",
    "exclude",
    "max_layer_sparsity",
)


def _check_dense_flags(dense: bool, overrides: dict[str, Any]) -> None:
    """Refuse a dense run given pruning settings on the command line (they would be ignored)."""
    if not dense:
        return
    given = [name for name in _PRUNING_FIELDS if name in overrides]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(
            f"the run is dense (--dense or the recipe's dense = true), so {flags} would be "
            f"ignored; drop {flags} for a dense run, or pass --no-dense to prune"
        )


# ----------------------------------------------------------- --print-config
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char in "\b\t\n\f\r":
            out.append(json.dumps(char)[1:-1])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _toml_value(value: Any, where: str) -> str:
    """``value`` as a TOML value: ``inf`` for infinity, inline tables for dicts.

    Raises:
        ValueError: for a value TOML cannot hold (``None`` inside a table or a list).
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if math.isnan(value):
            return "nan"
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v, where) for v in value) + "]"
    if isinstance(value, Mapping):
        items = [
            f"{k if _BARE_KEY.fullmatch(k) else _toml_string(k)} = {_toml_value(v, where)}"
            for k, v in value.items()
        ]
        return "{" + ", ".join(items) + "}"
    raise ValueError(f"{where}: {value!r} cannot be written in TOML")


def config_toml(config: TrainConfig) -> str:
    """``config`` as a TOML recipe that ``--recipe`` reads back to the same config.

    Every field is written, so the file does not depend on defaults; an unset
    field (``None``, which TOML cannot write) is a comment, and unset is the
    default of every field that can be unset.

    Args:
        config: the resolved training config.
    """
    lines = [
        "# feather-sparse train --print-config: every field of the resolved config.",
        "# Save it as a .toml file and pass it to --recipe to train with it.",
    ]
    for key, value in config.to_dict().items():
        if value is None:
            lines.append(f"# {key}: unset")
        else:
            lines.append(f"{key} = {_toml_value(value, key)}")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _console_logging(verbose: int, quiet: bool = False) -> Iterator[None]:
    """Show the package's INFO lines (epoch summaries) on stderr, without prefixes.

    ``quiet`` (the non-zero ranks of a distributed run) shows warnings and errors only.
    """
    pkg = logging.getLogger("feather_sparse")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_ConsoleFormatter())
    if quiet:
        handler.setLevel(logging.WARNING)
    old = (pkg.level, pkg.propagate)
    pkg.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO)
    pkg.propagate = False
    pkg.addHandler(handler)
    try:
        yield
    finally:
        pkg.removeHandler(handler)
        pkg.setLevel(old[0])
        pkg.propagate = old[1]


class _ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            return f"{record.levelname.lower()}: {message}"
        return message


def run(command: str, args: argparse.Namespace) -> int:
    """Run ``feather-sparse train``; prints the per-layer table and the final numbers.

    Ctrl-C prints where the run stopped and how to continue it (exit code
    130); so does SIGTERM (a scheduler's stop, ``docker stop``; exit code
    143). Other errors propagate, and :func:`feather_sparse.cli.main` prints
    them in one line.

    Args:
        command: ``"train"``.
        args: the parsed command line.
    """
    with _terminate_as_interrupt() as terminated:
        try:
            return _run(command, args)
        except KeyboardInterrupt as err:
            by = "SIGTERM: " if terminated else ""
            if isinstance(err, TrainingInterrupted):
                print(f"feather-sparse {command}: {by}{err}", file=sys.stderr)
            else:
                print(
                    f"feather-sparse {command}: {by}interrupted before training began",
                    file=sys.stderr,
                )
            return TERMINATED_EXIT_CODE if terminated else INTERRUPTED_EXIT_CODE


def _run(command: str, args: argparse.Namespace) -> int:
    overrides = _cli_overrides(args)
    resume_dir = args.resume
    if resume_dir is not None:
        if args.run_dir is not None and Path(args.run_dir) != Path(resume_dir):
            raise ValueError("--resume RUN_DIR already names the run folder; drop --run-dir")
        if args.recipe is not None:
            config = load_config(args.recipe, overrides)
            # Name what the user gave (the recipe), not overrides never typed.
            _check_resume(
                config, resume_config(resume_dir), recipe=args.recipe, overrides=overrides
            )
        else:
            config = resume_config(resume_dir, overrides)
        run_dir: str | None = resume_dir
    else:
        config = load_config(DEFAULT_RECIPE if args.recipe is None else args.recipe, overrides)
        run_dir = args.run_dir
    _check_dense_flags(config.dense, overrides)
    if args.print_config:
        # What training refuses before it starts, refused here too, by the same
        # checks (the device's presence is the machine's, not the recipe's).
        check_config(config, stop_after_epoch=args.stop_after_epoch, layers=True)
        print(config_toml(config), end="")
        return 0

    initialised = init_distributed(config.device)  # under torchrun: join the group
    try:
        ctx = distributed_context()
        main = ctx.is_main
        with _console_logging(getattr(args, "verbose", 0), quiet=not main):
            result = train(
                config,
                run_dir,
                resume=resume_dir is not None,
                stop_after_epoch=args.stop_after_epoch,
                progress=args.progress,
            )
        if initialised:
            # Leave together: a rank that tears gloo down while another still
            # finishes its last collective aborts the process (seen under load).
            # Not in `finally`: after a failure on one rank the others must not wait.
            torch.distributed.barrier()
    finally:
        if initialised:
            torch.distributed.destroy_process_group()
    if not main:  # rank 0 prints the results
        return 0
    if not result.completed:
        print(
            f"stopped after epoch {result.epochs}/{config.epochs}: test accuracy "
            f"{result.test_accuracy:.2%}; continue with: "
            f"{resume_command(result.run_dir, ctx.world_size, ctx.local_world_size)}"
        )
        return 0
    print()
    print(result.table)
    print()
    target = "dense" if config.dense else f"target {config.sparsity:.2%}"
    print(f"final test accuracy: {result.test_accuracy:.2%}")
    print(f"achieved sparsity:   {result.sparsity:.2%} ({target})")
    print(f"run folder:          {result.run_dir}")
    if result.model_path is not None:
        print(f"model:               {result.model_path}")
    print(f"wall time:           {result.wall_time:.1f} s")
    return 0
