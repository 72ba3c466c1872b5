"""What ``train()`` changes in the process is given back when it returns or fails."""

from __future__ import annotations

from pathlib import Path

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
