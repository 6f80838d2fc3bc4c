"""Tiny stand-ins of the real datasets, written in their real on-disk formats, so that a run
reads them through the same loaders (torchvision's classes, LEAF's JSON) as it reads the real
data: random images of the real shape, a few per class.

torchvision layouts under `root` (what `pollen data download NAME --data-dir root` leaves):
  mnist          MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte
  fashion-mnist  FashionMNIST/raw/ (the same four files)
  cifar10        cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}
  svhn           {train,test}_32x32.mat
LEAF layouts under `root` (LEAF's data/ directory):
  femnist        femnist/data/{train,test}/*.json
  shakespeare    shakespeare/data/{train,test}/*.json (tests.leaf)

CIFAR-10's and SVHN's torchvision classes check their files' MD5 sums, which a stand-in
cannot have: `skip_md5_checks` (a pytest monkeypatch) makes those checks test for the file's
existence only; everything after it (reading the pickles and .mat files) is torchvision's own.
"""

from __future__ import annotations

import os
import pickle
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.leaf import word_text, write_leaf, write_leaf_json

TORCHVISION = ("mnist", "fashion-mnist", "cifar10", "svhn")
LEAF = ("femnist", "shakespeare")


def write_standin(
    dataset: str,
    root: Path,
    *,
    train_per_class: int = 4,
    test_per_class: int = 2,
    classes: int | None = None,
    clients: int = 4,
    seed: int = 0,
) -> Path:
    """`dataset`'s stand-in under `root` (returned): torchvision datasets get
    `train_per_class`/`test_per_class` random images of each of their first `classes` labels
    (all by default); LEAF datasets one user per client, each with a few train and test
    samples."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    if dataset in TORCHVISION:
        _WRITERS[dataset](root, rng, train_per_class, test_per_class, classes)
    elif dataset == "femnist":
        _femnist(root, rng, clients, train_per_class, test_per_class, classes or 62)
    elif dataset == "shakespeare":
        words = ("the", "king", "shall", "go", "to", "war", "and", "peace")
        texts = {f"PLAY_ROLE{i}": word_text(rng, words, 80 + 10) for i in range(clients)}
        write_leaf(root, texts)
    else:
        raise ValueError(f"no stand-in writer for {dataset!r}; known: {TORCHVISION + LEAF}")
    return root


def skip_md5_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchvision's CIFAR and SVHN classes accept a stand-in's files: their MD5 check becomes
    an existence check."""
    import torchvision.datasets.cifar as cifar
    import torchvision.datasets.svhn as svhn

    def exists(fpath: str | Path, md5: str | None = None) -> bool:
        return os.path.isfile(fpath)

    monkeypatch.setattr(cifar, "check_integrity", exists)
    monkeypatch.setattr(svhn, "check_integrity", exists)


# ---- torchvision formats -----------------------------------------------------------------


def _labels(rng: np.random.Generator, per_class: int, classes: int) -> np.ndarray:
    return rng.permutation(np.repeat(np.arange(classes), per_class))


def _idx(path: Path, array: np.ndarray) -> None:
    """An IDX file (MNIST's format): magic 0x08 (uint8) and the number of dimensions, the
    dimensions as big-endian int32, then the bytes."""
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def _mnist_like(folder: str) -> Callable[..., None]:
    def write(
        root: Path, rng: np.random.Generator, train: int, test: int, classes: int | None
    ) -> None:
        raw = root / folder / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        for prefix, per_class in (("train", train), ("t10k", test)):
            labels = _labels(rng, per_class, classes or 10)
            images = rng.integers(0, 256, (len(labels), 28, 28), dtype=np.uint8)
            _idx(raw / f"{prefix}-images-idx3-ubyte", images)
            _idx(raw / f"{prefix}-labels-idx1-ubyte", labels.astype(np.uint8))

    return write


def _cifar10(
    root: Path, rng: np.random.Generator, train: int, test: int, classes: int | None
) -> None:
    """cifar-10-batches-py: five training batches and a test batch, each a pickled dict with
    "data" (N x 3072 uint8, channel-major rows) and "labels", and batches.meta."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    names = ["airplane", "automobile", "bird", "cat", "deer",
             "dog", "frog", "horse", "ship", "truck"]  # fmt: skip
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": names, "num_cases_per_batch": 10000, "num_vis": 3072}, f)
    train_labels = _labels(rng, train, classes or 10)
    parts = np.array_split(train_labels, 5)
    for i, labels in enumerate(parts, start=1):
        _cifar_batch(folder / f"data_batch_{i}", rng, labels)
    _cifar_batch(folder / "test_batch", rng, _labels(rng, test, classes or 10))


def _cifar_batch(path: Path, rng: np.random.Generator, labels: np.ndarray) -> None:
    data = rng.integers(0, 256, (len(labels), 3072), dtype=np.uint8)
    with open(path, "wb") as f:
        pickle.dump({"batch_label": path.name, "labels": labels.tolist(), "data": data}, f)


def _svhn(root: Path, rng: np.random.Generator, train: int, test: int, classes: int | None) -> None:
    """{train,test}_32x32.mat: "X" of shape 32 x 32 x 3 x N (uint8) and "y" of shape N x 1 with
    the digit 0 stored as 10, as SVHN publishes them."""
    from scipy.io import savemat  # lazy: scipy only for this format

    for split, per_class in (("train", train), ("test", test)):
        labels = _labels(rng, per_class, classes or 10)
        x = rng.integers(0, 256, (32, 32, 3, len(labels)), dtype=np.uint8)
        y = np.where(labels == 0, 10, labels).astype(np.uint8).reshape(-1, 1)
        savemat(str(root / f"{split}_32x32.mat"), {"X": x, "y": y})


_WRITERS: dict[str, Callable[..., None]] = {
    "mnist": _mnist_like("MNIST"),
    "fashion-mnist": _mnist_like("FashionMNIST"),
    "cifar10": _cifar10,
    "svhn": _svhn,
}


# ---- LEAF formats ------------------------------------------------------------------------


def _femnist(
    root: Path, rng: np.random.Generator, writers: int, train: int, test: int, classes: int
) -> None:
    """One LEAF user per writer (`f0000_00` ...): `train` and `test` images each, as lists of
    784 values k/255 and labels drawn from the first `classes` of the 62."""
    splits: dict[str, dict[str, dict[str, list[Any]]]] = {"train": {}, "test": {}}
    for w in range(writers):
        for split, count in (("train", train), ("test", test)):
            images = rng.integers(0, 256, (count, 784)) / 255.0
            labels = rng.integers(0, classes, count)
            splits[split][f"f{w:04d}_{w % 100:02d}"] = {
                "x": images.tolist(),
                "y": labels.tolist(),
            }
    for split, users in splits.items():
        write_leaf_json(root / "femnist" / "data" / split / f"all_data_0_{split}.json", users)
