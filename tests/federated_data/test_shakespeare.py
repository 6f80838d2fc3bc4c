"""Shakespeare from LEAF's JSON: encoding, next-character targets, one client per user, LEAF's
own train/test split, and clear errors for missing or malformed files."""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np
import pytest

from federated_data import (
    DataConfigError,
    DatasetNotFoundError,
    DataSpec,
    load_client_data,
    load_dataset,
    load_server_test_data,
    validate_spec,
)
from federated_data.catalog import dataset_info
from federated_data.registry import SHAKESPEARE_SERVER_TEST_PER_CLIENT
from federated_data.shakespeare import SUBDIR, reference_class_weights
from tests.leaf import windows, write_leaf

TEXTS = {
    # LEAF names users <play>_<role>; client i is the i-th name in sorted order
    "PLAY_B_ROMEO": "But soft, what light through yonder window breaks? It is the east. " * 3,
    "PLAY_A_HAMLET": "To be, or not to be, that is the question:\nWhether 'tis nobler! " * 3,
    "PLAY_A_OPHELIA": "O, what a noble mind is here o'erthrown! The courtier's, soldier's. " * 3,
}
SORTED = sorted(TEXTS)


def _codes(text: str) -> list[int]:
    return [string.printable.index(c) for c in text]


def _spec(data_dir: Path, num_clients: int = 3, **kw: object) -> DataSpec:
    fields: dict[str, object] = {
        "dataset": "shakespeare",
        "num_clients": num_clients,
        "partitioner": "natural",
        "val_fraction": 0.0,
        "data_dir": str(data_dir),
        **kw,
    }
    return DataSpec(**fields)  # type: ignore[arg-type]


def test_samples_are_encoded_over_printable_with_shifted_targets(tmp_path: Path) -> None:
    write_leaf(tmp_path, TEXTS, files=2)
    source = load_dataset("shakespeare", str(tmp_path))
    data, keys, mask = source.train, source.keys, source.test_mask
    assert keys is not None and mask is not None
    assert data.x.dtype == np.int16 and data.x.shape[1] == 80 and data.num_classes == 100
    assert source.test is None
    for k, user in enumerate(SORTED):
        x, y = windows(TEXTS[user])
        cut = int(0.8 * len(x))
        rows = np.flatnonzero(keys == k)
        assert len(rows) == len(x)
        assert mask[rows].sum() == len(x) - cut  # LEAF's test samples, marked
        train_rows = rows[~mask[rows]]
        assert data.x[train_rows[3]].tolist() == _codes(x[3])
        assert int(data.y[train_rows[3]]) == string.printable.index(y[3])
    targets = data.targets()
    assert targets.dtype == np.int64 and targets.shape == data.x.shape
    np.testing.assert_array_equal(targets[:, :-1], data.x[:, 1:])
    np.testing.assert_array_equal(targets[:, -1], data.y)


def test_one_client_per_user_with_leafs_split(tmp_path: Path) -> None:
    write_leaf(tmp_path, TEXTS)
    spec = _spec(tmp_path)
    validate_spec(spec)
    for cid, user in enumerate(SORTED):
        client = load_client_data(spec, cid, tmp_path / "cache")
        x, _ = windows(TEXTS[user])
        cut = int(0.8 * len(x))
        assert (len(client.train), len(client.val), len(client.test)) == (cut, 0, len(x) - cut)
        # the reference's targets: chars[j+1 : j+81] of the user's text
        text = TEXTS[user]
        j = cut + 5  # the 6th test sample starts at character j
        assert client.test.features()[5].tolist() == _codes(text[j : j + 80])
        assert client.test.targets()[5].tolist() == _codes(text[j + 1 : j + 81])
    # the server's test set: each client's first test sequences
    server = load_server_test_data(spec, tmp_path / "cache")
    assert server is not None and server.x.dtype == np.int16
    per_client = [min(len(windows(TEXTS[u])[0]) - int(0.8 * len(windows(TEXTS[u])[0])),
                      SHAKESPEARE_SERVER_TEST_PER_CLIENT) for u in SORTED]  # fmt: skip
    assert len(server) == sum(per_client)


def test_fewer_clients_take_the_first_users_and_more_are_refused(tmp_path: Path) -> None:
    write_leaf(tmp_path, TEXTS)
    two = load_client_data(_spec(tmp_path, 2), 1, tmp_path / "cache")
    assert len(two.train) == int(0.8 * len(windows(TEXTS[SORTED[1]])[0]))
    with pytest.raises(DataConfigError, match=r"num_clients must be in \[1, 3\]"):
        load_client_data(_spec(tmp_path, 4), 0, tmp_path / "cache")
    with pytest.raises(DataConfigError, match="needs partitioner 'natural'"):
        validate_spec(_spec(tmp_path, partitioner="iid"))


def test_catalog_knows_shapes_and_the_reference_weights() -> None:
    info = dataset_info("shakespeare")
    assert info.input_shape == (80,) and info.num_classes == 100
    weights = reference_class_weights()
    assert info.class_weights == weights and len(weights) == 100
    assert weights[string.printable.index(" ")] == pytest.approx(8 * 0.04250)
    assert weights[string.printable.index("e")] == pytest.approx(8 * 0.13456)
    assert weights[string.printable.index("Z")] == 8.0


def test_missing_files_say_what_is_expected_and_where(tmp_path: Path) -> None:
    expected = str(tmp_path / SUBDIR / "train")
    with pytest.raises(DatasetNotFoundError, match="LEAF") as info:
        load_dataset("shakespeare", str(tmp_path))
    assert expected in str(info.value) and "never downloaded" in str(info.value)
    with pytest.raises(DatasetNotFoundError, match="no data directory"):
        load_dataset("shakespeare", None)
    with pytest.raises(DataConfigError, match="cannot be downloaded"):
        load_dataset("shakespeare", str(tmp_path), download=True)
    write_leaf(tmp_path, TEXTS)
    for path in (tmp_path / SUBDIR / "test").glob("*.json"):
        path.unlink()
    with pytest.raises(DatasetNotFoundError, match="no test files"):
        load_dataset("shakespeare", str(tmp_path))


def _edit(tmp_path: Path, split: str, change: object) -> None:
    """Rewrite the split's file with `change(doc)` applied (or replaced by a raw string)."""
    path = next((tmp_path / SUBDIR / split).glob("*.json"))
    if isinstance(change, str):
        path.write_text(change)
        return
    doc = json.loads(path.read_text())
    change(doc)  # type: ignore[operator]
    path.write_text(json.dumps(doc))


def _user(doc: dict[str, object]) -> dict[str, list[str]]:
    return doc["user_data"][SORTED[0]]  # type: ignore[index, no-any-return]


@pytest.mark.parametrize(
    ("split", "change", "message"),
    [
        ("train", "{not json", "not a LEAF JSON file"),
        ("train", lambda d: d.pop("user_data"), "not a LEAF JSON file"),
        ("test", lambda d: d.update(users="x"), "'users' must be a list"),
        ("train", lambda d: d["user_data"].pop(SORTED[0]), "has no user_data entry"),
        ("train", lambda d: _user(d)["x"].__setitem__(2, "too short"), r"x\[2\] must be a string"),
        ("train", lambda d: _user(d)["y"].__setitem__(0, "ab"), r"y\[0\] must be one character"),
        ("train", lambda d: _user(d)["y"].pop(), "lists of equal length"),
        ("test", lambda d: _user(d).pop("y"), "needs 'x' and 'y'"),
        ("train", lambda d: _user(d)["y"].__setitem__(1, "é"), "'é' is not in Python's"),
        ("train", lambda d: _user(d)["y"].__setitem__(1, "\u2014"), "'\u2014' is not in"),
        ("train", lambda d: _user(d)["y"].__setitem__(1, "\x00"), r"'\\x00' is not in"),
        ("test", lambda d: d["users"].remove(SORTED[0]), "in only one of LEAF's train and test"),
    ],
)
def test_malformed_files_are_refused_by_name(
    tmp_path: Path, split: str, change: object, message: str
) -> None:
    write_leaf(tmp_path, TEXTS)
    _edit(tmp_path, split, change)
    with pytest.raises(DataConfigError, match=message):
        load_dataset("shakespeare", str(tmp_path))


def test_a_user_in_two_files_is_refused(tmp_path: Path) -> None:
    write_leaf(tmp_path, TEXTS)
    first = next((tmp_path / SUBDIR / "train").glob("*.json"))
    (first.parent / "copy.json").write_text(first.read_text())
    with pytest.raises(DataConfigError, match="appears in two files"):
        load_dataset("shakespeare", str(tmp_path))


def test_a_user_without_test_samples_gets_an_empty_test_split(tmp_path: Path) -> None:
    write_leaf(tmp_path, TEXTS)
    _edit(tmp_path, "test", lambda d: _user(d).update(x=[], y=[]))
    client = load_client_data(_spec(tmp_path), 0, tmp_path / "cache")
    assert len(client.test) == 0 and client.test.x.shape == (0, 80)
    assert len(client.train) == int(0.8 * len(windows(TEXTS[SORTED[0]])[0]))
