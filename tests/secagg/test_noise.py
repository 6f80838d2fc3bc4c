"""secagg.noise: Skellam noise of the stated variance, closed under sums (n shares of V / n are
Sk(V)), and a tail bound that holds."""

from __future__ import annotations

import numpy as np
import pytest

from secagg import noise


@pytest.mark.parametrize("variance", [0.5, 40.0, 1e8])
def test_the_noise_has_its_variance_and_no_bias(variance: float) -> None:
    x = noise.skellam(variance, 400_000, np.random.default_rng(3))
    assert x.dtype == np.int64
    assert abs(float(x.mean())) < 6 * np.sqrt(variance / x.size)
    assert float(x.var()) == pytest.approx(variance, rel=0.02)


def test_shares_of_the_noise_add_up_to_the_whole() -> None:
    rng = np.random.default_rng(4)
    n, variance = 7, 700.0
    total = np.sum([noise.skellam(variance / n, 300_000, rng) for _ in range(n)], axis=0)
    whole = noise.skellam(variance, 300_000, rng)
    assert float(total.var()) == pytest.approx(variance, rel=0.02)
    # the same distribution: quantiles agree within sampling error
    for p in (0.01, 0.1, 0.5, 0.9, 0.99):
        assert abs(np.quantile(total, p) - np.quantile(whole, p)) <= 2


def test_the_tail_bound_holds() -> None:
    variance = 50.0
    x = noise.skellam(variance, 2_000_000, np.random.default_rng(5))
    t = noise.tail(variance, 1e-4)
    assert float(np.mean(np.abs(x) >= t)) <= 1e-4
    assert noise.tail(0.0) == 0.0
    assert noise.tail(1e12) > 8 * np.sqrt(1e12)  # 2^-60 is far in the tail


def test_no_noise_and_bad_variances() -> None:
    assert not noise.skellam(0.0, 5, np.random.default_rng(0)).any()
    with pytest.raises(ValueError, match="finite"):
        noise.skellam(-1.0, 5, np.random.default_rng(0))
