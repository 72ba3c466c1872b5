"""`feather-sparse bench` without matplotlib stops before it trains anything.

Every experiment's page draws figures with matplotlib (an optional
dependency, ``feather-sparse[train]``). Without it, the command used to train
every run and then fail in the first figure with a traceback, leaving no page.
Now it checks first, and the command line reports it in one line, as any
other missing optional dependency.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import feather_sparse.bench.driver as bench
from _guards import guard
from feather_sparse import cli
from feather_sparse.bench import BenchOptions
from feather_sparse.plots import require_matplotlib
from test_bench_audit import _count_trainings
from test_bench_sweeps import SMALL

INSTALL = "pip install 'feather-sparse[train]'"


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("matplotlib.backends.backend_agg", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed


@guard(
    "`feather-sparse bench` where matplotlib (which draws the pages' figures) is not installed",
    "CLI exit 1 before any run trains, one line naming `pip install 'feather-sparse[train]'`",
)
@pytest.mark.parametrize("experiment", ["compare", "all"])
def test_the_command_stops_before_training(
    experiment: str,
    no_matplotlib: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls = _count_trainings(monkeypatch)
    out = tmp_path / "out"
    code = cli.main(["bench", experiment, "--quick", "--jobs", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and calls == []
    assert len(err.strip().splitlines()) == 1, err
    assert "feather-sparse bench: error: plots need matplotlib" in err and INSTALL in err
    assert not list(out.rglob("*.json")), "no run result may be written"


@pytest.mark.parametrize("call", ["run_experiment", "train_experiments"])
def test_the_library_calls_raise_before_training(
    call: str, no_matplotlib: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_trainings(monkeypatch)
    opts = BenchOptions(quick=True, overrides={**SMALL, "epochs": 1}, out=tmp_path, jobs=1)
    with pytest.raises(ImportError, match=r"pip install 'feather-sparse\[train\]'"):
        if call == "run_experiment":
            bench.run_experiment("stability", opts)
        else:
            bench.train_experiments(["stability", "p"], opts)
    assert calls == []


def test_with_matplotlib_the_check_passes() -> None:
    pytest.importorskip("matplotlib")
    require_matplotlib()  # raises nothing


def test_a_missing_optional_dependency_is_one_line_for_any_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command line's one-line errors include ImportError (its message names the
    install); -vv still shows the traceback."""
    import feather_sparse.cli.bench as cli_bench

    def missing(*args: object, **kwargs: object) -> int:
        raise ImportError("the thing needs pkg; install it with: pip install pkg")

    monkeypatch.setattr(cli_bench, "run", missing)
    assert cli.main(["bench", "compare"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        "feather-sparse bench: error: the thing needs pkg; install it with: pip install pkg"
    )
    with pytest.raises(ImportError):
        cli.main(["bench", "compare", "-vv"])
