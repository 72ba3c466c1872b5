"""How a sweep runs: :class:`BenchOptions` and the settings every bench run shares."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from feather_sparse.recipes import DEFAULT_RECIPE, TrainConfig, load_config

__all__ = [
    "BENCH_OVERRIDES",
    "DEFAULT_BENCH_RECIPE",
    "DEFAULT_SEEDS",
    "QUICK_OVERRIDES",
    "QUICK_SPARSITIES",
    "BenchOptions",
    "usable_cpus",
]

DEFAULT_SEEDS = (0, 1, 2)

#: ``--quick``: the smallest run that still exercises every code path.
QUICK_OVERRIDES: Mapping[str, Any] = {"epochs": 2}
QUICK_SPARSITIES = (0.95,)
#: Config fields every bench run sets: no TensorBoard files, and the test set
#: only for the final model (no table reads the per-epoch test accuracy, which
#: cost 7 % of a run of the bundled recipe; the weights are the same either way).
BENCH_OVERRIDES: Mapping[str, Any] = {"tensorboard": False, "eval_every": 0}

#: Recipe used when a data set with no recipe of its name is asked for.
DEFAULT_BENCH_RECIPE = DEFAULT_RECIPE


@dataclass(frozen=True)
class BenchOptions:
    """How to run an experiment.

    Attributes:
        recipe: the training recipe every run starts from (bundled name or TOML path).
        overrides: config fields set for every run (``model``, ``dataset``,
            ``epochs``, ``device``, ...). Fields an experiment varies (its
            method, sparsity, θ, ...) may not be overridden.
        seeds: training seeds; each cell is run once per seed.
        sparsities: the sparsity columns; ``None`` for the experiment's default.
        thetas: θ values of ``theta``/``theta-operator``/``stability``/``nm``; ``None``
            for default.
        ps: p values of ``p`` and ``nm``; ``None`` for the default.
        ablation_pattern: the N:M pattern of ``nm``'s θ and p ablations;
            ``None`` for its default (2:4).
        methods: labels of ``compare``'s methods to run; ``None`` for all.
        quick: a CI-sized smoke run (2 epochs, one seed, one sparsity).
        jobs: parallel training processes; 0 = automatic (see :meth:`worker_count`).
        threads: torch CPU threads per run (the config field ``threads``);
            ``None`` keeps the recipe's.
        out: folder of the tables, plots and raw results (a path or a string).
        runs_dir: folder of the per-run outputs; default ``out/runs``.
        force: re-run runs that already have a result.
        command: the command line to print under the tables (default: rebuilt
            from these options).
        suite: the name of the suite these options come from (see
            :mod:`feather_sparse.bench.suites`), for the pages; ``None`` for none.
        per_experiment: experiment name -> fields of these options that differ
            for that experiment (a suite's smaller ablation grids); see
            :meth:`for_experiment`.

    Each experiment reads only the grid fields it has (``sparsities``,
    ``thetas``, ``ps``, ``ablation_pattern``, ``methods``; see
    ``Experiment.options``): ``nm`` has no sparsity columns, ``compare`` no θ
    values. The command line refuses a grid flag that its experiment would
    ignore, and ``bench all`` clears such a field per experiment.
    """

    recipe: str = DEFAULT_BENCH_RECIPE
    overrides: Mapping[str, Any] = field(default_factory=dict)
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    sparsities: tuple[float, ...] | None = None
    thetas: tuple[float, ...] | None = None
    ps: tuple[float, ...] | None = None
    ablation_pattern: str | None = None
    methods: tuple[str, ...] | None = None
    quick: bool = False
    jobs: int = 0
    threads: int | None = None
    out: Path = Path("results")
    runs_dir: Path | None = None
    force: bool = False
    command: str | None = None
    suite: str | None = None
    per_experiment: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = {f.name for f in fields(self)} - {"per_experiment"}
        for experiment, changes in self.per_experiment.items():
            unknown = sorted(set(changes) - names)
            if unknown:
                raise ValueError(
                    f"per_experiment[{experiment!r}]: {', '.join(unknown)} are not bench "
                    f"options; choose from: {', '.join(sorted(names))}"
                )
        if not self.seeds:
            raise ValueError("seeds: give at least one seed")
        if any(s < 0 for s in self.seeds):
            raise ValueError(f"seeds must be >= 0, got {self.seeds}")
        # A value given twice would count each of its runs twice in a cell's mean ± std.
        for name, values, what in (
            ("seeds", self.seeds, "a seed is one run"),
            ("sparsities", self.sparsities, "a sparsity is one column"),
            ("thetas", self.thetas, "a θ is one set of runs"),
            ("ps", self.ps, "a p is one set of runs"),
            ("methods", self.methods, "a method is one set of runs"),
        ):
            _refuse_repeats(name, values, what)
        for s in self.sparsities or ():
            if not 0.0 < s < 1.0:
                raise ValueError(f"sparsities must be in (0, 1), got {s}")
        for t in self.thetas or ():
            if not 0.0 <= t <= 1.0:
                raise ValueError(f"thetas must be in [0, 1], got {t}")
        for p in self.ps or ():
            if not p >= 1.0:
                raise ValueError(f"ps must be >= 1 (1 = soft, inf = hard), got {p}")
        if self.ablation_pattern is not None:
            from feather_sparse.nm import NMPattern

            object.__setattr__(
                self, "ablation_pattern", str(NMPattern.parse(self.ablation_pattern))
            )
        if self.jobs < 0:
            raise ValueError(f"jobs must be >= 0 (0 = automatic), got {self.jobs}")
        for name in ("out", "runs_dir"):  # a string (a notebook's "results") names a folder too
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))
        for flag, folder in (("out", self.out), ("runs-dir", self.runs_dir)):
            _check_folder(flag, folder)
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    def for_experiment(self, name: str) -> BenchOptions:
        """These options as experiment ``name`` runs them (with its ``per_experiment`` fields).

        Args:
            name: the experiment's name.
        """
        changes = self.per_experiment.get(name)
        return replace(self, **changes) if changes else self

    @property
    def run_seeds(self) -> tuple[int, ...]:
        """The seeds actually run (the first one only with ``quick``)."""
        return self.seeds[:1] if self.quick else self.seeds

    def sparsity_grid(self, default: Sequence[float]) -> tuple[float, ...]:
        """The sparsity columns: the given ones, else ``QUICK_SPARSITIES`` or ``default``.

        Args:
            default: the experiment's own sparsities.
        """
        if self.sparsities:
            return tuple(self.sparsities)
        return QUICK_SPARSITIES if self.quick else tuple(default)

    @property
    def runs_path(self) -> Path:
        """The runs folder: ``runs_dir``, else ``out/runs``."""
        return self.runs_dir if self.runs_dir is not None else self.out / "runs"

    def base_config(self) -> TrainConfig:
        """The ``TrainConfig`` every run starts from (recipe, bench settings, overrides)."""
        return load_config(self.recipe, self.base_overrides())

    def base_overrides(self) -> dict[str, Any]:
        """Config fields set for every run: bench settings < ``--quick`` < the user's."""
        values: dict[str, Any] = dict(BENCH_OVERRIDES)
        if self.quick:
            values.update(QUICK_OVERRIDES)
        if self.threads is not None:
            values["threads"] = self.threads
        values.update(self.overrides)
        return values

    def worker_count(self) -> int:
        """Parallel processes to train the runs in.

        ``jobs`` if given; else one on a GPU, one when runs use all cores
        (``threads`` unset), and otherwise the usable cores divided by each
        run's threads.
        """
        if self.jobs:
            return self.jobs
        base = self.base_config()
        device = str(base.device)
        if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
            return 1
        if base.threads is None:
            return 1
        return max(1, usable_cpus() // int(base.threads))


def usable_cpus() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _refuse_repeats(name: str, values: Sequence[Any] | None, what: str) -> None:
    """Raise when ``values`` gives a value twice: its runs would count twice in each mean ± std."""
    given = tuple(values or ())
    repeated = dict.fromkeys(v for i, v in enumerate(given) if v in given[:i])
    if repeated:
        raise ValueError(
            f"{name}: {', '.join(map(_text, repeated))} given more than once "
            f"({','.join(map(_text, given))}); {what}, give each once"
        )


def _text(value: Any) -> str:
    """A grid value as the command line gives it (``0.95``, ``0``, ``inf``, ``GMP``)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _check_folder(flag: str, folder: Path | None) -> None:
    """Raise when ``folder``, or a folder above it, is an existing file."""
    if folder is None:
        return
    for path in (folder, *folder.parents):
        if path.exists() and not path.is_dir():
            what = "is" if path == folder else f"lies inside {path}, which is"
            raise ValueError(
                f"--{flag} {folder} {what} an existing file, not a folder; choose another --{flag}"
            )
