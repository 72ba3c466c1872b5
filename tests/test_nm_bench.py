"""``feather-sparse bench nm``: its grid, the ``--quick`` page, seeds and options."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from feather_sparse.bench import BenchOptions, run_experiment
from feather_sparse.bench.experiments import EXPERIMENTS
from feather_sparse.bench.experiments.nm import NM_SEEDS, plan
from feather_sparse.bench.runner import plan_runs
from feather_sparse.cli.bench import add_arguments, options_from_args
from test_bench_sweeps import SMALL

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.usefixtures("one_thread")


def parse(*argv: str) -> BenchOptions:
    parser = argparse.ArgumentParser()
    add_arguments("bench", parser)
    return options_from_args(parser.parse_args(["nm", *argv]))


def test_full_grid_methods_patterns_models_and_ablations(tmp_path: Path) -> None:
    opts = BenchOptions(seeds=NM_SEEDS, out=tmp_path)
    specs = plan(opts)
    runs = plan_runs(opts, specs)
    # 2 models × (5 methods × 3 patterns + θ 0, 0.5 + p 1, 2, ∞) × 5 seeds; θ = 1 and
    # p = 3 at 2:4 are feather-nm's own runs.
    assert runs.distinct == 2 * (5 * 3 + 2 + 3) * 5
    methods = {s.settings["method"] for s in specs}
    assert methods == {"feather-nm", "sr-ste", "s-ste", "hard-nm", "oneshot-nm"}
    assert {s.settings["pattern"] for s in specs} == {"2:4", "4:8", "1:4"}
    assert {s.settings["model"] for s in specs} == {"mnist1d_cnn", "mnist1d_mlpmixer"}
    one = BenchOptions(seeds=(0,), overrides={"model": "mnist1d_mlpmixer"}, out=tmp_path)
    assert plan_runs(one, plan(one)).distinct == 5 * 3 + 2 + 3
    with pytest.raises(ValueError, match="not an N:M method here"):
        plan(BenchOptions(methods=("gmp",), out=tmp_path))


def test_the_ablations_run_at_the_pattern_asked_for(tmp_path: Path) -> None:
    opts = parse("--ablation-pattern", " 4 : 8 ", "--methods", "feather-nm", "--ps", "1,3")
    assert opts.ablation_pattern == "4:8"
    mixer = BenchOptions(
        seeds=(0,),
        overrides={"model": "mnist1d_mlpmixer"},
        methods=("feather-nm",),
        thetas=(1.0,),
        ps=(1.0, 3.0),
        ablation_pattern=opts.ablation_pattern,
        out=tmp_path,
    )
    specs = plan(mixer)
    soft = [s for s in specs if s.group.startswith("p = 1")]
    assert [s.settings["pattern"] for s in soft] == ["4:8"]
    # p = 3 at 4:8 is feather-nm's own 4:8 run: 3 method cells + p = 1
    assert plan_runs(mixer, specs).distinct == 3 + 1
    with pytest.raises(ValueError, match="N:M pattern"):
        parse("--ablation-pattern", "4/8")


def test_five_seeds_unless_the_command_names_others() -> None:
    assert EXPERIMENTS.get("nm").seeds == NM_SEEDS == (0, 1, 2, 3, 4)
    assert parse().for_experiment("nm").seeds == NM_SEEDS
    assert parse().for_experiment("theta").seeds == (0, 1, 2)  # the others keep theirs
    assert parse("--seeds", "0,1").for_experiment("nm").seeds == (0, 1)


def test_quick_page_has_the_tables_the_intervals_and_the_flip_rate(tmp_path: Path) -> None:
    opts = BenchOptions(quick=True, overrides=SMALL, out=tmp_path, jobs=1, seeds=(0, 1))
    result = run_experiment("nm", opts)
    assert result.failed == 0
    assert result.runs == 5 + 2 + 3  # methods, θ 0 and 0.5, p 1, 2 and ∞ (2:4, the mixer)
    text = result.page.read_text()
    for heading in ("### mnist1d_mlpmixer", "## θ ablation", "## p ablation", "## Ranking"):
        assert heading in text
    assert "| method | 2:4 |" in text
    assert "| feather-nm | reference |" in text
    assert re.search(r"\| sr-ste \| [+-]\d+\.\d\d \(one seed\) \|", text)
    assert "Mask flip rate" in text and "| oneshot-nm | 0.000 |" in text
    assert "| θ = 1 (feather-nm) | reference |" in text
    assert "| p = 3 (feather-nm) | reference |" in text
    assert "--quick smoke run" in text
    assert all(f.is_file() for f in result.figures)
