"""KID: the unbiased polynomial-kernel MMD against a direct double sum, its subset averaging,
and the in-project feature network."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.kid import features, kid, mmd2_unbiased, train_feature_net


def _direct(x: np.ndarray, y: np.ndarray) -> float:
    d = x.shape[1]

    def k(a: np.ndarray, b: np.ndarray) -> float:
        return float((a @ b / d + 1) ** 3)

    m, n = len(x), len(y)
    xx = sum(k(x[i], x[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    yy = sum(k(y[i], y[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    xy = sum(k(x[i], y[j]) for i in range(m) for j in range(n)) / (m * n)
    return xx + yy - 2 * xy


def test_mmd_matches_the_direct_double_sum() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(7, 3)), rng.normal(0.5, 1.0, size=(9, 3))
    assert mmd2_unbiased(x, y) == pytest.approx(_direct(x, y), rel=1e-12)
    # one subset holding all samples is the full estimate (the order does not matter)
    full = kid(x, y[:7], subsets=1, subset_size=50)[0]
    assert full == pytest.approx(_direct(x, y[:7]), rel=1e-12)
    with pytest.raises(ValueError):
        mmd2_unbiased(x[:1], y)


def test_kid_is_near_zero_for_one_distribution_and_grows_with_a_shift() -> None:
    rng = np.random.default_rng(1)
    real = rng.normal(size=(400, 8))
    same, _ = kid(real, rng.normal(size=(400, 8)), subsets=20, subset_size=100, rng=rng)
    shifted, _ = kid(real, rng.normal(0.5, 1.0, size=(400, 8)), subsets=20, rng=rng)
    far, _ = kid(real, rng.normal(1.0, 1.0, size=(400, 8)), subsets=20, rng=rng)
    assert abs(same) < 0.02 < shifted < far


def test_feature_net_separates_two_image_classes() -> None:
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 0.2, size=(64, 1, 8, 8)).astype(np.float32)
    y = np.arange(64) % 2
    x[y == 1, :, :4] += 0.8
    net = train_feature_net(x, y, 2, epochs=3, seed=0)
    f = features(net, torch.from_numpy(x))
    assert f.shape == (64, 512)
    between, _ = kid(f[y == 0], f[y == 1], subsets=5, subset_size=32)
    within, _ = kid(f[y == 0][:16], f[y == 0][16:], subsets=5, subset_size=16)
    assert between > 10 * abs(within)
