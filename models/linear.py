"""FedEM's linear model for the synthetic binary task (and any flat or flattened input)."""

from __future__ import annotations

import math

import torch
from torch import nn


class LinearModel(nn.Module):
    """One affine map of the flattened input; a single logit for two classes (sigmoid/BCE).

    With two classes the model matches FedEM's synthetic model, Linear(150 -> 1): one logit
    carries the same information as two and halves the parameters. Other class counts get one
    logit per class (softmax/CE). Parameters: fc.weight, fc.bias (torch's default Linear init).
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        if len(input_shape) == 0 or any(dim < 1 for dim in input_shape):
            raise ValueError(f"model 'linear' needs a non-empty input shape, got {input_shape}")
        if num_classes < 2:
            raise ValueError(f"model 'linear' needs at least 2 classes, got {num_classes}")
        outputs = 1 if num_classes == 2 else num_classes
        self.fc = nn.Linear(math.prod(input_shape), outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(x.flatten(1))
        return out
