"""ADEPT-AE's autoencoders: the linear one of its MNIST, F-MNIST and synthetic experiments,
Linear(D -> k) then Linear(k -> D), no activations (as the authors' code; the paper's
"ReLU/sigmoid" wording fits only its CIFAR model), and the convolutional one of its CIFAR-10
experiment (Ozkara et al., AISTATS 2025, Sec. 5.1 and Table 2)."""

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


class ConvAutoencoder(nn.Module):
    """ADEPT-AE's CIFAR-10 autoencoder (the authors' code): Conv2d(C -> 16, 3x3, stride 2, no
    padding) -> ReLU -> flatten -> Linear(-> k) -> Linear(k ->) -> unflatten ->
    ConvTranspose2d(16 -> C, 3x3, stride 2) -> sigmoid; "ReLU after the first layer and sigmoid
    after the last" (paper, Sec. 5.1). For 3x32x32 the flattened size is 16 x 15 x 15 = 3600.
    Any (C, H, W) with H, W >= 3 works: the transposed convolution's output padding restores the
    input's side."""

    CHANNELS = 16

    def __init__(self, input_shape: tuple[int, ...], latent: int) -> None:
        super().__init__()
        if len(input_shape) != 3 or latent < 1 or min(input_shape) < 1:
            raise ValueError(
                f"the convolutional autoencoder needs image input (C, H, W) and latent >= 1, "
                f"got input {input_shape}, latent {latent}"
            )
        channels, height, width = input_shape
        if height < 3 or width < 3:
            raise ValueError(f"the convolutional autoencoder needs H, W >= 3, got {input_shape}")
        self.input_shape = tuple(input_shape)
        self.inner = (self.CHANNELS, (height - 3) // 2 + 1, (width - 3) // 2 + 1)
        pad = (height - (2 * self.inner[1] + 1), width - (2 * self.inner[2] + 1))
        size = math.prod(self.inner)
        self.conv = nn.Conv2d(channels, self.CHANNELS, 3, stride=2)
        self.encoder = nn.Linear(size, latent)
        self.decoder = nn.Linear(latent, size)
        self.deconv = nn.ConvTranspose2d(self.CHANNELS, channels, 3, stride=2, output_padding=pad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        code = self.encoder(torch.relu(self.conv(x)).flatten(1))
        inner = self.decoder(code).view(-1, *self.inner)
        return torch.sigmoid(self.deconv(inner))


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
