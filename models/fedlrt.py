"""FeDLRT's matrix operations (Schotthöfer & Laiu, 2024), independent of any network or framework.

A low-rank weight is W = U diag(s) V^T with orthonormal U (m×r), V (n×r). One aggregation round:
the server augments each basis with the averaged basis gradient (a QR; only the r new columns
travel), clients train the augmented coefficients S̃ (2r×2r) with the bases frozen, optionally
corrected by the difference between the global and their own coefficient gradient, and the
server averages S̃ and truncates it by SVD. Everything here is float64 NumPy; the server keeps
its factors in float64 and sends float32.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

VAR_COR = ("none", "simplified", "full")


@dataclass(frozen=True)
class Factors:
    """W = U diag(s) V^T; s positive and descending after every round."""

    U: np.ndarray
    s: np.ndarray
    V: np.ndarray

    @property
    def rank(self) -> int:
        return len(self.s)

    def dense(self) -> np.ndarray:
        """The full matrix, for tests and small reference problems only."""
        return (self.U * self.s) @ self.V.T


def factorize(W: np.ndarray, rank: int) -> Factors:
    """The top-`rank` SVD triplets of W: orthonormal U, V and a full-rank S, the starting point
    the paper's Algorithm 1 asks for."""
    U, s, Vt = np.linalg.svd(np.asarray(W, dtype=np.float64), full_matrices=False)
    return Factors(U[:, :rank].copy(), s[:rank].copy(), Vt[:rank].T.copy())


def max_rank(m: int, n: int, cap: int = 0) -> int:
    """Largest rank an m×n layer may keep: floor(min/2) by default, so that augmentation can
    always double it; `cap` > 0 replaces it, up to full rank min(m, n) (above min/2 the
    augmentation adds only the columns that fit, `augmentation_width`; at full rank none, and
    the coefficient step is the dense step in rotated coordinates)."""
    if cap > 0:
        return max(1, min(cap, m, n))
    return max(1, min(m, n) // 2)


def augmentation_width(rank: int, m: int, n: int) -> int:
    """New basis columns a rank-`rank` layer gets: r, or fewer when the space is nearly full
    (the same on both sides, so that S̃ stays square)."""
    return max(0, min(rank, m - rank, n - rank))


def augment_basis(B: np.ndarray, G: np.ndarray, width: int | None = None) -> np.ndarray:
    """B̄: `width` orthonormal columns orthogonal to B spanning (as far as possible) G's range.

    The new columns are the trailing columns of a Householder QR of [B | G'], G' being G with
    B's component removed twice; the client keeps its own B and appends B̄, so a sign flip of
    QR's leading columns never reaches it (the paper's Lemma 1)."""
    r = B.shape[1]
    width = G.shape[1] if width is None else width
    if width == 0:
        return np.zeros((B.shape[0], 0))
    proj = G - B @ (B.T @ G)
    proj = proj - B @ (B.T @ proj)
    Q, _ = np.linalg.qr(np.concatenate([B, proj], axis=1))
    return Q[:, r : r + width]


def augmented_bases(
    factors: Mapping[str, Factors], grads: Mapping[str, np.ndarray]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Ū, V̄ of every factorized layer: its bases augmented by the range of the mean gradients
    `grads[<layer>.U]`, `grads[<layer>.V]` (the paper's Alg. 1, basis augmentation)."""
    bars = {}
    for name, fac in factors.items():
        width = augmentation_width(fac.rank, fac.U.shape[0], fac.V.shape[0])
        bars[name] = (
            augment_basis(fac.U, grads[f"{name}.U"], width),
            augment_basis(fac.V, grads[f"{name}.V"], width),
        )
    return bars


def coefficient_start(
    factors: Mapping[str, Factors],
    bars: Mapping[str, tuple[np.ndarray, np.ndarray]],
    dense: Mapping[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """Where every client's coefficient training starts: S̃ = [[diag(s), 0], [0, 0]] of each
    layer's s as the clients get it (float32), and the dense parameters."""
    start = {
        f"{name}.S": padded_coefficients(
            fac.s.astype(np.float32).astype(np.float64), bars[name][0].shape[1]
        )
        for name, fac in factors.items()
    }
    start.update(dense)
    return start


def padded_coefficients(s: np.ndarray, width: int) -> np.ndarray:
    """S̃ = [[diag(s), 0], [0, 0]]: the augmented coefficients that represent the same W."""
    r = len(s)
    out = np.zeros((r + width, r + width))
    out[np.arange(r), np.arange(r)] = s
    return out


def threshold(sigma: np.ndarray, tau: float, relative: bool = True) -> float:
    """ϑ: τ‖σ‖ (relative, ‖σ‖ = ‖S̃*‖_F) or τ (absolute)."""
    return tau * float(np.linalg.norm(sigma)) if relative else tau


def truncation_rank(
    sigma: np.ndarray,
    tau: float,
    relative: bool = True,
    r_min: int = 1,
    r_max: int | None = None,
) -> int:
    """Smallest j whose discarded tail ||σ_{j+1:}|| is strictly below ϑ (ϑ = τ||σ|| relative,
    ϑ = τ absolute), clipped to [r_min, r_max]. ϑ = 0 keeps everything."""
    k = len(sigma)
    theta = threshold(sigma, tau, relative)
    if theta <= 0:
        j = k
    else:
        tails = np.sqrt(np.cumsum((sigma**2)[::-1]))[::-1]  # tails[j] = ||σ_{j:}||, 0-based
        below = np.nonzero(tails < theta)[0]
        j = int(below[0]) if len(below) else k
    upper = k if r_max is None else min(k, r_max)
    return int(min(max(j, r_min), upper))


@dataclass(frozen=True)
class Truncation:
    factors: Factors
    discarded: float  # ||σ_{r1+1:}||, the Frobenius error of the truncation
    threshold: float  # ϑ


def truncate(
    U_aug: np.ndarray,
    S_aug: np.ndarray,
    V_aug: np.ndarray,
    tau: float,
    relative: bool = True,
    r_min: int = 1,
    r_max: int | None = None,
) -> Truncation:
    """New factors from the averaged coefficients: SVD of S̃*, keep r1 values, rotate the
    augmented bases (U = Ũ P_r1 stays orthonormal)."""
    P, sigma, Qt = np.linalg.svd(S_aug)
    r1 = truncation_rank(sigma, tau, relative, r_min, r_max)
    theta = threshold(sigma, tau, relative)
    factors = Factors(U_aug @ P[:, :r1], sigma[:r1].copy(), V_aug @ Qt[:r1].T)
    return Truncation(factors, float(np.linalg.norm(sigma[r1:])), theta)


def correction(
    var_cor: str, global_grad: np.ndarray | None, client_grad: np.ndarray | None, size: int
) -> np.ndarray:
    """The client's constant correction V_c (spec eq. 8, 9), as a size×size matrix.

    full: G_S̃ − G_S̃,c (both size×size); simplified: [[G_S − G_S,c, 0], [0, 0]] from the r×r
    non-augmented block; none: zero."""
    out = np.zeros((size, size))
    if var_cor == "none":
        return out
    if global_grad is None or client_grad is None:
        raise ValueError(f"variance correction {var_cor!r} needs both gradients")
    diff = np.asarray(global_grad, np.float64) - np.asarray(client_grad, np.float64)
    if var_cor == "full":
        if diff.shape != (size, size):
            raise ValueError(f"full correction: gradient {diff.shape}, expected {(size, size)}")
        return diff
    if var_cor == "simplified":
        r = diff.shape[0]
        if diff.shape != (r, r) or r > size:
            raise ValueError(f"simplified correction: gradient {diff.shape} for size {size}")
        out[:r, :r] = diff
        return out
    raise ValueError(f"unknown variance correction {var_cor!r}; known: {', '.join(VAR_COR)}")


def corrected_descent(
    x0: np.ndarray,
    grad: Callable[[np.ndarray], np.ndarray],
    lr: float,
    steps: int,
    correction_term: np.ndarray | None = None,
) -> np.ndarray:
    """x ← x − λ(∇f(x) + V) for `steps` steps: the client update of FedAvg (V = 0), FedLin and
    FeDLRT's coefficient training, in one place."""
    x = np.array(x0, dtype=np.float64, copy=True)
    for _ in range(steps):
        g = grad(x)
        if correction_term is not None:
            g = g + correction_term
        x = x - lr * g
    return x


def orthonormality_error(B: np.ndarray) -> float:
    """max |B^T B − I|."""
    return float(np.abs(B.T @ B - np.eye(B.shape[1])).max()) if B.size else 0.0


def round_floats(m: int, n: int, r: int, var_cor: str) -> dict[str, int]:
    """Floats one client receives and sends per round for one m×n layer of rank r when clients
    keep U, V, s between phases (s sent as a vector)."""
    k = r + augmentation_width(r, m, n)
    w = k - r
    down = (m + n) * r + r + (m + n) * w
    up = (m + n) * r + k * k
    if var_cor == "simplified":
        down += r * r
        up += r * r
    elif var_cor == "full":
        down += k * k
        up += k * k
    return {"down": down, "up": up}
