"""Encoders, projection head and augmentations for self-supervised (spectral contrastive) runs.

A `ContrastiveNet` is backbone + projector; the projector's output z is what the loss and the
correlation matrices use, the backbone's output is what a linear probe reads. Backbones:

* 'cnn': a small CNN for the embedded 28x28 / 8x8 grayscale data;
* 'cnn-gn': the same CNN with per-sample normalisation (GroupNorm / LayerNorm) instead of
  BatchNorm. With one or two classes per client, train-mode BatchNorm subtracts the client's
  class mean from every feature, so the contrast against other clients' matrices cannot move
  it, and eval-mode outputs (averaged running statistics, the ones DP-CalR shares) differ from
  the ones trained; the paper's CIFAR-10 backbone has no BatchNorm for the same reason;
* 'fixup-resnet20': the paper's SVHN/CIFAR-10 backbone (Fixup ResNet-20, widen factor 8, no
  BatchNorm, 512-d features);
* 'resnet34-cifar': the paper's CIFAR-100 backbone (CIFAR-style BasicBlock ResNet [3,4,6,3] with
  BatchNorm, 512-d features).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from models.resnet_cifar import RESNET34_BLOCKS, CifarResNet

ENCODERS = ("cnn", "cnn-gn", "fixup-resnet20", "resnet34-cifar")


class SmallEncoder(nn.Module):
    """Three 3x3 conv layers (8, 16, 32 channels) with BatchNorm, kept narrow so CPU-only runs
    stay short. BatchNorm keeps the features' spread at unit scale; without it the projector's
    mean direction grows first and training settles in the collapsed (rank-one) solution.
    `per_sample` normalises each image on its own (GroupNorm, LayerNorm): no coupling of the
    samples of a batch, and train and eval mode compute the same function."""

    def __init__(self, channels: int, features: int = 128, per_sample: bool = False) -> None:
        super().__init__()

        def norm2d(c: int) -> nn.Module:
            return nn.GroupNorm(4, c) if per_sample else nn.BatchNorm2d(c)

        self.net = nn.Sequential(
            nn.Conv2d(channels, 8, 3, padding=1, bias=False),
            norm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False),
            norm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False),
            norm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(128, features, bias=False),
            nn.LayerNorm(features) if per_sample else nn.BatchNorm1d(features),
            nn.ReLU(),
        )
        self.out_features = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


class _FixupBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, num_blocks: int) -> None:
        super().__init__()
        self.bias1a, self.bias1b = nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))
        self.bias2a, self.bias2b = nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))
        self.scale = nn.Parameter(torch.ones(1))
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        std = math.sqrt(2.0 / (cout * 9)) * num_blocks**-0.5
        nn.init.normal_(self.conv1.weight, 0.0, std)
        nn.init.zeros_(self.conv2.weight)
        self.stride, self.pad = stride, cout - cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.conv1(x + self.bias1a) + self.bias1b)
        out = self.conv2(out + self.bias2a) * self.scale + self.bias2b
        short = x
        if self.stride != 1 or self.pad:
            short = F.avg_pool2d(x + self.bias1a, 1, self.stride)
            short = torch.cat(
                [short, torch.zeros_like(short[:, :1]).expand(-1, self.pad, -1, -1)], 1
            )
        return F.relu(out + short)


class FixupResNet20(nn.Module):
    """Fixup ResNet-20 x widen: stem 3x3 conv, 3 stages x 3 blocks (widths 16w, 32w, 64w),
    global average pool."""

    def __init__(self, channels: int, widen: int = 8) -> None:
        super().__init__()
        widths = (16 * widen, 32 * widen, 64 * widen)
        self.stem = nn.Conv2d(channels, widths[0], 3, 1, 1, bias=False)
        self.bias = nn.Parameter(torch.zeros(1))
        self.bias_out = nn.Parameter(torch.zeros(1))  # Fixup's bias before the (removed) fc
        blocks: list[nn.Module] = []
        cin = widths[0]
        for stage, width in enumerate(widths):
            for i in range(3):
                blocks.append(_FixupBlock(cin, width, 2 if stage and i == 0 else 1, 9))
                cin = width
        self.blocks = nn.Sequential(*blocks)
        self.out_features = widths[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.blocks(F.relu(self.stem(x) + self.bias))
        return F.adaptive_avg_pool2d(out, 1).flatten(1) + self.bias_out


class ContrastiveNet(nn.Module):
    """Backbone + projector (Linear -> ReLU -> Linear); forward gives the representation z.
    BYOL's online network also has a predictor (Linear -> ReLU -> Linear, dim -> 2 dim -> dim,
    the paper's 512-1024-512), part of the averaged weights."""

    def __init__(
        self, backbone: nn.Module, features: int, dim: int, hidden: int, predictor: bool = False
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.projector = nn.Sequential(
            nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, dim)
        )
        self.predictor: nn.Module | None = None
        if predictor:
            self.predictor = nn.Sequential(
                nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.projector(self.backbone(x))
        return out

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """The predictor's output of z (BYOL's online branch)."""
        if self.predictor is None:
            raise ValueError("this network has no predictor")
        out: torch.Tensor = self.predictor(self(x))
        return out


def build_contrastive_net(
    encoder: str, input_shape: tuple[int, ...], dim: int, hidden: int = 0, predictor: bool = False
) -> ContrastiveNet:
    """The named backbone for images of input_shape (C, H, W) with a projector to `dim`
    (hidden width `hidden`, default twice the backbone's features: 512-1024-512 in the paper)
    and, for BYOL, a predictor."""
    if len(input_shape) != 3:
        raise ValueError(f"contrastive encoders need image input (C, H, W), got {input_shape}")
    channels = input_shape[0]
    backbone: nn.Module
    if encoder == "cnn":
        backbone = SmallEncoder(channels)
    elif encoder == "cnn-gn":
        backbone = SmallEncoder(channels, per_sample=True)
    elif encoder == "fixup-resnet20":
        backbone = FixupResNet20(channels)
    elif encoder == "resnet34-cifar":
        backbone = CifarResNet(channels, RESNET34_BLOCKS)
    else:
        raise ValueError(f"unknown encoder {encoder!r}; known: {', '.join(ENCODERS)}")
    features = int(backbone.out_features)  # type: ignore[arg-type]
    return ContrastiveNet(backbone, features, dim, hidden or 2 * features, predictor)
