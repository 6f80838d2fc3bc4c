"""LEAF's federated JSON layout, shared by its datasets (Shakespeare, FEMNIST).

LEAF's preprocessing (github.com/TalwalkarLab/leaf, `./preprocess.sh ... -t sample`) writes
`<data_dir>/<name>/data/train/*.json` and `.../test/*.json`, each file holding
`{"users": [...], "user_data": {user: {"x": [...], "y": [...]}}}`: one user is one client, and
`-t sample` splits every user's samples into its train and test parts. `read_leaf` reads both
splits with a dataset's own encoder of one user's entry and returns every user's train then test
samples as one array, with the user index (users sorted by name) and a test mark per sample.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from federated_data.errors import DataConfigError, DatasetNotFoundError

UserEncoder = Callable[[Any, str], tuple[np.ndarray, np.ndarray]]
"""`encode(entry, where)`: one user's `{"x": [...], "y": [...]}` as (x array, int64 labels);
raises DataConfigError naming `where` for a malformed entry."""


def read_leaf(
    name: str,
    data_dir: str | None,
    download: bool,
    encode: UserEncoder,
    how_to_get: Callable[[str | Path], str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, keys, test_mask) of dataset `name` read from `data_dir/name/data/{train,test}`:
    every user's train samples then every user's test samples, users in name order."""
    if data_dir is None or not str(data_dir):
        raise DatasetNotFoundError(
            f"dataset {name!r} needs its files but no data directory was given (setting "
            f"data-dir); {how_to_get('DATA_DIR')}"
        )
    if download:
        raise DataConfigError(
            f"dataset {name!r} cannot be downloaded (download=true); {how_to_get(data_dir)}"
        )
    root = Path(data_dir) / name / "data"
    splits = {}
    for split in ("train", "test"):
        files = sorted((root / split).glob("*.json"))
        if not files:
            raise DatasetNotFoundError(
                f"dataset {name!r}: no {split} files in {root / split}; {how_to_get(data_dir)}"
            )
        splits[split] = _read_split(name, files, encode)
    train, test = splits["train"], splits["test"]
    if set(train) != set(test):
        only = sorted(set(train) ^ set(test))
        raise DataConfigError(
            f"dataset {name!r}: {len(only)} users are in only one of LEAF's train and test "
            f"splits (e.g. {only[0]!r}); one client per user needs both (LEAF's '-t sample' split)"
        )
    users = sorted(train)
    blocks = [(split[u], k, split is test) for split in (train, test) for k, u in enumerate(users)]
    x = np.concatenate([xy[0] for xy, _, _ in blocks])
    y = np.concatenate([xy[1] for xy, _, _ in blocks])
    keys = np.concatenate([np.full(len(xy[1]), k, dtype=np.int64) for xy, k, _ in blocks])
    test_mask = np.concatenate([np.full(len(xy[1]), is_test) for xy, _, is_test in blocks])
    return x, y, keys, test_mask


def _read_split(
    name: str, files: list[Path], encode: UserEncoder
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """user -> (x, y) over the files of one split."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for path in files:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            user_data = raw["user_data"]
            users = raw["users"]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise DataConfigError(
                f"dataset {name!r}: {path} is not a LEAF JSON file with 'users' and "
                f"'user_data' ({type(exc).__name__}: {exc})"
            ) from None
        if not isinstance(users, list) or not isinstance(user_data, dict):
            raise DataConfigError(
                f"dataset {name!r}: {path}: 'users' must be a list and 'user_data' an object"
            )
        for user in users:
            where = f"{path}, user {user!r}"
            if user in out:
                raise DataConfigError(f"dataset {name!r}: {where} appears in two files")
            if user not in user_data:
                raise DataConfigError(f"dataset {name!r}: {where} has no user_data entry")
            out[user] = encode(user_data[user], where)
    return out


def xy_lists(name: str, entry: Any, where: str) -> tuple[list[Any], list[Any]]:
    """A user's `x` and `y` lists, of equal length (DataConfigError otherwise)."""
    try:
        xs, ys = entry["x"], entry["y"]
    except (KeyError, TypeError):
        raise DataConfigError(f"dataset {name!r}: {where} needs 'x' and 'y' lists") from None
    if not isinstance(xs, list) or not isinstance(ys, list) or len(xs) != len(ys):
        raise DataConfigError(
            f"dataset {name!r}: {where}: 'x' and 'y' must be lists of equal length"
        )
    return xs, ys
