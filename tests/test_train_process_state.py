"""What ``train()`` changes in the process (settings, random state) is given back when it
returns or fails."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from _guards import guard
from _helpers import tiny_config, tiny_run
from feather_sparse.train import train

SMALL = tiny_run(train_size=128, test_size=64, eval_batch_size=64)


def _settings() -> tuple[int, bool, bool, bool]:
    return (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
    )


@guard(
    "`train()` called from Python (a notebook) with `deterministic=true` or `threads=1`",
    "the process's thread count, deterministic-algorithms mode and cudnn.benchmark are "
    "given back when it returns or fails; deterministic mode stayed on for the rest of "
    "the process (slower kernels, warnings from unrelated code)",
)
@pytest.mark.parametrize("fails", [False, True])
def test_train_gives_back_the_process_settings(
    tmp_path: Path, fails: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _settings()
    config = tiny_config(SMALL, epochs=1, deterministic=True, threads=1)
    if fails:
        from feather_sparse.train import session

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("the data set is gone")

        monkeypatch.setattr(session, "check_model_takes", broken)
        with pytest.raises(RuntimeError, match="the data set is gone"):
            train(config, tmp_path / "run", progress=False)
    else:
        train(config, tmp_path / "run", progress=False)
    assert _settings() == before
    assert not torch.are_deterministic_algorithms_enabled()


def _draws() -> tuple[float, float, float]:
    """The next number of Python's, numpy's and torch's global generators (drawn)."""
    return random.random(), float(np.random.rand()), torch.rand(()).item()


@pytest.mark.parametrize("fails", [False, True])
def test_train_gives_back_the_random_state(tmp_path: Path, fails: bool) -> None:
    # A search script drawing each trial's settings between runs: after a run that
    # seeded the generators (seed 0), its next draws must not restart from that seed.
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    expected = _draws()
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    config = tiny_config(SMALL, epochs=1)

    def broken(*args: object) -> None:
        raise RuntimeError("stopped by the callback")

    if fails:
        with pytest.raises(RuntimeError, match="stopped by the callback"):
            train(config, tmp_path / "run", callbacks=[broken], progress=False)
    else:
        train(config, tmp_path / "run", progress=False)
    assert _draws() == expected
