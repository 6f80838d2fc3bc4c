"""FedEM's mixture math (the E- and M-steps of the paper's Proposition 3.1) against its
invariants."""

from __future__ import annotations

import torch

from models.mixture import (
    fit_mixture_weights,
    log_weights,
    mixture_nll,
    mixture_probabilities,
    mixture_weights,
    responsibilities,
)


def test_responsibilities_are_the_posterior() -> None:
    gen = torch.Generator().manual_seed(0)
    losses = torch.rand(50, 3, generator=gen, dtype=torch.float64) * 5
    pi = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    q = responsibilities(log_weights(pi), losses)
    unnormalised = pi * torch.exp(-losses)
    torch.testing.assert_close(q, unnormalised / unnormalised.sum(1, keepdim=True))
    assert (q >= 0).all()
    torch.testing.assert_close(q.sum(1), torch.ones(50, dtype=torch.float64))


def test_large_losses_stay_finite() -> None:
    losses = torch.tensor([[1000.0, 1001.0, 5000.0], [0.0, 1e-9, 800.0]], dtype=torch.float64)
    q = responsibilities(log_weights(torch.full((3,), 1 / 3, dtype=torch.float64)), losses)
    assert torch.isfinite(q).all()
    torch.testing.assert_close(
        q[0], torch.tensor([0.7311, 0.2689, 0.0], dtype=torch.float64), atol=1e-4, rtol=0
    )
    naive = torch.exp(-losses) / torch.exp(-losses).sum(1, keepdim=True)
    assert torch.isnan(naive[0]).any()  # what the log-space form avoids


def test_pi_update_and_a_dead_component() -> None:
    q = torch.tensor([[0.5, 0.5, 0.0]] * 4, dtype=torch.float64)
    torch.testing.assert_close(mixture_weights(q), q[0])
    losses = torch.rand(10, 3, dtype=torch.float64)
    q = responsibilities(log_weights(torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)), losses)
    assert torch.isfinite(q).all() and (q[:, 2] == 0).all()
    assert torch.equal(mixture_weights(torch.zeros(0, 3)), torch.full((3,), 1 / 3))


def test_em_on_pi_never_increases_the_client_objective() -> None:
    gen = torch.Generator().manual_seed(1)
    losses = torch.rand(200, 4, generator=gen, dtype=torch.float64) * 3
    pi = torch.full((4,), 0.25, dtype=torch.float64)
    previous = float(mixture_nll(pi, losses))
    for _ in range(50):
        pi, _ = fit_mixture_weights(losses, 1, pi=pi)
        current = float(mixture_nll(pi, losses))
        assert current <= previous + 1e-12
        previous = current
    torch.testing.assert_close(pi.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_em_stops_at_tolerance_and_handles_no_data() -> None:
    losses = torch.tensor([[0.1, 5.0]] * 30 + [[5.0, 0.1]] * 10, dtype=torch.float64)
    pi, iterations = fit_mixture_weights(losses, 1000, tolerance=1e-10)
    assert iterations < 1000
    torch.testing.assert_close(
        pi, torch.tensor([0.75, 0.25], dtype=torch.float64), atol=2e-2, rtol=0
    )
    pi, iterations = fit_mixture_weights(torch.zeros(0, 3), 10)
    assert iterations == 0 and torch.equal(pi, torch.full((3,), 1 / 3))


def test_mixture_prediction_mixes_probabilities() -> None:
    gen = torch.Generator().manual_seed(2)
    probs = torch.softmax(torch.randn(3, 8, 5, generator=gen), dim=2)
    pi = torch.tensor([0.1, 0.6, 0.3])
    mixed = mixture_probabilities(pi, probs)
    torch.testing.assert_close(mixed.sum(1), torch.ones(8))
    torch.testing.assert_close(
        mixture_probabilities(torch.tensor([0.0, 1.0, 0.0]), probs), probs[1]
    )
    perm = torch.tensor([2, 0, 1])
    torch.testing.assert_close(mixture_probabilities(pi[perm], probs[perm]), mixed)
