"""A ``p`` given to a method that fixes a hard or soft operator names the method to use.

The operator's own message ("pass operator='feather' to choose p") sent the
user in a circle: the method then refused ``operator='feather'`` as a field it
fixes.
"""

from __future__ import annotations

import math

import pytest
from torch import nn
from torch.nn.utils import parametrize

import feather_sparse as fs
from _guards import guard


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))


@guard(
    "a `p` given to a method that fixes the hard or soft operator (`hard`, `soft`, `gmp`, "
    "`sr-ste`, ...)",
    "`ValueError` naming the method, its operator and p, and `method='feather'`; "
    "the model left unpruned",
)
@pytest.mark.parametrize(
    ("method", "extra", "operator", "own"),
    [
        ("hard", {}, "hard", "inf"),
        ("soft", {}, "soft", "1"),
        ("gmp", {}, "hard", "inf"),
        ("sr-ste", {"pattern": "2:4"}, "hard", "inf"),
    ],
)
def test_the_message_names_the_method_not_the_operator(
    method: str, extra: dict[str, str], operator: str, own: str
) -> None:
    model = _model()
    with pytest.raises(ValueError) as err:
        fs.make_pruner(model, method, sparsity=0.5, total_steps=10, p=2.0, **extra)
    text = str(err.value)
    assert f"method {method!r} fixes operator={operator!r}, whose p is {own}" in text
    assert "(got p=2.0)" in text and "use method='feather' to choose p" in text
    assert "operator='feather'" not in text  # the advice the method itself refuses
    assert not any(parametrize.is_parametrized(m) for m in model.modules())


@pytest.mark.parametrize(("method", "p"), [("hard", math.inf), ("soft", 1.0)])
def test_the_operators_own_p_is_accepted(method: str, p: float) -> None:
    pruner = fs.make_pruner(_model(), method, sparsity=0.5, total_steps=10, p=p)
    pruner.remove()
