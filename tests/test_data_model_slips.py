"""Slips with data sets and models that gave a wrong result or a misleading error.

An ImageNet eval crop larger than the resized image (padded with black), a
truncated JPEG among a million (an error naming no file), a half-extracted
CIFAR folder beside an intact archive (told to download it again), a
fractional width for a model whose channels must be whole numbers (a long
torch traceback): each is now refused clearly, or read as meant.
"""

from __future__ import annotations

import io
import logging
import pickle
import re
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import feather_sparse as fs
from _guards import guard
from feather_sparse import cli
from feather_sparse.data import load_dataset
from feather_sparse.data.cifar import CIFAR100, read_cifar
from feather_sparse.data.imagenet import CenterCropEval

# ----------------------------------------------------------------------------- ImageNet


def _image_tree(root: Path, pil: Any) -> Path:
    """train/ and val/ with 2 classes of 2 small JPEGs each."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in ("n001", "n002"):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(2):
                pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
                pil.fromarray(pixels).save(folder / f"{name}_{i}.JPEG", quality=90)
    return root


@guard(
    "imagenet `image_size` larger than `resize_size` (e.g. 288 with the default 256)",
    "`ValueError` at build time, before any folder is read, naming both and the 256/224 ratio",
)
def test_imagenet_crop_larger_than_the_resized_image_is_refused_before_reading(
    tmp_path: Path,
) -> None:
    # a folder that does not exist: the check comes before any data is looked at
    with pytest.raises(ValueError) as refused:
        load_dataset("imagenet", data_dir=tmp_path / "nowhere", batch_size=2, image_size=288)
    said = str(refused.value)
    assert "image_size=288" in said and "resize_size=256" in said
    assert "resize_size >= image_size" in said and "resize_size=329" in said
    with pytest.raises(ValueError, match=r"size=40 is larger than resize=32"):
        CenterCropEval(size=40, resize=32)
    assert CenterCropEval(size=32, resize=32).size == 32  # equal is fine


@guard(
    "a truncated or undecodable JPEG among the ImageNet images",
    "`OSError` subclass naming the image's path and the fix (remove or replace it)",
)
@pytest.mark.parametrize("workers", [0, 1])
def test_a_truncated_image_is_named_by_its_path(tmp_path: Path, workers: int) -> None:
    pil = pytest.importorskip("PIL.Image")
    root = _image_tree(tmp_path, pil)
    bad = root / "val" / "n002" / "n002_1.JPEG"
    bad.write_bytes(bad.read_bytes()[:200])  # an interrupted copy
    bundle = load_dataset(
        "imagenet", data_dir=root, batch_size=2, image_size=16, resize_size=16, num_workers=workers
    )
    with pytest.raises(OSError, match=re.escape(str(bad))) as failed:
        list(bundle.test)
    assert "remove it or replace it" in str(failed.value)


# ----------------------------------------------------------------------------- CIFAR


def _cifar100_batch(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    batch = {
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        b"fine_labels": rng.integers(0, 100, n).tolist(),
    }
    return pickle.dumps(batch, protocol=2)


def _cifar100_archive(root: Path) -> dict[str, bytes]:
    files = {"train": _cifar100_batch(6, 0), "test": _cifar100_batch(3, 1)}
    with tarfile.open(root / CIFAR100.archive, "w:gz") as tar:
        for name, blob in files.items():
            info = tarfile.TarInfo(f"{CIFAR100.folder}/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return files


@guard(
    "a half-extracted or damaged `cifar-100-python/` beside an intact `cifar-100-python.tar.gz`",
    "the archive is read instead, with a warning naming the folder's problem",
)
@pytest.mark.parametrize("damage", ["only train", "empty", "garbage test"])
def test_a_half_extracted_cifar_folder_gives_way_to_the_archive(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    files = _cifar100_archive(tmp_path)
    (x, y), (x_test, y_test) = read_cifar(tmp_path / CIFAR100.archive, CIFAR100)
    folder = tmp_path / CIFAR100.folder
    folder.mkdir()
    if damage != "empty":
        (folder / "train").write_bytes(files["train"])
    if damage == "garbage test":
        (folder / "test").write_bytes(files["test"][:40])  # cut short
    with caplog.at_level(logging.WARNING, logger="feather_sparse.data.cifar"):
        (gx, gy), (gx_test, gy_test) = read_cifar(tmp_path, CIFAR100)
    assert np.array_equal(gx, x) and np.array_equal(gy, y)
    assert np.array_equal(gx_test, x_test) and np.array_equal(gy_test, y_test)
    assert str(folder) in caplog.text and str(tmp_path / CIFAR100.archive) in caplog.text
    reason = {
        "only train": "it lacks test",
        "empty": "it lacks train, test",
        "garbage test": "test is not a CIFAR python-format batch",
    }[damage]
    assert reason in caplog.text


@guard(
    "a half-extracted `cifar-100-python/` beside a damaged `cifar-100-python.tar.gz`",
    "`ValueError` naming both, each with its problem",
)
def test_an_unusable_folder_and_archive_are_both_named(tmp_path: Path) -> None:
    folder = tmp_path / CIFAR100.folder
    folder.mkdir()
    (folder / "train").write_bytes(_cifar100_batch(4, 0))
    archive = tmp_path / CIFAR100.archive
    archive.write_bytes(b"\x1f\x8b cut short")
    with pytest.raises(ValueError) as refused:
        load_dataset("cifar100", data_dir=tmp_path, batch_size=2)
    said = str(refused.value)
    assert f"{folder}: it lacks test" in said
    assert f"{archive} is not a readable" in said and "download" in said


# ----------------------------------------------------------------------------- models

SLIPS = [
    ("resnet20", {"width": 0.5}, "width must be a positive integer"),
    ("resnet20", {"width": 2.0}, "width must be a positive integer"),
    ("resnet20", {"width": True}, "width must be a positive integer"),
    ("resnet20", {"width": "2"}, "width must be a positive integer"),
    ("mnist1d_cnn", {"width": float("nan")}, "width must be a positive finite number"),
    ("mnist1d_cnn", {"width": float("inf")}, "width must be a positive finite number"),
    ("mnist1d_cnn", {"width": True}, "width must be a positive finite number"),
    ("mnist1d_cnn", {"width": "0.5"}, "width must be a positive finite number"),
    ("mobilenet_v1", {"width_mult": float("nan")}, "width_mult must be a positive finite"),
    ("mobilenet_v1", {"width_mult": True}, "width_mult must be a positive finite"),
    ("mnist1d_mlp", {"hidden": [0.5]}, "hidden width must be a positive integer"),
    ("mnist1d_mlp", {"hidden": [True, 8]}, "hidden width must be a positive integer"),
    ("mnist1d_mlp", {"hidden": 256}, "hidden must be a list of layer widths"),
    ("mnist1d_mlpmixer", {"dim": 0.5}, "dim must be a positive integer"),
    ("mnist1d_mlpmixer", {"dim": True}, "dim must be a positive integer"),
    ("mnist1d_mlpmixer", {"depth": 1.5}, "depth must be a positive integer"),
]


@guard(
    "a fractional, bool, NaN or text width for a bundled model (`resnet20` with `width=0.5`)",
    "`ValueError` naming the option, what it takes and the value",
)
@pytest.mark.parametrize(("name", "kwargs", "message"), SLIPS)
def test_a_model_width_slip_is_a_clear_value_error(
    name: str, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        fs.create_model(name, **kwargs)
    assert repr(next(iter(kwargs.values()))) in str(refused.value)


def test_model_widths_that_are_fine_still_build() -> None:
    assert fs.create_model("resnet20", width=1).conv1.out_channels == 16
    assert fs.create_model("mnist1d_cnn", width=0.5).num_features == 128
    assert fs.create_model("mobilenet_v1", width_mult=0.25).num_features == 256
    assert fs.create_model("mnist1d_mlp", hidden=[8]).num_features == 8
    assert fs.create_model("mnist1d_mlp", hidden=np.array([8, 4])).num_features == 4
    assert fs.create_model("mnist1d_mlpmixer", dim=np.int64(8), depth=1).num_features == 8


@guard(
    "`train --model resnet20 --model-kwargs '{width=0.5}'`",
    "CLI exit 1 with one line naming `width` and 0.5, no traceback",
)
def test_train_with_a_fractional_resnet_width_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["train", "--model", "resnet20", "--model-kwargs", "{width=0.5}"]
    args += ["--set", "dataset=synthetic", "--set", "data_options={train_size=16, test_size=8}"]
    args += ["--batch-size", "8", "--epochs", "1", "--threads", "1"]
    args += ["--no-tensorboard", "--no-progress", "--run-dir", str(tmp_path / "run")]
    assert cli.main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "width must be a positive integer" in err[0] and "0.5" in err[0]
