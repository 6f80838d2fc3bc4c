"""FeDLRT's least-squares test problems (after the paper's Section 4.1) and a framework-free run
of FedAvg, FedLin and FeDLRT on them, built from the same operations the Flower strategy uses
(models.fedlrt).

A client holds features a_i = p(x_i), b_i = p(y_i) (orthonormal Legendre polynomials of degree
< n) and targets f_i; its loss is L_c(W) = 1/(2N_c) Σ_i (a_i^T W b_i − f_i)². Gradients of the
factorized model are computed from the projected features A U, B V: W is formed only by the
dense baselines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.polynomial import legendre

from models.fedlrt import (
    Factors,
    augment_basis,
    augmentation_width,
    corrected_descent,
    correction,
    factorize,
    orthonormality_error,
    padded_coefficients,
    truncate,
)


def legendre_features(x: np.ndarray, n: int) -> np.ndarray:
    """[√(2k+1) P_k(x)]_{k<n}: orthonormal for the uniform measure on [−1, 1]."""
    return legendre.legvander(x, n - 1) * np.sqrt(2 * np.arange(n) + 1)


@dataclass(frozen=True)
class LeastSquaresClient:
    A: np.ndarray  # N×n, rows p(x_i)
    B: np.ndarray  # N×n, rows p(y_i)
    f: np.ndarray  # N targets

    def __len__(self) -> int:
        return len(self.f)

    def residual(self, W: np.ndarray) -> np.ndarray:
        return np.einsum("ij,ij->i", self.A @ W, self.B) - self.f

    def loss(self, W: np.ndarray) -> float:
        return 0.5 * float(np.mean(self.residual(W) ** 2))

    def grad(self, W: np.ndarray) -> np.ndarray:
        """∇_W L_c = A^T diag(res) B / N."""
        return self.A.T @ (self.residual(W)[:, None] * self.B) / len(self)

    def coefficient_grad(self, U: np.ndarray, V: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        """S ↦ ∇_S L_c(U S V^T) = (AU)^T diag(res) (BV) / N, never forming U S V^T."""
        P, Q = self.A @ U, self.B @ V

        def grad(S: np.ndarray) -> np.ndarray:
            res = np.einsum("ij,ij->i", P @ S, Q) - self.f
            return P.T @ (res[:, None] * Q) / len(self)

        return grad

    def factor_grads(self, F: Factors) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(∇_U, ∇_V, ∇_S) of L_c(U diag(s) V^T): G V S^T, G^T U S, U^T G V with G = ∇_W L_c."""
        AU, BV = self.A @ F.U, self.B @ F.V
        res = np.einsum("ij,ij->i", AU * F.s, BV) - self.f
        GV = self.A.T @ (res[:, None] * BV) / len(self)  # G V
        GtU = self.B.T @ (res[:, None] * AU) / len(self)  # G^T U
        return GV * F.s, GtU * F.s, F.U.T @ GV


@dataclass(frozen=True)
class GramClient(LeastSquaresClient):
    """The same client with its gradients from the normal equations: with K the N×n² matrix of
    rows a_i ⊗ b_i (so that a_i^T W b_i = K_i · vec W, vec row-major), H = K^T K / N and
    h = K^T f / N, ∇_W L_c = mat(H vec W − h). Costs n⁴ per gradient instead of N n²: faster
    when N > n², as in the paper's homogeneous test with few clients. The loss is still
    computed from the data (no cancellation near the optimum)."""

    H: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    h: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @classmethod
    def of(cls, client: LeastSquaresClient) -> GramClient:
        n = client.A.shape[1]
        K = np.einsum("ij,ik->ijk", client.A, client.B).reshape(len(client), n * n)
        N = len(client)
        return cls(client.A, client.B, client.f, K.T @ K / N, K.T @ client.f / N)

    def grad(self, W: np.ndarray) -> np.ndarray:
        return (self.H @ W.ravel() - self.h).reshape(W.shape)

    def coefficient_grad(self, U: np.ndarray, V: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        """S ↦ U^T ∇_W L_c(U S V^T) V."""

        def grad(S: np.ndarray) -> np.ndarray:
            return U.T @ self.grad(U @ S @ V.T) @ V

        return grad

    def factor_grads(self, F: Factors) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        G = self.grad(F.dense())
        GV, GtU = G @ F.V, G.T @ F.U
        return GV * F.s, GtU * F.s, F.U.T @ GV


def global_loss(clients: Sequence[LeastSquaresClient], W: np.ndarray) -> float:
    """L = Σ_c (N_c/N) L_c: the global objective (1/C Σ L_c for equal client sizes)."""
    weights = client_weights(clients)
    return float(sum(w * c.loss(W) for w, c in zip(weights, clients, strict=True)))


def client_weights(clients: Sequence[LeastSquaresClient]) -> np.ndarray:
    sizes = np.array([len(c) for c in clients], dtype=np.float64)
    return sizes / sizes.sum()


def random_low_rank(n: int, r: int, rng: np.random.Generator) -> np.ndarray:
    """U_r V_r^T with orthonormal U_r, V_r from QR of Gaussians (all singular values 1)."""
    U, _ = np.linalg.qr(rng.standard_normal((n, r)))
    V, _ = np.linalg.qr(rng.standard_normal((n, r)))
    return U @ V.T


def _client(x: np.ndarray, y: np.ndarray, W: np.ndarray) -> LeastSquaresClient:
    n = W.shape[0]
    A, B = legendre_features(x, n), legendre_features(y, n)
    return LeastSquaresClient(A, B, np.einsum("ij,ij->i", A @ W, B))


def homogeneous_problem(
    n: int = 20, rank: int = 4, points: int = 10_000, clients: int = 4, seed: int = 0
) -> tuple[list[LeastSquaresClient], np.ndarray]:
    """H1, the paper's homogeneous test (Section 4.1): a rank-`rank` target, points uniform on
    [−1, 1]², split iid and equally."""
    rng = np.random.default_rng(seed)
    target = random_low_rank(n, rank, rng)
    xy = rng.uniform(-1, 1, size=(points, 2))
    parts = np.array_split(rng.permutation(points), clients)
    return [_client(xy[p, 0], xy[p, 1], target) for p in parts], target


BETA_SHAPES = ((1.0, 3.0), (3.0, 1.0), (2.0, 2.0), (1.0, 1.0))


def heterogeneous_problem(
    n: int = 10, rank: int = 2, points_per_client: int = 2500, seed: int = 0
) -> tuple[list[LeastSquaresClient], np.ndarray]:
    """H2, a heterogeneous test with client drift (in place of the paper's, Section 4.1, whose
    clients share their data): non-iid x ~ 2 Beta(a_c, b_c) − 1, client targets W* + D_c with
    the last D_c chosen so that Σ_c H_c vec(D_c) = 0, which makes W* (rank `rank`) the exact
    global minimiser while every client's own minimiser differs."""
    rng = np.random.default_rng(seed)
    target = random_low_rank(n, rank, rng)
    feats = []
    for a, b in BETA_SHAPES:
        x = 2 * rng.beta(a, b, size=points_per_client) - 1
        y = rng.uniform(-1, 1, size=points_per_client)
        feats.append((legendre_features(x, n), legendre_features(y, n)))
    hessians = []
    for A, B in feats:
        K = np.einsum("ij,ik->ijk", A, B).reshape(len(A), n * n)  # rows kron(a_i, b_i)
        hessians.append(K.T @ K / len(A))
    shifts = [rng.standard_normal((n, n)) / np.sqrt(n) for _ in feats[:-1]]
    rhs = sum(H @ D.ravel() for H, D in zip(hessians, shifts, strict=False))
    shifts.append(-np.linalg.solve(hessians[-1], rhs).reshape(n, n))
    out = []
    for (A, B), D in zip(feats, shifts, strict=True):
        W = target + D
        out.append(LeastSquaresClient(A, B, np.einsum("ij,ij->i", A @ W, B)))
    return out, target


def initial_factors(n: int, rank: int, seed: int) -> Factors:
    """Top-`rank` SVD of W0 = randn(n, n)/√n."""
    rng = np.random.default_rng(10_000 + seed)
    return factorize(rng.standard_normal((n, n)) / np.sqrt(n), rank)


@dataclass
class History:
    loss: list[float] = field(default_factory=list)  # global loss after each round
    rank: list[int] = field(default_factory=list)
    orthonormality: list[float] = field(default_factory=list)  # max |U^T U − I|, |V^T V − I|
    truncation: list[tuple[float, float]] = field(default_factory=list)  # (discarded, ϑ)
    distance: list[float] = field(default_factory=list)  # ‖W − target‖_F, when a target is given
    W: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    factors: Factors | None = None


def run_dense(
    clients: Sequence[LeastSquaresClient],
    W0: np.ndarray,
    lr: float,
    steps: int,
    rounds: int,
    corrected: bool = False,
    target: np.ndarray | None = None,
) -> History:
    """FedAvg (corrected=False, the paper's Algorithm 3) or FedLin (corrected=True, Algorithm 4)
    on W; with `target`, ‖W − target‖_F after each round too."""
    weights = client_weights(clients)
    W = np.array(W0, dtype=np.float64)
    hist = History()
    for _ in range(rounds):
        grads = [c.grad(W) for c in clients] if corrected else None
        mean = sum(w * g for w, g in zip(weights, grads, strict=True)) if grads else None
        local = []
        for i, c in enumerate(clients):
            term = mean - grads[i] if grads is not None and mean is not None else None
            local.append(corrected_descent(W, c.grad, lr, steps, term))
        W = sum(w * x for w, x in zip(weights, local, strict=True))
        hist.loss.append(global_loss(clients, W))
        hist.rank.append(min(W.shape))
        if target is not None:
            hist.distance.append(float(np.linalg.norm(W - target)))
    hist.W = W
    return hist


def fedlrt_round(
    clients: Sequence[LeastSquaresClient],
    F: Factors,
    var_cor: str,
    lr: float,
    steps: int,
    tau: float,
    relative: bool = True,
    r_min: int = 1,
    r_max: int | None = None,
) -> tuple[Factors, tuple[float, float]]:
    """One FeDLRT aggregation round (the paper's Algorithms 1 and 5) with all clients taking part;
    returns the new factors and (truncation error, ϑ)."""
    weights = client_weights(clients)
    m, n = F.U.shape[0], F.V.shape[0]
    width = augmentation_width(F.rank, m, n)
    # phase A: basis gradients at the current point, averaged
    grads = [c.factor_grads(F) for c in clients]
    G_U = sum(w * g[0] for w, g in zip(weights, grads, strict=True))
    G_V = sum(w * g[1] for w, g in zip(weights, grads, strict=True))
    U_aug = np.concatenate([F.U, augment_basis(F.U, G_U, width)], axis=1)
    V_aug = np.concatenate([F.V, augment_basis(F.V, G_V, width)], axis=1)
    S0 = padded_coefficients(F.s, width)
    k = S0.shape[0]
    coef = [c.coefficient_grad(U_aug, V_aug) for c in clients]
    # phase B (full) or the phase-A G_S (simplified): the client gradients the correction uses
    if var_cor == "full":
        own = [g(S0) for g in coef]
    elif var_cor == "simplified":
        own = [g[2] for g in grads]
    else:
        own = [np.zeros((k, k)) for _ in clients]
    mean = sum(w * g for w, g in zip(weights, own, strict=True))
    # phase C: coefficient training, then averaging and truncation on the server
    trained = [
        corrected_descent(S0, g, lr, steps, correction(var_cor, mean, o, k))
        for g, o in zip(coef, own, strict=True)
    ]
    S_mean = sum(w * S for w, S in zip(weights, trained, strict=True))
    cut = truncate(U_aug, S_mean, V_aug, tau, relative, r_min, r_max)
    return cut.factors, (cut.discarded, cut.threshold)


def run_fedlrt(
    clients: Sequence[LeastSquaresClient],
    F0: Factors,
    var_cor: str,
    lr: float,
    steps: int,
    rounds: int,
    tau: float,
    relative: bool = True,
    r_min: int = 1,
    r_max: int | None = None,
    target: np.ndarray | None = None,
) -> History:
    """`rounds` FeDLRT rounds from F0; with `target`, ‖W − target‖_F after each round too."""
    hist = History()
    F = F0
    for _ in range(rounds):
        F, cut = fedlrt_round(clients, F, var_cor, lr, steps, tau, relative, r_min, r_max)
        W = F.dense()
        hist.loss.append(global_loss(clients, W))
        if target is not None:
            hist.distance.append(float(np.linalg.norm(W - target)))
        hist.rank.append(F.rank)
        hist.orthonormality.append(max(orthonormality_error(F.U), orthonormality_error(F.V)))
        hist.truncation.append(cut)
    hist.factors, hist.W = F, F.dense()
    return hist
