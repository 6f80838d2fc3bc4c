"""FedEM's client: the personalised predictor on sequences (per-token probabilities mixed
with pi), and its E- and M-steps against the paper's surrogate of the likelihood."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from client.common import Tensors, new_model, split_tensors
from client.env import ClientEnv
from client.fedem import _losses, evaluate, mixture_metrics
from client.training import train_classifier
from models.linear import LinearModel
from models.losses import per_sample_loss
from models.mixture import (
    fit_mixture_weights,
    log_weights,
    mixture_nll,
    mixture_weights,
    responsibilities,
)
from models.weights import get_weights
from pollen.core import protocol
from pollen.core.contracts.fedem import pack
from tests.fakes import FixedLogits, settings_of


@pytest.mark.parametrize("weighted", [False, True])
def test_sequence_mixture_metrics_mix_each_token(weighted: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    logits = [torch.randn(7, 5, 4, generator=gen) for _ in range(2)]  # N x C x T per component
    y = torch.randint(0, 5, (7, 4), generator=gen)
    weights = torch.rand(5, generator=gen) * 8 if weighted else None
    pi = torch.tensor([0.3, 0.7], dtype=torch.float64)
    data = Tensors(torch.arange(7), y, weights)
    metrics = mixture_metrics([FixedLogits(lg) for lg in logits], pi, data, batch_size=3)

    mixed = sum(p * torch.softmax(lg.double(), 1) for p, lg in zip(pi, logits, strict=True))
    assert isinstance(mixed, torch.Tensor)
    nll = -mixed.gather(1, y.unsqueeze(1)).squeeze(1).log()  # 7 x 4
    if weights is not None:
        nll = nll * weights.double()[y]
    assert metrics["test-examples"] == 7
    assert metrics["test-accuracy"] == pytest.approx(float((mixed.argmax(1) == y).double().mean()))
    assert metrics["test-loss"] == pytest.approx(float(nll.mean(1).mean()))


def _surrogate(
    q: torch.Tensor, pi: torch.Tensor, losses: torch.Tensor
) -> torch.Tensor:
    """g(Θ, π) = (1/n) Σ_i Σ_m q_im (l(θ_m; s_i) − log π_m + log q_im) (Marfoq et al., 2021,
    eq. 182, without the constants −log p_m(x) − c that f carries as well)."""
    return (q * (losses - log_weights(pi) + q.log())).sum(1).mean()


def test_the_m_step_objective_is_a_first_order_surrogate_of_the_mixture_likelihood() -> None:
    """Marfoq et al. (2021), App. G.1: with q the E-step's posterior p(z | s, Θ₀, π₀) (eq. 8),
    g of eq. (182) is a partial first-order surrogate of the client's negative log-likelihood
    f(Θ, π) = −(1/n) Σ_i log Σ_m π_m exp(−l(θ_m; s_i)) near (Θ₀, π₀) (Definition 1): g − f is
    the mean KL(q_i ‖ p(z | s_i, Θ, π)) ≥ 0 (Lemma G.4), zero at (Θ₀, π₀) with zero gradient
    in Θ there (Lemma G.5), and g(Θ, π) − g(Θ, π₁) = KL(π₁ ‖ π) for the M-step's π₁ = mean_i q_i
    (Lemma G.6). Through the client's own pieces: its per-example losses and E-step, and its
    training loop, whose full-batch step on the q-weighted loss moves each component by
    −η ∇_θm g = −η ∇_θm f."""
    n, dim, classes, components, lr = 40, 6, 3, 3, 0.1
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(n, dim, generator=gen)
    data = Tensors(x, torch.randint(0, classes, (n,), generator=gen))
    torch.manual_seed(5)
    models: list[nn.Module] = [LinearModel((dim,), classes) for _ in range(components)]
    pi0 = torch.distributions.Dirichlet(torch.ones(components)).sample().double()
    losses0 = _losses(models, data)
    q = responsibilities(log_weights(pi0), losses0)

    # tight at the current point; a majorant elsewhere, the gap being the mean KL
    f0 = mixture_nll(pi0, losses0)
    assert abs(float(_surrogate(q, pi0, losses0) - f0)) < 1e-12
    for trial in range(20):
        moved = [copy.deepcopy(m) for m in models]
        with torch.no_grad():
            for m in moved:
                for p in m.parameters():
                    p.add_(torch.randn(p.shape, generator=gen) * (0.1 + trial / 10))
        pi = torch.distributions.Dirichlet(torch.ones(components)).sample().double()
        losses = _losses(moved, data)
        gap = _surrogate(q, pi, losses) - mixture_nll(pi, losses)
        posterior = responsibilities(log_weights(pi), losses)
        kl = (q * (q.log() - posterior.log())).sum(1).mean()
        assert float(gap) > 0 and abs(float(gap - kl)) < 1e-10
        # the M-step for pi minimises g: what any other pi costs more is KL(pi1 || pi)
        pi1 = mixture_weights(q)
        extra = _surrogate(q, pi, losses) - _surrogate(q, pi1, losses)
        assert abs(float(extra - (pi1 * (pi1.log() - pi.log())).sum())) < 1e-10

    # matching gradients: ∇_Θ f at (Θ₀, π₀) by autograd, against the client's weighted step
    objective = mixture_nll(
        pi0, torch.stack([per_sample_loss(m(data.x), data.y) for m in models], 1).double()
    )
    objective.backward()  # type: ignore[no-untyped-call]
    for k, model in enumerate(models):
        stepped = copy.deepcopy(model)
        train_classifier(stepped, data.x, data.y, epochs=1, batch_size=n, lr=lr,
                         sample_weights=q[:, k].float())  # fmt: skip
        for p, p1 in zip(model.parameters(), stepped.parameters(), strict=True):
            assert p.grad is not None and float(p.grad.abs().max()) > 1e-3
            torch.testing.assert_close(p1 - p, -lr * p.grad, rtol=1e-4, atol=1e-7)
def _unseen_env(settings: dict[str, Any], root: Path) -> ClientEnv:
    """Client 2's environment, built afresh for every message as a restarted client's is: only
    what its state store holds on disk carries over."""
    return ClientEnv(2, settings, root, "run", Path(str(settings["cache-dir"])), None)


def test_an_unseen_client_one_step_warm_starts_from_the_pi_it_stored(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    """fedem.unseen-protocol=one-step: each evaluation is exactly one EM iteration from the pi
    stored at the previous one (on disk, so it survives restarts); with the components fixed,
    k evaluations give k EM iterations from uniform weights. `converge` is unchanged: EM from
    uniform weights until the tolerance, nothing stored."""
    settings = settings_of({**run_config, "algorithm": "fedem", "fedem.components": 3,
                            "fedem.unseen-protocol": "one-step"})  # fmt: skip
    env = _unseen_env(settings, tmp_path)
    models = []
    for m in range(3):
        torch.manual_seed(m)
        models.append(new_model(env))
    arrays = pack([get_weights(m) for m in models])
    losses = _losses(models, split_tensors(env, "train"))
    stored = []
    for rnd in (1, 2, 3):
        content = protocol.instruction(rnd, "evaluate", {"unseen": True}, arrays=arrays)
        reply = evaluate(content, _unseen_env(settings, tmp_path))
        metrics = protocol.metrics_of(reply)
        assert metrics["em-iterations"] == 1
        saved = _unseen_env(settings, tmp_path).state.load(before_round=rnd + 1)
        assert saved is not None and saved[1]["round"] == rnd
        pi = torch.from_numpy(saved[0]["pi"])
        stored.append(pi)
        expected, done = fit_mixture_weights(losses, rnd, tolerance=0.0)
        assert done == rnd
        torch.testing.assert_close(pi, expected, rtol=1e-12, atol=1e-14)
        # the accuracy reported is that of the mixture with the updated pi
        test = mixture_metrics(models, pi, split_tensors(env, "test"))
        assert metrics["test-accuracy"] == test["test-accuracy"]
    assert (stored[0] - stored[2]).abs().sum() > 1e-6  # each step moved pi on
    converged, iterations = fit_mixture_weights(losses, 100, 1e-6)
    assert (stored[2] - converged).abs().sum() > 1e-6  # three steps are not convergence

    settings = {**settings, "fedem.unseen-protocol": "converge"}
    content = protocol.instruction(4, "evaluate", {"unseen": True}, arrays=arrays)
    metrics = protocol.metrics_of(evaluate(content, _unseen_env(settings, tmp_path)))
    assert metrics["em-iterations"] == iterations > 1
    saved = _unseen_env(settings, tmp_path).state.load(before_round=10)
    assert saved is not None and saved[1]["round"] == 3  # converge stores nothing
    expected_accuracy = mixture_metrics(models, converged, split_tensors(env, "test"))
    assert metrics["test-accuracy"] == expected_accuracy["test-accuracy"]
