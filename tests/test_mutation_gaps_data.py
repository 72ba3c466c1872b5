"""Tests that close the gaps a mutation audit of the data pipeline found.

Each test here fails on one or more hand-made mutants of
``src/feather_sparse/data/`` that the rest of the suite let through
(``docs/mutation-audit.md``, "The data pipeline"; the mutants' ids are in each
test's docstring) and checks the code against a computation written here from
the specification — the file formats, the published normalisation constants,
torchvision's recipes that the docstrings name, the loaders' documented
contracts — not against the code's own output.
"""

from __future__ import annotations

import io
import logging
import math
import pickle
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from _guards import guard
from feather_sparse.data import TensorLoader, epoch_indices, load_dataset
from feather_sparse.data import mnist1d as mnist1d_module
from feather_sparse.data.augment import CropFlipNormalize, random_crop, random_hflip
from feather_sparse.data.cache import save_npz_atomic
from feather_sparse.data.cifar import CIFAR10, CIFAR100, CifarSpec, read_cifar
from feather_sparse.data.imagenet import RandomResizedCropFlip

# The per-channel statistics of the training sets, as published (0..1 scale).
CIFAR10_STATS = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
CIFAR100_STATS = ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))
IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def normalised(x: np.ndarray | torch.Tensor, mean: tuple, std: tuple) -> torch.Tensor:
    """``(x / 255 - mean) / std`` per channel of uint8 ``(N, 3, H, W)``, in float64."""
    t = torch.as_tensor(np.asarray(x)).to(torch.float64)
    m = torch.tensor(mean, dtype=torch.float64)[:, None, None]
    s = torch.tensor(std, dtype=torch.float64)[:, None, None]
    return (t / 255 - m) / s


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- CIFAR files


def write_cifar_folder(
    root: Path, spec: CifarSpec, per_file: int, seed: int = 0, prefix: str = ""
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Python-format batch files of ``spec`` (a tar.gz if ``prefix`` is given, members
    named ``prefix + folder/name``); the images ``(N, 3, 32, 32)`` and labels written."""
    rng = np.random.default_rng(seed)
    blobs: dict[str, bytes] = {}
    parts: dict[str, list[np.ndarray]] = {"x": [], "y": [], "xt": [], "yt": []}
    for names, split in ((spec.train_files, ""), (spec.test_files, "t")):
        for name in names:
            data = rng.integers(0, 256, (per_file, 3072), dtype=np.uint8)
            labels = rng.integers(0, spec.num_classes, per_file)
            batch = {b"data": data, spec.label_key: labels.tolist()}
            blobs[name] = pickle.dumps(batch, protocol=2)
            # the format: 1024 red, 1024 green, 1024 blue values, each a row-major 32x32
            parts["x" + split].append(data.reshape(per_file, 3, 32, 32))
            parts["y" + split].append(labels)
    if prefix:
        root.mkdir(parents=True, exist_ok=True)
        with tarfile.open(root / spec.archive, "w:gz") as tar:
            for name, blob in blobs.items():
                info = tarfile.TarInfo(f"{prefix}{spec.folder}/{name}")
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
    else:
        (root / spec.folder).mkdir(parents=True)
        for name, blob in blobs.items():
            (root / spec.folder / name).write_bytes(blob)
    x, y, xt, yt = (np.concatenate(parts[k]) for k in ("x", "y", "xt", "yt"))
    return x, y, xt, yt


@guard(
    "a CIFAR batch whose labels fall outside the classes or do not match its images in number",
    "`ValueError` naming the file and the labels' range or count",
)
@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ([0, 100], r"labels span 0\.\.100; cifar100 has 100 classes"),
        ([-1, 5], r"labels span -1\.\.5; cifar100 has 100 classes"),
        ([0, 1, 2], "2 images but 3 labels"),
    ],
    ids=["label-100", "label-minus-1", "three-labels-for-two-images"],
)
def test_cifar_labels_outside_the_classes_or_miscounted_are_refused(
    tmp_path: Path, labels: list[int], message: str
) -> None:
    """dat05, dat06, dat07: CIFAR-100's fine labels are 0..99, one per image."""
    folder = tmp_path / CIFAR100.folder
    folder.mkdir()
    images = np.zeros((2, 3072), np.uint8)
    (folder / "train").write_bytes(pickle.dumps({b"data": images, b"fine_labels": labels}))
    (folder / "test").write_bytes(pickle.dumps({b"data": images, b"fine_labels": [0, 99]}))
    with pytest.raises(ValueError, match=message):
        read_cifar(folder, CIFAR100)


def test_cifar_archive_with_dot_slash_member_names_is_read(tmp_path: Path) -> None:
    """dat08: ``tar czf cifar-10-python.tar.gz ./cifar-10-batches-py`` names its
    members ``./cifar-10-batches-py/...``; the reader finds them."""
    x, y, xt, yt = write_cifar_folder(tmp_path, CIFAR10, per_file=2, prefix="./")
    (got_x, got_y), (got_xt, got_yt) = read_cifar(tmp_path / CIFAR10.archive, CIFAR10)
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)
    np.testing.assert_array_equal(got_xt, xt)
    np.testing.assert_array_equal(got_yt, yt)


@pytest.mark.parametrize(
    ("spec", "stats"),
    [(CIFAR10, CIFAR10_STATS), (CIFAR100, CIFAR100_STATS)],
    ids=["cifar10", "cifar100"],
)
def test_cifar_default_normalisation_is_each_data_sets_published_statistics(
    tmp_path: Path, spec: CifarSpec, stats: tuple
) -> None:
    """dat09, dat12, dat13: by default each set is normalised with its own
    training set's per-channel mean and std (cifar.py's docstring), not the
    other set's and not the often-quoted CIFAR-10 std (0.2023, 0.1994, 0.2010)."""
    per_file = 2 if spec is CIFAR10 else 6
    _, _, xt, _ = write_cifar_folder(tmp_path, spec, per_file=per_file)
    bundle = load_dataset(spec.name, data_dir=tmp_path, batch_size=4, eval_batch_size=64)
    got = torch.cat([xb for xb, _ in bundle.test])
    assert close(got, normalised(xt, *stats))


def test_cifar_mean_and_std_options_reach_the_test_set_and_the_training_set(
    tmp_path: Path,
) -> None:
    """dat11: ``mean=`` and ``std=`` replace the defaults for both loaders."""
    x, _, xt, _ = write_cifar_folder(tmp_path, CIFAR100, per_file=8)
    mean, std = (0.25, 0.5, 0.75), (0.5, 0.25, 0.125)
    bundle = load_dataset(
        "cifar100",
        data_dir=tmp_path,
        batch_size=4,
        eval_batch_size=64,
        augment=False,
        mean=mean,
        std=std,
    )
    assert close(torch.cat([xb for xb, _ in bundle.test]), normalised(xt, mean, std))
    order = bundle.train.indices()  # type: ignore[attr-defined]
    got = torch.cat([xb for xb, _ in bundle.train])
    assert close(got, normalised(x[order.numpy()[: got.shape[0]]], mean, std))


def test_cifar_padding_option_reaches_the_crop(tmp_path: Path) -> None:
    """dat10: with ``padding=0`` a training image is its normalised original or
    that mirrored left-right, nothing else (no crop offset)."""
    x, _, _, _ = write_cifar_folder(tmp_path, CIFAR100, per_file=16)
    bundle = load_dataset("cifar100", data_dir=tmp_path, batch_size=8, padding=0, seed=3)
    bundle.train.set_epoch(1)
    order = bundle.train.indices().numpy()  # type: ignore[attr-defined]
    got = torch.cat([xb for xb, _ in bundle.train])
    plain = normalised(x[order[: got.shape[0]]], *CIFAR100_STATS)
    flipped = [close(g, p.flip(-1)) for g, p in zip(got, plain, strict=True)]
    kept = [close(g, p) for g, p in zip(got, plain, strict=True)]
    assert all(f or k for f, k in zip(flipped, kept, strict=True))
    assert any(flipped) and any(kept)


# ----------------------------------------------------------------------------- augmentation


def test_random_crop_draws_every_offset_from_zero_to_twice_the_padding() -> None:
    """dat15: offsets are uniform on 0 .. 2·padding per axis (the docstring)."""
    padding, n = 1, 400
    x = torch.randperm(n * 4 * 4).remainder(250).add(1).to(torch.uint8).reshape(n, 1, 4, 4)
    out = random_crop(x, padding, torch.Generator().manual_seed(0))
    seen = set()
    for image, crop in zip(x.numpy(), out.numpy(), strict=True):
        padded = np.pad(image, ((0, 0), (padding, padding), (padding, padding)))
        hits = [
            (top, left)
            for top in range(2 * padding + 1)
            for left in range(2 * padding + 1)
            if np.array_equal(padded[:, top : top + 4, left : left + 4], crop)
        ]
        assert len(hits) == 1
        seen.add(hits[0])
    assert seen == {(t, s) for t in range(3) for s in range(3)}


def test_random_hflip_follows_its_probability() -> None:
    """dat19: ``p`` is the probability of flipping: 0 never, 1 always, 0.25 a quarter."""
    x = torch.randn(400, 2, 3, 5)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(random_hflip(x, g, p=0.0), x)
    assert torch.equal(random_hflip(x, g, p=1.0), x.flip(3))
    out = random_hflip(x, g, p=0.25)
    flipped = sum(torch.equal(o, i.flip(2)) for o, i in zip(out, x, strict=True))
    assert 60 < flipped < 140  # 100 expected; sd 8.7


def test_crop_flip_normalize_without_padding_or_flip_is_the_normalisation() -> None:
    """dat20: ``flip=False`` (and ``padding=0``) leaves only the normalisation."""
    x = torch.randint(0, 256, (32, 3, 6, 6), dtype=torch.uint8)
    augment = CropFlipNormalize(*CIFAR100_STATS, padding=0, flip=False)
    assert close(augment(x, torch.Generator().manual_seed(0)), normalised(x, *CIFAR100_STATS))


def test_crop_padding_is_black_after_normalisation() -> None:
    """dat21: the crop pads with zeros *before* normalising, so the padded border
    of a white image is the normalised value of black, (0 - mean) / std."""
    x = torch.full((64, 3, 8, 8), 255, dtype=torch.uint8)
    out = CropFlipNormalize(*CIFAR100_STATS, padding=2, flip=False)(
        x, torch.Generator().manual_seed(0)
    )
    white = normalised(torch.full((1, 3, 1, 1), 255), *CIFAR100_STATS)[0, :, 0, 0]
    black = normalised(torch.zeros(1, 3, 1, 1), *CIFAR100_STATS)[0, :, 0, 0]
    for c in range(3):
        values = out[:, c].double()
        is_white = (values - white[c]).abs() < 1e-5
        is_black = (values - black[c]).abs() < 1e-5
        assert bool((is_white | is_black).all()) and bool(is_black.any())


# ----------------------------------------------------------------------------- loaders


def test_each_seed_and_epoch_has_its_own_permutation() -> None:
    """dat22: the permutation depends on the seed and the epoch *in order*
    (``derive_seed``: "a pure function of parts, in order"): seed s, epoch e and
    seed e, epoch s differ, and so do seed s, epoch s for every s."""
    perms = {
        (seed, epoch): tuple(
            epoch_indices(
                40, batch_size=4, shuffle=True, drop_last=False, seed=seed, epoch=epoch
            ).tolist()
        )
        for seed in range(4)
        for epoch in range(4)
    }
    assert len(set(perms.values())) == 16


def _views(loader: TensorLoader, epoch: int) -> torch.Tensor:
    loader.set_epoch(epoch)
    return torch.cat([xb for xb, _ in loader])


def test_augmentation_changes_with_the_epoch_and_the_rank() -> None:
    """dat24, dat25: augmentation depends on ``(seed, epoch)`` and the rank
    (``TensorLoader``'s docstring): an unshuffled loader's samples get new crops
    every epoch (the same ones when an epoch is repeated), and two ranks given
    the same images do not get the same crops."""
    x = (torch.arange(16 * 3 * 8 * 8) % 251).to(torch.uint8).reshape(16, 3, 8, 8)
    same = x[:1].expand(16, 3, 8, 8).contiguous()
    y = torch.arange(16)

    def loader(images: torch.Tensor, rank: int = 0, world_size: int = 1) -> TensorLoader:
        augment = CropFlipNormalize(*CIFAR10_STATS, padding=2)
        return TensorLoader(
            images,
            y,
            batch_size=4,
            shuffle=False,
            drop_last=True,
            seed=0,
            rank=rank,
            world_size=world_size,
            transform=augment,
        )

    one = loader(x)
    epoch0, epoch1 = _views(one, 0), _views(one, 1)
    assert torch.equal(_views(one, 0), epoch0)
    assert not torch.equal(epoch0, epoch1)
    rank0, rank1 = loader(same, 0, 2), loader(same, 1, 2)
    assert not torch.equal(_views(rank0, 0), _views(rank1, 0))


def test_train_shards_are_cut_to_whole_global_batches() -> None:
    """dat26: with 2 ranks of batch 8, an epoch of 40 samples keeps the first
    32 of its permutation (two global batches), split between the ranks, and
    each rank's ``indices()`` and ``num_samples`` are the 16 samples its batches
    hold ("this rank's sample order", "samples this rank sees per epoch")."""
    n, batch, ranks = 40, 8, 2
    x, y = torch.arange(float(n))[:, None], torch.arange(n)
    perm = epoch_indices(n, batch_size=batch, shuffle=True, drop_last=False, seed=1, epoch=0)
    seen = []
    for rank in range(ranks):
        loader = TensorLoader(
            x, y, batch_size=batch, shuffle=True, drop_last=True, seed=1, rank=rank, world_size=2
        )
        delivered = torch.cat([yb for _, yb in loader])
        assert loader.num_samples == 16 and torch.equal(loader.indices(), delivered)
        seen.append(delivered.tolist())
    assert sorted(seen[0] + seen[1]) == sorted(perm[:32].tolist())


# ----------------------------------------------------------------------------- ImageNet


@pytest.fixture
def pil() -> Any:
    return pytest.importorskip("PIL.Image")


def write_images(root: Path, pil: Any, layout: dict[str, dict[str, list[tuple[int, int]]]]) -> None:
    """PNG files of noise: ``layout[split][class] = [(width, height), ...]``."""
    rng = np.random.default_rng(0)
    for split, classes in layout.items():
        for name, sizes in classes.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for i, (w, h) in enumerate(sizes):
                pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                pil.fromarray(pixels).save(folder / f"{name}_{i}.png")


def test_val_labels_follow_the_training_classes_when_val_lacks_one(
    tmp_path: Path, pil: Any
) -> None:
    """dat29: classes are train/'s sorted folders; val/ uses the same names
    (imagenet.py's docstring), so a val/ without n002 still labels n003 as 2."""
    sizes = [(20, 20)] * 2
    train = {"n001": sizes, "n002": sizes, "n003": sizes}
    write_images(tmp_path, pil, {"train": train, "val": {"n001": sizes[:1], "n003": sizes[:1]}})
    bundle = load_dataset("imagenet", data_dir=tmp_path, batch_size=2, image_size=8, resize_size=8)
    assert bundle.num_classes == 3
    assert torch.cat([yb for _, yb in bundle.test]).tolist() == [0, 2]


def torchvision_eval(path: Path, pil: Any, size: int, resize: int) -> np.ndarray:
    """torchvision's ``Resize(resize)`` then ``CenterCrop(size)`` of a PIL image, uint8 (3, H, W):
    the shorter side to ``resize`` (the longer ``int(resize * long / short)``), bilinear,
    then the crop at ``int(round((new - size) / 2))``."""
    with pil.open(path) as img:
        rgb = img.convert("RGB")
    w, h = rgb.size
    new_w, new_h = (resize, int(resize * h / w)) if w <= h else (int(resize * w / h), resize)
    rgb = rgb.resize((new_w, new_h), pil.Resampling.BILINEAR)
    top, left = round((new_h - size) / 2.0), round((new_w - size) / 2.0)
    out = np.asarray(rgb.crop((left, top, left + size, top + size)))
    return out.transpose(2, 0, 1)


def test_imagenet_eval_is_resize_centre_crop_and_the_published_normalisation(
    tmp_path: Path, pil: Any
) -> None:
    """dat14, dat34: eval resizes the shorter side, takes the central square and
    normalises with ImageNet's mean and std (imagenet.py's docstring)."""
    sizes = [(30, 50), (50, 30), (41, 41)]
    write_images(tmp_path, pil, {"train": {"n001": sizes}, "val": {"n001": sizes}})
    bundle = load_dataset(
        "imagenet",
        data_dir=tmp_path,
        batch_size=1,
        eval_batch_size=3,
        image_size=24,
        resize_size=28,
    )
    ((got, _),) = list(bundle.test)
    files = sorted((tmp_path / "val" / "n001").iterdir())
    expected = np.stack([torchvision_eval(f, pil, 24, 28) for f in files])
    assert close(got, normalised(expected, *IMAGENET_STATS))


def test_random_resized_crop_aspect_ratio_is_log_uniform() -> None:
    """dat30: the aspect ratio is log-uniform on 3/4 .. 4/3 (the Inception
    recipe, as torchvision's ``RandomResizedCrop``): log(w/h) is uniform on
    ±log(4/3), mean 0 and half the crops wider than high. (A uniform ratio has
    mean log 0.028 and 57 % wider.)"""
    crop = RandomResizedCropFlip(224, scale=(0.01, 0.01))  # small crops: the first try fits
    g = torch.Generator().manual_seed(0)
    logs = []
    for _ in range(4000):
        _, _, w, h = crop.box(4000, 4000, g)
        logs.append(math.log(w / h))
    bound = math.log(4 / 3)
    assert all(-bound - 0.01 <= v <= bound + 0.01 for v in logs)
    mean = sum(logs) / len(logs)
    assert abs(mean) < 0.01  # standard error 0.0026
    assert abs(sum(v > 0 for v in logs) / len(logs) - 0.5) < 0.03


def test_random_resized_crop_offsets_reach_every_position() -> None:
    """dat31: the crop's top and left are uniform on 0 .. height - h and
    0 .. width - w (torchvision: ``randint(0, height - h + 1)``)."""
    crop = RandomResizedCropFlip(8, scale=(0.25, 0.25), ratio=(1.0, 1.0))  # 5x5 of 10x10
    g = torch.Generator().manual_seed(0)
    tops, lefts = set(), set()
    for _ in range(300):
        left, top, w, h = crop.box(10, 10, g)
        assert (w, h) == (5, 5)
        tops.add(top)
        lefts.add(left)
    assert tops == lefts == set(range(6))


def test_random_resized_crop_fallback_for_a_tall_strip() -> None:
    """dat32: when no try fits, the central crop at the nearest allowed ratio:
    a 10x1000 strip gives w = 10, h = round(10 / (3/4)) = 13, centred."""
    crop = RandomResizedCropFlip(224)
    assert crop.box(10, 1000, torch.Generator().manual_seed(0)) == (0, 493, 10, 13)


def test_random_resized_crop_flips_about_half_the_images(pil: Any) -> None:
    """dat33: the training crop is flipped left-right with probability 1/2."""
    pixels = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    image = pil.fromarray(pixels)
    whole = RandomResizedCropFlip(16, scale=(1.0, 1.0), ratio=(1.0, 1.0))  # the whole image
    original = torch.from_numpy(pixels).permute(2, 0, 1)
    flips = 0
    for seed in range(200):
        out = whole(image, torch.Generator().manual_seed(seed))
        assert torch.equal(out, original) or torch.equal(out, original.flip(2))
        flips += torch.equal(out, original.flip(2))
    assert 70 < flips < 130  # 100 expected; sd 7


def test_imagenet_samples_get_new_crops_every_epoch(tmp_path: Path, pil: Any) -> None:
    """dat36: a sample's crop and flip are drawn from ``(seed, epoch, index)``
    (imagenet.py's docstring): the same image is cropped anew each epoch."""
    sizes = [(40, 30), (30, 40), (48, 48), (36, 44)]
    write_images(tmp_path, pil, {"train": {"n001": sizes}, "val": {"n001": sizes[:1]}})
    bundle = load_dataset("imagenet", data_dir=tmp_path, batch_size=4, image_size=16, seed=2)

    def by_sample(epoch: int) -> dict[int, torch.Tensor]:
        bundle.train.set_epoch(epoch)
        order = bundle.train.sampler.indices().tolist()  # type: ignore[attr-defined]
        ((x, _),) = list(bundle.train)
        return dict(zip(order, x, strict=True))

    first, second = by_sample(0), by_sample(1)
    assert all(torch.equal(a, b) for a, b in zip(first.values(), by_sample(0).values()))
    assert sum(not torch.equal(first[i], second[i]) for i in first) >= 3


@guard(
    "an ImageNet training image whose random crop lies inside it",
    "the crop alone is resized, as torchvision's crop-then-resize (no pixels from outside the box)",
)
def test_random_resized_crop_resizes_the_crop_alone_as_torchvision_does(pil: Any) -> None:
    """A real bug found by the audit (not a mutant): the crop was resized with
    ``Image.resize(..., box=...)``, whose bilinear filter reads pixels outside
    the box at the crop's edges. torchvision's ``resized_crop`` (the recipe the
    docstring names) crops, then resizes what it cropped."""
    pixels = np.random.default_rng(1).integers(0, 256, (120, 160, 3), dtype=np.uint8)
    image = pil.fromarray(pixels)
    crop = RandomResizedCropFlip(32)
    for seed in range(10):
        left, top, w, h = crop.box(160, 120, torch.Generator().manual_seed(seed))
        part = image.crop((left, top, left + w, top + h)).resize((32, 32), pil.Resampling.BILINEAR)
        expected = torch.from_numpy(np.asarray(part).copy()).permute(2, 0, 1)
        out = crop(image, torch.Generator().manual_seed(seed))
        assert torch.equal(out, expected) or torch.equal(out, expected.flip(2)), seed


# ----------------------------------------------------------------------------- MNIST-1D cache


@pytest.fixture
def fake_generate(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """MNIST-1D generation replaced by arrays of the right shapes; counts the calls."""
    calls: list[int] = []

    def generate() -> dict[str, np.ndarray]:
        calls.append(1)
        return {
            "x": np.full((4000, 40), 0.5, np.float32),
            "y": np.arange(4000, dtype=np.int64) % 10,
            "x_test": np.full((1000, 40), 0.25, np.float32),
            "y_test": np.arange(1000, dtype=np.int64) % 10,
        }

    monkeypatch.setattr(mnist1d_module, "_generate", generate)
    return calls


@guard(
    "an MNIST-1D cache that is sealed but lacks one of its arrays",
    "warning, then regenerated",
)
def test_a_cache_without_one_of_its_arrays_is_regenerated(
    tmp_path: Path, fake_generate: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """dat41: a cache file (whole, sealed) that lacks ``y_test`` is not what we
    wrote: it is ignored with a warning and regenerated (mnist1d.py's ``_read_cache``)."""
    x = np.zeros((4000, 40), np.float32)
    save_npz_atomic(
        tmp_path / mnist1d_module.MNIST1D_FILE, x=x, y=np.zeros(4000, np.int64), x_test=x[:1000]
    )
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        arrays = mnist1d_module.load_mnist1d_arrays(tmp_path)
    assert fake_generate == [1] and "regenerating" in caplog.text
    assert arrays["y_test"].shape == (1000,) and float(arrays["x"][0, 0]) == 0.5


@guard(
    "an MNIST-1D cache folder that cannot be written (a file in its place)",
    "warning `could not cache MNIST-1D`; the data set is used uncached",
)
def test_a_cache_folder_that_cannot_be_written_does_not_stop_loading(
    tmp_path: Path, fake_generate: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """dat42: "a read-only cache must not stop training": the generated arrays
    are returned, with a warning, when the cache cannot be written."""
    folder = tmp_path / "not-a-folder"
    folder.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="feather_sparse"):
        arrays = mnist1d_module.load_mnist1d_arrays(folder)
    assert fake_generate == [1] and arrays["x_test"].shape == (1000, 40)
    assert "could not cache MNIST-1D" in caplog.text


# ----------------------------------------------------------------------------- synthetic


def test_synthetic_test_samples_are_not_training_samples() -> None:
    """dat45: train and test are drawn apart (no test sample is a training sample)."""
    bundle = load_dataset(
        "synthetic",
        batch_size=8,
        eval_batch_size=16,
        train_size=64,
        test_size=16,
        input_shape=(4,),
        seed=5,
    )
    train = bundle.train.x  # type: ignore[attr-defined]
    test = torch.cat([xb for xb, _ in bundle.test])
    assert not (test[:, None, :] == train[None, :, :]).all(-1).any()
