"""CIFAR-style ResNets (3x3 stem, no max-pool, BasicBlocks, widths 64..512, BatchNorm).

The backbone serves FedSC (ResNet-34 encoder) and FeDLRT's vision runs (ResNet-18 with a fully
connected head whose hidden layers are the ones FeDLRT factorizes; the paper says only "its
fully connected head", so the head's shape here is an assumption: two 512-wide hidden layers).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

RESNET18_BLOCKS = (2, 2, 2, 2)
RESNET34_BLOCKS = (3, 4, 6, 3)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.short(x))


class CifarResNet(nn.Module):
    """Backbone only: images (C, H, W) -> 512 pooled features."""

    def __init__(self, channels: int, blocks: tuple[int, ...] = RESNET34_BLOCKS) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()
        )
        layers: list[nn.Module] = []
        cin = 64
        for stage, (width, count) in enumerate(zip((64, 128, 256, 512), blocks, strict=True)):
            for i in range(count):
                layers.append(BasicBlock(cin, width, 2 if stage and i == 0 else 1))
                cin = width
        self.layers = nn.Sequential(*layers)
        self.out_features = 512

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1).flatten(1)


class ResNet18Classifier(nn.Module):
    """ResNet-18 backbone + fully connected head 512 -> width -> width -> classes."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: int = 512) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(
                f"model 'resnet18-cifar' needs image input (C, H, W), got {input_shape}"
            )
        self.backbone = CifarResNet(input_shape[0], RESNET18_BLOCKS)
        self.head = nn.Sequential(
            nn.Linear(self.backbone.out_features, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.backbone(x))
        return out
