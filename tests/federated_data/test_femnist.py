"""FEMNIST from LEAF's JSON: images back to uint8 1x28x28, one client per writer with LEAF's own
train/test split, MNIST normalisation, and clear errors for missing or malformed files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from federated_data import (
    DataConfigError,
    DatasetNotFoundError,
    DataSpec,
    load_client_data,
    load_dataset,
)
from federated_data.catalog import dataset_info
from federated_data.femnist import SUBDIR
from tests.leaf import write_leaf_json
from tests.standins import write_standin


def _docs(root: Path) -> dict[str, Any]:
    return {
        split: json.loads(next((root / SUBDIR / split).glob("*.json")).read_text())
        for split in ("train", "test")
    }


def test_writers_become_clients_with_their_own_train_and_test_images(tmp_path: Path) -> None:
    write_standin("femnist", tmp_path, clients=3, train_per_class=5, test_per_class=2)
    docs = _docs(tmp_path)
    source = load_dataset("femnist", str(tmp_path), cache_dir=tmp_path / "cache")
    assert source.train.x.dtype == np.uint8 and source.train.x.shape[1:] == (1, 28, 28)
    assert source.train.num_classes == 62 and source.test is None
    assert source.train.mean == (0.1307,) and source.train.std == (0.3081,)
    assert dataset_info("femnist").input_shape == (1, 28, 28)
    writers = sorted(docs["train"]["users"])
    spec = DataSpec("femnist", 3, "natural", val_fraction=0.0, data_dir=str(tmp_path))
    for cid, writer in enumerate(writers):  # client i is the i-th writer in name order
        client = load_client_data(spec, cid, tmp_path / "cache")
        for split, data in (("train", client.train), ("test", client.test)):
            entry = docs[split]["user_data"][writer]
            pixels = np.asarray(entry["x"]).reshape(-1, 1, 28, 28)
            expected = np.rint(pixels * 255).astype(np.uint8)
            # the partition keeps a client's examples in source order
            np.testing.assert_array_equal(data.x, expected)
            np.testing.assert_array_equal(data.y, np.asarray(entry["y"]))


def test_femnist_is_never_downloaded_and_names_leafs_command(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match=r"preprocess\.sh -s niid --sf 0\.15"):
        load_dataset("femnist", str(tmp_path / "empty"))
    with pytest.raises(DatasetNotFoundError, match="no data directory"):
        load_dataset("femnist", None)
    with pytest.raises(DataConfigError, match="cannot be downloaded"):
        load_dataset("femnist", str(tmp_path), download=True)


def _user_edit(change: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        change(doc["user_data"][doc["users"][0]])

    return edit


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_user_edit(lambda e: e.update(x=[[0.5] * 700] * len(e["x"]))), "700 values, not 784"),
        (_user_edit(lambda e: e["x"].__setitem__(0, [0.5] * 700)), "lists of 784 numbers"),
        (_user_edit(lambda e: e["x"].__setitem__(0, [2.0] * 784)), r"must lie in \[0, 1\]"),
        (_user_edit(lambda e: e["x"].__setitem__(0, "pixels")), "lists of 784 numbers"),
        (_user_edit(lambda e: e["y"].__setitem__(0, 62)), r"integers in \[0, 62\)"),
        (_user_edit(lambda e: e["y"].__setitem__(0, 1.5)), "integers"),
        (_user_edit(lambda e: e["y"].pop()), "lists of equal length"),
        (_user_edit(lambda e: e.pop("x")), "needs 'x' and 'y'"),
        (lambda d: d.pop("users"), "not a LEAF JSON file"),
    ],
)
def test_malformed_files_are_refused_by_name(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], message: str
) -> None:
    write_standin("femnist", tmp_path, clients=2, train_per_class=2, test_per_class=1)
    path = next((tmp_path / SUBDIR / "train").glob("*.json"))
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(DataConfigError, match=message):
        load_dataset("femnist", str(tmp_path))


def test_a_writer_without_test_images_gets_an_empty_test_split(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = (rng.integers(0, 256, (4, 784)) / 255).tolist()
    for split, users in (
        ("train", {"w1": {"x": images, "y": [0, 1, 2, 3]}}),
        ("test", {"w1": {"x": [], "y": []}}),
    ):
        write_leaf_json(tmp_path / SUBDIR / split / "all_data_0.json", users)
    spec = DataSpec("femnist", 1, "natural", val_fraction=0.0, data_dir=str(tmp_path))
    client = load_client_data(spec, 0, tmp_path / "cache")
    assert len(client.train) == 4 and len(client.test) == 0
    assert client.test.x.shape == (0, 1, 28, 28)
