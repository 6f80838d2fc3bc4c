"""ADEPT-PCA (Ozkara et al., AISTATS 2025, Algorithm 2): personal principal subspaces U_i and a
global subspace V, all on St(d, r), tied by a Gaussian prior of learned width sigma (NumPy,
float64; see models.stiefel).

Client i's objective (probabilistic PCA with noise std `noise` = sigma_eps):

    F_i = (n/2) (logdet W_i + tr(W_i^-1 S_i)) + (2 xi + ||P_T(V, U_i)||^2) / (2 sigma^2)
          + d_theta log sigma,            W_i = U_i U_i^T + sigma_eps^2 I

The paper prints the data gradient with a factor n/2; the exact derivative has n
(`data_factor` = 1.0; 0.5 mirrors the paper, which pools more).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from models.stiefel import distance_sq, retract, tangent_projection


@dataclass(frozen=True)
class PCAHyper:
    eta1: float  # personal subspace U_i (Riemannian gradient step)
    eta2: float  # the client's copy of V
    eta3: float  # sigma
    xi: float  # hyper-prior: keeps sigma^2 >= 2 xi / d_theta at stationary points
    noise: float  # sigma_eps of the probabilistic PCA likelihood
    d_theta: float  # dimension in the sigma prior (default d * r, U_i's entries)
    data_factor: float = 1.0


def _w_inverse_times(u: np.ndarray, noise: float, a: np.ndarray) -> np.ndarray:
    """W^-1 A by Woodbury, W^-1 = (I - U (sigma_eps^2 I_r + U^T U)^-1 U^T) / sigma_eps^2:
    r x r solves instead of a d x d inverse (exact for any U, on the manifold or not)."""
    inner = noise**2 * np.eye(u.shape[1]) + u.T @ u
    out: np.ndarray = (a - u @ np.linalg.solve(inner, u.T @ a)) / noise**2
    return out


def data_term(u: np.ndarray, s: np.ndarray, n: int, noise: float) -> float:
    """(n/2)(logdet W + tr(W^-1 S)): the negative log-likelihood up to a constant."""
    w = u @ u.T + noise**2 * np.eye(u.shape[0])
    _, logdet = np.linalg.slogdet(w)
    return 0.5 * n * (logdet + float(np.trace(np.linalg.solve(w, s))))


def objective(
    u: np.ndarray, v: np.ndarray, sigma: float, s: np.ndarray, n: int, hp: PCAHyper
) -> float:
    """F_i(U, V, sigma) with the exact data term."""
    prior = (2 * hp.xi + distance_sq(v, u)) / (2 * sigma**2) + hp.d_theta * np.log(sigma)
    return data_term(u, s, n, hp.noise) + float(prior)


def data_gradient(
    u: np.ndarray, s: np.ndarray, n: int, noise: float, data_factor: float = 1.0
) -> np.ndarray:
    """Euclidean gradient of the data term: n (W^-1 U - W^-1 S W^-1 U) (times data_factor)."""
    w_inv_u = _w_inverse_times(u, noise, u)
    out: np.ndarray = data_factor * n * (w_inv_u - _w_inverse_times(u, noise, s @ w_inv_u))
    return out


def grad_u(
    u: np.ndarray, v: np.ndarray, sigma: float, s: np.ndarray, n: int, hp: PCAHyper
) -> np.ndarray:
    """Euclidean gradient of F_i in U."""
    return data_gradient(u, s, n, hp.noise, hp.data_factor) + tangent_projection(v, u) / sigma**2


def grad_v(u: np.ndarray, v: np.ndarray, sigma: float) -> np.ndarray:
    """Euclidean gradient of F_i in V (exact where V^T V = I)."""
    ut_v = u.T @ v
    out: np.ndarray = -tangent_projection(v, u) @ (ut_v + ut_v.T) / (2 * sigma**2)
    return out


def sigma_gradient(distance2: float | np.ndarray, sigma: float, xi: float, d_theta: float) -> float:
    """dF_i/dsigma = d_theta/sigma - (2 xi + d^2(V, U_i)) / sigma^3."""
    return float(d_theta / sigma - (2 * xi + distance2) / sigma**3)


def client_round(
    u: np.ndarray, v: np.ndarray, sigma: float, s: np.ndarray, n: int, hp: PCAHyper
) -> tuple[np.ndarray, np.ndarray, float]:
    """One ADEPT-PCA round on a client: (new U_i, V_i, sigma_i) to keep / send.

    Order matters: sigma uses the old U_i; U_i uses the received V and sigma; V_i uses the new
    U_i. V_i is not retracted: the server retracts the mean step."""
    sigma_i = sigma - hp.eta3 * sigma_gradient(distance_sq(v, u), sigma, hp.xi, hp.d_theta)
    if not sigma_i > 0:
        raise ValueError(
            f"the sigma step went from {sigma:.4g} to {sigma_i:.4g}: adept.lr-sigma ({hp.eta3:g}) "
            f"is too large for d_theta = {hp.d_theta:g}; keep it below sigma^2 / d_theta "
            f"= {sigma**2 / hp.d_theta:.3g}"
        )
    u_new = retract(u, -hp.eta1 * tangent_projection(u, grad_u(u, v, sigma, s, n, hp)))
    v_i = v - hp.eta2 * tangent_projection(v, grad_v(u_new, v, sigma))
    return u_new, v_i, sigma_i


def data_step(u: np.ndarray, s: np.ndarray, n: int, hp: PCAHyper) -> np.ndarray:
    """One Riemannian gradient step on the data term alone, without retraction (local
    training retracts it; the global baseline's server retracts the clients' mean)."""
    g = data_gradient(u, s, n, hp.noise, hp.data_factor)
    out: np.ndarray = u - hp.eta1 * tangent_projection(u, g)
    return out


def server_update(v: np.ndarray, replies: Sequence[np.ndarray]) -> np.ndarray:
    """V <- R(V, mean_i V_i - V): the unweighted mean step is tangent at V, the retraction keeps
    V on St(d, r). (sigma is averaged like ADEPT-AE's: models.adept_ae.average.)"""
    return server_step(v, np.mean(np.stack(replies), axis=0))


def server_step(v: np.ndarray, combined: np.ndarray) -> np.ndarray:
    """V <- R(V, combined - V) for a combination of the clients' V_i (the paper's Alg. 2,
    server step: the mean, `server_update`; or a Byzantine-robust rule of the V_i around V,
    strategies.adept), retracted by the polar retraction (models.stiefel.retract), so the new V
    is on St(d, r) whatever the rule returned."""
    return retract(v, combined - v)


def reconstruction_error(u: np.ndarray, x: np.ndarray) -> float:
    """Mean over rows of ||x - U U^T x||^2."""
    residual = x - (x @ u) @ u.T
    return float(np.mean(np.sum(residual**2, axis=1)))


def population_error(u: np.ndarray, u_true: np.ndarray, noise: float) -> float:
    """E||x - U U^T x||^2 for x = U* z + eps, z ~ N(0, I_r), eps ~ N(0, sigma_eps^2 I_d)."""
    d, r = u.shape
    return float(r - np.sum((u_true.T @ u) ** 2) + (d - r) * noise**2)


def error_ratio(u: np.ndarray, u_true: np.ndarray, noise: float) -> float:
    """Population reconstruction error of U over that of the true subspace U* (>= 1)."""
    return population_error(u, u_true, noise) / population_error(u_true, u_true, noise)
