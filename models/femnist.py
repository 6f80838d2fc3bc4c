"""The CNN FedEM's reference code trained on FEMNIST and EMNIST (`FemnistCNN`).

The paper's text describes a different network (3x3 convolutions, dropout, a 128-unit dense
layer); the reported numbers come from this one, so this one is reproduced.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

KERNEL = 5
MIN_SIDE = 16
"""Smallest image side: two unpadded 5x5 convolutions, each followed by 2x2 max-pooling,
leave at least one pixel only from 16 pixels up (16 -> 12 -> 6 -> 2 -> 1)."""


def _side_after_features(side: int) -> int:
    """Image side after conv5 -> pool2 -> conv5 -> pool2 (no padding, floor pooling)."""
    side = (side - KERNEL + 1) // 2
    return (side - KERNEL + 1) // 2


class FemnistCNN(nn.Module):
    """Conv(C->32, 5) -> ReLU -> MaxPool2 -> Conv(32->64, 5) -> ReLU -> MaxPool2 -> flatten
    -> Linear(-> 2048) -> ReLU -> Linear(2048 -> classes); no padding, no dropout.

    For 1x28x28 input the flatten size is 1024 and, with 62 classes, the model has 2,278,334
    parameters, as in the reference. The flatten size follows the input shape, so any (C, H, W)
    with H, W >= 16 works; C is the number of input channels (1 in the reference).
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(
                f"model 'femnist-cnn' needs image input (C, H, W), got shape {input_shape}"
            )
        channels, height, width = input_shape
        if channels < 1 or height < MIN_SIDE or width < MIN_SIDE:
            raise ValueError(
                f"model 'femnist-cnn' needs C >= 1 channels and H, W >= {MIN_SIDE}, "
                f"got shape {input_shape}"
            )
        if num_classes < 2:
            raise ValueError(f"model 'femnist-cnn' needs at least 2 classes, got {num_classes}")
        self.flat_features = 64 * _side_after_features(height) * _side_after_features(width)
        # Created in the reference's order so that a seeded build draws the same random numbers.
        self.conv1 = nn.Conv2d(channels, 32, KERNEL)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(32, 64, KERNEL)
        self.fc1 = nn.Linear(self.flat_features, 2048)
        self.output = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = F.relu(self.fc1(x.flatten(1)))
        out: torch.Tensor = self.output(x)
        return out
