"""ImageNet (ILSVRC-2012) from class folders, with the standard ResNet augmentation.

Layout under ``data_dir``: ``train/<class>/<image>`` and ``val/<class>/<image>``
(e.g. ``train/n01440764/n01440764_10026.JPEG``); classes are the sorted
folder names of ``train/``, and ``val/`` must use the same names.

Augmentation as in the paper's ImageNet experiments (the usual ResNet-50
recipe): *train* takes a random crop covering 8%..100% of the image area with
aspect ratio 3/4..4/3, resized to 224x224 (Szegedy et al. 2015, "Going deeper
with convolutions"), and flips it horizontally with probability 1/2; *eval*
resizes the shorter side to 256 and takes the central 224x224. Both end with
per-channel normalisation by the ImageNet mean and std.

Images are decoded and cropped with Pillow in ``num_workers`` DataLoader
processes and travel as uint8; normalisation runs on the training device.
The crop and flip of a sample are drawn from its own ``torch.Generator``
seeded by ``(seed, epoch, sample index)``, not from a worker's global RNG, so
the batches do not depend on ``num_workers``, on worker scheduling, or on
whether torchvision is installed (it is not used: for PIL images
torchvision's resize and crop call these same Pillow operations).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from feather_sparse.data.augment import IMAGENET_MEAN, IMAGENET_STD, Normalize
from feather_sparse.data.base import DATASETS, DataBundle, LoaderConfig
from feather_sparse.data.loaders import AUGMENT_STREAM, EpochShard, derive_seed

__all__ = [
    "IMAGE_EXTENSIONS",
    "CenterCropEval",
    "ImageFolder",
    "ImageFolderLoader",
    "RandomResizedCropFlip",
    "UnreadableImageError",
    "find_classes",
]

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}
)
_LAYOUT = "train/<class>/<image> and val/<class>/<image> (e.g. train/n01440764/*.JPEG)"
_EXTRA = "pip install 'feather-sparse[imagenet]'"


def _pil_image() -> Any:
    """The ``PIL.Image`` module, or an ImportError naming the extra to install."""
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError(
            f"the imagenet data set decodes images with Pillow, which is not installed "
            f"({err}); install it with: {_EXTRA}"
        ) from err
    return Image


def _bilinear(image_module: Any) -> Any:
    # Pillow >= 9.1 has the Resampling enum; older releases the module constant.
    return getattr(image_module, "Resampling", image_module).BILINEAR


def _to_tensor(img: Any) -> Tensor:
    """A PIL RGB image as a ``(3, H, W)`` uint8 tensor."""
    array = np.asarray(img, dtype=np.uint8)  # (H, W, 3)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


class RandomResizedCropFlip:
    """Random-area, random-aspect crop resized to ``size``, then a random flip (train).

    The crop parameters follow the Inception recipe: up to 10 tries at an area
    fraction uniform in ``scale`` and a log-uniform aspect ratio in ``ratio``;
    if none fits, the whole image's central crop at the nearest allowed ratio.

    Args:
        size: side of the square output.
        scale: range of the crop's area as a fraction of the image.
        ratio: range of the crop's aspect ratio (width / height).
    """

    def __init__(
        self,
        size: int = 224,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
    ) -> None:
        self.size = size
        self.scale = scale
        self.ratio = ratio

    def box(self, width: int, height: int, generator: torch.Generator) -> tuple[int, int, int, int]:
        """``(left, top, w, h)`` of the crop in a ``width`` x ``height`` image.

        Args:
            width: the image's width in pixels.
            height: its height in pixels.
            generator: the random generator to draw from.
        """
        area = width * height
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            u_area, u_ratio, u_top, u_left = torch.rand(4, generator=generator).tolist()
            target = area * (self.scale[0] + (self.scale[1] - self.scale[0]) * u_area)
            aspect = math.exp(log_lo + (log_hi - log_lo) * u_ratio)
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                # floor(u * count) is uniform on 0 .. count - 1
                top = min(int(u_top * (height - h + 1)), height - h)
                left = min(int(u_left * (width - w + 1)), width - w)
                return left, top, w, h
        # Fallback: the largest central crop whose aspect ratio is allowed.
        aspect = width / height
        if aspect < self.ratio[0]:
            w, h = width, round(width / self.ratio[0])
        elif aspect > self.ratio[1]:
            w, h = round(height * self.ratio[1]), height
        else:
            w, h = width, height
        return (width - w) // 2, (height - h) // 2, w, h

    def __call__(self, img: Any, generator: torch.Generator) -> Tensor:
        """Crop, resize and maybe flip a PIL image; returns ``(3, size, size)`` uint8."""
        left, top, w, h = self.box(img.width, img.height, generator)
        # Crop, then resize what was cropped, as torchvision's resized_crop does:
        # resize(box=...) would let the filter read pixels outside the box at its edges.
        img = img.crop((left, top, left + w, top + h))
        img = img.resize((self.size, self.size), _bilinear(_pil_image()))
        out = _to_tensor(img)
        flip = bool(torch.rand(1, generator=generator).item() < 0.5)
        return out.flip(2) if flip else out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, scale={self.scale}, ratio={self.ratio})"


def _check_eval_sizes(size: Any, resize: Any, size_name: str, resize_name: str) -> tuple[int, int]:
    """``(size, resize)`` as ints if the central ``size`` square fits the resized image."""
    for name, value in ((size_name, size), (resize_name, resize)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"imagenet: {name} must be a positive integer, got {value!r}")
    size, resize = int(size), int(resize)
    if size > resize:
        raise ValueError(
            f"imagenet: {size_name}={size} is larger than {resize_name}={resize}: the eval "
            f"images' shorter side is resized to {resize_name} and the central {size_name} "
            "square is taken, so it would run past the image and be padded with black; "
            f"set {resize_name} >= {size_name} (the usual ratio is 256/224, e.g. "
            f"{resize_name}={size * 256 // 224} for {size_name}={size})"
        )
    return size, resize


class CenterCropEval:
    """Resize the shorter side to ``resize``, then take the central ``size`` square (eval).

    Args:
        size: side of the square output (224).
        resize: length of the shorter side before cropping (256).

    Raises:
        ValueError: if ``size`` or ``resize`` is not a positive integer, or
            ``size > resize`` (the crop would run past the resized image, and
            Pillow would fill the rest with black).
    """

    def __init__(self, size: int = 224, resize: int = 256) -> None:
        self.size, self.resize = _check_eval_sizes(size, resize, "size", "resize")

    def __call__(self, img: Any, generator: torch.Generator | None = None) -> Tensor:
        """Resize and crop a PIL image; returns ``(3, size, size)`` uint8."""
        width, height = img.width, img.height
        if width <= height:
            new_w, new_h = self.resize, int(self.resize * height / width)
        else:
            new_w, new_h = int(self.resize * width / height), self.resize
        img = img.resize((new_w, new_h), _bilinear(_pil_image()))
        top = round((new_h - self.size) / 2)
        left = round((new_w - self.size) / 2)
        return _to_tensor(img.crop((left, top, left + self.size, top + self.size)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, resize={self.resize})"


def find_classes(folder: Path) -> list[str]:
    """The sorted class-folder names directly under ``folder``.

    Args:
        folder: the split's folder (one subfolder per class).
    """
    return sorted(entry.name for entry in os.scandir(folder) if entry.is_dir())


def _scan(folder: Path, classes: Sequence[str], *, require_all: bool) -> list[tuple[str, int]]:
    """``(path, label)`` of every image in the class folders under ``folder``, sorted."""
    samples: list[tuple[str, int]] = []
    for label, name in enumerate(classes):
        class_dir = folder / name
        if not class_dir.is_dir():
            if require_all:
                raise FileNotFoundError(f"class folder {class_dir} is missing")
            continue
        files = sorted(
            entry.path
            for entry in os.scandir(class_dir)
            if entry.is_file() and os.path.splitext(entry.name)[1].lower() in IMAGE_EXTENSIONS
        )
        if not files and require_all:
            raise FileNotFoundError(
                f"class folder {class_dir} holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))})"
            )
        samples.extend((path, label) for path in files)
    return samples


class UnreadableImageError(OSError):
    """An image file that Pillow cannot open or decode; the message names the file.

    An ``OSError``, like the Pillow errors it wraps, so code that handles
    unreadable files still does.
    """


class ImageFolder(Dataset[tuple[Tensor, int]]):
    """Images in class folders, indexed by ``(index, sample_seed)`` keys.

    The key carries the seed of the sample's augmentation, so the random crop
    is decided by the batch sampler (in the main process) and not by the
    worker that happens to decode the image.

    Args:
        samples: ``(path, label)`` pairs.
        transform: PIL image and generator to a uint8 ``(3, H, W)`` tensor.
    """

    def __init__(self, samples: list[tuple[str, int]], transform: Any) -> None:
        self.samples = samples
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key: tuple[int, int]) -> tuple[Tensor, int]:
        index, sample_seed = key
        path, label = self.samples[index]
        image_module = _pil_image()
        try:
            with image_module.open(path) as img:
                rgb = img.convert("RGB")  # decodes: a truncated file fails here
        except (FileNotFoundError, PermissionError):
            raise  # these name the file, and the fix is not to replace it
        except (OSError, SyntaxError, ValueError, EOFError) as err:
            # Pillow's decode errors ("Truncated File Read", "broken data stream")
            # name no file, and in a data set of a million images it cannot be found.
            said = str(err)
            reason = (
                "not an image Pillow can read" if path in said else f"{type(err).__name__}: {said}"
            )
            raise UnreadableImageError(
                f"cannot decode image {path} ({reason}); the file is truncated, damaged or "
                "not an image: remove it or replace it with an intact copy"
            ) from err
        generator = torch.Generator().manual_seed(sample_seed)
        return self.transform(rgb, generator), label


class _ShardedBatchSampler(EpochShard):
    """Batches of ``(index, sample_seed)`` keys: this rank's shard of one epoch."""

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        order = self.indices().tolist()
        for batch in self.batch_slices():
            yield [
                (i, derive_seed(self.seed, self.epoch, AUGMENT_STREAM, i) if self.shuffle else 0)
                for i in order[batch]
            ]


class ImageFolderLoader:
    """The ``Loader`` over an ``ImageFolder``: decoding in workers, normalising on the device.

    Args:
        dataset: the images.
        batch_size: samples per batch on this rank.
        shuffle: reshuffle (and augment) every epoch; train.
        drop_last: drop what does not fill a global batch; train.
        seed: shuffling and augmentation depend only on ``(seed, epoch)``.
        rank: this rank.
        world_size: number of ranks.
        num_workers: DataLoader worker processes (0: decode in this process).
        device: where batches are delivered.
        mean: per-channel mean on the 0..1 scale.
        std: per-channel std on the 0..1 scale.
    """

    def __init__(
        self,
        dataset: ImageFolder,
        *,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int,
        rank: int,
        world_size: int,
        num_workers: int,
        device: torch.device,
        mean: Sequence[float],
        std: Sequence[float],
    ) -> None:
        self.dataset = dataset
        self.device = device
        self.batch_size = batch_size
        self.sampler = _ShardedBatchSampler(
            len(dataset),
            batch_size=batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            seed=seed,
            rank=rank,
            world_size=world_size,
            what="images",
        )
        self.normalize = Normalize(mean, std, device)
        # The sampler runs in this process, so set_epoch reaches it even with
        # persistent workers; the workers only decode.
        self._loader: DataLoader[tuple[Tensor, int]] = DataLoader(
            dataset,
            batch_sampler=self.sampler,
            num_workers=num_workers,
            pin_memory=device.type == "cuda",
            persistent_workers=num_workers > 0,
        )

    @property
    def num_samples(self) -> int:
        """Samples this rank sees per epoch."""
        return self.sampler.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s permutation and augmentation from now on.

        Args:
            epoch: the epoch whose permutation and augmentation to use.
        """
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        for x, y in self._loader:
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
            yield self.normalize(x), y

    def __repr__(self) -> str:
        return (
            f"ImageFolderLoader(samples={len(self.dataset)}, batch_size={self.batch_size}, "
            f"batches={len(self)}, rank={self.sampler.rank}/{self.sampler.world_size}, "
            f"device={self.device})"
        )


def _check_layout(root: Path | None) -> Path:
    if root is None:
        raise FileNotFoundError(
            f"imagenet is read from class folders: pass the folder that holds {_LAYOUT} "
            "with --data-dir / data_dir="
        )
    if not root.is_dir():
        raise FileNotFoundError(f"imagenet: expected a folder with {_LAYOUT} at {root}")
    for split in ("train", "val"):
        folder = root / split
        if not folder.is_dir():
            raise FileNotFoundError(f"imagenet: expected {_LAYOUT} under {root}; no {folder}")
        if not find_classes(folder):
            raise FileNotFoundError(
                f"imagenet: {folder} has no class folders; expected {_LAYOUT} "
                "(sort a flat val/ into one folder per class first)"
            )
    return root


@DATASETS.register("imagenet")
def build_imagenet(
    data_dir: Path | None,
    config: LoaderConfig,
    *,
    image_size: int = 224,
    resize_size: int = 256,
    augment: bool = True,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> DataBundle:
    """ImageNet from ``train/`` and ``val/`` class folders under ``data_dir``.

    Options: ``image_size`` (crop side, 224), ``resize_size`` (eval shorter
    side, 256), ``augment`` (random resized crop + flip for training, else the
    eval transform), ``mean``/``std``. ``resize_size`` must be at least
    ``image_size`` (e.g. 329 for 288: the usual 256/224 ratio).
    """
    # Before any folder is read: a crop larger than the resized image is padded with black.
    _check_eval_sizes(image_size, resize_size, "image_size", "resize_size")
    _pil_image()  # fail early, before scanning folders, if Pillow is missing
    root = _check_layout(data_dir)
    classes = find_classes(root / "train")
    unknown = sorted(set(find_classes(root / "val")) - set(classes))
    if unknown:
        raise ValueError(
            f"imagenet: val/ has classes that train/ lacks: {', '.join(unknown[:5])}"
            f"{' ...' if len(unknown) > 5 else ''}"
        )
    train_samples = _scan(root / "train", classes, require_all=True)
    val_samples = _scan(root / "val", classes, require_all=False)
    if not val_samples:
        raise FileNotFoundError(f"imagenet: no images in the class folders under {root / 'val'}")
    evaluate = CenterCropEval(image_size, resize_size)
    train_set = ImageFolder(
        train_samples, RandomResizedCropFlip(image_size) if augment else evaluate
    )
    val_set = ImageFolder(val_samples, evaluate)
    common: dict[str, Any] = {
        "seed": config.seed,
        "rank": config.rank,
        "world_size": config.world_size,
        "num_workers": config.num_workers,
        "device": config.device,
        "mean": mean,
        "std": std,
    }
    return DataBundle(
        name="imagenet",
        train=ImageFolderLoader(
            train_set, batch_size=config.batch_size, shuffle=True, drop_last=True, **common
        ),
        test=ImageFolderLoader(
            val_set, batch_size=config.eval_batch_size, shuffle=False, drop_last=False, **common
        ),
        num_classes=len(classes),
        input_shape=(3, image_size, image_size),
        train_size=len(train_samples),
        test_size=len(val_samples),
    )
