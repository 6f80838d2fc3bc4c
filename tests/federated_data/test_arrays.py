"""ArrayDataset: compact storage, normalisation on demand, and rejection of malformed arrays."""

from __future__ import annotations

import numpy as np
import pytest

from federated_data import ArrayDataset, DataConfigError


def _images() -> ArrayDataset:
    x = np.arange(2 * 3 * 2 * 2, dtype=np.uint8).reshape(2, 3, 2, 2) * 10
    return ArrayDataset(x, np.array([0, 2]), 3, (0.1, 0.2, 0.3), (0.5, 0.25, 2.0))


def test_features_normalise_uint8_images_per_channel() -> None:
    data = _images()
    out = data.features()
    assert out.dtype == np.float32 and out.shape == (2, 3, 2, 2)
    for c, (m, s) in enumerate(zip(data.mean, data.std, strict=True)):
        expected = (data.x[:, c].astype(np.float64) / 255.0 - m) / s
        np.testing.assert_allclose(out[:, c], expected, rtol=1e-5, atol=1e-6)
    assert data.x.dtype == np.uint8  # stored form untouched


def test_float_features_without_statistics_are_only_cast() -> None:
    x = np.array([[1.5, -2.0], [3.0, 4.0]], dtype=np.float32)
    data = ArrayDataset(x, np.array([1, 0]), 2)
    np.testing.assert_array_equal(data.features(), x)
    assert data.input_shape == (2,)
    scaled = ArrayDataset(x, np.array([1, 0]), 2, (1.0, 2.0), (2.0, 4.0))
    np.testing.assert_allclose(scaled.features(), (x - [1.0, 2.0]) / [2.0, 4.0])


def test_subset_len_and_shape() -> None:
    data = _images()
    assert len(data) == 2 and data.input_shape == (3, 2, 2)
    sub = data.subset([1])
    assert len(sub) == 1 and sub.y.tolist() == [2]
    np.testing.assert_array_equal(sub.x[0], data.x[1])
    assert (sub.mean, sub.std, sub.num_classes) == (data.mean, data.std, data.num_classes)
    assert data.label_counts().tolist() == [1, 0, 1]


@pytest.mark.parametrize(
    ("x", "y", "classes", "mean", "std", "message"),
    [
        (np.zeros((2, 4), np.float64), np.zeros(2, np.int64), 2, (), (), "uint8 or float32"),
        (np.zeros((2, 4), np.float32), np.zeros(3, np.int64), 2, (), (), "2 examples but y has 3"),
        (np.zeros((2, 4), np.float32), np.zeros(2, np.int32), 2, (), (), "int64"),
        (np.zeros((2, 4), np.float32), np.array([0, 2]), 2, (), (), r"\[0, 2\)"),
        (np.zeros((2, 4), np.float32), np.zeros(2, np.int64), 2, (0.0,), (), "mean has 1"),
        (
            np.zeros((2, 3, 1, 1), np.uint8),
            np.zeros(2, np.int64),
            2,
            (0.0, 0.0),
            (1.0, 1.0),
            "one per channel",
        ),
        (np.zeros((2, 1), np.float32), np.zeros(2, np.int64), 2, (0.0,), (0.0,), "std"),
        (np.zeros(2, np.float32), np.zeros(2, np.int64), 2, (), (), "shape"),
        (np.zeros((2, 3, 1), np.int16), np.zeros(2, np.int64), 2, (), (), r"shape \(N, T\)"),
        (np.array([[0, 2], [1, 1]], np.int16), np.zeros(2, np.int64), 2, (), (), "token ids"),
        (np.zeros((2, 3), np.int16), np.zeros(2, np.int64), 2, (0.0,), (1.0,), "no mean/std"),
    ],
)
def test_malformed_arrays_are_rejected(
    x: np.ndarray,
    y: np.ndarray,
    classes: int,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    message: str,
) -> None:
    with pytest.raises(DataConfigError, match=message):
        ArrayDataset(x, y, classes, mean, std)


def test_token_sequences_give_int64_input_and_next_token_targets() -> None:
    x = np.array([[3, 1, 4, 1], [5, 9, 2, 6]], dtype=np.int16)
    data = ArrayDataset(x, np.array([5, 5]), 10)
    assert data.is_tokens and data.input_shape == (4,)
    features = data.features()
    assert features.dtype == np.int64
    np.testing.assert_array_equal(features, x)
    assert data.targets().tolist() == [[1, 4, 1, 5], [9, 2, 6, 5]]
    sub = data.subset([1])
    assert sub.is_tokens and sub.targets().tolist() == [[9, 2, 6, 5]]
    images = _images()
    assert not images.is_tokens and images.targets() is images.y
