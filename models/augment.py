"""Random augmentations drawn independently for every image, from the caller's generator
(reproducible without touching the process-wide RNG).

* Small grayscale images (28x28, 8x8): random resized crop (area 0.5-1, aspect 0.8-1.25), a
  small rotation (10 degrees) and shift (10%), composed into one affine map per image and applied
  to the whole batch at once (affine_grid / grid_sample), then Gaussian pixel noise. Cheap and
  keeps digits legible. (torchvision's v2 transforms draw one parameter set per call, so they
  would have to run image by image, which costs milliseconds per image on a CPU.)
* RGB images: the paper's pipeline with torchvision transforms v2, image by image (crop scale
  0.2-1, colour jitter 0.4/0.4/0.4/0.1 with p 0.8, horizontal flip, grayscale with p 0.2),
  applied to un-normalised pixels.
* `random_hflip`: each image of a batch mirrored left-right with probability 1/2 (the
  supervised loop's `random-flip`, FeDLRT's CIFAR-10 training, Schotthöfer et al. App. B.2).

Random numbers come from the caller's (CPU) generator and are moved to the images' device, so
the same seed gives the same augmentations on a CPU and a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.nn import functional as F  # noqa: N812


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
            from torchvision.transforms import v2  # lazy: torchvision, RGB input only

            self.pipeline = v2.Compose([
                v2.RandomResizedCrop(side, scale=(0.2, 1.0), antialias=True),
                v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                v2.RandomHorizontalFlip(),
                v2.RandomGrayscale(p=0.2),
            ])  # fmt: skip
        shape = (1, channels, 1, 1)
        self.mean = torch.tensor(mean or [0.0] * channels).reshape(shape)
        self.std = torch.tensor(std or [1.0] * channels).reshape(shape)
        self.noise = 0.0 if self.rgb else noise

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        mean, std = self.mean.to(x.device, x.dtype), self.std.to(x.device, x.dtype)
        pixels = x * std + mean
        if self.rgb:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                out = torch.stack([self.pipeline(img) for img in pixels.clamp(0.0, 1.0)])
        else:
            out = random_affine(pixels, generator)
            noise = torch.randn(out.shape, generator=generator, dtype=out.dtype)
            out = out + self.noise * noise.to(out.device)
        return (out - mean) / std


def random_affine(
    x: torch.Tensor,
    generator: torch.Generator,
    area: tuple[float, float] = (0.5, 1.0),
    ratio: tuple[float, float] = (0.8, 1.25),
    degrees: float = 10.0,
    shift: float = 0.1,
) -> torch.Tensor:
    """Per-image random resized crop, rotation and shift in one bilinear resampling."""
    n = len(x)

    def uniform(low: float, high: float) -> torch.Tensor:
        drawn = torch.rand(n, generator=generator, dtype=x.dtype)
        return low + (high - low) * drawn.to(x.device)

    scale = uniform(*area).sqrt()
    aspect = uniform(math.log(ratio[0]), math.log(ratio[1])).exp().sqrt()
    sx, sy = (scale * aspect).clamp(max=1.0), (scale / aspect).clamp(max=1.0)
    # crop centre inside the image, plus the shift (grid coordinates span [-1, 1])
    cx = uniform(-1.0, 1.0) * (1 - sx) + uniform(-2 * shift, 2 * shift)
    cy = uniform(-1.0, 1.0) * (1 - sy) + uniform(-2 * shift, 2 * shift)
    angle = uniform(-math.radians(degrees), math.radians(degrees))
    cos, sin = angle.cos(), angle.sin()
    theta = torch.stack(
        [
            torch.stack([sx * cos, -sy * sin, cx], dim=1),
            torch.stack([sx * sin, sy * cos, cy], dim=1),
        ],
        dim=1,
    )
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def random_hflip(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Images (N, C, H, W) each flipped along W with probability 1/2 (one draw per image)."""
    flip = (torch.rand(len(x), generator=generator) < 0.5).to(x.device)
    return torch.where(flip.view(-1, *([1] * (x.dim() - 1))), x.flip(-1), x)
