"""The denoiser of ADEPT-DGM: the "BasicUNet" of the Hugging Face diffusion course that the
authors' MNIST code uses (three convolutions down with two max-pools, three up with two x2
upsamplings and additive skips, SiLU after every layer including the output; unconditional:
it does not receive the noise amount). `channels=(32, 64), kernel=5` is their 309,057-parameter
model; smaller widths and kernels make it CPU-friendly. Any image side divisible by 4 works
(28, 8)."""

from __future__ import annotations

import torch
from torch import nn


class SmallUNet(nn.Module):
    def __init__(
        self, input_shape: tuple[int, ...], channels: tuple[int, int] = (32, 64), kernel: int = 5
    ) -> None:
        super().__init__()
        if len(input_shape) != 3 or input_shape[1] % 4 or input_shape[2] % 4:
            raise ValueError(f"SmallUNet needs (C, H, W), H and W divisible by 4: {input_shape}")
        if kernel % 2 == 0 or min(channels) < 1:
            raise ValueError(f"bad SmallUNet widths {channels} or even kernel {kernel}")
        c, (c1, c2) = input_shape[0], channels
        pad = kernel // 2

        def conv(i: int, o: int) -> nn.Conv2d:
            return nn.Conv2d(i, o, kernel, padding=pad)

        self.down_layers = nn.ModuleList([conv(c, c1), conv(c1, c2), conv(c2, c2)])
        self.up_layers = nn.ModuleList([conv(c2, c2), conv(c2, c1), conv(c1, c)])
        self.act = nn.SiLU()
        self.downscale = nn.MaxPool2d(2)
        self.upscale = nn.Upsample(scale_factor=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, layer in enumerate(self.down_layers):
            x = self.act(layer(x))
            if i < 2:
                skips.append(x)
                x = self.downscale(x)
        for i, layer in enumerate(self.up_layers):
            if i > 0:
                x = self.upscale(x) + skips.pop()
            x = self.act(layer(x))
        return x
