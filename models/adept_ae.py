"""ADEPT-AE (Ozkara et al., AISTATS 2025, Algorithm 1 with the modifications of its
experiments): a personal model theta_i, the client's working copy of the global model mu and a
per-weight sigma, all as lists of tensors in `model.parameters()` order (PyTorch).

Per weight j the prior is (2 xi + (mu_j - theta_j)^2) / (2 sigma_j^2) + log sigma_j. As run by
the authors: sigma is updated once per round, at the first local iteration (so from the
previous round's theta_i and the received mu), only after `lazy` rounds, its gradient
l_inf-clipped per tensor and sigma clamped to [sigma_min, sigma_max]; theta_i takes SGD-momentum
steps on the reconstruction loss plus `prior_scale` times the prior; mu moves at every local
iteration (plain SGD, or an optimizer such as the authors' Adam for ADEPT-DGM).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import nn

from models.autoencoder import ConvAutoencoder, LinearAutoencoder, squared_errors
from models.unet_small import SmallUNet


def theta_network(
    input_shape: tuple[int, ...],
    denoiser: bool,
    *,
    latent: int,
    channels: int,
    kernel: int,
    architecture: str = "linear",
) -> nn.Module:
    """theta's (and mu's) architecture: the autoencoder with `latent` units (adept-ae's,
    `adept-ae.latent`; `architecture` "linear" or "conv", `adept-ae.architecture`) or, with
    `denoiser`, the small UNet denoiser of widths `channels` and 2 `channels` and convolution
    size `kernel` (adept-dgm's, `adept-dgm.channels` and `adept-dgm.kernel`)."""
    if denoiser:
        return SmallUNet(input_shape, (channels, 2 * channels), kernel)
    if architecture == "conv":
        return ConvAutoencoder(input_shape, latent)
    if architecture != "linear":
        raise ValueError(f"unknown autoencoder architecture {architecture!r}: linear or conv")
    return LinearAutoencoder(input_shape, latent)


@dataclass(frozen=True)
class AEHyper:
    eta2: float = 0.01  # mu (plain SGD)
    eta3: float = 1e-3  # sigma (plain SGD)
    xi: float = 1e-6
    prior_scale: float = 0.1  # c: the prior's weight beside a per-sample mean loss
    mu_gradient: str = "code"  # "code": 2 (mu - theta); "paper": c (mu - theta) / sigma^2
    clip_theta: float = 1.0
    clip_mu: float = 1.0
    clip_sigma: float = 10.0
    sigma_min: float = 1e-3
    sigma_max: float = 100.0


class Optimizer(Protocol):
    def step(self) -> None: ...
    def zero_grad(self) -> None: ...


def prior_term(
    theta: Sequence[torch.Tensor],
    mu: Sequence[torch.Tensor],
    sigma: Sequence[torch.Tensor],
    xi: float,
) -> torch.Tensor:
    """sum_j [(2 xi + (mu_j - theta_j)^2) / (2 sigma_j^2) + log sigma_j] over all weights."""
    total = torch.zeros((), device=theta[0].device if len(theta) else None)
    for t, m, s in zip(theta, mu, sigma, strict=True):
        total = total + ((2 * xi + (m - t) ** 2) / (2 * s**2) + torch.log(s)).sum()
    return total


def sigma_gradient(
    theta: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor, xi: float
) -> torch.Tensor:
    """Derivative of the prior in sigma_j: 1/sigma_j - (2 xi + (theta_j - mu_j)^2)/sigma_j^3."""
    return 1.0 / sigma - (2 * xi + (theta - mu) ** 2) / sigma**3


def clip_linf(grads: Sequence[torch.Tensor], max_norm: float) -> list[torch.Tensor]:
    """Rescale the gradients jointly so that their largest |entry| is at most max_norm
    (torch's clip_grad_norm_ with norm_type=inf: a rescale, not an elementwise clamp)."""
    largest = max((float(g.abs().max()) for g in grads if g.numel()), default=0.0)
    scale = min(1.0, max_norm / (largest + 1e-6))
    return [g * scale for g in grads]


def sigma_step(
    theta: Sequence[torch.Tensor],
    mu: Sequence[torch.Tensor],
    sigma: Sequence[torch.Tensor],
    hp: AEHyper,
) -> list[torch.Tensor]:
    """One clipped, clamped gradient step on every sigma tensor."""
    out = []
    for t, m, s in zip(theta, mu, sigma, strict=True):
        (g,) = clip_linf([sigma_gradient(t, m, s, hp.xi)], hp.clip_sigma)
        out.append((s - hp.eta3 * g).clamp(hp.sigma_min, hp.sigma_max))
    return out


def mu_gradient(
    theta: Sequence[torch.Tensor],
    mu: Sequence[torch.Tensor],
    sigma: Sequence[torch.Tensor],
    hp: AEHyper,
) -> list[torch.Tensor]:
    """The clipped gradient of the client's copy of mu: 2 (mu - theta) (`mu_gradient` "code",
    the authors' loss sum ||mu - theta||^2) or c (mu - theta) / sigma^2 ("paper")."""
    if hp.mu_gradient == "code":
        grads = [2 * (m - t) for t, m in zip(theta, mu, strict=True)]
    else:
        grads = [hp.prior_scale * (m - t) / s**2 for t, m, s in zip(theta, mu, sigma, strict=True)]
    return clip_linf(grads, hp.clip_mu)


def mu_step(
    theta: Sequence[torch.Tensor],
    mu: Sequence[torch.Tensor],
    sigma: Sequence[torch.Tensor],
    hp: AEHyper,
) -> list[torch.Tensor]:
    """One clipped plain-SGD step of the client's copy of mu towards theta_i (step eta2)."""
    grads = mu_gradient(theta, mu, sigma, hp)
    return [m - hp.eta2 * g for m, g in zip(mu, grads, strict=True)]


def local_round(
    model: nn.Module,
    batches: Iterable[torch.Tensor],
    opt: Optimizer,
    hp: AEHyper,
    mu: Sequence[torch.Tensor] | None = None,
    sigma: Sequence[torch.Tensor] | None = None,
    update_sigma: bool = False,
    errors: Callable[[nn.Module, torch.Tensor], torch.Tensor] = squared_errors,
    mu_optimizer: Optimizer | None = None,
) -> tuple[list[torch.Tensor] | None, list[torch.Tensor] | None, float]:
    """One round of local iterations on `model` (theta_i, updated in place).

    With mu and sigma given this is ADEPT (returns the drifted mu and sigma to send); without
    them, plain training on the data term (local and FedAvg baselines). The data term is the
    per-sample mean of `errors(model, batch)`: the reconstruction error (ADEPT-AE) or the
    denoising error (ADEPT-DGM, models.diffusion). The client's copy of mu takes plain SGD
    steps of size eta2 on a copy of `mu`, or, given `mu_optimizer` (an optimizer over the
    tensors of `mu` themselves, e.g. the authors' Adam for ADEPT-DGM), that optimizer's steps
    on the clipped gradient, in place. Returns (mu, sigma, mean training loss)."""
    params = [p for p in model.parameters() if p.requires_grad]
    prior = mu is not None and sigma is not None
    if mu_optimizer is not None and mu is not None:
        mu_loc: list[torch.Tensor] | None = list(mu)
    else:
        mu_loc = [m.detach().clone() for m in mu] if mu is not None else None
    sig_loc = [s.detach().clone() for s in sigma] if sigma is not None else None
    losses = []
    model.train()
    for k, x in enumerate(batches):
        theta = [p.detach() for p in params]
        if prior and k == 0 and update_sigma:
            assert mu_loc is not None and sig_loc is not None
            sig_loc = sigma_step(theta, mu_loc, sig_loc, hp)
        opt.zero_grad()
        loss = errors(model, x).mean()
        objective = loss
        if prior:
            assert mu_loc is not None and sig_loc is not None
            objective = loss + hp.prior_scale * prior_term(params, mu_loc, sig_loc, hp.xi)
        grads = torch.autograd.grad(objective, params)
        for p, g in zip(params, clip_linf(grads, hp.clip_theta), strict=True):
            p.grad = g
        opt.step()
        if prior:
            assert mu_loc is not None and sig_loc is not None
            theta = [p.detach() for p in params]
            if mu_optimizer is None:
                mu_loc = mu_step(theta, mu_loc, sig_loc, hp)
            else:
                steps = mu_gradient(theta, [m.detach() for m in mu_loc], sig_loc, hp)
                for m, g in zip(mu_loc, steps, strict=True):
                    m.grad = g
                mu_optimizer.step()
        losses.append(float(loss.detach()))
    if mu_loc is not None and mu_optimizer is not None:
        mu_loc = [m.detach().clone() for m in mu_loc]
    return mu_loc, sig_loc, float(np.mean(losses)) if losses else float("nan")


def average(replies: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The server's combination of mu and of sigma: the elementwise, unweighted mean over the
    replying clients (of sigma itself, never of sigma^2 or 1/sigma^2), each tensor keeping its
    shape and dtype."""
    if not replies:
        raise ValueError("nothing to average")
    return {
        key: np.mean(np.stack([np.asarray(r[key], np.float64) for r in replies]), axis=0).astype(
            first.dtype
        )
        for key, first in replies[0].items()
    }
