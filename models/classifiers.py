"""Small image classifiers for the embedded MNIST-style data (and any N×C×H×W input)."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """Two hidden layers; the usual MNIST FedAvg baseline model."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: int = 200) -> None:
        super().__init__()
        features = 1
        for dim in input_shape:
            features *= dim
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


class SmallCNN(nn.Module):
    """Two conv blocks and two dense layers (the FedAvg paper's MNIST CNN, scaled to input)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, width = input_shape
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        flat = 64 * (height // 4) * (width // 4)
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(flat, 512), nn.ReLU(), nn.Linear(512, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.features(x))
        return out
