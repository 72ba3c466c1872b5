"""A model whose prunable layers hold no weights at all: refused at attach, with the fix.

Found in the mutation audit of the Pruner (``docs/mutation-audit.md``, "The
Pruner"): with every matched layer empty (``nn.Linear(8, 0)``) the Pruner
attached and then divided by its zero weights in ``sparsity_achieved()``,
``report()`` and ``finalize()`` (a ``ZeroDivisionError``, after finalize had
already baked the model).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import feather_sparse as fs
from _guards import guard


@guard(
    "every prunable layer has no weights (only `nn.Linear(8, 0)`-like layers matched)",
    "`ValueError` at attach naming the layers and the fix; the model is left untouched",
)
@pytest.mark.parametrize("pattern", [None, "2:4"])
def test_a_model_whose_prunable_layers_are_all_empty_is_refused(pattern: str | None) -> None:
    with pytest.warns(UserWarning, match="zero-element"):  # torch's own, at initialisation
        model = nn.Sequential(nn.Linear(8, 0), nn.ReLU(), nn.Linear(0, 4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kwargs: dict[str, Any] = {"pattern": pattern} if pattern else {"sparsity": 0.5}
    with pytest.raises(ValueError, match=r"'0', '2'.* hold no weights.*nothing to prune"):
        fs.Pruner(model, total_steps=10, **kwargs)
    assert not any(parametrize.is_parametrized(m) for m in model.modules())
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
