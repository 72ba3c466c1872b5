"""Tests that kill the mutants of the figures and the export command the suite missed
(docs/mutation-audit.md, "The figures, the old experiments import path and the
export command").

The figures are checked through the data they hold (the Agg figure each function
builds, caught as ``plots._figure`` returns it): which points each line has, the
ticks and their labels, the band and the error bars, the legend, the bars. Each
expectation is worked out from the docstrings (``plot_curves``: mean ± std, the
distinct x values at equal spacing in order, one label per distinct x; the
baseline ``(label, mean, std)``; the stability's recorded epochs; bars of each
layer's sparsity in % and of its sparse MACs, ``uses × nonzeros``) or from the
paper's formula (the operator family), never from the code's own output.
"""

from __future__ import annotations

import math
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from _guards import guard
from _helpers import needs_safetensors
from feather_sparse.analysis import Curve, MaskStability
from feather_sparse.analysis.flops import FlopsReport, LayerFlops
from feather_sparse.analysis.layers import LayerSparsity, SparsityDistribution

pytest.importorskip("matplotlib")
plots = pytest.importorskip("feather_sparse.plots")


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures the plot functions build, in order."""
    figures: list[Any] = []
    real = plots._figure

    def catch(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        fig, ax = real(*args, **kwargs)
        figures.append(fig)
        return fig, ax

    monkeypatch.setattr(plots, "_figure", catch)
    return figures


def _lines(ax: Any) -> dict[str, list[tuple[float, float]]]:
    return {line.get_label(): [tuple(p) for p in line.get_xydata()] for line in ax.lines}


def _legend(ax: Any) -> list[str]:
    legend = ax.get_legend()
    return [] if legend is None else [t.get_text() for t in legend.get_texts()]


def _ticks(ax: Any) -> tuple[list[float], list[str]]:
    return [float(t) for t in ax.get_xticks()], [t.get_text() for t in ax.get_xticklabels()]


# Two methods over the paper's sparsities; B lacks 0.9 (its runs failed), so the
# first curve does not hold every x value and the x values are not first seen in order.
A = Curve("A", (0.95, 0.98), (70.0, 60.0), (1.0, 2.0))
B = Curve("B", (0.9, 0.95, 0.98), (80.0, 75.0, 65.0), (0.5, 1.5, 2.5))
POSITION = {0.9: 0.0, 0.95: 1.0, 0.98: 2.0}  # the distinct x values, in order, at 0, 1, 2


# ------------------------------------------------------------------------ curves


def test_categorical_curves_draw_each_point_at_its_x_values_tick(
    drawn: list[Any], tmp_path: Path
) -> None:
    plots.plot_curves(
        [A, B], tmp_path / "c.png", xlabel="sparsity", ylabel="accuracy", categorical_x=True
    )
    ax = drawn[0].axes[0]
    lines = _lines(ax)
    for curve in (A, B):
        assert lines[curve.label] == [(POSITION[x], m) for x, m in zip(curve.x, curve.mean)]
    positions, labels = _ticks(ax)
    assert positions == [0.0, 1.0, 2.0]
    assert labels == ["0.9", "0.95", "0.98"]
    assert _legend(ax) == ["A", "B"]


def test_the_band_is_mean_minus_to_mean_plus_one_std(drawn: list[Any], tmp_path: Path) -> None:
    plots.plot_curves([B], tmp_path / "c.png", xlabel="x", ylabel="y")
    (band,) = drawn[0].axes[0].collections
    vertices = band.get_paths()[0].vertices
    for x, m, s in zip(B.x, B.mean, B.std):
        ys = [float(y) for vx, y in vertices if math.isclose(vx, x)]
        assert min(ys) == pytest.approx(m - s) and max(ys) == pytest.approx(m + s)


def test_error_bars_span_one_std_and_name_their_curve(drawn: list[Any], tmp_path: Path) -> None:
    plots.plot_curves([A, B], tmp_path / "c.png", xlabel="x", ylabel="y", errorbars=True)
    ax = drawn[0].axes[0]
    assert [c.get_label() for c in ax.containers] == ["A", "B"]
    assert _legend(ax) == ["A", "B"]
    for curve, container in zip((A, B), ax.containers):
        _, _, (bars,) = container.lines
        segments = sorted(
            (float(s[0][0]), float(s[0][1]), float(s[1][1])) for s in bars.get_segments()
        )
        assert segments == [
            (x, pytest.approx(m - s), pytest.approx(m + s))
            for x, m, s in zip(curve.x, curve.mean, curve.std)
        ]


def test_the_baseline_is_label_mean_std(drawn: list[Any], tmp_path: Path) -> None:
    plots.plot_curves(
        [B], tmp_path / "c.png", xlabel="x", ylabel="y", baseline=("dense", 85.0, 0.5)
    )
    ax = drawn[0].axes[0]
    assert [y for _, y in _lines(ax)["dense"]] == [85.0, 85.0]
    (span,) = ax.patches
    assert (span.get_y(), span.get_y() + span.get_height()) == pytest.approx((84.5, 85.5))


def test_xticklabels_are_one_per_distinct_x_and_need_categorical_x(tmp_path: Path) -> None:
    kwargs: dict[str, Any] = dict(xlabel="x", ylabel="y")
    for labels in (["90%", "95%"], ["90%", "95%", "98%", "99%"]):
        with pytest.raises(ValueError, match="3 distinct x values"):
            plots.plot_curves(
                [A, B], tmp_path / "c.png", categorical_x=True, xticklabels=labels, **kwargs
            )
    with pytest.raises(ValueError, match="categorical_x"):
        plots.plot_curves([A, B], tmp_path / "c.png", xticklabels=["a", "b", "c"], **kwargs)
    assert not (tmp_path / "c.png").exists()


def test_panels_draw_categorical_curves_with_the_labels_as_documented(
    drawn: list[Any], tmp_path: Path
) -> None:
    plots.plot_panels(
        [("θ = 1", [A, B]), ("θ = 0.5", [B])],
        tmp_path / "p.png",
        xlabel="sparsity",
        ylabel="accuracy",
        categorical_x=True,
    )
    left, right = drawn[0].axes
    assert [left.get_title(), right.get_title()] == ["θ = 1", "θ = 0.5"]
    assert [left.get_xlabel(), right.get_xlabel()] == ["sparsity", "sparsity"]
    assert [left.get_ylabel(), right.get_ylabel()] == ["accuracy", ""]
    assert _lines(left)["A"] == [(POSITION[x], m) for x, m in zip(A.x, A.mean)]
    assert _lines(right)["B"] == [(POSITION[x], m) for x, m in zip(B.x, B.mean)]
    assert _ticks(right) == ([0.0, 1.0, 2.0], ["0.9", "0.95", "0.98"])


# ------------------------------------------------------------ stability, bars, p


def test_stability_is_drawn_against_the_recorded_epochs_with_negative_r_shown(
    drawn: list[Any], tmp_path: Path
) -> None:
    run = MaskStability(
        label="θ=1",
        epochs=(3, 4, 5),
        pearson=(-0.4, 0.5, 1.0),
        changed=(math.nan, 0.2, 0.1),
        sparsity=(0.5, 0.8, 0.9),
        layers=("fc",),
        layer_pearson=((-0.4, 0.5, 1.0),),
    )
    plots.plot_stability([run], tmp_path / "s.png")
    ax = drawn[0].axes[0]
    assert _lines(ax)["θ=1"] == [(3.0, -0.4), (4.0, 0.5), (5.0, 1.0)]
    bottom, top = ax.get_ylim()
    assert bottom <= -0.4 and top >= 1.0


def _distribution(*nonzeros: int) -> SparsityDistribution:
    return SparsityDistribution(
        tuple(LayerSparsity(f"l{i}", (10,), 10, nz) for i, nz in enumerate(nonzeros))
    )


def test_layer_sparsity_bars_are_percentages_centred_on_each_layers_tick(
    drawn: list[Any], tmp_path: Path
) -> None:
    # sparsities 0.9 / 0.2 / 0.5 and 0.1 / 0.6 / 0.0: in % 90 / 20 / 50 and 10 / 60 / 0
    dists = {"feather": _distribution(1, 8, 5), "gmp": _distribution(9, 4, 10)}
    plots.plot_layer_sparsity(dists, tmp_path / "l.png")
    ax = drawn[0].axes[0]
    assert [c.get_label() for c in ax.containers] == ["feather", "gmp"]
    heights = [[bar.get_height() for bar in c] for c in ax.containers]
    assert heights == [pytest.approx([90.0, 20.0, 50.0]), pytest.approx([10.0, 60.0, 0.0])]
    for j in range(3):  # each layer's bars side by side, their middle on the layer's tick
        left, right = (c[j] for c in ax.containers)
        assert left.get_x() + left.get_width() == pytest.approx(right.get_x())
        assert (left.get_x() + right.get_x() + right.get_width()) / 2 == pytest.approx(j)
    assert _ticks(ax) == ([0.0, 1.0, 2.0], ["l0", "l1", "l2"])


def test_layer_sparsity_of_models_with_other_layers_is_refused(tmp_path: Path) -> None:
    other = SparsityDistribution(tuple(LayerSparsity(n, (10,), 10, 5) for n in ("l0", "x", "l2")))
    with pytest.raises(ValueError, match="other layers"):
        plots.plot_layer_sparsity({"a": _distribution(1, 8, 5), "b": other}, tmp_path / "l.png")


@guard(
    "`plot_flops` given FLOPs reports of models with other layers",
    "`ValueError` naming the report that lists other layers; no figure written",
)
def test_flops_of_models_with_other_layers_is_refused(tmp_path: Path) -> None:
    """Found by this audit: bars of a second model with other layers were drawn under
    the first model's layer names, as plot_layer_sparsity already refused."""
    one = (LayerFlops("conv", "Conv1d", (4, 10, 30), 1200, 300, 2000),)
    two = (LayerFlops("fc", "Linear", (4, 1000), 4000, 1000, 500),)
    reports = {"a": FlopsReport((10, 100), one), "b": FlopsReport((10, 100), two)}
    with pytest.raises(ValueError, match="'b' lists other layers than 'a'"):
        plots.plot_flops(reports, tmp_path / "f.png")
    assert not (tmp_path / "f.png").exists()


def test_flops_bars_are_each_layers_sparse_mflops_and_the_legend_the_sparse_total(
    drawn: list[Any], tmp_path: Path
) -> None:
    # sparse MACs = uses × nonzeros: 2000 × 300 = 0.6 M and 500 × 1000 = 0.5 M, 1.1 M total
    # (dense: 2000 × 1200 = 2.4 M and 500 × 4000 = 2 M)
    layers = (
        LayerFlops("conv", "Conv1d", (4, 10, 30), 1200, 300, 2000),
        LayerFlops("fc", "Linear", (4, 1000), 4000, 1000, 500),
    )
    plots.plot_flops({"feather": FlopsReport((10, 100), layers)}, tmp_path / "f.png")
    ax = drawn[0].axes[0]
    (bars,) = ax.containers
    assert [bar.get_height() for bar in bars] == pytest.approx([0.6, 0.5])
    assert _legend(ax) == ["feather (1.1 M total)"]


def _family(p: float, t: float, w: float) -> float:
    """P_T(w) of the paper, eq. (3): sign(w)·(|w|^p − T^p)^(1/p) above T, else 0."""
    if abs(w) <= t:
        return 0.0
    if math.isinf(p):
        return w
    return math.copysign((abs(w) ** p - t**p) ** (1 / p), w)


def test_operator_family_draws_eq3_over_minus_span_to_span_with_its_labels(
    drawn: list[Any], tmp_path: Path
) -> None:
    plots.plot_operator_family([1, 1.5, math.inf], tmp_path / "o.png", threshold=0.5, span=2.0)
    lines = _lines(drawn[0].axes[0])
    assert list(lines) == ["identity", "p = 1 (soft)", "p = 1.5", "p = ∞ (hard)"]
    for label, p in (("p = 1 (soft)", 1.0), ("p = 1.5", 1.5), ("p = ∞ (hard)", math.inf)):
        points = lines[label]
        assert (points[0][0], points[-1][0]) == (-2.0, 2.0)
        for w, y in points[::50]:
            assert y == pytest.approx(_family(p, 0.5, w), abs=1e-9)


# ------------------------------------------------------------- the file written


def test_the_png_has_the_documented_resolution(tmp_path: Path) -> None:
    path = plots.plot_curves([A], tmp_path / "c.png", xlabel="x", ylabel="y")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert (width, height) == (round(6.4 * plots.DPI), round(4.2 * plots.DPI))


def test_a_figure_into_a_new_folder_creates_the_folder(tmp_path: Path) -> None:
    target = tmp_path / "new" / "deeper" / "c.png"
    assert plots.plot_curves([A], target, xlabel="x", ylabel="y") == target
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_a_figure_names_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("matplotlib.backends.backend_agg", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"pip install 'feather-sparse\[train\]'"):
        plots.plot_curves([A], tmp_path / "c.png", xlabel="x", ylabel="y")
    assert not (tmp_path / "c.png").exists()


def test_old_experiments_import_path_names_the_objects_of_their_new_home() -> None:
    """``feather_sparse.experiments`` re-exports every name from where it lives now."""
    import importlib

    from feather_sparse import experiments

    homes = (
        "feather_sparse.bench",
        "feather_sparse.bench.experiments.backbones",
        "feather_sparse.bench.experiments.base",
        "feather_sparse.bench.experiments.compare",
        "feather_sparse.bench.experiments.flops",
        "feather_sparse.bench.experiments.operator",
        "feather_sparse.bench.experiments.p",
        "feather_sparse.bench.experiments.stability",
        "feather_sparse.bench.experiments.theta_operator",
        "feather_sparse.bench.options",
        "feather_sparse.bench.runner",
    )
    renamed = {"add_cli_arguments": "add_arguments", "run_cli": "run"}
    cli_bench = importlib.import_module("feather_sparse.cli.bench")
    for name in experiments.__all__:
        if name in renamed:
            assert getattr(experiments, name) is getattr(cli_bench, renamed[name]), name
            continue
        found = [m for m in homes if hasattr(importlib.import_module(m), name)]
        if not found and hasattr(cli_bench, name):
            found = ["feather_sparse.cli.bench"]
        assert found, name
        for home in found:
            assert getattr(experiments, name) is getattr(importlib.import_module(home), name), (
                name,
                home,
            )


# ------------------------------------------------------ the export command


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    from feather_sparse import cli

    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.fixture
def mlp_fsp(tmp_path: Path) -> Path:
    """A .fsp of the bundled MLP (it names its architecture: input shape (1, 40))."""
    from feather_sparse.export import save_sparse
    from feather_sparse.models import create_model

    torch.manual_seed(0)
    path = tmp_path / "src" / "mlp.fsp"
    path.parent.mkdir()
    save_sparse(create_model("mnist1d_mlp").eval(), path)
    return path


@needs_safetensors
def test_one_file_named_twice_for_o_and_onnx_is_refused(
    mlp_fsp: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-o out/m.bin --onnx out/../out/m.bin``: one file, two spellings; the ONNX model
    would replace the .fsp. Refused before anything is written."""
    out = tmp_path / "out"
    out.mkdir()
    line = _one_line_error(
        capsys,
        [
            "export",
            str(mlp_fsp),
            "-o",
            str(out / "m.bin"),
            "--onnx",
            str(out / ".." / "out" / "m.bin"),
        ],
    )
    assert "-o and --onnx both name" in line and "give two files" in line
    assert list(out.iterdir()) == []


@needs_safetensors
def test_an_onnx_target_that_must_not_be_written_stops_the_export_before_o(
    mlp_fsp: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every target is checked before anything is written: ``--onnx notes.txt`` (a text
    file, never replaced) is refused, and ``-o`` is not written either."""
    pytest.importorskip("onnx")  # without it the command stops first, naming the install
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    out = tmp_path / "out.fsp"
    line = _one_line_error(capsys, ["export", str(mlp_fsp), "-o", str(out), "--onnx", str(notes)])
    assert str(notes) in line
    assert notes.read_text() == "my notes\n"
    assert not out.exists()


@needs_safetensors
def test_an_input_shape_with_a_zero_size_is_refused(
    mlp_fsp: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnx")
    line = _one_line_error(
        capsys,
        ["export", str(mlp_fsp), "--onnx", str(tmp_path / "m.onnx"), "--input-shape", "0,40"],
    )
    assert "--input-shape must be positive sizes" in line
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize(
    ("diff", "scale", "status"),
    [
        # the tolerance is 1000 float32 epsilons (1.19e-4) times max(1, the output's scale)
        (1e-5, 1e-3, 0),  # a small output: the floor of 1 applies
        (1e-3, 10.0, 0),  # 1.19e-3 at scale 10
        (2e-3, 10.0, 1),
        (math.nan, 1.0, 1),  # NaN is no match
    ],
)
@needs_safetensors
def test_the_onnx_verdict_is_1000_epsilons_of_the_scale_at_least_1(
    diff: float,
    scale: float,
    status: int,
    mlp_fsp: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("onnx")
    from feather_sparse import cli
    from feather_sparse.cli import export as export_cli

    reference = torch.full((2, 10), scale)
    monkeypatch.setattr(export_cli, "_verify_onnx", lambda *args: (diff, reference))
    assert cli.main(["export", str(mlp_fsp), "--onnx", str(tmp_path / "m.onnx")]) == status
    out, err = capsys.readouterr()
    if status == 0:
        assert "onnxruntime matches PyTorch" in out and not err
    else:
        assert "does not compute what the model computes" in err
