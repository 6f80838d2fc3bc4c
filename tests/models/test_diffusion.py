"""ADEPT-DGM's diffusion pieces: the UNet, the corruptions, the samplers (the VP/DDIM one
against the exact Gaussian posterior mean) and the denoising loss inside ADEPT's local round."""

from __future__ import annotations

import math

import pytest
import torch

from models.adept_ae import AEHyper, local_round
from models.diffusion import (
    corrupt,
    cosine_alpha_bar,
    denoising_errors,
    sample,
    sample_ddim,
    sample_soft,
)
from models.unet_small import SmallUNet

torch.set_num_threads(1)  # as the clients do: small tensors, many threads only contend


def test_default_unet_is_the_authors_309k_basic_unet() -> None:
    net = SmallUNet((1, 28, 28))
    assert sum(p.numel() for p in net.parameters()) == 309_057
    small = SmallUNet((1, 8, 8), channels=(8, 16), kernel=3)
    assert small(torch.rand(5, 1, 8, 8)).shape == (5, 1, 8, 8)
    with pytest.raises(ValueError):
        SmallUNet((1, 10, 10))


def test_corruptions_have_the_stated_means() -> None:
    x = torch.full((20_000, 1, 2, 2), 0.8, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    # soft: E[(1 - a) x + a z] = x/2 + 1/4 with a, z ~ U(0, 1)
    assert float(corrupt(x, "soft", g).mean()) == pytest.approx(0.65, abs=0.005)
    # vp: E[sqrt(abar(t))] x, and unit-variance noise at t = 1
    t = torch.linspace(0, 1, 100_001, dtype=torch.float64)
    scale = float(cosine_alpha_bar(t).sqrt().mean())
    assert float(corrupt(x, "vp", g).mean()) == pytest.approx(0.8 * scale, abs=0.01)
    assert float(cosine_alpha_bar(torch.tensor(0.0))) == pytest.approx(1.0)
    assert float(cosine_alpha_bar(torch.tensor(1.0))) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError):
        corrupt(x, "ve", g)


def test_soft_sampler_returns_the_last_prediction_and_keeps_fixed_points() -> None:
    start = torch.rand(4, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    target = torch.full_like(start, 0.3)
    torch.testing.assert_close(sample_soft(lambda x: target, start, 7), target)
    torch.testing.assert_close(sample_soft(lambda x: x, start, 7), start)
    # a denoiser that halves its input: x_N = prod_j (1 - a_j/2) x_0 with a_j = 1/(N - j)
    factor = math.prod(1 - 0.5 / (5 - j) for j in range(5))
    torch.testing.assert_close(sample_soft(lambda x: 0.5 * x, start, 5), factor * start)


def _posterior_mean(mean: float, var: float):  # type: ignore[no-untyped-def]
    """E[x0 | x_t] for x0 ~ N(mean, var): recovers abar(t) from the sampler's time grid."""
    state = {"k": 0}

    def denoise(x: torch.Tensor, steps: int) -> torch.Tensor:
        t = torch.tensor(1.0 - state["k"] / steps, dtype=x.dtype)
        state["k"] += 1
        a = cosine_alpha_bar(t)
        return mean + a.sqrt() * var / (a * var + 1 - a) * (x - a.sqrt() * mean)

    return denoise


@pytest.mark.parametrize("steps", [2, 200])
def test_ddim_with_the_exact_denoiser_reproduces_gaussian_data(steps: int) -> None:
    """With the exact posterior mean, many DDIM steps give N(mean, var); two steps shrink the
    variance (so this test can tell a sampler that is only right in its mean)."""
    denoise = _posterior_mean(0.4, 0.09)
    start = torch.randn(20_000, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    out = sample_ddim(lambda x: denoise(x, steps), start, steps)
    assert float(out.mean()) == pytest.approx(0.4, abs=0.01)
    if steps == 200:
        assert float(out.var()) == pytest.approx(0.09, rel=0.05)
    else:
        assert float(out.var()) < 0.8 * 0.09


def test_denoising_round_trains_the_unet_and_sampling_is_seeded() -> None:
    torch.manual_seed(0)
    net = SmallUNet((1, 8, 8), channels=(4, 8), kernel=3)
    x = torch.zeros(16, 1, 8, 8)
    x[:, :, 2:6, 3:5] = 1.0
    g = torch.Generator().manual_seed(1)
    before = float(denoising_errors(net, x, "soft", g).mean().detach())
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    hp = AEHyper()

    def errors(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        return denoising_errors(model, batch, "soft", g)

    for _ in range(3):
        local_round(net, [x] * 20, opt, hp, errors=errors)
    assert float(denoising_errors(net, x, "soft", g).mean().detach()) < 0.5 * before
    a = sample(net, 6, (1, 8, 8), "soft", 10, seed=3, batch=4)
    torch.testing.assert_close(a, sample(net, 6, (1, 8, 8), "soft", 10, seed=3))
    assert a.shape == (6, 1, 8, 8) and float(a.min()) >= 0 and float(a.max()) <= 1
