"""ADEPT-DGM theory (paper Sec. 4): the personalised Gaussian diffusion's
closed-form ADEPT optimum against ADEPT's gradient iterations and Theorem 4.4, and the
reverse SDE's output moments (Lemma 4.1), including the printed-drift typo."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate

from models.diffusion_gaussian import (
    closed_form,
    elbo_weight,
    gradient_descent,
    mse_prediction,
    reverse_sde,
)

D, N, M = 10, 10, 500
C = 1.0 / N  # data_std^2 / n with data_std = 1


def _task(population_var: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """m clients, theta_i ~ N(2, population_var I), n samples x_ij ~ N(theta_i, I)."""
    rng = np.random.default_rng(0)
    theta = 2.0 + np.sqrt(population_var) * rng.standard_normal((M, D))
    x = theta[:, None, :] + rng.standard_normal((M, N, D))
    return theta, x, x.mean(axis=1)


def _mse(estimate: np.ndarray, truth: np.ndarray) -> float:
    return float(((estimate - truth) ** 2).mean())


def test_elbo_weight_is_the_time_integral_of_the_score_weights() -> None:
    for horizon in (1.0, 20.0):
        value, _ = integrate.quad(lambda t: 1.0 / (0.7**2 + t) ** 2, 0.0, horizon)
        assert elbo_weight(0.7, horizon) == pytest.approx(value, rel=1e-10)
    assert elbo_weight(0.7) == pytest.approx(1 / 0.49)


@pytest.mark.parametrize(
    ("population_var", "xi"), [(1.0, 1e-6), (0.5, 1e-6), (0.2, 1.5), (0.02, 1.5)]
)
def test_gradient_descent_reaches_the_closed_form_and_beats_local(
    population_var: float, xi: float
) -> None:
    theta, x, xbar = _task(population_var)
    alpha = elbo_weight(1.0)
    exact = closed_form(xbar, N, alpha, xi)
    np.testing.assert_allclose(exact.mu, x.reshape(-1, D).mean(axis=0), atol=1e-9)
    gd = gradient_descent(xbar, N, alpha, xi, 2500, 0.05, 0.01, 0.002, 2.0)
    assert gd.sigma2 == pytest.approx(exact.sigma2, abs=1e-3)
    # the iterations land on theta_i = w xbar_i + (1 - w) mu of Lemma 4.2
    np.testing.assert_allclose(gd.theta, exact.theta, atol=1e-3)
    local, adept = _mse(xbar, theta), _mse(exact.theta, theta)
    assert _mse(gd.theta, theta) == pytest.approx(adept, abs=1e-3)
    assert local == pytest.approx(C, rel=0.03)
    assert adept < local - 0.005
    assert adept == pytest.approx(mse_prediction(exact.sigma2, C, population_var), abs=3e-3)


def test_corollary_xi_helps_everywhere_and_sigma_grows_with_heterogeneity() -> None:
    xi = 3 * D * 1.0 / (2 * N)  # Corollary 4.5: 1.5
    sigmas = []
    for population_var in (0.02, 0.2, 0.5, 1.0):
        theta, _, xbar = _task(population_var)
        exact = closed_form(xbar, N, elbo_weight(1.0), xi)
        assert exact.sigma2 >= 2 * xi / D
        assert _mse(exact.theta, theta) < _mse(xbar, theta)
        sigmas.append(exact.sigma2)
    assert sigmas == sorted(sigmas) and sigmas[0] < sigmas[-1] - 0.5


def test_tiny_xi_collapses_to_pooling_and_loses_when_theorem_condition_fails() -> None:
    """sigma*^2 = 0.2 lies in (c, 3c): no non-zero root, the MAP pools fully and is worse
    than local training (the condition sigma^2 > sigma*^2/2 - c/2 of Theorem 4.4 fails)."""
    theta, _, xbar = _task(0.2)
    exact = closed_form(xbar, N, elbo_weight(1.0), 1e-6)
    assert exact.sigma2 < 1e-3 and exact.w < 0.02
    assert _mse(exact.theta, theta) > 1.8 * _mse(xbar, theta)
    # below c the same collapse helps (full pooling of near-identical clients)
    theta, _, xbar = _task(0.02)
    assert _mse(closed_form(xbar, N, elbo_weight(1.0), 1e-6).theta, theta) < 0.5 * C


def test_reverse_sde_moments_follow_lemma_4_1_and_catch_the_printed_drift() -> None:
    theta_hat, horizon = np.array([3.0, -1.0]), 20.0
    out = reverse_sde(theta_hat, 1.0, horizon, 10_000, 2000, np.random.default_rng(0))
    np.testing.assert_allclose(out.mean(axis=0), theta_hat * horizon / (1 + horizon), atol=0.03)
    np.testing.assert_allclose(out.var(axis=0), [1.0, 1.0], atol=0.05)
    typo = reverse_sde(theta_hat, 1.0, horizon, 2_000, 2000, np.random.default_rng(1), True)
    assert typo.var(axis=0).min() > 4.0
