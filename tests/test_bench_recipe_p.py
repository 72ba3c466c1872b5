"""Experiments whose rows stand for an operator's own power, under a recipe (or
``--set``) that gives another ``p``.

``bench operator`` compares the hard (p = ∞), soft (p = 1) and Feather (p = 3)
operators. Its rows left ``p`` to the config, so with a recipe's ``p = 2`` the
row labelled "Feather (p = 3)" trained p = 2 and the hard and soft rows failed
(their operators fix p); ``--set p=2`` did the same. The pages of ``theta``,
``backbones`` and ``flops`` said "p = 3" whatever p their Feather runs trained
with.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from _guards import guard
from feather_sparse.bench.driver import plan_experiments
from feather_sparse.bench.experiments.base import feather_p_text
from feather_sparse.bench.options import BenchOptions
from feather_sparse.bench.runner import plan_runs

SHIPPED = Path(__file__).resolve().parent.parent / "src/feather_sparse/recipes/mnist1d.toml"


def _trained_p(opts: BenchOptions, name: str) -> dict[str, float | None]:
    """Each row's p as its run trains it (``None``: the operator's own)."""
    specs = plan_experiments([name], opts)
    plan = plan_runs(opts, specs)
    return {s.group: plan.todo[k].get("p") for s, k in zip(specs, plan.keys)}


@guard(
    "`bench operator` with a recipe or `--set` that gives p (its Feather row trained that p "
    "under the label p = 3, its hard and soft rows failed)",
    "each row trains its operator's own p; `--set p=...` refused as set by the experiment",
)
def test_operator_rows_train_their_own_p_whatever_the_recipe_gives(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(SHIPPED.read_text() + "\np = 2.0\n")
    opts = BenchOptions(recipe=str(recipe), seeds=(0,), sparsities=(0.9,), out=tmp_path)
    assert _trained_p(opts, "operator") == {
        "hard": math.inf,
        "soft": 1.0,
        "Feather (p = 3)": 3.0,
    }
    over = BenchOptions(overrides={"p": 2.0}, seeds=(0,), sparsities=(0.9,), out=tmp_path)
    with pytest.raises(ValueError, match="p: set by the experiment"):
        plan_runs(over, plan_experiments(["operator"], over))


def test_operator_rows_leave_p_to_the_operator_without_a_recipe_p(tmp_path: Path) -> None:
    """The usual case is as before: no row sets p (the stored runs keep their keys)."""
    opts = BenchOptions(seeds=(0,), sparsities=(0.9,), out=tmp_path)
    assert set(_trained_p(opts, "operator").values()) == {None}


@pytest.mark.parametrize(
    ("overrides", "text"),
    [
        ({}, "p = 3"),
        ({"p": 2.0}, "p = 2, set by the recipe or --set"),
        ({"p": math.inf}, "p = ∞, set by the recipe or --set"),
    ],
)
def test_pages_name_the_p_their_feather_runs_train_with(
    overrides: dict[str, float], text: str, tmp_path: Path
) -> None:
    assert feather_p_text(BenchOptions(overrides=overrides, out=tmp_path)) == text


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        ("", "Feather's operator per group (p = 3, θ automatic = 1 at these sparsities)"),
        ("\np = 2.0\n", "Feather's operator per group (p = 2, θ automatic, as the recipe gives)"),
        (
            "\np = 2.0\ntheta = 0.5\n",
            "Feather's operator per group (p = 2, θ = 0.5, as the recipe gives)",
        ),
    ],
)
def test_the_nm_page_names_the_p_and_theta_feather_nm_trains_with(
    extra: str, text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The main grid's feather-nm trains the recipe's p and θ when it gives them; the
    page said "p = 3, θ automatic = 1" whatever they were."""
    from test_mutation_gaps_enm import Figure, summarize

    Figure(monkeypatch)
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(SHIPPED.read_text() + extra)
    body = summarize(BenchOptions(recipe=str(recipe), seeds=(0,), out=tmp_path), [])
    assert text in body
