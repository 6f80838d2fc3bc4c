"""The linear autoencoder of ADEPT-AE's MNIST and synthetic experiments: Linear(D -> k) then
Linear(k -> D), no activations (as the authors' code; the paper's "ReLU/sigmoid" wording fits
only its CIFAR model)."""

from __future__ import annotations

import math

import torch
from torch import nn


class LinearAutoencoder(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], latent: int) -> None:
        super().__init__()
        if latent < 1 or not input_shape or any(dim < 1 for dim in input_shape):
            raise ValueError(f"bad autoencoder shape: input {input_shape}, latent {latent}")
        self.input_shape = tuple(input_shape)
        size = math.prod(input_shape)
        self.encoder = nn.Linear(size, latent)
        self.decoder = nn.Linear(latent, size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.decoder(self.encoder(x.flatten(1)))
        return out.view(-1, *self.input_shape)


def squared_errors(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """||x - AE(x)||^2 of every sample (summed over its entries), shape (n,)."""
    return ((x - model(x)) ** 2).flatten(1).sum(dim=1)


@torch.no_grad()
def reconstruction_metrics(
    model: nn.Module, x: torch.Tensor, split: str = "test"
) -> dict[str, int | float]:
    """Mean squared reconstruction error and energy captured, 1 - mean ||x - x^||^2/||x||^2
    (the paper's figure, as a fraction), on one split; only the count when it is empty."""
    out: dict[str, int | float] = {f"{split}-examples": len(x)}
    if len(x):
        model.eval()
        errors = squared_errors(model, x)
        energy = (x**2).flatten(1).sum(dim=1).clamp_min(1e-12)
        out[f"{split}-error"] = float(errors.mean())
        out[f"{split}-energy"] = float(1.0 - (errors / energy).mean())
    return out
