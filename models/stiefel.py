"""The Stiefel manifold St(d, r) = {U in R^(d x r): U^T U = I_r} (NumPy, float64).

ADEPT-PCA keeps its principal subspaces on this manifold: gradients are projected onto the
tangent space and steps are mapped back by the polar retraction. The retraction is computed
from an SVD (the orthogonal polar factor): the closed form (U + Xi)(I + Xi^T Xi)^(-1/2) is equal
only for exactly tangent Xi, and its rounding errors compound until U leaves the manifold.
"""

from __future__ import annotations

import numpy as np


def tangent_projection(v: np.ndarray, z: np.ndarray) -> np.ndarray:
    """P_T(V, Z) = Z - V (V^T Z + Z^T V) / 2: the orthogonal projection of Z onto the tangent
    space at V."""
    vz = v.T @ z
    out: np.ndarray = z - 0.5 * v @ (vz + vz.T)
    return out


def distance_sq(v: np.ndarray, u: np.ndarray) -> float:
    """d^2(V, U) = ||P_T(V, U)||_F^2, the squared distance ADEPT-PCA's prior uses."""
    return float(np.sum(tangent_projection(v, u) ** 2))


def polar_factor(a: np.ndarray) -> np.ndarray:
    """The orthogonal polar factor A B^T of A = A S B^T (thin SVD): the point of St(d, r)
    nearest to A in Frobenius norm."""
    left, _, right_t = np.linalg.svd(a, full_matrices=False)
    out: np.ndarray = left @ right_t
    return out


def retract(u: np.ndarray, xi: np.ndarray) -> np.ndarray:
    """Polar retraction R(U, Xi) = polar factor of U + Xi."""
    return polar_factor(u + xi)


def random_point(d: int, r: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly distributed point of St(d, r) (Q of a Gaussian matrix, signs fixed)."""
    q, upper = np.linalg.qr(rng.standard_normal((d, r)))
    signs = np.sign(np.diag(upper))
    signs[signs == 0] = 1.0
    out: np.ndarray = q * signs
    return out


def top_eigenvectors(s: np.ndarray, r: int) -> np.ndarray:
    """The r leading eigenvectors of a symmetric matrix, as a point of St(d, r)."""
    _, vectors = np.linalg.eigh(s)
    out: np.ndarray = vectors[:, ::-1][:, :r].copy()
    return out
