"""Denoising diffusion for ADEPT-DGM (plain PyTorch): the training corruption, the
x-prediction loss and the samplers.

Two variants:
- "soft" (the authors' released MNIST code): x_alpha = (1 - alpha) x + alpha z with
  alpha ~ U(0, 1) per sample and z ~ U[0, 1) per pixel; the denoiser predicts x from x_alpha
  without being told alpha; sampling starts from U[0, 1) and mixes in the prediction,
  x <- (1 - 1/(N - j)) x + phi(x)/(N - j) for j = 0..N-1, then clamps to [0, 1].
- "vp" (the paper's text: variance preserving, cosine schedule, x-prediction; the paper gives
  no more, so this is our re-implementation): x_t = sqrt(abar(t)) x + sqrt(1 - abar(t)) eps,
  t ~ U(0, 1), eps ~ N(0, I), abar(t) = cos^2(pi/2 (t + s)/(1 + s)) / cos^2(pi/2 s/(1 + s)),
  and the deterministic DDIM sampler from N(0, I) on a uniform time grid.

Noise is drawn from the caller's (CPU) generator and moved to the data's (the model's) device,
so a seed gives the same noise on a CPU and a GPU.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
from torch import nn

Denoiser = Callable[[torch.Tensor], torch.Tensor]
KINDS = ("soft", "vp")
COSINE_OFFSET = 0.008


def cosine_alpha_bar(t: torch.Tensor, offset: float = COSINE_OFFSET) -> torch.Tensor:
    """abar(t) of the cosine schedule, t in [0, 1]: 1 at t = 0, 0 at t = 1."""
    f = torch.cos((t + offset) / (1 + offset) * math.pi / 2) ** 2
    return (f / math.cos(offset / (1 + offset) * math.pi / 2) ** 2).clamp(0.0, 1.0)


def corrupt(x: torch.Tensor, kind: str, generator: torch.Generator | None = None) -> torch.Tensor:
    """A noisy version of every sample of x, each with its own noise amount."""
    shape = (len(x),) + (1,) * (x.dim() - 1)
    t = torch.rand(shape, generator=generator, dtype=x.dtype).to(x.device)
    if kind == "soft":
        z = torch.rand(x.shape, generator=generator, dtype=x.dtype).to(x.device)
        return (1 - t) * x + t * z
    if kind == "vp":
        a = cosine_alpha_bar(t)
        eps = torch.randn(x.shape, generator=generator, dtype=x.dtype).to(x.device)
        return a.sqrt() * x + (1 - a).sqrt() * eps
    raise ValueError(f"unknown diffusion {kind!r}; known: {', '.join(KINDS)}")


def denoising_errors(
    model: nn.Module, x: torch.Tensor, kind: str, generator: torch.Generator | None = None
) -> torch.Tensor:
    """||phi(corrupt(x)) - x||^2 per sample (summed over pixels), shape (n,): the x-prediction
    loss whose per-sample mean is ADEPT-DGM's data term."""
    return ((model(corrupt(x, kind, generator)) - x) ** 2).flatten(1).sum(dim=1)


@torch.no_grad()
def sample_soft(denoiser: Denoiser, start: torch.Tensor, steps: int) -> torch.Tensor:
    """The released sampler: `steps` mixing steps from `start`, clamped to [0, 1]."""
    x = start
    for j in range(steps):
        a = 1.0 / (steps - j)
        x = (1 - a) * x + a * denoiser(x)
    return x.clamp(0.0, 1.0)


@torch.no_grad()
def sample_ddim(denoiser: Denoiser, start: torch.Tensor, steps: int) -> torch.Tensor:
    """Deterministic DDIM with an x-predicting denoiser, from t = 1 (start ~ N(0, I)) to t = 0
    in `steps` uniform steps; no clamp (the caller clips to the data range)."""
    x = start
    grid = torch.linspace(1.0, 0.0, steps + 1, dtype=start.dtype, device=start.device)
    for t, t_next in itertools.pairwise(grid):
        a, a_next = cosine_alpha_bar(t), cosine_alpha_bar(t_next)
        x0 = denoiser(x)
        eps = (x - a.sqrt() * x0) / (1 - a).clamp_min(1e-12).sqrt()
        x = a_next.sqrt() * x0 + (1 - a_next).sqrt() * eps
    return x


def sample(
    model: nn.Module, count: int, shape: tuple[int, ...], kind: str, steps: int, seed: int,
    batch: int = 100,
) -> torch.Tensor:  # fmt: skip
    """`count` images in [0, 1] from the denoiser, seeded (the authors seed with the client),
    on the CPU whatever the model's device."""
    g = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    model.eval()
    out = []
    for start in range(0, count, batch):
        size = (min(batch, count - start), *shape)
        if kind == "soft":
            noise = torch.rand(size, generator=g).to(device)
            out.append(sample_soft(model, noise, steps).cpu())
        elif kind == "vp":
            noise = torch.randn(size, generator=g).to(device)
            out.append(sample_ddim(model, noise, steps).clamp(0.0, 1.0).cpu())
        else:
            raise ValueError(f"unknown diffusion {kind!r}; known: {', '.join(KINDS)}")
    return torch.cat(out) if out else torch.zeros((0, *shape))
