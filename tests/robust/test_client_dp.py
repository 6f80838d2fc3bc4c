"""robust.client_dp against Flower 1.39's DP helpers (`compute_stdv`,
`compute_adaptive_noise_params`, `compute_clip_model_update`), direct NumPy computations and
what the mechanism must guarantee: one client moves the release by at most clip / m."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.supercore.differential_privacy import (
    compute_adaptive_noise_params,
    compute_clip_model_update,
    compute_stdv,
)

from robust import client_dp
from strategies.aggregate import RunningMean


def _model(rng: np.random.Generator, scale: float = 1.0) -> dict[str, np.ndarray]:
    return {
        "w": (scale * rng.standard_normal((4, 5))).astype(np.float32),
        "b": (scale * rng.standard_normal(5)).astype(np.float32),
    }


@pytest.mark.parametrize(("z", "clip", "m"), [(1.0, 1.0, 10), (0.7, 2.5, 37), (3.0, 0.1, 1000)])
def test_the_noise_std_is_flowers(z: float, clip: float, m: int) -> None:
    assert client_dp.noise_std(z, clip, m) == pytest.approx(compute_stdv(z, clip, m), rel=1e-12)


def test_the_released_noise_has_that_std_on_every_coordinate() -> None:
    d = 200_000
    ref = {"w": np.zeros(d, np.float32)}
    total = client_dp.NoisySum(ref, clip=2.0)
    out = total.result(denominator=8, noise_multiplier=1.5, rng=np.random.default_rng(0))["w"]
    want = 1.5 * 2.0 / 8
    # the sample std of 200,000 normals is within 1 % of sigma with overwhelming probability
    assert abs(float(out.std()) / want - 1) < 0.01
    assert abs(float(out.mean())) < 5 * want / math.sqrt(d)


def test_clipping_is_flowers_flat_clip() -> None:
    rng = np.random.default_rng(1)
    ref, new = _model(rng), _model(rng, scale=3.0)
    ours = client_dp.NoisySum(ref, clip=0.5)
    ours.add(new)
    got = ours.result(1, 0.0, rng)
    flower = [new["w"].copy(), new["b"].copy()]
    compute_clip_model_update(flower, [ref["w"], ref["b"]], 0.5)
    np.testing.assert_allclose(got["w"], flower[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["b"], flower[1], rtol=1e-5, atol=1e-6)
    assert ours.unclipped == 0


def test_without_noise_or_clipping_the_mean_is_the_unit_weight_running_mean_bit_for_bit() -> None:
    """noise 0, a bound no update reaches and m = the replies: exactly the mean FedAvg's fold
    computes with equal weights (here also with equal example counts, as FedAvg weighs)."""
    rng = np.random.default_rng(2)
    ref = _model(rng)
    models = [_model(rng) for _ in range(7)]
    total = client_dp.NoisySum(ref, clip=1e12)
    unit, counted = RunningMean(), RunningMean()
    for m in models:
        total.add(m)
        unit.add(m, 1.0)
        counted.add(m, 53)
    got = total.result(denominator=7, noise_multiplier=0.0, rng=rng)
    for key in ref:
        assert got[key].dtype == ref[key].dtype
        np.testing.assert_array_equal(got[key], unit.result()[key])
        np.testing.assert_array_equal(got[key], counted.result()[key])


def test_one_client_moves_the_release_by_at_most_clip_over_m() -> None:
    """Neighbouring federations (one client's update replaced by anything, or removed): with
    the same noise draw the releases differ by at most C / m in l2 norm, whatever the update."""
    rng = np.random.default_rng(3)
    ref = _model(rng)
    honest = [_model(rng) for _ in range(9)]
    clip, m = 0.8, 10.0

    def release(extra: dict[str, np.ndarray] | None) -> np.ndarray:
        total = client_dp.NoisySum(ref, clip)
        for h in honest:
            total.add(h)
        if extra is not None:
            total.add(extra)
        out = total.result(m, 1.3, np.random.default_rng(99))
        return np.concatenate([out[k].astype(np.float64).ravel() for k in ref])

    base = release(None)
    for scale in (1.0, 1e3, 1e9):
        huge = _model(np.random.default_rng(4), scale=scale)
        moved = float(np.linalg.norm(release(huge) - base))
        assert moved <= clip / m * (1 + 1e-5) + 1e-6, (scale, moved)
    # unclipped, the huge update would have moved the mean by ~1e9 / 10
    assert float(np.linalg.norm(release(_model(np.random.default_rng(4), 1e9)) - base)) > 0.07


def test_an_update_given_as_a_row_is_clipped_like_a_model() -> None:
    rng = np.random.default_rng(5)
    ref, new = _model(rng), _model(rng, scale=4.0)
    keys = list(ref)
    as_model, as_row = client_dp.NoisySum(ref, 1.0), client_dp.NoisySum(ref, 1.0)
    as_model.add(new)
    row = np.concatenate([(new[k].astype(np.float64) - ref[k]).ravel() for k in keys])
    as_row.add_update(row)
    a, b = as_model.result(3, 0.0, rng), as_row.result(3, 0.0, rng)
    for k in keys:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("z", "m"), [(1.0, 100), (0.5, 30), (2.0, 200)])
def test_the_adaptive_update_noise_is_flowers(z: float, m: int) -> None:
    sigma_b = client_dp.count_std(m)
    ours = client_dp.update_noise_multiplier(z, sigma_b)
    flower_sigma_b, flower_z = compute_adaptive_noise_params(z, m, None)
    assert sigma_b == pytest.approx(flower_sigma_b)
    assert ours == pytest.approx(flower_z, rel=1e-12)
    # the two releases together spend what one release at z spends (Andrew et al., Thm. 1)
    assert ours**-2 + (2 * sigma_b) ** -2 == pytest.approx(z**-2)


def test_adaptive_clipping_refuses_a_count_noise_too_small_for_z() -> None:
    with pytest.raises(ValueError, match="count's noise above 1"):
        client_dp.update_noise_multiplier(2.0, 1.0)


def test_the_bound_follows_the_target_quantile() -> None:
    """Without noise, the geometric update drives the bound to the target quantile of fixed
    update norms (Andrew et al., Sec. 2): here to the median of norms 1 ... 9, i.e. 5."""
    norms = np.arange(1.0, 10.0)
    clip = 0.1
    for _ in range(400):
        share = float((norms <= clip).mean())
        clip = client_dp.next_clip(clip, share, target_quantile=0.5, lr=0.2)
    assert 4.0 <= clip <= 6.0
    assert client_dp.next_clip(2.0, 1.0, 0.5, 0.2) == pytest.approx(2.0 * math.exp(-0.1))


def test_a_client_noises_its_own_update_around_its_clip() -> None:
    rng = np.random.default_rng(6)
    update = rng.standard_normal(100_000) * 10
    sent = client_dp.privatize_update(update, clip=3.0, noise_multiplier=0.5,
                                      rng=np.random.default_rng(7))  # fmt: skip
    clipped = update * 3.0 / np.linalg.norm(update)
    noise = sent - clipped
    assert abs(float(noise.std()) / 1.5 - 1) < 0.01
    # noise-free: clipped only
    np.testing.assert_allclose(
        client_dp.privatize_update(update, 3.0, 0.0, rng), clipped, rtol=1e-12
    )
