"""FedSC's spectral-contrastive math against the paper's identities (Eqs. 1, 4 and 6) and the
definitions of its local objective, on a toy federation: 3 non-i.i.d. clients, fixed views,
float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.spectral import (
    aggregate,
    alpha_at,
    correlation,
    global_objective,
    local_objective,
    norm_clip,
    objective_terms,
    others,
    positive_trace,
)

SIZES = (40, 25, 35)


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Client j: x ~ N(3 e_j, I) in 6 dims, two fixed noisy views."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for j, n in enumerate(SIZES):
        x = torch.randn(n, 6, generator=gen, dtype=torch.float64)
        x[:, j] += 3.0
        v1 = x + 0.1 * torch.randn(n, 6, generator=gen, dtype=torch.float64)
        v2 = x + 0.1 * torch.randn(n, 6, generator=gen, dtype=torch.float64)
        out.append((v1, v2))
    return out


def _weight() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return (0.3 * torch.randn(4, 6, generator=gen, dtype=torch.float64)).requires_grad_()


def _encode(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ w.T)


Q = [n / sum(SIZES) for n in SIZES]


def test_trace_form_equals_pairwise_loss() -> None:
    """Paper Eq. 1 (App. A): -mean<z1,z2> + 1/2 mean over all ordered view pairs (z_a.z_b)^2
    == trace form."""
    w = _weight().detach()
    data = _data()
    views = [(_encode(w, a), _encode(w, b)) for a, b in data]
    z1 = torch.cat([a for a, _ in views])
    z2 = torch.cat([b for _, b in views])
    pairwise = (
        -(z1 * z2).sum(1).mean() + 0.5 * ((torch.cat([z1, z2]) @ torch.cat([z1, z2]).T) ** 2).mean()
    )
    assert float(global_objective(views, Q)) == pytest.approx(float(pairwise), abs=1e-12)


def test_objective_terms_follow_eq4() -> None:
    """Paper Eq. 4: contraction + intra + inter == global loss, with the inter-client part
    equal to sum_j q_j (1 - q_j)/2 Tr(R_j R_{-j}); local-sum is FedAvg + SC's objective."""
    w = _weight().detach()
    views = [(_encode(w, a), _encode(w, b)) for a, b in _data()]
    terms = objective_terms(views, Q)
    parts = terms["contraction"] + terms["intra-contrast"] + terms["inter-contrast"]
    assert parts == pytest.approx(float(global_objective(views, Q)), abs=1e-12)
    assert terms["global"] == pytest.approx(float(global_objective(views, Q)), abs=1e-12)
    latest = {j: correlation(*v).numpy() for j, v in enumerate(views)}
    inter = sum(
        0.5 * qj * (1 - qj) * float(np.trace(latest[j] @ others(latest, dict(enumerate(Q)), j)))
        for j, qj in enumerate(Q)
    )
    assert terms["inter-contrast"] == pytest.approx(inter, abs=1e-12)
    local = sum(qj * float(local_objective(*v, 1.0)) for qj, v in zip(Q, views, strict=True))
    assert terms["local-sum"] == pytest.approx(local, abs=1e-12)


def test_effective_rank_counts_equally_used_directions() -> None:
    """k orthogonal directions used equally: effective rank k; one direction: 1."""
    z = torch.eye(6, dtype=torch.float64)[:3].repeat(4, 1) * 2.0
    assert objective_terms([(z, z)], [1.0])["effective-rank"] == pytest.approx(3.0)
    assert objective_terms([(z[:1], z[:1])], [1.0])["effective-rank"] == pytest.approx(1.0)


def test_aggregated_correlation_equals_centralised() -> None:
    """Aggregation: sum_j q_j R_j (each client's own, with clipping) == R of the union."""
    w = _weight().detach()
    mu = 0.5  # active: tanh outputs have norms up to 2
    clipped = [(norm_clip(_encode(w, a), mu), norm_clip(_encode(w, b), mu)) for a, b in _data()]
    local = {j: correlation(*v).numpy() for j, v in enumerate(clipped)}
    central = correlation(torch.cat([a for a, _ in clipped]), torch.cat([b for _, b in clipped]))
    np.testing.assert_allclose(aggregate(local, dict(enumerate(Q))), central.numpy(), atol=1e-14)
    r = central.numpy()
    np.testing.assert_array_equal(r, r.T)
    assert np.linalg.eigvalsh(r).min() >= -1e-12


def _local_grads(alpha_of: list[float], with_cross: bool = True) -> torch.Tensor:
    data = _data()
    w = _weight()
    with torch.no_grad():
        latest = {
            j: correlation(_encode(w, a), _encode(w, b)).numpy() for j, (a, b) in enumerate(data)
        }
    total = torch.zeros_like(w)
    for j, (a, b) in enumerate(data):
        rbar = others(latest, dict(enumerate(Q)), j) if with_cross else None
        loss = local_objective(
            _encode(w, a),
            _encode(w, b),
            alpha_of[j],
            None if rbar is None else torch.from_numpy(rbar),
        )
        (grad,) = torch.autograd.grad(loss, w)
        total += Q[j] * grad
    return total


def _global_grad() -> torch.Tensor:
    w = _weight()
    loss = global_objective([(_encode(w, a), _encode(w, b)) for a, b in _data()], Q)
    (grad,) = torch.autograd.grad(loss, w)
    return grad


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_fresh_others_make_local_gradients_average_to_the_global_one() -> None:
    """Paper Eq. 6: alpha_j = q_j, Rbar_{-j} = sg(R_{-j}): sum_j q_j grad L_j == grad L."""
    assert _rel(_local_grads(Q), _global_grad()) < 1e-12


def test_fedavg_sc_and_wrong_variants_do_not_match_the_global_gradient() -> None:
    """Negative controls of Eq. 6: FedAvg + SC (alpha = 1, no R), or alpha = 1 with Rbar."""
    assert _rel(_local_grads([1.0] * 3, with_cross=False), _global_grad()) > 0.3
    assert _rel(_local_grads([1.0] * 3), _global_grad()) > 0.3


def test_others_is_stopped_and_gradient_matches_analytic_form() -> None:
    """Stop-gradient: linear encoder, no clipping: grad = -W C+ - W C+^T... written via R, and
    Rbar gets no gradient."""
    a, b = _data()[0]
    w = _weight()
    rbar = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    rbar.requires_grad_()
    alpha = 0.3
    loss = local_objective(a @ w.T, b @ w.T, alpha, rbar)
    loss.backward()
    assert rbar.grad is None
    n = len(a)
    c_pos = (a.T @ b + b.T @ a) / (2 * n)
    c = (a.T @ a + b.T @ b) / (2 * n)
    wd = w.detach()
    r = wd @ c @ wd.T
    sym = (rbar.detach() + rbar.detach().T) / 2
    expected = -2 * wd @ c_pos + 2 * alpha * r @ wd @ c + 2 * (1 - alpha) * sym @ wd @ c
    assert w.grad is not None
    torch.testing.assert_close(w.grad, expected, rtol=1e-12, atol=1e-12)


def test_alpha_one_ignores_others_and_loss_pieces() -> None:
    """alpha = 1 with any Rbar equals the plain SC loss; the parts add up."""
    gen = torch.Generator().manual_seed(4)
    z1, z2 = torch.randn(8, 5, generator=gen), torch.randn(8, 5, generator=gen)
    rbar = torch.randn(5, 5, generator=gen)
    plain = local_objective(z1, z2, 0.7)
    torch.testing.assert_close(local_objective(z1, z2, 1.0, rbar), plain)
    r = (z1.T @ z1 + z2.T @ z2) / 16
    torch.testing.assert_close(plain, -positive_trace(z1, z2) + 0.5 * (r * r).sum())


def test_norm_clip_bounds_and_keeps_short_vectors() -> None:
    z = torch.tensor([[0.1, 0.2], [3.0, 4.0], [0.0, 0.0]], dtype=torch.float64)
    out = norm_clip(z, mu=4.0)
    torch.testing.assert_close(out[0], z[0])
    torch.testing.assert_close(out[1], z[1] * 2 / 5)
    torch.testing.assert_close(out[2], z[2])


def test_incremental_update_and_others_match_definitions() -> None:
    """Partial participation: with stale copies, R~ = sum q_j R~_j^latest; Rbar_{-j} leaves j
    out."""
    gen = np.random.default_rng(0)
    latest = {j: gen.normal(size=(3, 3)) for j in range(3)}
    q = dict(enumerate(Q))
    old_total = aggregate(latest, q)
    new = gen.normal(size=(3, 3))
    incremental = old_total - q[1] * latest[1] + q[1] * new
    latest[1] = new
    np.testing.assert_allclose(aggregate(latest, q), incremental, atol=1e-14)
    expected = (q[0] * latest[0] + q[2] * latest[2]) / (q[0] + q[2])
    np.testing.assert_allclose(others(latest, q, 1), expected, atol=1e-14)  # type: ignore[arg-type]
    assert others({1: new}, q, 1) is None


def test_alpha_schedules() -> None:
    assert alpha_at("linear", 1, 200, 0.2, 0.1) == 1.0
    assert alpha_at("linear", 200, 200, 0.2, 0.1) == pytest.approx(0.204)
    assert alpha_at("constant", 5, 10, 0.3, 0.1) == 0.3
    assert alpha_at("q", 5, 10, 0.3, 0.1) == 0.1
