"""Model code a client runs on its device keeps every tensor there: random draws from CPU
generators are moved to the data's device. Checked on torch's "meta" device, which (like
CUDA) refuses to mix with CPU tensors, so these fail on a CPU-only machine too."""

from __future__ import annotations

import pytest
import torch

from models.augment import Augmenter
from models.diffusion import KINDS, corrupt

META = torch.device("meta")


def test_meta_refuses_cpu_tensors() -> None:
    """The premise: mixing a CPU tensor into a meta computation raises, as with CUDA."""
    with pytest.raises(RuntimeError):
        _ = torch.ones(3) + torch.ones(3, device=META)


def test_augmentations_stay_on_the_images_device() -> None:
    images = torch.zeros(4, 1, 8, 8, device=META)
    out = Augmenter((1, 8, 8), (0.5,), (0.25,))(images, torch.Generator().manual_seed(0))
    assert out.device == META and out.shape == images.shape


@pytest.mark.parametrize("kind", KINDS)
def test_diffusion_noise_goes_to_the_data(kind: str) -> None:
    x = torch.zeros(3, 1, 4, 4, device=META)
    out = corrupt(x, kind, torch.Generator().manual_seed(0))
    assert out.device == META and out.shape == x.shape
