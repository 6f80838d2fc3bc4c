"""Dataset registry: embedded datasets, torchvision conversion and its error messages."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from federated_data import (
    DATASET_NAMES,
    ArrayDataset,
    DataConfigError,
    DatasetNotFoundError,
    SourceData,
    dataset_names,
    load_dataset,
    register_dataset,
    registry,
)
from federated_data.catalog import CATALOG

TORCHVISION_NAMES = ["mnist", "fashion-mnist", "cifar10", "cifar100", "emnist", "svhn"]


def test_builtin_names_and_catalog_agree() -> None:
    assert set(DATASET_NAMES) == {
        "mnist-5k",
        "digits",
        "fedem-synthetic",
        "shakespeare",
        "femnist",
        "pca-synthetic",
        "ae-synthetic",
        *TORCHVISION_NAMES,
    }
    assert set(DATASET_NAMES) == set(CATALOG)
    for name, spec in registry.TORCHVISION_DATASETS.items():
        assert CATALOG[name].num_classes == spec.num_classes
        assert len(spec.mean) == len(spec.std) == CATALOG[name].input_shape[0]


def test_mnist_5k_shapes_and_labels(source_cache: Path) -> None:
    source = load_dataset("mnist-5k", cache_dir=source_cache)
    train = source.train
    assert source.test is None
    assert train.x.shape == (5000, 1, 28, 28) and train.x.dtype == np.uint8
    assert train.y.dtype == np.int64 and train.label_counts().tolist() == [500] * 10
    assert train.x.max() == 255 and train.x.min() == 0
    assert (train.mean, train.std) == ((0.1307,), (0.3081,))
    assert train.input_shape == CATALOG["mnist-5k"].input_shape
    # normalised pixels are centred near 0 with unit spread
    feats = train.features()
    assert abs(float(feats.mean())) < 0.02 and abs(float(feats.std()) - 1.0) < 0.02


def test_digits_shapes_scaling_and_hardcoded_statistics(source_cache: Path) -> None:
    from sklearn.datasets import load_digits

    source = load_dataset("digits", cache_dir=source_cache)
    train = source.train
    assert source.test is None
    assert train.x.shape == (1797, 1, 8, 8) and train.x.dtype == np.uint8
    assert train.y.min() == 0 and train.y.max() == 9 and train.num_classes == 10
    assert train.x.max() == 255
    original = load_digits().images
    np.testing.assert_array_equal(np.round(train.x[:, 0].astype(np.float64) * 16 / 255), original)
    pixels = train.x.astype(np.float64) / 255
    assert abs(pixels.mean() - train.mean[0]) < 1e-4
    assert abs(pixels.std() - train.std[0]) < 1e-4


def test_unknown_dataset_lists_valid_names() -> None:
    with pytest.raises(DataConfigError, match=r"unknown dataset 'imagenet'.*cifar10.*mnist-5k"):
        load_dataset("imagenet")


def test_cached_loaders_run_once_per_cache_dir(tmp_path: Path) -> None:
    calls: list[tuple[str | None, bool]] = []

    def loader(data_dir: str | None, download: bool) -> SourceData:
        calls.append((data_dir, download))
        x = np.arange(12, dtype=np.uint8).reshape(3, 1, 2, 2)
        train = ArrayDataset(x, np.array([0, 1, 0]), 2, (0.5,), (0.25,))
        test = ArrayDataset(x[:1], np.array([1]), 2, (0.5,), (0.25,))
        return SourceData(train, test, keys=np.array([7, 7, 8]))

    register_dataset("tiny", loader, cache=True)
    first = load_dataset("tiny", "somewhere", False, cache_dir=tmp_path)
    second = load_dataset("tiny", None, False, cache_dir=tmp_path)
    assert calls == [("somewhere", False)]
    assert (tmp_path / "sources").is_dir()
    assert second.test is not None and first.test is not None and second.keys is not None
    for a, b in ((first.train, second.train), (first.test, second.test)):
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.y, b.y)
        assert (a.mean, a.std, a.num_classes) == (b.mean, b.std, b.num_classes)
    assert second.keys.tolist() == [7, 7, 8]
    load_dataset("tiny", cache_dir=tmp_path / "elsewhere")
    assert len(calls) == 2


def test_corrupt_source_cache_names_the_file(tmp_path: Path) -> None:
    path = registry.source_cache_path("digits", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(DataConfigError, match=f"{re.escape(str(path))}.*delete it"):
        load_dataset("digits", cache_dir=tmp_path)


def test_register_dataset_refuses_to_overwrite() -> None:
    def loader(data_dir: str | None, download: bool) -> SourceData:
        raise AssertionError("not called")

    with pytest.raises(DataConfigError, match="already registered"):
        register_dataset("digits", loader)
    register_dataset("digits", loader, replace=True)
    register_dataset("synthetic", loader)
    assert "synthetic" in dataset_names() and "synthetic" not in DATASET_NAMES


# --- torchvision: error paths ---------------------------------------------------------------


@pytest.mark.parametrize("name", TORCHVISION_NAMES)
def test_missing_data_dir_says_how_to_get_the_data(name: str, tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset(name, None, cache_dir=tmp_path)
    text = str(err.value)
    assert repr(name) in text and "data-dir" in text
    assert f"pollen data download {name} --data-dir DIR" in text
    assert "--set download=true" in text
    assert not (tmp_path / "sources").exists() or not any((tmp_path / "sources").glob("*.npz"))


def test_nonexistent_directory_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    pattern = f"'cifar10'.*{re.escape(str(missing))}.*pollen data download"
    with pytest.raises(DatasetNotFoundError, match=pattern):
        load_dataset("cifar10", str(missing), cache_dir=tmp_path)


def test_empty_directory_is_reported_by_torchvision_and_named(tmp_path: Path) -> None:
    empty = tmp_path / "data"
    empty.mkdir()
    pattern = f"'svhn'.*{re.escape(str(empty))}.*download=true"
    with pytest.raises(DatasetNotFoundError, match=pattern):
        load_dataset("svhn", str(empty), cache_dir=tmp_path)


def test_download_without_a_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(DataConfigError, match="download=true needs a data-dir"):
        load_dataset("mnist", None, download=True, cache_dir=tmp_path)


def test_dataset_not_found_is_a_data_config_error() -> None:
    assert issubclass(DatasetNotFoundError, DataConfigError)
    assert issubclass(DataConfigError, ValueError)


# --- torchvision: conversion with fake dataset classes --------------------------------------


def _fake_class(make: Any, label_attr: str = "targets") -> tuple[type, list[dict[str, Any]]]:
    """A stand-in torchvision class whose split is chosen by its keyword arguments."""
    opened: list[dict[str, Any]] = []

    class Fake:
        def __init__(self, root: str, download: bool, **kwargs: Any) -> None:
            opened.append({"root": root, "download": download, **kwargs})
            is_train = kwargs.get("train", kwargs.get("split") == "train")
            self.data, labels = make(is_train)
            setattr(self, label_attr, labels)

    return Fake, opened


def _rng_images(n: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, *shape), dtype=np.uint8)


def test_cifar_hwc_arrays_become_chw(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    train_x, test_x = _rng_images(6, (32, 32, 3), 0), _rng_images(2, (32, 32, 3), 1)

    def make(is_train: bool) -> tuple[np.ndarray, list[int]]:
        return (train_x, [0, 1, 2, 3, 4, 99]) if is_train else (test_x, [5, 6])

    fake, opened = _fake_class(make)
    monkeypatch.setattr("torchvision.datasets.CIFAR100", fake)
    source = load_dataset("cifar100", str(tmp_path), cache_dir=tmp_path / "cache")
    assert opened == [
        {"root": str(tmp_path), "download": False, "train": True},
        {"root": str(tmp_path), "download": False, "train": False},
    ]
    assert source.train.x.shape == (6, 3, 32, 32) and source.train.x.flags.c_contiguous
    np.testing.assert_array_equal(source.train.x[4, 2, 10, 7], train_x[4, 10, 7, 2])
    np.testing.assert_array_equal(source.train.x, train_x.transpose(0, 3, 1, 2))
    assert source.train.y.dtype == np.int64 and source.train.y.tolist()[-1] == 99
    assert source.test is not None and source.test.y.tolist() == [5, 6]
    assert source.train.num_classes == 100 and source.train.mean == (0.4914, 0.4822, 0.4465)

    # cached: the files (here, the fake class) are not needed any more
    monkeypatch.setattr("torchvision.datasets.CIFAR100", None)
    again = load_dataset("cifar100", None, cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(again.train.x, source.train.x)


def test_svhn_chw_arrays_and_labels_attribute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    train_x, test_x = _rng_images(4, (3, 32, 32), 2), _rng_images(3, (3, 32, 32), 3)

    def make(is_train: bool) -> tuple[np.ndarray, np.ndarray]:
        return (train_x, np.array([0, 9, 1, 2])) if is_train else (test_x, np.array([3, 3, 0]))

    fake, opened = _fake_class(make, label_attr="labels")
    monkeypatch.setattr("torchvision.datasets.SVHN", fake)
    source = load_dataset("svhn", str(tmp_path), cache_dir=tmp_path / "cache")
    assert [o["split"] for o in opened] == ["train", "test"]
    np.testing.assert_array_equal(source.train.x, train_x)
    assert source.train.y.tolist() == [0, 9, 1, 2]
    assert source.test is not None and source.test.x.shape == (3, 3, 32, 32)
    assert source.train.std == (0.1980, 0.2010, 0.1970)


@pytest.mark.parametrize(
    ("name", "class_name", "mean", "transposed", "classes"),
    [
        ("mnist", "MNIST", (0.1307,), False, 10),
        ("fashion-mnist", "FashionMNIST", (0.2860,), False, 10),
        ("emnist", "EMNIST", (0.1307,), True, 62),
    ],
)
def test_mnist_like_tensors_gain_a_channel_axis(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
    class_name: str,
    mean: tuple[float, ...],
    transposed: bool,
    classes: int,
) -> None:
    import torch

    train_x = _rng_images(5, (28, 28), 4)

    def make(is_train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        x = train_x if is_train else train_x[:2]
        y = [0, 1, 2, 3, classes - 1] if is_train else [4, 5]
        return torch.from_numpy(x), torch.tensor(y)

    fake, opened = _fake_class(make)
    monkeypatch.setattr(f"torchvision.datasets.{class_name}", fake)
    source = load_dataset(name, str(tmp_path), download=True, cache_dir=tmp_path / "cache")
    assert all(o["download"] is True for o in opened)
    if name == "emnist":
        assert {o["split"] for o in opened} == {"byclass"}
    expected = train_x.transpose(0, 2, 1) if transposed else train_x
    assert source.train.x.shape == (5, 1, 28, 28) and source.train.x.dtype == np.uint8
    np.testing.assert_array_equal(source.train.x[:, 0], expected)
    assert source.train.y.dtype == np.int64 and source.train.y.tolist()[-1] == classes - 1
    assert source.train.mean == mean and source.train.num_classes == classes
    assert source.test is not None and source.test.y.tolist() == [4, 5]


def test_unexpected_torchvision_layout_is_reported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake, _ = _fake_class(lambda is_train: (np.zeros((2, 32, 32), np.uint8), [0, 1]))
    monkeypatch.setattr("torchvision.datasets.CIFAR10", fake)
    with pytest.raises(DataConfigError, match=r"CIFAR10.data: expected a uint8 array with 4"):
        load_dataset("cifar10", str(tmp_path), cache_dir=tmp_path / "cache")


# --- dataset parameters and predefined splits -------------------------------------------------


def _counted_generator(calls: list[tuple[int, int]]) -> Any:
    def loader(data_dir: str | None, download: bool, *, size: int, num_clients: int) -> SourceData:
        calls.append((size, num_clients))
        x = np.arange(size * 2, dtype=np.float32).reshape(size, 2)
        return SourceData(ArrayDataset(x, np.arange(size) % 2, 2))

    return loader


def test_declared_params_reach_the_loader_and_each_set_is_cached_apart(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    register_dataset(
        "gen", _counted_generator(calls), cache=True, params={"size": 4, "num_clients": 1}
    )
    assert len(load_dataset("gen", cache_dir=tmp_path).train) == 4
    assert len(load_dataset("gen", cache_dir=tmp_path, params={"size": 6}).train) == 6
    assert len(load_dataset("gen", cache_dir=tmp_path, params={"size": 6}).train) == 6
    assert calls == [(4, 1), (6, 1)]
    assert len(list((tmp_path / "sources").glob("gen*.npz"))) == 2
    assert registry.resolve_dataset_params("gen", {"size": 3}, num_clients=7) == {
        "size": 3,
        "num_clients": 7,
    }
    assert registry.dataset_param_names("gen") == ("size", "num_clients")
    with pytest.raises(DataConfigError, match="'gen' has no parameter 'sise'; accepted: size"):
        load_dataset("gen", cache_dir=tmp_path, params={"sise": 3})


def test_datasets_without_params_refuse_them_and_keep_the_two_argument_loader(
    source_cache: Path,
) -> None:
    assert registry.dataset_param_names("digits") == ()
    with pytest.raises(DataConfigError, match="'digits' takes no parameters, got 'size'"):
        load_dataset("digits", cache_dir=source_cache, params={"size": 3})
    assert len(load_dataset("digits", cache_dir=source_cache, params={}).train) == 1797


def test_register_dataset_checks_its_parameter_declaration() -> None:
    def loader(data_dir: str | None, download: bool, **params: Any) -> SourceData:
        raise AssertionError("not called")

    with pytest.raises(DataConfigError, match="check_params needs declared params"):
        register_dataset("g1", loader, check_params=dict)
    with pytest.raises(DataConfigError, match="int, float or str defaults"):
        register_dataset("g2", loader, params={"flag": True})
    with pytest.raises(DataConfigError, match="server_test_per_client"):
        register_dataset("g3", loader, server_test_per_client=0)


def test_test_mask_survives_the_source_cache(tmp_path: Path, source_cache: Path) -> None:
    mask = np.array([False, True, False, True])

    def loader(data_dir: str | None, download: bool) -> SourceData:
        x = np.zeros((4, 3), dtype=np.float32)
        return SourceData(
            ArrayDataset(x, np.array([0, 1, 1, 0]), 2), None, np.array([0, 0, 1, 1]), mask
        )

    register_dataset("split", loader, cache=True)
    load_dataset("split", cache_dir=tmp_path)
    cached = load_dataset("split", cache_dir=tmp_path)
    assert cached.test_mask is not None and cached.test_mask.tolist() == mask.tolist()
    assert load_dataset("digits", cache_dir=source_cache).test_mask is None


def test_test_mask_needs_keys_and_one_bool_per_example() -> None:
    train = ArrayDataset(np.zeros((3, 2), dtype=np.float32), np.array([0, 1, 0]), 2)
    with pytest.raises(DataConfigError, match="test_mask needs keys"):
        SourceData(train, test_mask=np.array([True, False, False]))
    with pytest.raises(DataConfigError, match="one entry per training example"):
        SourceData(train, keys=np.arange(3), test_mask=np.array([1, 0, 0]))
    with pytest.raises(DataConfigError, match="one entry per training example"):
        SourceData(train, keys=np.arange(3), test_mask=np.array([True, False]))
