"""Named sweeps (``feather-sparse bench EXPERIMENT --suite NAME``): a recipe, a grid and a place.

A suite is a preset of :class:`~feather_sparse.bench.options.BenchOptions`
fields, fixed before any of its runs, with the rule that chose its grids
written on every page it makes. Flags given on the command line override the
suite's values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feather_sparse.registry import Registry

__all__ = ["PAPER_REGIME", "SUITES", "Suite"]


@dataclass(frozen=True)
class Suite:
    """A named sweep.

    Attributes:
        name: what ``--suite`` takes.
        summary: one line for ``--help``.
        rule: how the grids were chosen, written under every table of the suite.
        experiments: what ``bench all --suite NAME`` runs.
        fields: :class:`BenchOptions` fields of every experiment (``recipe``,
            ``seeds``, ``sparsities``, ``out``, ``runs_dir``, ``jobs``, ``threads``).
        per_experiment: experiment name -> fields that differ for it.
    """

    name: str
    summary: str
    rule: str
    experiments: tuple[str, ...]
    fields: Mapping[str, Any]
    per_experiment: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def options_fields(self, explicit: Mapping[str, Any]) -> dict[str, Any]:
        """The suite's ``BenchOptions`` fields with ``explicit`` ones (command-line flags) on top.

        An explicit ``sparsities`` applies to every experiment, so it also
        replaces the suite's per-experiment sparsities.

        Args:
            explicit: the fields the user set, by name.
        """
        values: dict[str, Any] = {**self.fields, "suite": self.name}
        per_experiment = {k: dict(v) for k, v in self.per_experiment.items()}
        for name, value in explicit.items():
            values[name] = value
            for fields in per_experiment.values():
                fields.pop(name, None)
        values["per_experiment"] = {k: v for k, v in per_experiment.items() if v}
        return values


#: The highest sparsities of the regime suite, where its ablations run.
_REGIME_SPARSITIES = (0.9, 0.95, 0.98, 0.99, 0.995)
_REGIME_ABLATION_SPARSITIES = _REGIME_SPARSITIES[-2:]

PAPER_REGIME = Suite(
    name="paper-regime",
    summary=(
        "the bundled MNIST-1D in the paper's regime (recipe mnist1d-regime): 5 seeds, "
        "sparsity 90-99.5 %, into docs/results/mnist1d-regime; 'all' = compare, operator, "
        "theta, p (2 runs x 1 thread)"
    ),
    rule=(
        "`compare` runs every sparsity of the suite (90, 95, 98, 99, 99.5 %); the ablations "
        "of Feather's own settings (`operator`, `theta`, `p`) run only at the suite's two "
        "highest sparsities (99 and 99.5 %), where the regime makes the methods lose "
        "points and where the paper places the effect of θ and of the operator. The rule "
        "was fixed with the suite, before any of its runs, to keep the sweep near an hour "
        "on two cores. `stability`, outside `all`, runs at the suite's lowest sparsity (90 %)"
    ),
    experiments=("compare", "operator", "theta", "p"),
    fields={
        "recipe": "mnist1d-regime",
        "seeds": (0, 1, 2, 3, 4),
        "sparsities": _REGIME_SPARSITIES,
        "out": Path("docs/results/mnist1d-regime"),
        "runs_dir": Path("runs/mnist1d-regime"),
        "jobs": 2,
        "threads": 1,
    },
    per_experiment={
        **{
            name: {"sparsities": _REGIME_ABLATION_SPARSITIES} for name in ("operator", "theta", "p")
        },
        "stability": {"sparsities": _REGIME_SPARSITIES[:1]},
    },
)

SUITES: Registry[Suite] = Registry("suite")
SUITES.register(PAPER_REGIME.name, PAPER_REGIME)
