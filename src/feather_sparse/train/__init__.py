"""Training runs behind ``feather-sparse train``: recipes in, a pruned model out.

One call trains a registered model on a registered data set with the Feather
Pruner (Glentis Georgoulakis, Retsinas & Maragos, BMVC 2023) or, with
``dense``, without it::

    from feather_sparse.recipes import load_config
    from feather_sparse.train import train

    result = train(load_config("cifar100", sparsity=0.98), "runs/r20-s98")
    result.test_accuracy, result.sparsity

This package only re-exports. One module per job, in the order a run uses them:

- :mod:`~feather_sparse.train.dist`: the device and this process's rank (DDP);
- :mod:`~feather_sparse.train.optim`: optimizer and learning-rate schedule;
- :mod:`~feather_sparse.train.init_from`: the weights a run starts from (``init_from``);
- :mod:`~feather_sparse.train.session`: one session's state, built or restored;
- :mod:`~feather_sparse.train.loop`: the epoch loop, evaluation, :func:`train`;
- :mod:`~feather_sparse.train.result`: what :func:`train` returns or raises on Ctrl-C;
- :mod:`~feather_sparse.train.checkpoint`: ``last.pt``, RNG states, resume checks;
- :mod:`~feather_sparse.train.run_dir`: the run folder, its files and log;
- :mod:`~feather_sparse.train.progress`: the progress bar and console lines.

The config → Pruner mapping is :func:`feather_sparse.methods.build_pruner`
(re-exported here, where it used to live).

The command line (``add_cli_arguments``, ``run_cli``) lives in
:mod:`feather_sparse.cli.train`; the two names are still importable from here.
"""

from __future__ import annotations

from typing import Any

# ``X as X``: names the former single module offered outside ``__all__``, kept importable.
from feather_sparse.methods import build_pruner
from feather_sparse.train.checkpoint import (
    CHECKPOINT_FORMAT,
    RESUME_FREE_FIELDS,
    checkpoint_path,
    load_checkpoint,
    load_latest_checkpoint,
    resume_config,
    save_checkpoint,
)
from feather_sparse.train.checkpoint import CHECKPOINT_VERSION as CHECKPOINT_VERSION
from feather_sparse.train.dist import (
    DistContext,
    distributed_context,
    init_distributed,
    resolve_device,
)
from feather_sparse.train.loop import EpochCallback, check_config, evaluate, train
from feather_sparse.train.optim import build_lr_scheduler, build_optimizer, lr_factor
from feather_sparse.train.progress import BAR_REFRESHES_PER_EPOCH as BAR_REFRESHES_PER_EPOCH
from feather_sparse.train.progress import LOG_INTERVAL_S as LOG_INTERVAL_S
from feather_sparse.train.result import ProcessLost, TrainingInterrupted, TrainResult
from feather_sparse.train.run_dir import DEFAULT_RUNS_ROOT as DEFAULT_RUNS_ROOT
from feather_sparse.train.run_dir import RUN_FORMAT as RUN_FORMAT
from feather_sparse.train.run_dir import default_run_dir

__all__ = [
    "CHECKPOINT_FORMAT",
    "RESUME_FREE_FIELDS",
    "DistContext",
    "EpochCallback",
    "ProcessLost",
    "TrainResult",
    "TrainingInterrupted",
    "add_cli_arguments",
    "build_lr_scheduler",
    "build_optimizer",
    "build_pruner",
    "check_config",
    "checkpoint_path",
    "default_run_dir",
    "distributed_context",
    "evaluate",
    "init_distributed",
    "load_checkpoint",
    "load_latest_checkpoint",
    "lr_factor",
    "resolve_device",
    "resume_config",
    "run_cli",
    "save_checkpoint",
    "train",
]

# The CLI front end moved to feather_sparse.cli.train (the library does not
# import argparse); the old names resolve there on first use.
_CLI_NAMES = {"add_cli_arguments": "add_arguments", "run_cli": "run"}


def __getattr__(name: str) -> Any:
    if name in _CLI_NAMES:
        # Lazy: importing the library never imports the CLI (and argparse).
        from feather_sparse.cli import train as cli_train

        return getattr(cli_train, _CLI_NAMES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
