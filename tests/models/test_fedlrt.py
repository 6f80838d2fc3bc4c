"""FeDLRT's matrix operations against exact identities (the paper's Lemma 1, eqs. 8-10) and
small least-squares runs (float64)."""

from __future__ import annotations

import numpy as np
import pytest

from models.fedlrt import (
    augment_basis,
    augmentation_width,
    correction,
    factorize,
    max_rank,
    orthonormality_error,
    padded_coefficients,
    round_floats,
    truncate,
    truncation_rank,
)
from models.least_squares import (
    GramClient,
    fedlrt_round,
    global_loss,
    heterogeneous_problem,
    homogeneous_problem,
    initial_factors,
    run_dense,
    run_fedlrt,
)


def _orthonormal(rng: np.random.Generator, n: int, r: int) -> np.ndarray:
    return np.linalg.qr(rng.standard_normal((n, r)))[0]


@pytest.mark.parametrize("zero_gradient", [False, True])
def test_augmentation_keeps_the_basis_and_the_model(zero_gradient: bool) -> None:
    rng = np.random.default_rng(0)
    U, V = _orthonormal(rng, 30, 4), _orthonormal(rng, 20, 4)
    s = np.array([3.0, 2.0, 1.0, 0.5])
    G_U = np.zeros((30, 4)) if zero_gradient else rng.standard_normal((30, 4))
    U_bar, V_bar = augment_basis(U, G_U), augment_basis(V, rng.standard_normal((20, 4)))
    assert U_bar.shape == (30, 4) and V_bar.shape == (20, 4)
    U_aug, V_aug = np.hstack([U, U_bar]), np.hstack([V, V_bar])
    assert orthonormality_error(U_aug) < 1e-10 and orthonormality_error(V_aug) < 1e-10
    assert np.abs(U.T @ U_bar).max() < 1e-12
    np.testing.assert_allclose(U_aug @ padded_coefficients(s, 4) @ V_aug.T, (U * s) @ V.T,
                               atol=1e-12)  # fmt: skip
    if not zero_gradient:  # the new columns span what the gradient adds to span(U)
        resid = G_U - U_aug @ (U_aug.T @ G_U)
        assert np.abs(resid).max() < 1e-10


def test_augmentation_width_fills_but_never_exceeds_the_space() -> None:
    assert augmentation_width(3, 10, 10) == 3
    assert augmentation_width(7, 10, 10) == 3
    assert augmentation_width(10, 10, 10) == 0
    assert augmentation_width(4, 20, 6) == 2
    assert max_rank(784, 200) == 100 and max_rank(784, 200, cap=30) == 30
    assert max_rank(784, 200, cap=150) == 150 and max_rank(784, 200, cap=1000) == 200


def _brute_force_rank(sigma: np.ndarray, theta: float | np.floating) -> int:
    for j in range(len(sigma) + 1):
        if np.linalg.norm(sigma[j:]) < theta:
            return j
    return len(sigma)


def test_truncation_rank_is_the_smallest_tail_below_the_threshold() -> None:
    rng = np.random.default_rng(1)
    for _ in range(50):
        sigma = np.sort(rng.exponential(size=8))[::-1]
        tau = float(rng.uniform(0.01, 0.6))
        theta = tau * np.linalg.norm(sigma)
        assert truncation_rank(sigma, tau, r_min=0) == _brute_force_rank(sigma, theta)
        assert truncation_rank(sigma, 0.3, relative=False, r_min=0) == _brute_force_rank(sigma, 0.3)
    sigma = np.array([4.0, 2.0, 1.0, 1e-3])
    assert truncation_rank(sigma, 0.0) == 4  # ϑ = 0: no truncation
    assert truncation_rank(np.zeros(4), 0.1) == 4  # S̃* = 0: ϑ = 0 as well
    assert truncation_rank(sigma, 0.99) == 1  # r_min
    assert truncation_rank(sigma, 1e-6, r_max=2) == 2  # cap
    assert truncation_rank(sigma, 5.0, relative=False, r_min=0) == 0  # ||σ|| = 4.58 < 5


def test_truncation_error_is_below_the_threshold_and_factors_stay_orthonormal() -> None:
    rng = np.random.default_rng(2)
    U_aug, V_aug = _orthonormal(rng, 40, 8), _orthonormal(rng, 25, 8)
    S = rng.standard_normal((8, 8)) @ np.diag(0.5 ** np.arange(8))
    for tau in (0.01, 0.1, 0.3):
        cut = truncate(U_aug, S, V_aug, tau)
        F = cut.factors
        error = np.linalg.norm(U_aug @ S @ V_aug.T - F.dense())
        assert error == pytest.approx(cut.discarded, rel=1e-9, abs=1e-12)
        assert error < cut.threshold == pytest.approx(tau * np.linalg.norm(S))
        # minimal: keeping one value fewer would exceed ϑ
        sigma = np.linalg.svd(S, compute_uv=False)
        assert np.linalg.norm(sigma[F.rank - 1 :]) >= cut.threshold
        assert orthonormality_error(F.U) < 1e-10 and orthonormality_error(F.V) < 1e-10
        assert (F.s > 0).all() and (np.diff(F.s) <= 0).all()


def test_corrections_are_the_gradient_differences_of_eqs_8_and_9() -> None:
    rng = np.random.default_rng(3)
    g, gc = rng.standard_normal((6, 6)), rng.standard_normal((6, 6))
    np.testing.assert_array_equal(correction("full", g, gc, 6), g - gc)
    simple = correction("simplified", g[:3, :3], gc[:3, :3], 6)
    np.testing.assert_array_equal(simple[:3, :3], (g - gc)[:3, :3])
    assert not simple[3:].any() and not simple[:, 3:].any()
    assert not correction("none", None, None, 6).any()
    with pytest.raises(ValueError, match="full correction"):
        correction("full", g[:3, :3], gc[:3, :3], 6)
    with pytest.raises(ValueError, match="unknown"):
        correction("partial", g, gc, 6)


def test_factor_gradients_are_the_chain_rule_of_the_dense_gradient() -> None:
    clients, _ = homogeneous_problem(n=6, rank=2, points=300, clients=1, seed=0)
    c = clients[0]
    F = initial_factors(6, 3, 0)
    G = c.grad(F.dense())
    G_U, G_V, G_S = c.factor_grads(F)
    S = np.diag(F.s)
    np.testing.assert_allclose(G_U, G @ F.V @ S.T, atol=1e-12)
    np.testing.assert_allclose(G_V, G.T @ F.U @ S, atol=1e-12)
    np.testing.assert_allclose(G_S, F.U.T @ G @ F.V, atol=1e-12)
    np.testing.assert_allclose(c.coefficient_grad(F.U, F.V)(S), G_S, atol=1e-12)


def test_communication_formulas_count_every_message() -> None:
    m, n, r = 30, 20, 4
    total = {v: sum(round_floats(m, n, r, v).values()) for v in ("none", "simplified", "full")}
    assert total["none"] == 3 * (m + n) * r + 4 * r * r + r
    assert total["simplified"] == 3 * (m + n) * r + 6 * r * r + r
    assert total["full"] == 3 * (m + n) * r + 12 * r * r + r


def test_full_rank_full_correction_is_fedlin_and_no_correction_is_fedavg() -> None:
    """With Ũ, Ṽ square (r0 = n/2, no cap) and no truncation the coefficient steps are
    the dense steps in rotated coordinates; simplified correction is not equivalent."""
    n = 6
    clients, _ = heterogeneous_problem(n=n, rank=2, points_per_client=300, seed=0)
    F0 = initial_factors(n, n // 2, 0)
    lr, steps, rounds = 1e-2, 10, 8
    full, none, simple = (
        run_fedlrt(clients, F0, v, lr, steps, rounds, tau=0.0, r_max=n)
        for v in ("full", "none", "simplified")
    )
    fedlin = run_dense(clients, F0.dense(), lr, steps, rounds, corrected=True)
    fedavg = run_dense(clients, F0.dense(), lr, steps, rounds, corrected=False)
    assert full.rank[-1] == n
    assert np.abs(full.W - fedlin.W).max() < 1e-10
    assert np.abs(none.W - fedavg.W).max() < 1e-10
    assert np.abs(simple.W - fedlin.W).max() > 1e-6
    assert np.abs(fedlin.W - fedavg.W).max() > 1e-6  # drift exists


def test_single_client_variants_coincide() -> None:
    """With one client every correction is zero."""
    clients, _ = heterogeneous_problem(n=6, rank=2, points_per_client=200, seed=1)
    F0 = initial_factors(6, 2, 1)
    runs = [
        run_fedlrt(clients[:1], F0, v, lr=1e-2, steps=5, rounds=4, tau=0.05)
        for v in ("none", "simplified", "full")
    ]
    for other in runs[1:]:
        assert np.abs(other.W - runs[0].W).max() < 1e-12


def test_homogeneous_least_squares_finds_the_true_rank_and_converges() -> None:
    """H1 (the paper's homogeneous test), scaled down: start above the true rank, compress to
    it, reach loss < 1e-8; every round keeps orthonormal bases and a truncation error below ϑ."""
    clients, target = homogeneous_problem(n=8, rank=2, points=2000, clients=4, seed=0)
    hist = run_fedlrt(clients, initial_factors(8, 4, 0), "simplified", lr=1e-2, steps=20,
                      rounds=100, tau=0.1)  # fmt: skip
    first = hist.rank.index(2)
    assert hist.rank[0] > 2 and min(hist.rank[first:]) == 2 and hist.rank[-1] == 2
    assert hist.loss[-1] < 1e-8
    assert np.linalg.norm(hist.W - target) < 1e-3
    assert max(hist.orthonormality) < 1e-10
    assert all(discarded < theta for discarded, theta in hist.truncation)
    assert global_loss(clients, target) < 1e-25


def test_factorize_keeps_the_leading_singular_triplets() -> None:
    rng = np.random.default_rng(4)
    W = rng.standard_normal((12, 9))
    F = factorize(W, 3)
    sigma = np.linalg.svd(W, compute_uv=False)
    np.testing.assert_allclose(F.s, sigma[:3])
    assert np.linalg.norm(W - F.dense()) == pytest.approx(np.linalg.norm(sigma[3:]))


def _written_out_round(clients: list, U: np.ndarray, s: np.ndarray, V: np.ndarray,
                       var_cor: str, lr: float, steps: int,
                       tau: float) -> tuple[np.ndarray, ...]:  # fmt: skip
    """A round of the paper's Algorithms 1 and 5 (and its truncation rule) written out on the
    dense gradient, as independently of models.fedlrt as possible: Ū = Q[:, r:2r] of
    qr([U | G_U]); the tail of σ(S̃*) strictly below τ‖S̃*‖_F is cut."""
    r, S = len(s), np.diag(s)
    G = [c.grad(U @ S @ V.T) for c in clients]
    Q_u = np.linalg.qr(np.hstack([U, np.mean([g @ V @ S.T for g in G], 0)]))[0]
    Q_v = np.linalg.qr(np.hstack([V, np.mean([g.T @ U @ S for g in G], 0)]))[0]
    U_t, V_t = np.hstack([U, Q_u[:, r:]]), np.hstack([V, Q_v[:, r:]])
    S0 = np.zeros((2 * r, 2 * r))
    S0[:r, :r] = S
    own = [U_t.T @ g @ V_t for g in G]
    if var_cor == "simplified":
        own = [np.pad(o[:r, :r], ((0, r), (0, r))) for o in own]
    trained = []
    for c, o in zip(clients, own, strict=True):
        corr = np.mean(own, 0) - o
        St = S0.copy()
        for _ in range(steps):
            St = St - lr * (U_t.T @ c.grad(U_t @ St @ V_t.T) @ V_t + corr)
        trained.append(St)
    P, sigma, Qt = np.linalg.svd(np.mean(trained, 0))
    theta = tau * np.linalg.norm(sigma)
    r1 = max(1, next(j for j in range(len(sigma) + 1) if np.linalg.norm(sigma[j:]) < theta))
    r1 = min(r1, U.shape[0] // 2)  # r_max: the next augmentation must fit
    return U_t @ P[:, :r1], sigma[:r1], V_t @ Qt[:r1].T


@pytest.mark.parametrize("var_cor", ["simplified", "full"])
def test_rounds_equal_the_rules_written_out(var_cor: str) -> None:
    """Pins augmentation, correction, averaging and the truncation rule of a round to the
    paper's formulas (H1's setting, scaled down, on the seed whose H1 run stays at rank 5),
    rank by rank and iterate by iterate."""
    clients, _ = homogeneous_problem(n=12, rank=3, points=2000, clients=4, seed=2)
    F = initial_factors(12, 6, 2)
    U, s, V = F.U, F.s, F.V
    for _ in range(15):
        F, _cut = fedlrt_round(clients, F, var_cor, lr=1e-2, steps=20, tau=0.1, r_max=6)
        U, s, V = _written_out_round(clients, U, s, V, var_cor, lr=1e-2, steps=20, tau=0.1)
        assert F.rank == len(s)
        np.testing.assert_allclose(F.dense(), (U * s) @ V.T, rtol=0, atol=1e-10)


def test_normal_equation_gradients_are_the_data_gradients() -> None:
    """GramClient (gradients from H = K^T K / N) computes what LeastSquaresClient does, so runs
    on either give the same iterates, ranks and losses."""
    clients, target = homogeneous_problem(n=8, rank=2, points=600, clients=3, seed=1)
    gram = [GramClient.of(c) for c in clients]
    rng = np.random.default_rng(0)
    W = rng.standard_normal((8, 8))
    F = initial_factors(8, 3, 0)
    U, V, S = _orthonormal(rng, 8, 4), _orthonormal(rng, 8, 4), rng.standard_normal((4, 4))
    for data, fast in zip(clients, gram, strict=True):
        np.testing.assert_allclose(fast.grad(W), data.grad(W), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(
            fast.coefficient_grad(U, V)(S), data.coefficient_grad(U, V)(S), rtol=1e-10, atol=1e-12
        )
        for a, b in zip(fast.factor_grads(F), data.factor_grads(F), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
        assert fast.loss(W) == data.loss(W)
    slow = run_fedlrt(clients, F, "simplified", lr=1e-2, steps=5, rounds=15, tau=0.1,
                      target=target)  # fmt: skip
    quick = run_fedlrt(gram, F, "simplified", lr=1e-2, steps=5, rounds=15, tau=0.1, target=target)
    assert quick.rank == slow.rank
    np.testing.assert_allclose(quick.W, slow.W, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(quick.distance, slow.distance, rtol=1e-8)
    lin = run_dense(gram, F.dense(), lr=1e-2, steps=5, rounds=15, corrected=True, target=target)
    ref = run_dense(clients, F.dense(), lr=1e-2, steps=5, rounds=15, corrected=True)
    np.testing.assert_allclose(lin.W, ref.W, rtol=1e-9, atol=1e-12)
    assert lin.distance[-1] == float(np.linalg.norm(lin.W - target))
