"""DP-CalR (the paper's Algorithm 2) and its privacy accounting (Sec. 6.1, Prop. 6.6)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.dp_correlation import (
    calibrate_sigma,
    closed_form_epsilon,
    dp_correlation,
    rdp_epsilon,
    sensitivity,
)
from models.spectral import correlation, norm_clip

H = 4


def _identity(x: torch.Tensor, _gen: torch.Generator) -> torch.Tensor:
    return x


def _shift(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return x + 0.5 * torch.randn(x.shape, generator=gen, dtype=x.dtype)


def _x(n: int = 30) -> torch.Tensor:
    return 1.5 * torch.randn(n, H, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def _release(
    sigma: float, noise_seed: int, symmetrize: bool = True, mu: float = 2.0
) -> torch.Tensor:
    r, _ = dp_correlation(
        lambda v: v, _x(), _identity, mu, sigma, torch.Generator().manual_seed(1),
        torch.Generator().manual_seed(noise_seed), passes=1, views_per_pass=1,
        symmetrize=symmetrize,
    )  # fmt: skip
    return r


def test_noiseless_release_is_the_clipped_correlation_and_psd() -> None:
    """sigma = 0: symmetric PSD, Tr <= mu, ||R||_F <= mu; averaged over passes and views
    it equals the correlation of all clipped views together."""
    mu = 2.0
    x = _x()
    r, frac = dp_correlation(
        lambda v: v, x, _shift, mu, 0.0, torch.Generator().manual_seed(5),
        torch.Generator().manual_seed(6), passes=3, views_per_pass=2, batch_size=7,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(5)
    views = [norm_clip(_shift(x[s : s + 7], gen), mu) for _ in range(6) for s in range(0, 30, 7)]
    torch.testing.assert_close(r, correlation(*views), rtol=1e-12, atol=1e-14)
    assert 0 < frac < 1
    np.testing.assert_array_equal(r.numpy(), r.numpy().T)
    assert float(torch.linalg.eigvalsh(r).min()) >= -1e-12
    assert float(r.trace()) <= mu + 1e-12 and float(r.norm()) <= mu + 1e-12


def test_noise_statistics_and_fresh_noise() -> None:
    """sigma > 0: unbiased, entry std sigma without symmetrising, asymmetric then; two
    releases with different generators differ; symmetrising keeps Tr(R N)."""
    sigma, draws = 0.05, 400
    clean = _release(0.0, 0)
    noisy = torch.stack([_release(sigma, s, symmetrize=False) for s in range(draws)])
    noise = noisy - clean
    assert float(noise.mean(0).abs().max()) < 4 * sigma / math.sqrt(draws)
    assert float(noise.std()) == pytest.approx(sigma, rel=0.05)
    assert not torch.allclose(noisy[0], noisy[0].T)
    assert not torch.equal(noisy[0], noisy[1])
    sym = _release(sigma, 0)
    torch.testing.assert_close(sym, sym.T)
    torch.testing.assert_close((clean * sym).sum(), (clean * noisy[0]).sum())


def test_replace_one_sensitivity_is_sqrt2_mu_over_n() -> None:
    """Swapping one clipped vector for an orthogonal one moves R by sqrt(2) mu / n."""
    mu, n = 4.0, 100
    gen = torch.Generator().manual_seed(2)
    z = norm_clip(torch.randn(n, 8, generator=gen, dtype=torch.float64), mu)
    a, b = z.clone(), z.clone()
    a[0] = math.sqrt(mu) * torch.eye(8, dtype=torch.float64)[0]
    b[0] = math.sqrt(mu) * torch.eye(8, dtype=torch.float64)[1]
    gap = float((correlation(a) - correlation(b)).norm())
    assert gap == pytest.approx(sensitivity(mu, n), rel=1e-12)
    assert gap > sensitivity(mu, n, "paper")


def test_epsilon_values() -> None:
    """Closed form (Prop. 6.6) and Opacus' RDP accountant on reference numbers."""
    w = sensitivity(1.0, 1000, "paper")
    assert closed_form_epsilon(10, 0.01, w, 1e-5) == pytest.approx(1.5674, abs=1e-3)
    assert rdp_epsilon(10, 0.01, w, 1e-5) == pytest.approx(1.3085, abs=0.01)
    # Table 6, SVHN (eps 6, delta 1e-2): mu 2, sigma 0.0018, 100 releases, |D_j| 10,000
    w2 = sensitivity(2.0, 10_000)
    assert closed_form_epsilon(100, 0.0018, w2, 1e-2) == pytest.approx(6.00, abs=0.02)
    assert rdp_epsilon(100, 0.0018, w2, 1e-2) == pytest.approx(5.00, abs=0.05)
    assert rdp_epsilon(0, 0.01, w, 1e-5) == 0.0 and rdp_epsilon(3, 0.0, w, 1e-5) == math.inf


def test_calibrated_noise_gives_the_target_epsilon() -> None:
    """The noise scale matches epsilon: calibrate, then account; monotone in every argument."""
    w = sensitivity(2.0, 10_000)
    sigma = calibrate_sigma(6.0, 100, w, 1e-2)
    assert sigma == pytest.approx(0.00180, abs=2e-5)
    assert closed_form_epsilon(100, sigma, w, 1e-2) == pytest.approx(6.0, rel=1e-9)
    eps = rdp_epsilon(100, sigma, w, 1e-2)
    assert eps < 6.0
    assert rdp_epsilon(100, 2 * sigma, w, 1e-2) < eps < rdp_epsilon(200, sigma, w, 1e-2)
    assert rdp_epsilon(100, sigma, sensitivity(2.0, 20_000), 1e-2) < eps
    assert rdp_epsilon(100, sigma, sensitivity(4.0, 10_000), 1e-2) > eps


@pytest.mark.parametrize(
    ("releases", "sigma", "n", "delta"),
    [
        (1, 0.01, 1000, 1e-5),
        (10, 0.01, 1000, 1e-5),
        (100, 0.0018, 10_000, 1e-2),
        (7, 0.3, 50, 1e-3),
    ],
)
def test_rdp_epsilon_matches_opacus(releases: int, sigma: float, n: int, delta: float) -> None:
    """The accountant computed here equals Opacus' RDPAccountant at sample rate 1."""
    from opacus.accountants import RDPAccountant

    w = sensitivity(1.0, n)
    accountant = RDPAccountant()
    accountant.history = [(sigma / w, 1.0, releases)]
    assert rdp_epsilon(releases, sigma, w, delta) == pytest.approx(
        accountant.get_epsilon(delta), rel=1e-12
    )


@pytest.mark.parametrize(
    ("releases", "sigma", "n", "delta", "before"),
    [
        (1, 0.01, 1000, 1e-5, 0.5458132098177005),
        (10, 0.01, 1000, 1e-5, 1.9142498748403742),
        (100, 0.0018, 10_000, 1e-2, 2.015014349781019),
        (7, 0.3, 50, 1e-3, 0.6863022302309583),
        (50, 0.05, 600, 1e-5, 1.3862750468052076),
    ],
)
def test_rdp_epsilon_is_unchanged_by_the_move_to_opacus(
    releases: int, sigma: float, n: int, delta: float, before: float
) -> None:
    """The epsilons the hand-written copy of Opacus' formula reported (`before`, printed by
    that code) are the ones Opacus' analysis now gives."""
    assert rdp_epsilon(releases, sigma, sensitivity(1.0, n), delta) == pytest.approx(
        before, rel=1e-12
    )
