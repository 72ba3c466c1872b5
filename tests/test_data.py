"""Data sets and loaders: readers on files written in the real formats, determinism, sharding."""

from __future__ import annotations

import dataclasses
import io
import pickle
import random
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from feather_sparse.data import (
    DATASETS,
    DataBundle,
    Loader,
    TensorLoader,
    epoch_indices,
    list_datasets,
    load_dataset,
)
from feather_sparse.data import mnist1d as mnist1d_module
from feather_sparse.data.augment import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    CropFlipNormalize,
    Normalize,
    random_crop,
    random_hflip,
)
from feather_sparse.data.cache import CACHE_ENV, cache_dir
from feather_sparse.data.cifar import CIFAR10, CIFAR100, CifarSpec, read_cifar
from feather_sparse.data.imagenet import RandomResizedCropFlip

# ----------------------------------------------------------------------------- helpers


def batches(loader: Loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in loader]


def same_batches(a: list[tuple[torch.Tensor, torch.Tensor]], b: list) -> bool:
    return len(a) == len(b) and all(
        torch.equal(xa, xb) and torch.equal(ya, yb)
        for (xa, ya), (xb, yb) in zip(a, b, strict=False)
    )


def write_cifar(
    root: Path, spec: CifarSpec, *, per_file: int, form: str, protocol: int = 2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Write a small CIFAR variant in the python format; return its arrays (N, 3072)."""
    rng = np.random.default_rng(seed)
    files: dict[str, bytes] = {}
    out: dict[str, list[np.ndarray]] = {"x": [], "y": [], "x_test": [], "y_test": []}
    for names, split in ((spec.train_files, ""), (spec.test_files, "_test")):
        for name in names:
            data = rng.integers(0, 256, size=(per_file, 3072), dtype=np.uint8)
            labels = rng.integers(0, spec.num_classes, size=per_file).tolist()
            batch = {b"batch_label": name.encode(), b"data": data, spec.label_key: labels}
            batch[b"filenames"] = [f"img_{i}.png".encode() for i in range(per_file)]
            if spec is CIFAR100:
                batch[b"coarse_labels"] = [label // 5 for label in labels]
            files[name] = pickle.dumps(batch, protocol=protocol)
            out["x" + split].append(data)
            out["y" + split].append(np.asarray(labels))
    if form == "folder":
        folder = root / spec.folder
        folder.mkdir(parents=True)
        for name, blob in files.items():
            (folder / name).write_bytes(blob)
    else:
        root.mkdir(parents=True, exist_ok=True)
        with tarfile.open(root / spec.archive, "w:gz") as tar:
            for name, blob in files.items():
                info = tarfile.TarInfo(f"{spec.folder}/{name}")
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
    x, y, x_test, y_test = (np.concatenate(out[k]) for k in ("x", "y", "x_test", "y_test"))
    return x, y, x_test, y_test


# ----------------------------------------------------------------------------- registry


def test_registry_lists_every_dataset_and_rejects_unknown_names_and_options() -> None:
    names = list_datasets()
    for expected in ("mnist1d", "cifar10", "cifar100", "imagenet", "synthetic", "synthetic-cifar"):
        assert expected in names
    with pytest.raises(ValueError, match=r"unknown dataset 'mnist2d'.*mnist1d"):
        load_dataset("mnist2d", batch_size=8)
    with pytest.raises(ValueError, match=r"does not take option colour.*input_shape"):
        load_dataset("synthetic", batch_size=8, colour="red")
    with pytest.raises(ValueError, match="rank"):
        load_dataset("synthetic", batch_size=8, rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch sizes"):
        load_dataset("synthetic", batch_size=0)


def test_bundle_is_frozen_and_loaders_follow_the_protocol() -> None:
    bundle = load_dataset("synthetic", batch_size=16)
    assert isinstance(bundle, DataBundle)
    assert isinstance(bundle.train, Loader) and isinstance(bundle.test, Loader)
    with pytest.raises(dataclasses.FrozenInstanceError):
        bundle.num_classes = 3  # type: ignore[misc]


def test_a_builder_function_passes_through_the_registry() -> None:
    calls = []

    def tiny(data_dir: Path | None, config, *, size: int = 4) -> DataBundle:
        calls.append(size)
        return DATASETS.get("synthetic")(data_dir, config, train_size=size, test_size=size)

    bundle = load_dataset(tiny, batch_size=2, size=6)
    assert calls == [6] and bundle.train_size == 6 and len(bundle.train) == 3


# ----------------------------------------------------------------------------- synthetic


@pytest.mark.parametrize(
    ("name", "shape", "classes"),
    [
        ("synthetic", (3, 32, 32), 10),
        ("synthetic-cifar", (3, 32, 32), 100),
        ("synthetic-imagenet", (3, 224, 224), 1000),
        ("synthetic-mnist1d", (1, 40), 10),
    ],
)
def test_synthetic_presets(name: str, shape: tuple[int, ...], classes: int) -> None:
    small = {"train_size": 20, "test_size": 7}
    bundle = load_dataset(name, batch_size=8, eval_batch_size=4, **small)
    assert (bundle.name, bundle.input_shape, bundle.num_classes) == (name, shape, classes)
    assert (bundle.train_size, bundle.test_size) == (20, 7)
    assert (len(bundle.train), len(bundle.test)) == (2, 2)  # 20 // 8 dropped to 2; ceil(7 / 4)
    train = batches(bundle.train)
    assert [tuple(x.shape) for x, _ in train] == [(8, *shape)] * 2
    assert all(x.dtype == torch.float32 and y.dtype == torch.int64 for x, y in train)
    assert [x.shape[0] for x, _ in bundle.test] == [4, 3]
    assert all(int(y.min()) >= 0 and int(y.max()) < classes for _, y in train)


def test_synthetic_is_a_function_of_the_seed_and_options_override_presets() -> None:
    a = load_dataset("synthetic", batch_size=8, seed=1, input_shape=(2, 5), num_classes=3)
    b = load_dataset("synthetic", batch_size=8, seed=1, input_shape=(2, 5), num_classes=3)
    c = load_dataset("synthetic", batch_size=8, seed=2, input_shape=(2, 5), num_classes=3)
    assert a.input_shape == (2, 5) and a.num_classes == 3
    assert same_batches(batches(a.test), batches(b.test))
    assert not same_batches(batches(a.test), batches(c.test))
    with pytest.raises(ValueError, match="num_classes"):
        load_dataset("synthetic", batch_size=8, num_classes=1)


# ----------------------------------------------------------------------------- loaders


def test_shuffle_is_a_pure_function_of_seed_and_epoch_and_leaves_global_rng_alone() -> None:
    x = torch.arange(50.0)[:, None]
    y = torch.arange(50)

    def loader() -> TensorLoader:
        return TensorLoader(x, y, batch_size=8, shuffle=True, drop_last=True, seed=5)

    run = loader()
    torch_state = torch.get_rng_state()
    epochs = []
    for epoch in range(3):
        run.set_epoch(epoch)
        epochs.append(batches(run))
    assert torch.equal(torch.get_rng_state(), torch_state)
    resumed = loader()  # a fresh process resuming at epoch 2
    resumed.set_epoch(2)
    assert same_batches(batches(resumed), epochs[2])
    assert same_batches(batches(resumed), epochs[2])  # iterating again changes nothing
    assert not same_batches(epochs[0], epochs[1])
    other_seed = TensorLoader(x, y, batch_size=8, shuffle=True, drop_last=True, seed=6)
    assert not same_batches(batches(other_seed), epochs[0])
    # 50 // 8 = 6 full batches, each a set of distinct samples.
    seen = torch.cat([yb for _, yb in epochs[0]])
    assert len(epochs[0]) == 6 and seen.unique().numel() == 48


@pytest.mark.parametrize("n", [103, 96, 17])
def test_train_shards_are_disjoint_equal_and_cover_the_epoch_minus_the_remainder(n: int) -> None:
    x, y = torch.arange(float(n))[:, None], torch.arange(n)
    ranks = [
        TensorLoader(x, y, batch_size=8, shuffle=True, drop_last=True, seed=3, rank=r, world_size=2)
        for r in range(2)
    ]
    for epoch in (0, 1):
        per_rank = []
        for loader in ranks:
            loader.set_epoch(epoch)
            got = batches(loader)
            assert len(got) == len(loader) == n // 16
            assert all(yb.numel() == 8 for _, yb in got)
            per_rank.append(torch.cat([yb for _, yb in got]))
        a, b = (set(t.tolist()) for t in per_rank)
        assert not a & b
        assert len(a | b) == (n // 16) * 16  # only the remainder (< one global batch) dropped
        # the union is exactly the first whole global batches of the epoch's permutation
        perm = epoch_indices(
            n, batch_size=16, shuffle=True, drop_last=False, seed=3, epoch=epoch
        ).tolist()
        assert a | b == set(perm[: (n // 16) * 16])


def test_test_shards_keep_every_sample_exactly_once() -> None:
    n = 21
    x, y = torch.arange(float(n))[:, None], torch.arange(n)
    shards = [
        TensorLoader(x, y, batch_size=10, shuffle=False, drop_last=False, rank=r, world_size=2)
        for r in range(2)
    ]
    got = [torch.cat([yb for _, yb in batches(s)]).tolist() for s in shards]
    assert sorted(got[0] + got[1]) == list(range(n))
    assert (len(shards[0]), len(shards[1])) == (2, 1)  # 11 and 10 samples
    assert got[0] == list(range(0, n, 2))


def test_train_set_smaller_than_one_global_batch_is_an_error() -> None:
    with pytest.raises(ValueError, match="lower batch_size"):
        load_dataset("synthetic", batch_size=8, world_size=2, train_size=15, test_size=4)


def test_distributed_bundles_have_equal_train_lengths() -> None:
    bundles = [
        load_dataset("synthetic", batch_size=8, rank=r, world_size=3, train_size=100, test_size=10)
        for r in range(3)
    ]
    assert {len(b.train) for b in bundles} == {100 // 24}
    assert sum(sum(y.numel() for _, y in b.test) for b in bundles) == 10


# ----------------------------------------------------------------------------- augmentation


def _reference_crop(image: np.ndarray, padding: int, top: int, left: int) -> np.ndarray:
    padded = np.pad(image, ((0, 0), (padding, padding), (padding, padding)))
    return padded[:, top : top + image.shape[1], left : left + image.shape[2]]


def test_random_crop_takes_zero_padded_crops_at_varied_offsets() -> None:
    generator = torch.Generator().manual_seed(0)
    # distinct values so every crop offset gives a different picture
    x = (torch.arange(64 * 2 * 6 * 6) % 251 + 1).to(torch.uint8).reshape(64, 2, 6, 6)
    out = random_crop(x, 2, generator)
    assert out.shape == x.shape and out.dtype == torch.uint8
    offsets = set()
    for image, crop in zip(x.numpy(), out.numpy(), strict=True):
        matches = [
            (top, left)
            for top in range(5)
            for left in range(5)
            if np.array_equal(_reference_crop(image, 2, top, left), crop)
        ]
        assert len(matches) == 1
        offsets.add(matches[0])
    assert len(offsets) > 10  # crops really move, in both directions


def test_random_hflip_flips_some_images_and_keeps_the_rest() -> None:
    x = torch.randn(64, 3, 4, 5)
    out = random_hflip(x, torch.Generator().manual_seed(0))
    flipped = [torch.equal(o, i.flip(2)) for o, i in zip(out, x, strict=True)]
    kept = [torch.equal(o, i) for o, i in zip(out, x, strict=True)]
    assert all(f != k for f, k in zip(flipped, kept, strict=True))
    assert 16 < sum(flipped) < 48


def test_normalize_matches_the_formula_and_augmentation_is_seeded() -> None:
    x = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8)
    mean, std = CIFAR100_MEAN, CIFAR100_STD
    expected = (x.float() / 255 - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[
        :, None, None
    ]
    torch.testing.assert_close(Normalize(mean, std)(x), expected)
    augment = CropFlipNormalize(mean, std, padding=4)
    a = augment(x, torch.Generator().manual_seed(1))
    b = augment(x, torch.Generator().manual_seed(1))
    c = augment(x, torch.Generator().manual_seed(2))
    assert a.shape == (16, 3, 8, 8) and a.dtype == torch.float32
    assert torch.equal(a, b) and not torch.equal(a, c)
    # zero padding shows up as the normalised value of black
    black = (-torch.tensor(mean) / torch.tensor(std))[None, :, None, None].expand_as(a)
    assert torch.isclose(a, black).any()


# ----------------------------------------------------------------------------- CIFAR


@pytest.mark.parametrize("spec", [CIFAR10, CIFAR100], ids=lambda s: s.name)
@pytest.mark.parametrize("form", ["archive-folder", "archive-file", "parent-folder", "folder"])
def test_cifar_reader_reads_every_form(tmp_path: Path, spec: CifarSpec, form: str) -> None:
    per_file = 3 if spec is CIFAR10 else 12
    written, where = {
        "archive-folder": ("tar", tmp_path),  # the folder that holds the archive
        "archive-file": ("tar", tmp_path / spec.archive),
        "parent-folder": ("folder", tmp_path),  # the folder that holds the extracted one
        "folder": ("folder", tmp_path / spec.folder),
    }[form]
    x, y, x_test, y_test = write_cifar(tmp_path, spec, per_file=per_file, form=written)
    (got_x, got_y), (got_xt, got_yt) = read_cifar(where, spec)
    assert got_x.shape == (len(y), 3, 32, 32) and got_x.dtype == np.uint8
    np.testing.assert_array_equal(got_x.reshape(len(y), -1), x)
    np.testing.assert_array_equal(got_y, y)
    np.testing.assert_array_equal(got_xt.reshape(len(y_test), -1), x_test)
    np.testing.assert_array_equal(got_yt, y_test)


def test_cifar_rows_are_red_green_blue_planes(tmp_path: Path) -> None:
    folder = tmp_path / CIFAR100.folder
    folder.mkdir()
    row = np.zeros(3072, dtype=np.uint8)
    row[:1024] = 255  # red plane
    row[1024 + 5] = 7  # green, row 0, column 5
    for name in ("train", "test"):
        batch = {b"data": row[None], b"fine_labels": [42]}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))
    (x, y), _ = read_cifar(folder, CIFAR100)
    assert (x[0, 0] == 255).all() and x[0, 1, 0, 5] == 7 and x[0, 1].sum() == 7
    assert (x[0, 2] == 0).all() and y.tolist() == [42]


def test_cifar_bundle_normalises_test_and_augments_train(tmp_path: Path) -> None:
    x, y, x_test, y_test = write_cifar(tmp_path, CIFAR10, per_file=8, form="tar")
    bundle = load_dataset("cifar10", data_dir=tmp_path, batch_size=16, eval_batch_size=5, seed=0)
    assert (bundle.name, bundle.num_classes, bundle.input_shape) == ("cifar10", 10, (3, 32, 32))
    assert (bundle.train_size, bundle.test_size) == (40, 8)
    assert (len(bundle.train), len(bundle.test)) == (2, 2)
    test_x = torch.cat([xb for xb, _ in bundle.test])
    expected = Normalize(CIFAR10_MEAN, CIFAR10_STD)(torch.from_numpy(x_test).view(-1, 3, 32, 32))
    torch.testing.assert_close(test_x, expected)
    assert torch.cat([yb for _, yb in bundle.test]).tolist() == y_test.tolist()

    bundle.train.set_epoch(4)
    epoch4 = batches(bundle.train)
    assert all(xb.shape == (16, 3, 32, 32) and xb.dtype == torch.float32 for xb, _ in epoch4)
    # augmented: train images are not just the normalised originals
    plain = Normalize(CIFAR10_MEAN, CIFAR10_STD)(torch.from_numpy(x).view(-1, 3, 32, 32))
    yb = epoch4[0][1]
    assert not torch.equal(epoch4[0][0], plain[: yb.numel()])
    resumed = load_dataset("cifar10", data_dir=tmp_path, batch_size=16, seed=0)
    resumed.train.set_epoch(4)
    assert same_batches(batches(resumed.train), epoch4)
    no_aug = load_dataset("cifar10", data_dir=tmp_path, batch_size=16, augment=False)
    no_aug.train.set_epoch(4)
    # same permutation with augmentation off, and each image is the plain normalised one
    plain_batches = batches(no_aug.train)
    for (_, ya), (_, yn) in zip(epoch4, plain_batches, strict=True):
        assert torch.equal(ya, yn)
    first = no_aug.train.indices()[:16]  # type: ignore[attr-defined]
    assert torch.equal(torch.from_numpy(y)[first], plain_batches[0][1])
    assert torch.equal(plain[first], plain_batches[0][0])


def test_cifar_reader_accepts_modern_pickles(tmp_path: Path) -> None:
    x, *_ = write_cifar(tmp_path, CIFAR100, per_file=4, form="tar", protocol=5)
    (got, _), _ = read_cifar(tmp_path / CIFAR100.archive, CIFAR100)
    np.testing.assert_array_equal(got.reshape(4, -1), x)


def test_cifar_missing_paths_say_what_was_expected_where(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"cifar-100-python.tar.gz.*--data-dir"):
        load_dataset("cifar100", batch_size=8)
    expected = r"expected cifar-100-python/train and test \(or cifar-100-python.tar.gz\) under "
    with pytest.raises(FileNotFoundError, match=expected + ".*download https://"):
        load_dataset("cifar100", data_dir=tmp_path, batch_size=8)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset("cifar100", data_dir=tmp_path / "nope", batch_size=8)
    with pytest.raises(FileNotFoundError, match=r"data_batch_1\.\.data_batch_5, test_batch"):
        load_dataset("cifar10", data_dir=tmp_path, batch_size=8)
    (tmp_path / CIFAR10.folder).mkdir()
    (tmp_path / CIFAR10.folder / "data_batch_1").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="missing data_batch_2"):
        load_dataset("cifar10", data_dir=tmp_path, batch_size=8)


def test_cifar_malformed_files_are_rejected(tmp_path: Path) -> None:
    folder = tmp_path / CIFAR100.folder
    folder.mkdir()
    short_rows = {b"data": np.zeros((2, 100), np.uint8), b"fine_labels": [0, 1]}
    (folder / "train").write_bytes(pickle.dumps(short_rows))
    (folder / "test").write_bytes(pickle.dumps(short_rows))
    with pytest.raises(ValueError, match="rows of 3072"):
        read_cifar(tmp_path, CIFAR100)
    coarse_only = {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]}
    (folder / "train").write_bytes(pickle.dumps(coarse_only))
    with pytest.raises(ValueError, match="fine_labels"):
        read_cifar(tmp_path, CIFAR100)
    (folder / "train").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="not a CIFAR python-format batch"):
        read_cifar(tmp_path, CIFAR100)
    bad_tar = tmp_path / "other" / CIFAR100.archive
    bad_tar.parent.mkdir()
    bad_tar.write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(ValueError, match="not a readable"):
        read_cifar(bad_tar, CIFAR100)


class _Exploit:
    def __reduce__(self) -> tuple:
        return (print, ("pwned",))


def test_cifar_reader_refuses_pickles_that_run_code(tmp_path: Path) -> None:
    folder = tmp_path / CIFAR100.folder
    folder.mkdir()
    for name in ("train", "test"):
        (folder / name).write_bytes(pickle.dumps({b"data": _Exploit(), b"fine_labels": []}))
    with pytest.raises(ValueError, match=r"refusing to load builtins\.print"):
        read_cifar(folder, CIFAR100)


# ----------------------------------------------------------------------------- MNIST-1D


@pytest.fixture(scope="module")
def mnist1d_generated(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Generate MNIST-1D once into a fresh cache (via the env var), recording RNG states."""
    pytest.importorskip("mnist1d")
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(folder))
        np.random.seed(1234)
        random.seed(1234)
        before = (np.random.get_state()[1].copy(), random.getstate())
        bundle = load_dataset("mnist1d", batch_size=128)
        after = (np.random.get_state()[1].copy(), random.getstate())
    return {"folder": folder, "bundle": bundle, "before": before, "after": after}


def test_mnist1d_shapes_and_classes(mnist1d_generated: dict) -> None:
    bundle = mnist1d_generated["bundle"]
    assert (bundle.name, bundle.input_shape, bundle.num_classes) == ("mnist1d", (1, 40), 10)
    assert (bundle.train_size, bundle.test_size) == (4000, 1000)
    assert (len(bundle.train), len(bundle.test)) == (4000 // 128, 8)
    x, y = next(iter(bundle.train))
    assert x.shape == (128, 1, 40) and x.dtype == torch.float32 and y.dtype == torch.int64
    labels = torch.cat([yb for _, yb in bundle.test])
    assert labels.numel() == 1000 and set(labels.tolist()) == set(range(10))


def test_mnist1d_generation_leaves_the_global_rngs_alone(mnist1d_generated: dict) -> None:
    before, after = mnist1d_generated["before"], mnist1d_generated["after"]
    np.testing.assert_array_equal(before[0], after[0])
    assert before[1] == after[1]


def test_mnist1d_is_cached_and_later_loads_need_no_package(
    mnist1d_generated: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = mnist1d_generated["folder"]
    assert (folder / mnist1d_module.MNIST1D_FILE).is_file()
    assert not list(folder.glob("*.tmp"))  # the atomic write left no temporary file
    monkeypatch.setenv(CACHE_ENV, str(folder))
    monkeypatch.setitem(sys.modules, "mnist1d", None)  # importing it now fails
    monkeypatch.setitem(sys.modules, "mnist1d.data", None)
    again = load_dataset("mnist1d", batch_size=128)
    assert same_batches(batches(again.test), batches(mnist1d_generated["bundle"].test))
    # data_dir names the cache folder explicitly
    explicit = load_dataset("mnist1d", data_dir=folder, batch_size=500)
    assert explicit.train_size == 4000


def test_mnist1d_without_package_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setitem(sys.modules, "mnist1d", None)
    monkeypatch.setitem(sys.modules, "mnist1d.data", None)
    with pytest.raises(ImportError, match=r"pip install 'feather-sparse\[train\]'"):
        load_dataset("mnist1d", batch_size=128)


def test_mnist1d_bad_cache_is_regenerated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = {
        "x": np.ones((4000, 40), np.float32),
        "y": np.zeros(4000, np.int64),
        "x_test": np.ones((1000, 40), np.float32),
        "y_test": np.zeros(1000, np.int64),
    }
    monkeypatch.setattr(mnist1d_module, "_generate", lambda: fake)
    (tmp_path / mnist1d_module.MNIST1D_FILE).write_bytes(b"truncated")
    arrays = mnist1d_module.load_mnist1d_arrays(tmp_path)
    assert "regenerating" in caplog.text
    np.testing.assert_array_equal(arrays["x"], fake["x"])
    reread = mnist1d_module.load_mnist1d_arrays(tmp_path)  # now a good cache
    np.testing.assert_array_equal(reread["y_test"], fake["y_test"])


def test_cache_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv(CACHE_ENV)
    assert cache_dir() == tmp_path / "xdg" / "feather-sparse"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "feather-sparse"


# ----------------------------------------------------------------------------- ImageNet


@pytest.fixture
def image_root(tmp_path: Path) -> Path:
    """train/ and val/ with 3 classes of small JPEGs of varied sizes and aspect ratios."""
    image = pytest.importorskip("PIL.Image")
    sizes = [(40, 30), (30, 50), (64, 64)]
    rng = np.random.default_rng(0)
    for split, per_class in (("train", 3), ("val", 1)):
        for c, name in enumerate(("n001", "n002", "n003")):
            folder = tmp_path / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                w, h = sizes[(c + i) % 3]
                pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                pixels[:, : w // 2] = (255, 0, 0)  # left half red, right half noise
                image.fromarray(pixels).save(folder / f"{name}_{i}.JPEG", quality=95)
    (tmp_path / "train" / "n001" / "notes.txt").write_text("not an image")
    return tmp_path


def test_imagenet_folders_give_shaped_normalised_batches(image_root: Path) -> None:
    bundle = load_dataset(
        "imagenet", data_dir=image_root, batch_size=4, image_size=32, resize_size=36
    )
    assert (bundle.name, bundle.num_classes, bundle.input_shape) == ("imagenet", 3, (3, 32, 32))
    assert (bundle.train_size, bundle.test_size) == (9, 3)
    assert (len(bundle.train), len(bundle.test)) == (2, 1)
    train = batches(bundle.train)
    assert [tuple(x.shape) for x, _ in train] == [(4, 3, 32, 32)] * 2
    assert all(x.dtype == torch.float32 for x, _ in train)
    ((x_val, y_val),) = batches(bundle.test)
    assert y_val.tolist() == [0, 1, 2]
    # eval = resize + centre crop: the left columns stay (JPEG-)red, normalised
    red = (torch.tensor([1.0, 0, 0]) - torch.tensor([0.485, 0.456, 0.406])) / torch.tensor(
        [0.229, 0.224, 0.225]
    )
    torch.testing.assert_close(
        x_val[:, :, 10:22, 1], red[None, :, None].expand(3, 3, 12), atol=0.25, rtol=0
    )


def test_imagenet_batches_depend_only_on_seed_and_epoch(image_root: Path) -> None:
    def load(workers: int) -> DataBundle:
        return load_dataset(
            "imagenet",
            data_dir=image_root,
            batch_size=3,
            image_size=24,
            resize_size=28,
            num_workers=workers,
            seed=7,
        )

    a, b = load(0), load(2)
    a.train.set_epoch(3)
    b.train.set_epoch(3)
    epoch3 = batches(a.train)
    assert same_batches(epoch3, batches(b.train))  # same with worker processes
    assert same_batches(epoch3, batches(a.train))
    a.train.set_epoch(4)
    epoch4 = batches(a.train)
    assert not same_batches(epoch3, epoch4)
    b.train.set_epoch(4)  # persistent workers follow set_epoch too
    assert same_batches(batches(b.train), epoch4)
    assert len(epoch3) == 3 and all(x.shape == (3, 3, 24, 24) for x, _ in epoch3)


def test_imagenet_shards_are_disjoint_and_equal(image_root: Path) -> None:
    seen = []
    for rank in range(2):
        bundle = load_dataset(
            "imagenet",
            data_dir=image_root,
            batch_size=2,
            image_size=16,
            resize_size=16,
            rank=rank,
            world_size=2,
        )
        assert len(bundle.train) == 2  # 9 // (2 * 2)
        seen.append(set(bundle.train.sampler.indices().tolist()))  # type: ignore[attr-defined]
        assert sum(y.numel() for _, y in bundle.test) == (2 if rank == 0 else 1)
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == 8


def test_random_resized_crop_boxes_stay_inside_and_follow_the_limits() -> None:
    crop = RandomResizedCropFlip(224)
    areas = []
    for seed in range(300):
        g = torch.Generator().manual_seed(seed)
        left, top, w, h = crop.box(500, 375, g)
        assert left >= 0 and top >= 0 and left + w <= 500 and top + h <= 375
        areas.append(w * h / (500 * 375))
        assert 3 / 4 - 0.02 <= w / h <= 4 / 3 + 0.02
    assert min(areas) < 0.2 and max(areas) > 0.8
    assert min(areas) >= 0.08 - 0.01
    # a strip too thin for any allowed ratio falls back to a central crop at ratio 4/3
    g = torch.Generator().manual_seed(0)
    assert crop.box(1000, 10, g) == (493, 0, 13, 10)


def test_imagenet_layout_errors_say_what_was_expected(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    with pytest.raises(FileNotFoundError, match=r"train/<class>/<image>.*--data-dir"):
        load_dataset("imagenet", batch_size=8)
    (tmp_path / "train" / "n001").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"expected train/<class>/<image>.*no .*val"):
        load_dataset("imagenet", data_dir=tmp_path, batch_size=8)
    (tmp_path / "val").mkdir()
    (tmp_path / "val" / "ILSVRC2012_val_00000001.JPEG").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="no class folders"):
        load_dataset("imagenet", data_dir=tmp_path, batch_size=8)
    (tmp_path / "val" / "n999").mkdir()
    with pytest.raises(ValueError, match="val/ has classes that train/ lacks: n999"):
        load_dataset("imagenet", data_dir=tmp_path, batch_size=8)
    (tmp_path / "val" / "n999").rmdir()
    (tmp_path / "val" / "n001").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no images"):
        load_dataset("imagenet", data_dir=tmp_path, batch_size=8)


def test_imagenet_without_pillow_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match=r"pip install 'feather-sparse\[imagenet\]'"):
        load_dataset("imagenet", data_dir=tmp_path, batch_size=8)


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_cuda_batches_equal_cpu_batches(tmp_path: Path) -> None:
    write_cifar(tmp_path, CIFAR10, per_file=8, form="tar")
    cpu = load_dataset("cifar10", data_dir=tmp_path, batch_size=8, seed=3)
    gpu = load_dataset("cifar10", data_dir=tmp_path, batch_size=8, seed=3, device="cuda")
    cpu.train.set_epoch(2)
    gpu.train.set_epoch(2)
    for (xc, yc), (xg, yg) in zip(cpu.train, gpu.train, strict=True):
        assert xg.is_cuda and yg.is_cuda
        assert torch.equal(yc, yg.cpu())
        torch.testing.assert_close(xc, xg.cpu())
