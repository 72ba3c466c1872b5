"""CIFAR-10 and CIFAR-100 (Krizhevsky 2009) from the python-format archive.

The archives ``cifar-10-python.tar.gz`` and ``cifar-100-python.tar.gz`` hold
pickled dicts with bytes keys: ``b"data"`` is a uint8 array of rows of 3072
values (1024 red, 1024 green, 1024 blue, each a row-major 32x32 image) and
the labels are ``b"labels"`` (CIFAR-10) or ``b"fine_labels"`` (CIFAR-100).
``data_dir`` may be the folder that holds the archive or its extracted folder,
the archive itself, or the extracted folder itself. Archives are read in one
pass without extracting anything to disk.

The whole set is kept as uint8 on the training device; augmentation (random
crop with 4 pixels of zero padding, horizontal flip) and normalisation run
there on each batch (``augment.CropFlipNormalize``); the test set is only
normalised. This is the augmentation of the paper's CIFAR-100 experiments.

Normalisation uses each data set's own per-channel statistics. The authors'
released code normalises CIFAR-100 with the CIFAR-10 mean and the often-quoted
std ``(0.2023, 0.1994, 0.2010)``; pass ``mean=`` and ``std=`` to match it.

The pickles are read with an unpickler that only accepts the numpy array
constructors, so a tampered archive cannot run code.
"""

from __future__ import annotations

import io
import logging
import pickle
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from feather_sparse.data.augment import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    CropFlipNormalize,
    Normalize,
)
from feather_sparse.data.base import (
    DATASETS,
    DataBundle,
    DatasetBuilder,
    LoaderConfig,
    tensor_bundle,
)

__all__ = ["CIFAR10", "CIFAR100", "CifarSpec", "read_cifar"]

logger = logging.getLogger(__name__)

_ROW = 3 * 32 * 32


@dataclass(frozen=True)
class CifarSpec:
    """Where one CIFAR variant keeps what, in its python-format archive.

    Attributes:
        name: the data set's name (``cifar10``, ``cifar100``).
        archive: the file name of its python-format archive.
        folder: the folder the archive unpacks to.
        train_files: the training batch files in that folder.
        test_files: the test batch files.
        label_key: the key of the labels in each batch's pickled dict.
        num_classes: the number of classes.
        mean: the per-channel mean the inputs are normalised with.
        std: the per-channel standard deviation.
        url: where to download the archive (named in error messages; never fetched).
    """

    name: str
    archive: str
    folder: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    label_key: bytes
    num_classes: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    url: str

    def expected(self) -> str:
        """What the files are called, for error messages."""
        names = [*self.train_files, *self.test_files]
        listed = f"{names[0]}..{names[-2]}, {names[-1]}" if len(names) > 3 else " and ".join(names)
        return f"{self.folder}/{listed} (or {self.archive})"


CIFAR10 = CifarSpec(
    name="cifar10",
    archive="cifar-10-python.tar.gz",
    folder="cifar-10-batches-py",
    train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
    test_files=("test_batch",),
    label_key=b"labels",
    num_classes=10,
    mean=CIFAR10_MEAN,
    std=CIFAR10_STD,
    url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
)
CIFAR100 = CifarSpec(
    name="cifar100",
    archive="cifar-100-python.tar.gz",
    folder="cifar-100-python",
    train_files=("train",),
    test_files=("test",),
    label_key=b"fine_labels",
    num_classes=100,
    mean=CIFAR100_MEAN,
    std=CIFAR100_STD,
    url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
)


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, numbers, bytes and numpy arrays; nothing else."""

    _ALLOWED = frozenset(
        {
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"),
            ("numpy.core.numeric", "_frombuffer"),
            ("numpy._core.numeric", "_frombuffer"),
            # bytes in protocol-2 pickles written by Python 3
            ("_codecs", "encode"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR file")
        return super().find_class(module, name)


def _unpickle(f: IO[bytes], where: str) -> dict[bytes, Any]:
    try:
        obj = _ArrayUnpickler(f, encoding="bytes").load()
    except Exception as err:
        raise ValueError(f"{where} is not a CIFAR python-format batch: {err}") from err
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is not a CIFAR python-format batch (a pickled dict)")
    return obj


def _parse_batch(
    batch: dict[bytes, Any], spec: CifarSpec, where: str
) -> tuple[np.ndarray, np.ndarray]:
    """``(N, 3, 32, 32)`` uint8 images and ``(N,)`` int64 labels of one batch file."""
    if b"data" not in batch or spec.label_key not in batch:
        raise ValueError(
            f"{where} has keys {sorted(batch)}; a {spec.name} batch needs "
            f"b'data' and {spec.label_key!r}"
        )
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[spec.label_key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _ROW:
        raise ValueError(
            f"{where}: b'data' is {data.dtype} {data.shape}; expected uint8 rows of {_ROW}"
        )
    if labels.shape != (data.shape[0],):
        raise ValueError(f"{where}: {data.shape[0]} images but {labels.size} labels")
    if labels.size and (labels.min() < 0 or labels.max() >= spec.num_classes):
        raise ValueError(
            f"{where}: labels span {labels.min()}..{labels.max()}; "
            f"{spec.name} has {spec.num_classes} classes"
        )
    # Each row is 3 planes of 32x32, row-major: exactly (3, 32, 32).
    return data.reshape(-1, 3, 32, 32), labels


def _missing(spec: CifarSpec, where: Path, detail: str = "") -> FileNotFoundError:
    return FileNotFoundError(
        f"{spec.name}: expected {spec.expected()} under {where}{detail}; "
        f"download {spec.url} and pass its folder (or the archive) with --data-dir"
    )


# file name -> (where it was read from, for messages; its unpickled dict)
_Batches = dict[str, tuple[str, dict[bytes, Any]]]


def _read_folder(folder: Path, spec: CifarSpec) -> _Batches:
    files = {name: folder / name for name in (*spec.train_files, *spec.test_files)}
    absent = [name for name, path in files.items() if not path.is_file()]
    if absent:
        raise _missing(spec, folder.parent, f" (missing {', '.join(absent)} in {folder})")
    out = {}
    for name, path in files.items():
        with path.open("rb") as f:
            out[name] = (str(path), _unpickle(f, str(path)))
    return out


def _read_archive(archive: Path, spec: CifarSpec) -> _Batches:
    wanted = {f"{spec.folder}/{name}": name for name in (*spec.train_files, *spec.test_files)}
    out: _Batches = {}
    try:
        # One sequential pass: seeking back in a .gz stream would decompress it again.
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                name = wanted.get(member.name.removeprefix("./"))
                if name is None or not member.isfile():
                    continue
                f = tar.extractfile(member)
                assert f is not None  # isfile() members always have data
                where = f"{archive}:{member.name}"
                out[name] = (where, _unpickle(io.BytesIO(f.read()), where))
    except (tarfile.TarError, EOFError, OSError) as err:
        raise ValueError(
            f"{archive} is not a readable {spec.archive} ({err}); download {spec.url} again"
        ) from err
    absent = [path for path, name in wanted.items() if name not in out]
    if absent:
        raise ValueError(
            f"{archive} does not contain {', '.join(absent)}; expected the python-format "
            f"archive {spec.archive} from {spec.url}"
        )
    return out


def read_cifar(
    data_dir: Path | str | None, spec: CifarSpec
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Read a CIFAR variant from its archive or extracted folder.

    Where the folder given holds both, an extracted folder that is incomplete
    or damaged (an interrupted ``tar xzf``) is passed over, with a warning,
    for the archive beside it.

    Args:
        data_dir: the folder holding ``spec.archive`` or ``spec.folder``, the
            archive itself, or the extracted folder itself.
        spec: ``CIFAR10`` or ``CIFAR100``.

    Returns:
        ``((x_train, y_train), (x_test, y_test))`` with ``x`` uint8
        ``(N, 3, 32, 32)`` and ``y`` int64 ``(N,)``.

    Raises:
        FileNotFoundError: if the data is not where ``data_dir`` says, with
            what was expected and where to get it.
        ValueError: if a file is there but is not in the python format (or,
            where both are there, neither the folder nor the archive is usable).
    """
    if data_dir is None:
        raise FileNotFoundError(
            f"{spec.name} is read from disk: download {spec.url} and pass the folder "
            f"that holds it (or the extracted {spec.folder}) with --data-dir / data_dir="
        )
    root = Path(data_dir).expanduser()
    if not root.exists():
        raise _missing(spec, root, " (that path does not exist)")
    if root.is_file():
        return _parse(_read_archive(root, spec), spec)
    if root.name == spec.folder or all(
        (root / n).is_file() for n in (*spec.train_files, *spec.test_files)
    ):
        return _parse(_read_folder(root, spec), spec)
    folder, archive = root / spec.folder, root / spec.archive
    if folder.is_dir() and archive.is_file():
        # An interrupted `tar xzf` leaves a partial folder beside the intact archive.
        names = (*spec.train_files, *spec.test_files)
        absent = [name for name in names if not (folder / name).is_file()]
        try:
            if not absent:
                return _parse(_read_folder(folder, spec), spec)
            problem = f"it lacks {', '.join(absent)}"
        except (OSError, ValueError) as err:
            problem = str(err)
        logger.warning(
            "%s: the extracted folder %s is incomplete or damaged (%s); reading the archive "
            "%s instead (delete the folder, or extract the archive again, to silence this)",
            spec.name,
            folder,
            problem,
            archive,
        )
        try:
            return _parse(_read_archive(archive, spec), spec)
        except (OSError, ValueError) as err:
            raise ValueError(
                f"{spec.name}: neither the extracted folder nor the archive under {root} is "
                f"usable. The folder {folder}: {problem}. The archive: {err}"
            ) from err
    if folder.is_dir():
        return _parse(_read_folder(folder, spec), spec)
    if archive.is_file():
        return _parse(_read_archive(archive, spec), spec)
    raise _missing(spec, root)


def _parse(
    batches: _Batches, spec: CifarSpec
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The train and test arrays of the batches read, each batch checked."""

    def join(names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        parts = [_parse_batch(batches[n][1], spec, batches[n][0]) for n in names]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    return join(spec.train_files), join(spec.test_files)


def _builder(spec: CifarSpec, summary: str) -> DatasetBuilder:
    """The registry entry of one CIFAR variant; both take the same options."""

    def build(
        data_dir: Path | None,
        config: LoaderConfig,
        *,
        augment: bool = True,
        padding: int = 4,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> DataBundle:
        (x, y), (x_test, y_test) = read_cifar(data_dir, spec)
        mean = spec.mean if mean is None else tuple(mean)
        std = spec.std if std is None else tuple(std)
        if len(mean) != 3 or len(std) != 3:
            raise ValueError(f"{spec.name}: mean and std need 3 channels, got {mean}, {std}")
        evaluate = Normalize(mean, std, config.device)
        train_transform = (
            CropFlipNormalize(mean, std, config.device, padding=padding) if augment else evaluate
        )
        return tensor_bundle(
            spec.name,
            config,
            train=(torch.from_numpy(x), torch.from_numpy(y)),
            test=(torch.from_numpy(x_test), torch.from_numpy(y_test)),
            num_classes=spec.num_classes,
            input_shape=(3, 32, 32),
            train_transform=train_transform,
            test_transform=evaluate,
        )

    build.__name__ = build.__qualname__ = f"build_{spec.name}"
    build.__doc__ = (
        f"{summary}\n\n"
        "Options: ``augment`` (crop + flip on the training set), ``padding`` of the\n"
        f"random crop, and ``mean``/``std`` (default: {spec.name}'s own statistics).\n"
    )
    return build


build_cifar10 = DATASETS.register(
    CIFAR10.name, _builder(CIFAR10, "CIFAR-10: 50000/10000 images ``(3, 32, 32)``, 10 classes.")
)
build_cifar100 = DATASETS.register(
    CIFAR100.name,
    _builder(CIFAR100, "CIFAR-100 (fine labels): 50000/10000 images ``(3, 32, 32)``, 100 classes."),
)
