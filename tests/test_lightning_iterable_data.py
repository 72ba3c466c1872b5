"""The Lightning callback on an iterable data set, whose length the Trainer cannot tell.

``trainer.estimated_stepping_batches`` is then ``max_steps``: ``-1`` when it is
unset (with ``max_epochs`` set or left to Lightning's default), ``inf`` with
``max_epochs=-1``. Either way the callback cannot lay out the schedule and
must ask for ``FeatherCallback(..., total_steps=N)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

pl = pytest.importorskip(
    "lightning.pytorch",
    reason="lightning is not installed (pip install 'feather-sparse[lightning]')",
)

from _guards import guard  # noqa: E402
from _helpers import one_thread, quiet_trainer  # noqa: E402
from feather_sparse.integrations.lightning import FeatherCallback  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:.*LeafSpec.*")]

BATCHES = 4  # per pass over the data


class Stream(torch.utils.data.IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """Eight samples with no ``__len__``: the Trainer cannot count the batches."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(0)
        for _ in range(2 * BATCHES):
            yield torch.randn(8, generator=g), torch.randint(0, 2, (), generator=g)


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.head(self.body(x).relu()), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(module: Net, callback: FeatherCallback, **trainer_kwargs: Any) -> None:
    trainer = quiet_trainer([callback], **trainer_kwargs)
    with one_thread():
        trainer.fit(module, torch.utils.data.DataLoader(Stream(), batch_size=2))


@guard(
    "Lightning: an iterable data set (no length) with `max_steps` unset and no `total_steps`",
    "`ValueError` when training starts, saying to pass `FeatherCallback(..., total_steps=N)`; "
    "the module left dense",
)
@pytest.mark.parametrize("max_epochs", [2, None, -1])
def test_an_iterable_data_set_without_max_steps_asks_for_total_steps(
    max_epochs: int | None,
) -> None:
    # max_epochs=2 and None (Lightning's default, 1000): the estimate is max_steps, -1;
    # max_epochs=-1: inf. The callback raises before a batch runs.
    module, callback = Net(), FeatherCallback(0.5, exclude=["head"])
    dense = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(ValueError, match=r"pass FeatherCallback\(\.\.\., total_steps=N\)") as info:
        fit(module, callback, max_epochs=max_epochs)
    assert "cannot tell how many optimizer steps" in str(info.value)
    assert callback.pruner is None
    assert not any(hasattr(m, "parametrizations") for m in module.modules())
    for key, value in module.state_dict().items():
        assert torch.equal(value, dense[key]), key


def test_an_iterable_data_set_trains_with_total_steps() -> None:
    module, callback = Net(), FeatherCallback(0.5, exclude=["head"], total_steps=2 * BATCHES)
    fit(module, callback, max_epochs=2)
    assert callback.pruner is not None
    assert callback.pruner.current_step == callback.pruner.total_steps == 2 * BATCHES
    assert not any(hasattr(m, "parametrizations") for m in module.modules())
    zeros = int((module.body.weight == 0).sum())
    assert zeros == round(0.5 * module.body.weight.numel())
