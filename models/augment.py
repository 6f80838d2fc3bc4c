"""Random augmentations (torchvision transforms v2) drawn independently for every image.

v2 transforms applied to a batch tensor draw one set of parameters for the whole batch, so
images are transformed one by one; the draws are seeded from the caller's generator, which keeps
runs reproducible without touching the process-wide RNG.

* Small grayscale images (28x28, 8x8): random resized crop (scale 0.5-1), a small affine
  (10 degrees, 10% shift) and Gaussian pixel noise: cheap, and keeps digits legible.
* RGB images: the paper's pipeline (crop scale 0.2-1, colour jitter 0.4/0.4/0.4/0.1 with p 0.8,
  horizontal flip, grayscale with p 0.2), applied to un-normalised pixels.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchvision.transforms import v2


class Augmenter:
    def __init__(
        self,
        input_shape: tuple[int, ...],
        mean: Sequence[float] = (),
        std: Sequence[float] = (),
        noise: float = 0.1,
    ) -> None:
        channels, side = input_shape[0], input_shape[-1]
        self.rgb = channels == 3
        if self.rgb:
            self.pipeline = v2.Compose([
                v2.RandomResizedCrop(side, scale=(0.2, 1.0), antialias=True),
                v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                v2.RandomHorizontalFlip(),
                v2.RandomGrayscale(p=0.2),
            ])  # fmt: skip
        else:
            self.pipeline = v2.Compose([
                v2.RandomResizedCrop(side, scale=(0.5, 1.0), ratio=(0.8, 1.25), antialias=True),
                v2.RandomAffine(degrees=10, translate=(0.1, 0.1)),
            ])  # fmt: skip
        shape = (1, channels, 1, 1)
        self.mean = torch.tensor(mean or [0.0] * channels).reshape(shape)
        self.std = torch.tensor(std or [1.0] * channels).reshape(shape)
        self.noise = 0.0 if self.rgb else noise

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        mean, std = self.mean.to(x.dtype), self.std.to(x.dtype)
        pixels = x * std + mean
        if self.rgb:
            pixels = pixels.clamp(0.0, 1.0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = torch.stack([self.pipeline(img) for img in pixels])
        if self.noise:
            out = out + self.noise * torch.randn(out.shape, generator=generator, dtype=out.dtype)
        return (out - mean) / std
