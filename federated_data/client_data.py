"""A client's train/val/test data, partitioned once per data spec and cached on disk.

The first process to ask for a spec loads the source dataset, partitions it and writes every
client's file; the manifest, written last, marks the cache complete. Later calls, typically
one fresh client process per message, read a single small .npz and import no framework.
"""

from __future__ import annotations

import hashlib
import json
import math
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from federated_data.arrays import ArrayDataset
from federated_data.cachefiles import (
    default_cache_dir,
    exclusive_lock,
    load_npz,
    remove_stale_temporaries,
    save_npz_atomic,
    write_text_atomic,
)
from federated_data.catalog import CATALOG
from federated_data.errors import DataConfigError
from federated_data.partition import partition_labels, validate_partition_params
from federated_data.registry import (
    NUM_CLIENTS,
    SOURCE_FORMAT,
    ParamValue,
    SourceData,
    coarse_labels_of,
    has_predefined_split,
    load_dataset,
    resolve_dataset_params,
    server_test_per_client,
)

__all__ = [
    "ClientData",
    "DataSpec",
    "default_cache_dir",
    "load_client_data",
    "load_server_test_data",
    "partition_summary",
    "validate_spec",
]

# Bump when the way client files are derived from a spec changes: old caches are then ignored.
CACHE_FORMAT = 1
MANIFEST = "manifest.json"
_SPLITS = ("train", "val", "test")
SERVER_TEST = "server-test.npz"
"""In a partition's cache directory, when the dataset has no official test split: the server's
test set, every client's test split joined (load_server_test_data), written with the partition
so that the server reads one file instead of one per client (10,000 of FedEM's synthetic
clients: 3.1 s)."""


@dataclass(frozen=True)
class DataSpec:
    """Everything that decides which examples each client holds, plus where the data lives.

    `params` are the partitioner's parameters and `dataset_params` the dataset's (e.g. a
    generator's dimension), both as (name, value) pairs sorted on construction so that equal
    settings give equal specs and equal cache keys. `num_clients` is never a dataset
    parameter: datasets that need the client count receive this spec's `num_clients`.

    For a dataset with a predefined split (each client's test examples fixed by the data),
    `test_fraction` is ignored and `val_fraction` is taken from the client's training examples.

    `pool_test` partitions the dataset's official test set together with its training set (the
    server then evaluates on the union of the clients' test splits); `subsample` keeps only that
    share of the (pooled) examples, drawn at random with the seed before partitioning. Both
    change a partition's cache key only when set, so existing caches stay valid.
    """

    dataset: str
    num_clients: int
    partitioner: str = "iid"
    seed: int = 0
    params: tuple[tuple[str, ParamValue], ...] = ()
    val_fraction: float = 0.1
    test_fraction: float = 0.2
    data_dir: str | None = None
    download: bool = False
    dataset_params: tuple[tuple[str, ParamValue], ...] = ()
    pool_test: bool = False
    subsample: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.dataset, str) or not self.dataset:
            raise DataConfigError(f"dataset must be a non-empty name, got {self.dataset!r}")
        if not isinstance(self.partitioner, str) or not self.partitioner:
            raise DataConfigError(f"partitioner must be a non-empty name, got {self.partitioner!r}")
        for name in ("num_clients", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise DataConfigError(f"{name} must be an integer, got {value!r}")
        if self.num_clients < 1:
            raise DataConfigError(f"num_clients must be >= 1, got {self.num_clients}")
        if self.seed < 0:
            raise DataConfigError(f"seed must be >= 0, got {self.seed}")
        for name in ("val_fraction", "test_fraction"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (0.0 <= value < 1.0)
            ):
                raise DataConfigError(f"{name} must be a number in [0, 1), got {value!r}")
        if not isinstance(self.pool_test, bool):
            raise DataConfigError(f"pool_test must be true or false, got {self.pool_test!r}")
        if (
            isinstance(self.subsample, bool)
            or not isinstance(self.subsample, int | float)
            or not (0.0 < self.subsample <= 1.0)
        ):
            raise DataConfigError(f"subsample must be a number in (0, 1], got {self.subsample!r}")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise DataConfigError(
                f"val_fraction + test_fraction must be < 1 to leave training data, got "
                f"{self.val_fraction} + {self.test_fraction}"
            )
        object.__setattr__(self, "params", _normalise_params(self.params, "params"))
        dataset_params = _normalise_params(self.dataset_params, "dataset_params")
        if any(name == NUM_CLIENTS for name, _ in dataset_params):
            raise DataConfigError(
                "dataset_params: num_clients is the spec's own num_clients field; set that "
                "instead (datasets that use it receive it from there)"
            )
        object.__setattr__(self, "dataset_params", dataset_params)

    def identity(self) -> dict[str, Any]:
        """The fields that change the partition (not where the data is read from).

        `dataset_params` appear only when given, so specs of datasets without parameters keep
        the keys (and caches) they had before datasets could take parameters.
        """
        out: dict[str, Any] = {
            "format": [CACHE_FORMAT, SOURCE_FORMAT],
            "dataset": self.dataset,
            "num_clients": int(self.num_clients),
            "partitioner": self.partitioner,
            "seed": int(self.seed),
            "params": [[k, _canonical(v)] for k, v in self.params],
            "val_fraction": _canonical(self.val_fraction),
            "test_fraction": _canonical(self.test_fraction),
        }
        if self.dataset_params:
            out["dataset_params"] = [[k, _canonical(v)] for k, v in self.dataset_params]
        if self.pool_test:
            out["pool_test"] = True
        if self.subsample != 1.0:
            out["subsample"] = _canonical(self.subsample)
        return out

    def key(self) -> str:
        """Short stable hash of `identity()`: the cache directory name of this partition."""
        text = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "num_clients": int(self.num_clients),
            "partitioner": self.partitioner,
            "seed": int(self.seed),
            "params": [[k, v] for k, v in self.params],
            "val_fraction": self.val_fraction,
            "test_fraction": self.test_fraction,
            "data_dir": self.data_dir,
            "download": self.download,
            "dataset_params": [[k, v] for k, v in self.dataset_params],
            "pool_test": self.pool_test,
            "subsample": self.subsample,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DataSpec:
        fields = dict(raw)
        for name in ("params", "dataset_params"):
            fields[name] = tuple((str(k), v) for k, v in fields.get(name, ()))
        try:
            return cls(**fields)
        except TypeError as exc:
            raise DataConfigError(f"not a data spec: {exc}") from None


@dataclass(frozen=True)
class ClientData:
    """One client's share of the data, split into local train, validation and test sets."""

    client_id: int
    train: ArrayDataset
    val: ArrayDataset
    test: ArrayDataset


def validate_spec(spec: DataSpec) -> None:
    """Reject a spec that cannot be partitioned, without loading any data (launcher check)."""
    _coarse_map(spec, required=False)  # rejects an unknown dataset, listing the valid names
    _dataset_params(spec)
    if has_predefined_split(spec.dataset) and spec.partitioner != "natural":
        raise DataConfigError(_predefined_split_needs_natural(spec))
    if has_predefined_split(spec.dataset) and (spec.pool_test or spec.subsample != 1.0):
        raise DataConfigError(
            f"dataset {spec.dataset!r} fixes each client's examples itself (a predefined split): "
            f"pool-test and subsample do not apply to it"
        )
    info = CATALOG.get(spec.dataset)
    params: dict[str, Any] = dict(spec.params)
    if spec.partitioner == "natural":
        params["keys"] = np.arange(spec.num_clients)  # stand-in: real keys come with the data
    elif spec.partitioner == "pachinko":
        params["coarse_of_fine"] = _coarse_map(spec)
    validate_partition_params(
        spec.partitioner,
        spec.num_clients,
        info.num_classes if info is not None else None,
        None,
        **params,
    )


def load_client_data(spec: DataSpec, client_id: int, cache_dir: str | Path) -> ClientData:
    """Client `client_id`'s data; the first call for a spec builds every client's cache file."""
    cid = _check_client(spec, client_id)
    directory = _ensure_cache(spec, Path(cache_dir))
    return _read_client(directory / _client_file(cid), cid)


def load_server_test_data(spec: DataSpec, cache_dir: str | Path) -> ArrayDataset | None:
    """Data for server-side evaluation: the official test split if the dataset has one, else
    every client's test split together (None when those are all empty).

    Datasets registered with `server_test_per_client` (fedem-synthetic: 200) contribute only
    the first that many of each client's test examples, so the server's set stays small when
    clients hold large test sets; their test splits are already in random order.
    """
    root = Path(cache_dir)
    directory = _ensure_cache(spec, root)
    if _read_manifest(directory)["has_official_test"]:
        return load_dataset(
            spec.dataset, spec.data_dir, spec.download, root, _dataset_params(spec)
        ).test
    path = directory / SERVER_TEST
    if not path.exists():  # a partition cached before the joined file was written with it
        tests = [_read_client(directory / _client_file(i), i).test for i in range(spec.num_clients)]
        _save_server_test(path, [_server_share(spec, t) for t in tests])
    (joined,) = _read_cached(path, ("",))
    return joined if len(joined) else None


def _server_share(spec: DataSpec, test: ArrayDataset) -> ArrayDataset:
    """What a client's test split gives the server's: the first `server_test_per_client` of its
    examples where the dataset sets that, else all."""
    cap = server_test_per_client(spec.dataset)
    return test if cap is None else test.subset(np.arange(min(cap, len(test))))


def _save_server_test(path: Path, tests: list[ArrayDataset]) -> None:
    """SERVER_TEST: the clients' shares of their test splits, joined."""
    first = tests[0]
    save_npz_atomic(
        path,
        {
            "_x": np.concatenate([t.x for t in tests]),
            "_y": np.concatenate([t.y for t in tests]),
            "num_classes": np.asarray(first.num_classes, dtype=np.int64),
            "mean": np.asarray(first.mean, dtype=np.float64),
            "std": np.asarray(first.std, dtype=np.float64),
        },
    )


def partition_summary(spec: DataSpec, cache_dir: str | Path) -> dict[str, Any]:
    """Per-client split sizes and label histograms, read from the manifest (built if absent)."""
    return _read_manifest(_ensure_cache(spec, Path(cache_dir)))


def _normalise_params(raw: Any, field: str) -> tuple[tuple[str, ParamValue], ...]:
    try:
        pairs = [(name, value) for name, value in raw]
    except (TypeError, ValueError):
        raise DataConfigError(f"{field} must be (name, value) pairs, got {raw!r}") from None
    seen: set[str] = set()
    for name, value in pairs:
        if not isinstance(name, str):
            raise DataConfigError(f"{field}: parameter names must be strings, got {name!r}")
        if name in seen:
            raise DataConfigError(f"{field}: parameter {name!r} given twice")
        seen.add(name)
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise DataConfigError(
                f"{field}: {name} must be an int, float or str, got {type(value).__name__}"
            )
    return tuple(sorted(pairs))


def _dataset_params(spec: DataSpec) -> dict[str, Any]:
    """What the spec's dataset loader receives (checked; DataConfigError names a bad one)."""
    return resolve_dataset_params(
        spec.dataset, dict(spec.dataset_params), num_clients=spec.num_clients
    )


def _predefined_split_needs_natural(spec: DataSpec) -> str:
    return (
        f"dataset {spec.dataset!r} gives every client its own train and test examples (a "
        f"predefined split), so it needs partitioner 'natural' (client i = i-th key); got "
        f"{spec.partitioner!r}"
    )


def _canonical(value: ParamValue) -> ParamValue:
    """Integral floats as ints, so that 1 and 1.0 name the same partition."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _check_client(spec: DataSpec, client_id: int) -> int:
    if isinstance(client_id, bool) or not isinstance(client_id, int | np.integer):
        raise DataConfigError(f"client_id must be an integer, got {client_id!r}")
    if not 0 <= client_id < spec.num_clients:
        raise DataConfigError(
            f"client_id must be in [0, {spec.num_clients}) for num_clients="
            f"{spec.num_clients}, got {client_id}"
        )
    return int(client_id)


def _client_file(client_id: int) -> str:
    return f"client-{client_id}.npz"


def _coarse_map(spec: DataSpec, required: bool = True) -> np.ndarray | None:
    cmap = coarse_labels_of(spec.dataset)
    if cmap is None and required:
        raise DataConfigError(
            f"partitioner 'pachinko' needs fine and coarse labels (coarse_of_fine); dataset "
            f"{spec.dataset!r} has none (cifar100 has)"
        )
    return cmap


def _ensure_cache(spec: DataSpec, cache_dir: Path) -> Path:
    directory = cache_dir / spec.key()
    if (directory / MANIFEST).exists():
        return directory
    validate_spec(spec)
    with exclusive_lock(directory):
        if not (directory / MANIFEST).exists():
            remove_stale_temporaries(directory)
            _build(spec, directory, cache_dir)
    return directory


def _build(spec: DataSpec, directory: Path, cache_dir: Path) -> None:
    source = _pooled_and_subsampled(
        load_dataset(spec.dataset, spec.data_dir, spec.download, cache_dir, _dataset_params(spec)),
        spec,
    )
    if source.test_mask is not None and spec.partitioner != "natural":
        raise DataConfigError(_predefined_split_needs_natural(spec))
    parts = partition_labels(
        source.train.y,
        spec.partitioner,
        spec.num_clients,
        spec.seed,
        **_partition_params(spec, source),
    )
    clients: list[dict[str, Any]] = []
    tests: list[ArrayDataset] = []
    for cid, indices in enumerate(parts):
        splits = {
            name: source.train.subset(idx)
            for name, idx in zip(
                _SPLITS, _split_client(indices, spec, cid, source.test_mask), strict=True
            )
        }
        arrays: dict[str, np.ndarray] = {
            "num_classes": np.asarray(source.train.num_classes, dtype=np.int64),
            "mean": np.asarray(source.train.mean, dtype=np.float64),
            "std": np.asarray(source.train.std, dtype=np.float64),
        }
        summary: dict[str, Any] = {"client_id": cid}
        for name, data in splits.items():
            arrays[f"{name}_x"], arrays[f"{name}_y"] = data.x, data.y
            summary[name] = len(data)
        for name, data in splits.items():
            summary[f"{name}_labels"] = data.label_counts().tolist()
        save_npz_atomic(directory / _client_file(cid), arrays)
        clients.append(summary)
        if source.test is None:
            tests.append(_server_share(spec, splits["test"]))
    if source.test is None:  # the server's test set, one file to read (load_server_test_data)
        _save_server_test(directory / SERVER_TEST, tests)
    manifest = {
        "format": CACHE_FORMAT,
        "key": spec.key(),
        "spec": spec.to_dict(),
        "num_classes": source.train.num_classes,
        "input_shape": list(source.train.input_shape),
        "mean": list(source.train.mean),
        "std": list(source.train.std),
        "source_train_size": len(source.train),
        "has_official_test": source.test is not None,
        "predefined_split": source.test_mask is not None,
        "official_test_size": len(source.test) if source.test is not None else None,
        "clients": clients,
    }
    write_text_atomic(directory / MANIFEST, json.dumps(manifest, indent=1) + "\n")


def _pooled_and_subsampled(source: SourceData, spec: DataSpec) -> SourceData:
    """The examples the partitioner splits: with `pool_test` the official test set appended to
    the training set (no official test set left), then with `subsample` a random share of them
    (sorted, so the partition sees them in source order)."""
    if spec.pool_test and source.test is not None:
        train, test = source.train, source.test
        source = SourceData(
            ArrayDataset(
                np.concatenate([train.x, test.x]),
                np.concatenate([train.y, test.y]),
                train.num_classes,
                train.mean,
                train.std,
            )
        )
    if spec.subsample < 1.0:
        n = len(source.train)
        keep = max(1, math.floor(spec.subsample * n + 0.5))
        rng = np.random.default_rng([spec.seed, *SUBSAMPLE_STREAM])
        chosen = np.sort(rng.choice(n, size=keep, replace=False))
        source = SourceData(source.train.subset(chosen), source.test)
    return source


SUBSAMPLE_STREAM = (0, 0x5B)
"""Words after the seed in the subsample's seed ([seed, 0, 0x5B], three words where the
per-client splits' [seed, client] have two): its draw is independent of theirs and of the
partitioner's."""


def _partition_params(spec: DataSpec, source: SourceData) -> dict[str, Any]:
    params: dict[str, Any] = dict(spec.params)
    if spec.partitioner == "pachinko":
        params["coarse_of_fine"] = _coarse_map(spec)
    elif spec.partitioner == "natural":
        if source.keys is None:
            raise DataConfigError(
                f"partitioner 'natural' needs one key per example (e.g. writer id); dataset "
                f"{spec.dataset!r} provides none"
            )
        params["keys"] = source.keys
    return params


def _split_client(
    indices: np.ndarray, spec: DataSpec, client_id: int, test_mask: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, val, test) index arrays: test and val carved at random from the partition.

    With a `test_mask` (predefined split) the client's marked examples are its test split and
    val is carved from the rest; `test_fraction` then plays no part.
    """
    rng = np.random.default_rng([spec.seed, client_id])
    if test_mask is not None:
        marked = test_mask[indices]
        pool = rng.permutation(indices[~marked])
        n_val = math.floor(spec.val_fraction * len(pool) + 0.5)
        return np.sort(pool[n_val:]), np.sort(pool[:n_val]), np.sort(indices[marked])
    shuffled = rng.permutation(indices)
    n_test = math.floor(spec.test_fraction * len(indices) + 0.5)
    n_val = math.floor(spec.val_fraction * len(indices) + 0.5)
    test = shuffled[:n_test]
    val = shuffled[n_test : n_test + n_val]
    train = shuffled[n_test + n_val :]
    return np.sort(train), np.sort(val), np.sort(test)


def _read_client(path: Path, client_id: int) -> ClientData:
    return ClientData(client_id, *_read_cached(path, _SPLITS))


def _read_cached(path: Path, names: Sequence[str]) -> list[ArrayDataset]:
    """The datasets `{name}_x`, `{name}_y` of a cached file (a client's, or SERVER_TEST with
    the one name ""), with its num_classes, mean and std."""
    try:
        f = load_npz(path)
        num_classes = int(f["num_classes"])
        mean = tuple(float(v) for v in f["mean"])
        std = tuple(float(v) for v in f["std"])
        return [ArrayDataset(f[f"{n}_x"], f[f"{n}_y"], num_classes, mean, std) for n in names]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise DataConfigError(
            f"cached partition file {path} is unreadable ({exc}); delete the directory "
            f"{path.parent} to rebuild the partition"
        ) from exc


def _read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    try:
        manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataConfigError(
            f"partition manifest {path} is unreadable ({exc}); delete the directory "
            f"{directory} to rebuild the partition"
        ) from exc
    return manifest
