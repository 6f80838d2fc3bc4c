"""Stiefel primitives: projection properties, retraction on the manifold, stability."""

from __future__ import annotations

import numpy as np

from models.stiefel import polar_factor, random_point, retract, tangent_projection


def _setup() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (
        random_point(100, 20, rng),
        random_point(100, 20, rng),
        rng.standard_normal((100, 20)),
        rng.standard_normal((100, 20)),
    )


def test_tangent_projection_is_an_orthogonal_projection() -> None:
    v, _, z1, z2 = _setup()
    p1 = tangent_projection(v, z1)
    np.testing.assert_allclose(tangent_projection(v, p1), p1, atol=1e-12)
    assert abs(np.sum(p1 * z2) - np.sum(z1 * tangent_projection(v, z2))) < 1e-10
    np.testing.assert_allclose(tangent_projection(v, v), 0.0, atol=1e-12)
    skew = v.T @ p1
    np.testing.assert_allclose(skew + skew.T, 0.0, atol=1e-12)
    np.testing.assert_allclose(
        tangent_projection(v, 2 * z1 - z2), 2 * p1 - tangent_projection(v, z2), atol=1e-12
    )


def test_retraction_stays_on_the_manifold_and_matches_the_closed_form() -> None:
    _, u, z, _ = _setup()
    xi = tangent_projection(u, z)
    out = retract(u, xi)
    np.testing.assert_allclose(out.T @ out, np.eye(20), atol=1e-10)
    np.testing.assert_allclose(retract(u, np.zeros_like(u)), u, atol=1e-12)
    values, vectors = np.linalg.eigh(np.eye(20) + xi.T @ xi)
    closed = (u + xi) @ (vectors @ np.diag(values**-0.5) @ vectors.T)
    np.testing.assert_allclose(out, closed, atol=1e-10)
    assert np.allclose(polar_factor(3 * u), u)


def test_thousand_retractions_keep_orthonormality() -> None:
    rng = np.random.default_rng(1)
    u = random_point(100, 20, rng)
    for _ in range(1000):
        g = rng.standard_normal((100, 20))
        g *= 50 / np.linalg.norm(g)
        u = retract(u, -0.01 * tangent_projection(u, g))
    assert np.linalg.norm(u.T @ u - np.eye(20)) < 1e-10
