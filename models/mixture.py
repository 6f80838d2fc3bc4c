"""FedEM's mixture-of-models math (Marfoq et al., NeurIPS 2021), independent of Flower.

A client's distribution is a mixture of M components; its predictor mixes the components'
predicted *probabilities* with its weights pi. The E-step runs in log space: losses of tens or
hundreds would underflow if exponentiated directly.
"""

from __future__ import annotations

import torch


def responsibilities(log_pi: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
    """q[i, m] = pi_m exp(-L[i, m]) / sum_m' pi_m' exp(-L[i, m']) for losses L (n, M).

    A zero weight (log_pi = -inf) gives that component zero responsibility, without NaN."""
    return torch.softmax(log_pi.unsqueeze(0) - losses, dim=1)


def mixture_weights(q: torch.Tensor) -> torch.Tensor:
    """M-step for pi: the mean responsibility of each component (uniform when n = 0)."""
    if q.shape[0] == 0:
        return torch.full((q.shape[1],), 1.0 / q.shape[1], dtype=q.dtype)
    return q.mean(dim=0)


def log_weights(pi: torch.Tensor) -> torch.Tensor:
    return torch.log(pi.clamp_min(0.0))  # log 0 = -inf is meaningful here


def mixture_nll(pi: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
    """-(1/n) sum_i log sum_m pi_m exp(-L[i, m]): the client's objective f_t."""
    return -torch.logsumexp(log_weights(pi).unsqueeze(0) - losses, dim=1).mean()


def fit_mixture_weights(
    losses: torch.Tensor,
    iterations: int,
    tolerance: float = 0.0,
    pi: torch.Tensor | None = None,
) -> tuple[torch.Tensor, int]:
    """EM on pi alone, components frozen (an unseen client personalising itself).

    Starts from `pi` (uniform by default) and stops after `iterations` or once the L1 change
    falls below `tolerance`; returns pi and the iterations done."""
    num = losses.shape[1]
    current = torch.full((num,), 1.0 / num, dtype=losses.dtype) if pi is None else pi.clone()
    if losses.shape[0] == 0:
        return current, 0
    done = 0
    for done in range(1, iterations + 1):  # noqa: B007 (the count is returned)
        new = mixture_weights(responsibilities(log_weights(current), losses))
        change = float((new - current).abs().sum())
        current = new
        if change < tolerance:
            break
    return current, done


def mixture_probabilities(pi: torch.Tensor, probabilities: torch.Tensor) -> torch.Tensor:
    """sum_m pi_m p_m(y | x) for component probabilities of shape (M, n, C), or (M, n, C, T)
    for sequences (each position's next-token distribution mixed with the same pi). pi is
    moved to the probabilities' device and type."""
    return torch.einsum(
        "m,m...->...", pi.to(probabilities.device, probabilities.dtype), probabilities
    )
