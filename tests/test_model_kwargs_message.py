"""An unknown `model_kwargs` name is answered with the names the user can set there.

``num_classes`` comes from the data set: ``model_kwargs`` refuses it
(``check_config``), so the list of accepted names must not offer it.
"""

from __future__ import annotations

import inspect

import pytest

from _guards import guard
from feather_sparse import cli
from feather_sparse.models import check_model_kwargs, create_model, list_models
from feather_sparse.models._registry import _MODELS


@guard(
    "`--model-kwargs` / config `model_kwargs` with a name the model does not take",
    "`ValueError` listing the model's own options, without `num_classes` (set by the data set)",
)
@pytest.mark.parametrize("name", list_models())
def test_unknown_option_lists_only_what_model_kwargs_can_set(name: str) -> None:
    factory = _MODELS.get(name).factory
    options = [p for p in inspect.signature(factory).parameters if p != "num_classes"]
    with pytest.raises(ValueError, match="does not accept these arguments") as caught:
        check_model_kwargs(name, widht=2)
    message = str(caught.value)
    assert "num_classes" not in message
    if options:
        assert message.endswith(f"it accepts: {', '.join(options)}")
        for option in options:  # each name it lists is one model_kwargs takes
            check_model_kwargs(name, **{option: 1})  # values are not checked here
    else:
        assert message.endswith("it takes no options")


def test_cli_answers_a_misspelt_option_with_the_settable_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["train", "--model-kwargs", "{widht = 2}", "--print-config"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith("unexpected keyword argument 'widht'); it accepts: width"), err
    # num_classes itself is refused in model_kwargs, with the reason
    assert cli.main(["train", "--model-kwargs", "{num_classes = 3}", "--print-config"]) == 1
    assert "num_classes comes from the data set" in capsys.readouterr().err


def test_create_model_still_lists_num_classes() -> None:
    """``create_model`` takes ``num_classes`` itself: its error keeps it in the list."""
    with pytest.raises(ValueError, match=r"it accepts: num_classes, width$"):
        create_model("resnet20", widht=2)
