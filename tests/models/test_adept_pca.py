"""ADEPT-PCA math: finite-difference gradients, the sigma dynamics and its lower bound, and a
small version of the paper's synthetic experiment (App. F.1)."""

from __future__ import annotations

import numpy as np
import pytest

from federated_data.synthetic_pca import generate_pca_synthetic, true_subspaces
from models.adept_ae import average
from models.adept_pca import (
    PCAHyper,
    client_round,
    data_gradient,
    error_ratio,
    grad_u,
    grad_v,
    objective,
    server_update,
    sigma_gradient,
)
from models.stiefel import distance_sq, random_point, retract, tangent_projection, top_eigenvectors

D, R, N, NOISE, SIGMA = 8, 3, 5, 0.5, 0.7
HP = PCAHyper(eta1=0.0, eta2=0.0, eta3=0.0, xi=1e-3, noise=NOISE, d_theta=D * R)


def _problem() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((N, D))
    return random_point(D, R, rng), random_point(D, R, rng), x.T @ x / N


def _numeric_gradient(f, a: np.ndarray, h: float = 1e-6) -> np.ndarray:  # type: ignore[no-untyped-def]
    out = np.zeros_like(a)
    for idx in np.ndindex(a.shape):
        e = np.zeros_like(a)
        e[idx] = h
        out[idx] = (f(a + e) - f(a - e)) / (2 * h)
    return out


def test_gradients_match_central_differences() -> None:
    u, v, s = _problem()
    num_u = _numeric_gradient(lambda a: objective(a, v, SIGMA, s, N, HP), u)
    np.testing.assert_allclose(grad_u(u, v, SIGMA, s, N, HP), num_u, atol=1e-6)
    num_v = _numeric_gradient(lambda a: objective(u, a, SIGMA, s, N, HP), v)
    np.testing.assert_allclose(grad_v(u, v, SIGMA), num_v, atol=1e-6)
    h = 1e-6
    num_sigma = (objective(u, v, SIGMA + h, s, N, HP) - objective(u, v, SIGMA - h, s, N, HP)) / (
        2 * h
    )
    assert abs(sigma_gradient(distance_sq(v, u), SIGMA, HP.xi, HP.d_theta) - num_sigma) < 1e-6


def test_paper_factor_fails_the_difference_check_by_a_factor_two() -> None:
    u, v, s = _problem()
    num = _numeric_gradient(lambda a: objective(a, v, 1e6, s, N, HP), u)
    half = data_gradient(u, s, N, NOISE, data_factor=0.5)
    assert not np.allclose(half, num, atol=1e-4)
    np.testing.assert_allclose(2 * half, num, atol=1e-5)


def test_riemannian_v_gradient_is_the_derivative_along_the_retraction() -> None:
    u, v, s = _problem()
    h_dir = tangent_projection(v, np.random.default_rng(4).standard_normal((D, R)))
    eps = 1e-6
    f = lambda t: objective(u, retract(v, t * h_dir), SIGMA, s, N, HP)  # noqa: E731
    along = (f(eps) - f(-eps)) / (2 * eps)
    expected = np.sum(tangent_projection(v, grad_v(u, v, SIGMA)) * h_dir)
    assert abs(along - expected) < 1e-6


def test_riemannian_data_gradient_on_the_manifold_has_the_closed_form() -> None:
    u, _, s = _problem()
    kappa = N / (NOISE**2 * (1 + NOISE**2))
    expected = -kappa * (np.eye(D) - u @ u.T) @ s @ u
    np.testing.assert_allclose(
        tangent_projection(u, data_gradient(u, s, N, NOISE)), expected, atol=1e-10
    )


def _sigma_only(sigma: float, dist2: list[float], xi: float, d_theta: float, eta3: float,
                steps: int) -> list[float]:  # fmt: skip
    trace = []
    for _ in range(steps):
        sigma = float(
            np.mean([sigma - eta3 * sigma_gradient(d2, sigma, xi, d_theta) for d2 in dist2])
        )
        trace.append(sigma)
    return trace


def test_sigma_converges_to_its_closed_form_minimiser() -> None:
    dist2 = [0.3, 1.1, 2.0]
    trace = _sigma_only(1.0, dist2, xi=1e-2, d_theta=10, eta3=1e-3, steps=20_000)
    assert abs(trace[-1] ** 2 - (2e-2 + np.mean(dist2)) / 10) < 1e-6


def test_sigma_lower_bound_holds_only_under_the_step_size_condition() -> None:
    xi, d_theta, omega = 1e-2, 10.0, 0.5
    eta3 = (1 - omega) * 2 * xi / d_theta**2
    bound = omega * np.sqrt(2 * xi / d_theta)
    for start in (1.0, bound):
        trace = _sigma_only(start, [0.0], xi, d_theta, eta3, 20_000)
        assert min(trace) >= bound - 1e-12
        assert abs(trace[-1] - np.sqrt(2 * xi / d_theta)) < 1e-4
    assert min(_sigma_only(1.0, [0.0], xi, d_theta, 10 * eta3, 20_000)) < 0


def test_server_mean_of_sigma_is_one_gradient_step_and_unweighted() -> None:
    dist2, sigma, eta3 = [0.1, 0.5, 2.0], 0.8, 1e-3
    replies = [
        {"sigma": np.array(sigma - eta3 * sigma_gradient(d, sigma, 1e-3, 24))} for d in dist2
    ]
    expected = sigma - eta3 * np.mean([sigma_gradient(d, sigma, 1e-3, 24) for d in dist2])
    assert abs(float(average(replies)["sigma"]) - expected) < 1e-15


def test_server_update_retracts_the_mean_step() -> None:
    rng = np.random.default_rng(5)
    v = random_point(D, R, rng)
    steps = [0.1 * tangent_projection(v, rng.standard_normal((D, R))) for _ in range(3)]
    out = server_update(v, [v + s for s in steps])
    np.testing.assert_allclose(out.T @ out, np.eye(R), atol=1e-12)
    np.testing.assert_allclose(out, retract(v, np.mean(steps, axis=0)), atol=1e-12)


def test_synthetic_generator_scatters_subspaces_with_heterogeneity() -> None:
    clients, center, personal = generate_pca_synthetic(
        {"dimension": 30, "rank": 4, "num_clients": 5, "heterogeneity": 0.1, "seed": 2}
    )
    again_center, again = true_subspaces(
        {"dimension": 30, "rank": 4, "num_clients": 5, "heterogeneity": 0.1, "seed": 2}
    )
    np.testing.assert_array_equal(personal, again)
    np.testing.assert_array_equal(center, again_center)
    assert (
        len(clients) == 5 and clients[0][0].shape == (20, 30) and clients[0][1].dtype == np.float32
    )
    assert all(np.allclose(u.T @ u, np.eye(4)) for u in personal)
    assert 0 < distance_sq(center, personal[0]) < 1
    _, _, same = generate_pca_synthetic({"dimension": 30, "rank": 4, "heterogeneity": 0.0})
    assert max(distance_sq(same[0], u) for u in same) < 1e-20


def _ratios(het: float, rounds: int = 200) -> tuple[float, float, float, float]:
    """(local, global, ADEPT) mean error ratios and the learned sigma on a small synthetic task."""
    d, r, m, n, noise = 40, 5, 8, 10, 0.2
    clients, _, truth = generate_pca_synthetic({"dimension": d, "rank": r, "num_clients": m,
        "train_size": n, "noise": noise, "heterogeneity": het, "seed": 0})  # fmt: skip
    covs = [x.astype(np.float64).T @ x.astype(np.float64) / n for x, _ in clients]
    kappa = n / (noise**2 * (1 + noise**2))
    hp = PCAHyper(eta1=0.2 / kappa, eta2=0.5, eta3=1e-8, xi=1e-6, noise=noise, d_theta=d * r)
    us = [top_eigenvectors(s, r) for s in covs]
    local = float(np.mean([error_ratio(u, t, noise) for u, t in zip(us, truth, strict=True)]))
    pooled = top_eigenvectors(np.mean(covs, axis=0), r)
    global_ = float(np.mean([error_ratio(pooled, t, noise) for t in truth]))
    v, sigma = random_point(d, r, np.random.default_rng(7)), 0.03
    for _ in range(rounds):
        out = [client_round(u, v, sigma, s, n, hp) for u, s in zip(us, covs, strict=True)]
        us = [o[0] for o in out]
        v = server_update(v, [o[1] for o in out])
        sigma = float(np.mean([o[2] for o in out]))
    adept = float(np.mean([error_ratio(u, t, noise) for u, t in zip(us, truth, strict=True)]))
    return local, global_, adept, sigma


@pytest.mark.slow
def test_adept_pca_beats_local_and_global_at_moderate_heterogeneity() -> None:
    rows = {het: _ratios(het) for het in (0.0, 0.1, 0.2)}
    locals_ = [rows[h][0] for h in rows]
    assert max(locals_) - min(locals_) < 0.05  # local ignores heterogeneity
    assert rows[0.0][1] < rows[0.1][1] < rows[0.2][1]  # global suffers from it
    assert rows[0.0][3] < rows[0.1][3] < rows[0.2][3]  # learned sigma grows with it
    local, global_, adept, _ = rows[0.1]
    assert adept < min(local, global_) - 0.2
    assert all(rows[h][2] < rows[h][0] for h in rows)  # never worse than local


def test_a_sigma_step_below_zero_is_an_error_naming_the_step_size() -> None:
    u, v, s = _problem()
    hp = PCAHyper(eta1=0.0, eta2=0.0, eta3=1.0, xi=1e-3, noise=NOISE, d_theta=D * R)
    with pytest.raises(ValueError, match=r"adept.lr-sigma \(1\) is too large for d_theta = 24"):
        client_round(u, v, SIGMA, s, N, hp)
    ok = PCAHyper(eta1=0.0, eta2=0.0, eta3=1e-3, xi=1e-3, noise=NOISE, d_theta=D * R)
    assert client_round(u, v, SIGMA, s, N, ok)[2] > 0
