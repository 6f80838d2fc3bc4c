"""FEMNIST as LEAF's preprocessing writes it (never downloaded): NIST SD19 handwritten digits
and letters grouped by writer, one writer per client.

LEAF (github.com/TalwalkarLab/leaf, data/femnist: `./preprocess.sh ... -t sample`) writes
`femnist/data/{train,test}/*.json`, each user (writer) holding `"x"`: 28x28 grayscale images
flattened to 784 values in [0, 1] (LEAF divides the pixels by 255) and `"y"`: class ids 0-61
(digits 0-9, upper-case letters 10-35, lower-case 36-61). Images are stored back as uint8
(value x 255, rounded) and normalised with MNIST's mean and std, as FedEM's code does
(Marfoq et al., NeurIPS 2021, App. I.1: FEMNIST's CNN on 1x28x28 inputs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from federated_data.arrays import ArrayDataset
from federated_data.errors import DataConfigError
from federated_data.leaf import read_leaf, xy_lists

SIDE = 28
NUM_CLASSES = 62
SUBDIR = Path("femnist") / "data"
"""Where under the data directory LEAF's output lies (LEAF's own layout below its data/)."""


def how_to_get(data_dir: str | Path) -> str:
    return (
        f"expected LEAF's FEMNIST JSON files in {Path(data_dir) / SUBDIR / 'train'}/*.json and "
        f"{Path(data_dir) / SUBDIR / 'test'}/*.json; produce them with LEAF's FEMNIST "
        f"preprocessing (github.com/TalwalkarLab/leaf, data/femnist: ./preprocess.sh -s niid "
        f"--sf 0.15 -k 3 -t sample --tf 0.8) and pass LEAF's data/ directory as data-dir (this "
        f"dataset is never downloaded)"
    )


def load_leaf_femnist(
    data_dir: str | None, download: bool, mean: tuple[float, ...], std: tuple[float, ...]
) -> tuple[ArrayDataset, np.ndarray, np.ndarray]:
    """Every writer's train then test images (uint8, N x 1 x 28 x 28) with the writer index
    (writers sorted by name) and a test mark of every image."""
    x, y, keys, test_mask = read_leaf("femnist", data_dir, download, _encode_user, how_to_get)
    return ArrayDataset(x, y, NUM_CLASSES, mean, std), keys, test_mask


def _encode_user(entry: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = xy_lists("femnist", entry, where)
    if not xs:
        return np.zeros((0, 1, SIDE, SIDE), np.uint8), np.zeros(0, np.int64)
    try:
        pixels = np.asarray(xs, dtype=np.float64).reshape(len(xs), -1)
        labels = np.asarray(ys)
    except (TypeError, ValueError):
        raise DataConfigError(
            f"dataset 'femnist': {where}: 'x' must be lists of {SIDE * SIDE} numbers and 'y' "
            f"integers"
        ) from None
    if pixels.shape[1] != SIDE * SIDE:
        raise DataConfigError(
            f"dataset 'femnist': {where}: an image has {pixels.shape[1]} values, not "
            f"{SIDE * SIDE} (28x28)"
        )
    if not np.isfinite(pixels).all() or pixels.min() < 0 or pixels.max() > 1:
        raise DataConfigError(f"dataset 'femnist': {where}: pixel values must lie in [0, 1]")
    if (
        labels.ndim != 1
        or labels.dtype.kind not in "iu"
        or int(labels.min()) < 0
        or int(labels.max()) >= NUM_CLASSES
    ):
        raise DataConfigError(
            f"dataset 'femnist': {where}: labels must be integers in [0, {NUM_CLASSES})"
        )
    images = np.rint(pixels * 255.0).astype(np.uint8).reshape(len(xs), 1, SIDE, SIDE)
    return images, labels.astype(np.int64).reshape(len(xs))
