"""A MNIST-1D cache whose arrays have the right shapes but not the right contents
(another dtype, labels outside the ten classes, NaN samples: a file written by
another tool or version under the same name) is regenerated, not trained on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from _guards import guard
from feather_sparse.data import mnist1d as mnist1d_module
from feather_sparse.data.cache import save_npz_atomic


def _good() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x": rng.standard_normal((4000, 40)).astype(np.float32),
        "y": rng.integers(0, 10, 4000).astype(np.int64),
        "x_test": rng.standard_normal((1000, 40)).astype(np.float32),
        "y_test": rng.integers(0, 10, 1000).astype(np.int64),
    }


def _spoiled(kind: str) -> dict[str, np.ndarray]:
    arrays = _good()
    if kind == "float64 samples":
        arrays["x"] = arrays["x"].astype(np.float64)
    elif kind == "float labels":
        arrays["y_test"] = arrays["y_test"].astype(np.float32)
    elif kind == "int32 labels":
        arrays["y"] = arrays["y"].astype(np.int32)
    elif kind == "label 10":
        arrays["y"][7] = 10
    elif kind == "negative label":
        arrays["y_test"][3] = -1
    elif kind == "NaN sample":
        arrays["x"][5, 2] = np.nan
    return arrays


@guard(
    "a MNIST-1D cache of the right shapes but another dtype or out-of-range labels was "
    "trained on (float64 samples failed deep in the first layer; a label 10 in the loss)",
    "the cache's dtypes, labels (0..9) and finiteness are checked; such a file is "
    "regenerated with a warning naming it",
)
@pytest.mark.parametrize(
    "kind",
    ["float64 samples", "float labels", "int32 labels", "label 10", "negative label", "NaN sample"],
)
def test_a_cache_with_wrong_contents_is_regenerated(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fresh = _good()
    monkeypatch.setattr(mnist1d_module, "_generate", lambda: fresh)
    path = tmp_path / mnist1d_module.MNIST1D_FILE
    save_npz_atomic(path, **_spoiled(kind))
    arrays = mnist1d_module.load_mnist1d_arrays(tmp_path)
    assert "regenerating" in caplog.text and str(path) in caplog.text
    for key, value in fresh.items():
        assert arrays[key].dtype == value.dtype
        np.testing.assert_array_equal(arrays[key], value)
    caplog.clear()
    mnist1d_module.load_mnist1d_arrays(tmp_path)  # the regenerated file is now read as it is
    assert "regenerating" not in caplog.text


def test_a_good_cache_is_read_without_regenerating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail() -> None:
        raise AssertionError("regenerated a good cache")

    monkeypatch.setattr(mnist1d_module, "_generate", fail)
    good = _good()
    save_npz_atomic(tmp_path / mnist1d_module.MNIST1D_FILE, **good)
    arrays = mnist1d_module.load_mnist1d_arrays(tmp_path)
    np.testing.assert_array_equal(arrays["y"], good["y"])
