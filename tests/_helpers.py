"""Helpers several test files share: one CPU thread, the tiny 1-D convnet, tiny training runs
and their resumption, and the skip of the tests that need safetensors where it is missing."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

from feather_sparse import cli
from feather_sparse.bench.runner import RunOutcome
from feather_sparse.recipes import TrainConfig, load_config
from feather_sparse.train import CHECKPOINT_FORMAT, TrainResult, load_checkpoint, train

#: Why the tests that need safetensors skip; ``None`` where it is installed.
#:
#: safetensors is optional (the ``export`` extra, which ``dev`` includes): sparse
#: checkpoints (``.fsp``) are safetensors files, and transformers needs it too.
#: Where it is missing the library says so in its errors and a training run saves
#: ``model.pt`` instead of ``model.fsp``; the tests of that behaviour run there, the
#: tests that write or read a ``.fsp`` skip. Asked as the library's training asks
#: (``train.run_dir._export_unavailable``): only a missing package skips, a broken
#: install fails the tests with its own error.
SAFETENSORS_MISSING: str | None = (
    "safetensors is not installed; install it with: pip install -e '.[export]' "
    "(or '.[dev]', which includes it)"
    if importlib.util.find_spec("safetensors") is None
    else None
)

#: Marks a test, a parameter (``pytest.param(..., marks=needs_safetensors)``) or a
#: module (``pytestmark = needs_safetensors``) that needs safetensors.
needs_safetensors = pytest.mark.skipif(
    SAFETENSORS_MISSING is not None, reason=SAFETENSORS_MISSING or ""
)


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block on one intra-op thread, then restore the previous count.

    The tests' models are tiny: one thread is fastest, and several threads on a
    busy CPU spin against each other (5-100x slower). No result depends on it.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextmanager
def script_module(path: Path, name: str) -> Iterator[ModuleType]:
    """The Python file ``path`` (a benchmark script, say) imported as module ``name``,
    registered in ``sys.modules`` while in use (dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[name]


def conv1d_net(seed: int = 0, hidden: int = 32) -> nn.Module:
    """A seeded conv + two linear layers on ``(batch, 2, 16)`` inputs, 4 classes."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv1d(2, 8, 5, padding=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 16, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 4),
    )


def checkpoint_state(**entries: Any) -> dict[str, Any]:
    """A training checkpoint holding every entry ``load_checkpoint`` requires (placeholder
    values, a dense run), with ``entries`` added or replacing them."""
    state: dict[str, Any] = {
        "format": CHECKPOINT_FORMAT,
        "epoch": 1,
        "step": 4,
        "config": {},
        "model": {},
        "pruner": None,
        "optimizer": {},
        "lr_scheduler": {},
        "rng": {"torch": torch.get_rng_state(), "numpy": [], "python": [], "cuda": []},
    }
    return {**state, **entries}


def tiny_run(train_size: int, test_size: int, eval_batch_size: int) -> dict[str, Any]:
    """Recipe overrides for a tiny training run: the ``mnist1d`` default model at a
    quarter of its width on ``train_size`` synthetic samples, batches of 64, 3 epochs,
    on the CPU (also where a GPU is present: the tests compare CPU bits; the gpu tests
    ask for ``device="cuda"`` themselves)."""
    return {
        "device": "cpu",
        "model_kwargs": {"width": 0.25},
        "dataset": "synthetic-mnist1d",
        "data_options": {"train_size": train_size, "test_size": test_size},
        "batch_size": 64,
        "eval_batch_size": eval_batch_size,
        "epochs": 3,
        "tensorboard": False,
        "threads": 1,
    }


def tiny_config(settings: dict[str, Any], **overrides: Any) -> TrainConfig:
    """The ``mnist1d`` recipe with ``settings`` (from :func:`tiny_run`), then ``overrides``."""
    return load_config("mnist1d", {**settings, **overrides})


def tiny_run_args(
    train_size: int,
    test_size: int,
    *,
    epochs: int | None = None,
    eval_batch_size: int | None = None,
    quarter_width: bool = True,
) -> list[str]:
    """``feather-sparse train`` arguments for a tiny run on synthetic MNIST-1D,
    batches of 64, on the CPU (as :func:`tiny_run`); ``epochs`` and ``eval_batch_size``
    are passed only when given."""
    args = ["--model-kwargs", "{width = 0.25}"] if quarter_width else []
    args += [
        "--dataset",
        "synthetic-mnist1d",
        "--set",
        f"data_options={{train_size = {train_size}, test_size = {test_size}}}",
        "--batch-size",
        "64",
    ]
    if eval_batch_size is not None:
        args += ["--eval-batch-size", str(eval_batch_size)]
    if epochs is not None:
        args += ["--epochs", str(epochs)]
    return [*args, "--no-tensorboard", "--no-progress", "--threads", "1", "--device", "cpu"]


def straight_and_resumed(
    config: TrainConfig, root: Path
) -> tuple[TrainResult, TrainResult, dict[str, Any], dict[str, Any]]:
    """Train ``config`` straight into ``root / "straight"``; train it again into
    ``root / "resumed"``, stopped after 2 epochs and finished by ``train --resume``.

    Returns:
        The straight run's result, the stopped run's result, and the final
        checkpoints of the straight run and of the resumed one.
    """
    straight = train(config, root / "straight", progress=False)
    run = root / "resumed"
    half = train(config, run, stop_after_epoch=2, progress=False)
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    return straight, half, load_checkpoint(root / "straight"), load_checkpoint(run)


def frozen_spartan() -> tuple[nn.Module, Any]:
    """A small MLP whose Spartan Pruner has frozen its masks (5 of 5 steps trained)."""
    import feather_sparse as fs

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    pruner = fs.make_pruner(model, "spartan", sparsity=0.5, total_steps=5)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(5):
        model(torch.randn(4, 16)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        pruner.step()
    assert pruner.backbone.frozen
    return model, pruner


def training_checkpoint(
    path: Path,
    model: nn.Module,
    pruner: Any,
    *,
    epoch: int = 1,
    config: dict[str, Any] | None = None,
) -> Path:
    """A training checkpoint of format 1 (no checksum) holding every entry ``export`` reads.

    ``config`` adds to the recorded config (``model`` and ``seed``); ``pruner`` is a
    :class:`~feather_sparse.Pruner` or None (a dense run).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "format": "feather-sparse-checkpoint",
            "version": 1,
            "epoch": epoch,
            "step": 4,
            "config": {"model": model.feather_model_spec, "seed": 0, **(config or {})},
            "model": model.state_dict() if pruner is None else pruner.dense_state_dict(),
            "pruner": None if pruner is None else pruner.state_dict(),
            "optimizer": {},
            "lr_scheduler": {},
            "rng": {"torch": torch.get_rng_state(), "numpy": [], "python": [], "cuda": []},
        },
        path,
    )
    return path


def quiet_trainer(callbacks: list[Any], **kwargs: Any) -> Any:
    """A CPU Lightning Trainer without logger, checkpoints, progress bar or model
    summary (``kwargs`` add to or override these); skips the test without lightning."""
    pl = pytest.importorskip("lightning.pytorch", reason="lightning is not installed")
    options: dict[str, Any] = {
        "accelerator": "cpu",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        **kwargs,
    }
    return pl.Trainer(callbacks=callbacks, **options)


def write_stability_runs(
    folder: Path,
    pearson: dict[tuple[str, float], list[tuple[float, ...]]],
    epochs: tuple[int, ...],
) -> Path:
    """Finished runs of ``bench stability`` under ``folder/runs`` and their index
    ``folder/stability.json``: for each (group, sparsity), one run per seed whose
    mask-stability Pearson values at ``epochs`` are the given tuple. Returns the runs folder."""
    runs = folder / "runs"
    raw = []
    for (group, x), per_seed in pearson.items():
        for seed, values in enumerate(per_seed):
            key = f"{group}-{x}-{seed}".replace(" ", "")
            outcome = RunOutcome(
                key=key, config={}, ok=True, stability_epochs=epochs, stability_pearson=values
            )
            (runs / key).mkdir(parents=True)
            (runs / key / "result.json").write_text(json.dumps(outcome.to_json()))
            raw.append({"group": group, "x": x, "seed": seed, "key": key, "ok": True})
    (folder / "stability.json").write_text(json.dumps(raw))
    return runs
