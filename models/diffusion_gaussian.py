"""The theory of ADEPT-DGM (paper Sec. 4): personalised Gaussian diffusion
with a variance-exploding forward process x_t = x_0 + w_t and the linear score family
phi(x; theta, s) = -(x - theta)/(data_std^2 + s). Closed forms for the ADEPT optimum, the same
optimum found by ADEPT's gradient iterations, and the reverse SDE. NumPy, float64; these are
the oracles that the diffusion code and the paper's formulas are checked against."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def elbo_weight(data_std: float, horizon: float = np.inf) -> float:
    """alpha = 1/data_std^2 - 1/(data_std^2 + T): maximising the ELBO of the linear family is
    minimising (alpha/2) ||theta - x||^2 per sample."""
    return 1.0 / data_std**2 - (0.0 if np.isinf(horizon) else 1.0 / (data_std**2 + horizon))


@dataclass(frozen=True)
class GaussianADEPT:
    mu: np.ndarray  # (d,)
    theta: np.ndarray  # (m, d)
    sigma2: float
    w: float


def closed_form(
    xbar: np.ndarray, n: int, alpha: float, xi: float, iters: int = 100_000
) -> GaussianADEPT:
    """Lemma 4.2/4.3: mu = mean_i xbar_i, theta_i = w xbar_i + (1 - w) mu with
    w = v/(v + c), c = 1/(n alpha), and v = sigma^2 the fixed point of
    v = 2 xi/d + s^2 w^2 (s^2 = sum_i ||mu - xbar_i||^2/(m d)) iterated from a large v (the
    stable, non-trivial root when it exists)."""
    m, d = xbar.shape
    mu = xbar.mean(axis=0)
    s2 = float(((xbar - mu) ** 2).sum() / (m * d))
    c = 1.0 / (n * alpha)
    v = 10.0 * max(s2, c, 1.0)
    for _ in range(iters):
        new = 2 * xi / d + s2 * (v / (v + c)) ** 2
        if abs(new - v) < 1e-15:
            break
        v = new
    w = v / (v + c)
    return GaussianADEPT(mu, w * xbar + (1 - w) * mu, v, w)


def gradient_descent(
    xbar: np.ndarray, n: int, alpha: float, xi: float, rounds: int,
    eta_theta: float, eta_mu: float, eta_sigma: float, sigma_init: float,
    sigma_min: float = 1e-3,
) -> GaussianADEPT:  # fmt: skip
    """ADEPT (Algorithm 3's structure, tau = 1, full batch) on the reduced objective
    F_i = (alpha n/2) ||theta_i - xbar_i||^2 + (2 xi + ||theta_i - mu||^2)/(2 sigma^2)
    + d log sigma: each client steps theta_i, then its copies of mu and sigma with the new
    theta_i; the server takes the plain means. Starts from theta_i = xbar_i, mu = mean."""
    d = xbar.shape[1]
    theta, mu, sigma = xbar.copy(), xbar.mean(axis=0), float(sigma_init)
    for _ in range(rounds):
        theta = theta - eta_theta * (alpha * n * (theta - xbar) + (theta - mu) / sigma**2)
        dist = ((theta - mu) ** 2).sum(axis=1)
        mu = np.mean(mu - eta_mu * (mu - theta) / sigma**2, axis=0)
        sigma_i = sigma - eta_sigma * (d / sigma - (2 * xi + dist) / sigma**3)
        sigma = max(float(np.mean(sigma_i)), sigma_min)
    w = float("nan")
    return GaussianADEPT(mu, theta, sigma**2, w)


def mse_prediction(sigma2: float, c: float, population_var: float) -> float:
    """Theorem 4.4, per coordinate: (c/(v + c))^2 sigma*^2 + (v/(v + c))^2 c (v = sigma_hat^2,
    c = data_std^2/n); local training has error c."""
    return (c / (sigma2 + c)) ** 2 * population_var + (sigma2 / (sigma2 + c)) ** 2 * c


def reverse_sde(
    theta_hat: np.ndarray, data_std: float, horizon: float, paths: int, steps: int,
    rng: np.random.Generator, printed_drift: bool = False,
) -> np.ndarray:  # fmt: skip
    """Euler-Maruyama on the reverse VE SDE with the learned linear score,
    dx = -(x - theta_hat)/(data_std^2 + T - t) dt + dw, from x ~ N(0, (data_std^2 + T) I).
    Lemma 4.1: the output is N(theta_hat T/(data_std^2 + T), data_std^2 I). `printed_drift`
    uses the paper's eq. (11)/(12) denominator data_std^2 + t (a typo)."""
    d = len(theta_hat)
    x = rng.standard_normal((paths, d)) * np.sqrt(data_std**2 + horizon)
    dt = horizon / steps
    for k in range(steps):
        t = k * dt
        denom = data_std**2 + (t if printed_drift else horizon - t)
        x = x - (x - theta_hat) / denom * dt + np.sqrt(dt) * rng.standard_normal((paths, d))
    return x
