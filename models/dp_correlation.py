"""DP-CalR (FedSC paper, Algorithm 2) and the privacy accounting of its releases.

A release is the clipped correlation matrix of a client's whole training split, averaged over
`passes` x `views_per_pass` augmented views of every image, plus i.i.d. Gaussian noise on all
H x H entries. Only this matrix is protected; model weights travel in the clear.

Sensitivity: every image contributes (1/n) mean_v z_v z_v^T, a PSD matrix of Frobenius norm at
most mu / n. Replacing one image changes R by the difference of two such matrices, whose norm can
reach sqrt(2) mu / n (two orthogonal rank-one terms), not the paper's mu / n. The default here is
the sqrt(2) bound (the one the paper's Table 6 noise levels match); 'paper' gives mu / n.

Accounting: a release is the Gaussian mechanism on the H x H matrix (l2 = Frobenius sensitivity
W above, noise std sigma on every entry, so noise multiplier sigma / W) applied to the whole
training split (sample rate 1); T releases are accounted by Opacus' RDP accountant
(models.privacy.gaussian_epsilon), beside the paper's closed-form bound (Prop. 6.6).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from models.privacy import gaussian_epsilon
from models.spectral import norm_clip

Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


@torch.no_grad()
def dp_correlation(
    encode: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    augment: Augment,
    mu: float,
    sigma: float,
    views: torch.Generator,
    noise: torch.Generator,
    passes: int = 5,
    views_per_pass: int = 2,
    batch_size: int = 512,
    symmetrize: bool = True,
) -> tuple[torch.Tensor, float]:
    """(R~, fraction of clipped representations). `encode` maps inputs to representations (a
    model in eval mode); `views` draws augmentations, `noise` the DP noise and must be the
    client's private generator. `symmetrize` returns (R~ + R~^T)/2: post-processing, so the
    guarantee is unchanged, and FedSC's objective only sees the symmetric part of R~ anyway."""
    total: torch.Tensor | None = None
    clipped, count = 0, 0
    for _ in range(passes * views_per_pass):
        for start in range(0, len(x), batch_size):
            z = encode(augment(x[start : start + batch_size], views)).double()
            clipped += int((z.norm(dim=1) >= math.sqrt(mu)).sum())
            z = norm_clip(z, mu)
            part = z.T @ z
            total = part if total is None else total + part
            count += len(z)
    if total is None:
        raise ValueError("DP-CalR needs at least one example")
    r = total / count
    if sigma > 0:
        # drawn from the private (CPU) generator, then moved to R's device
        r = r + sigma * torch.randn(r.shape, generator=noise, dtype=r.dtype).to(r.device)
    if symmetrize:
        r = (r + r.T) / 2
    return r, clipped / count


def sensitivity(mu: float, n: int, convention: str = "sqrt2") -> float:
    """l2 (Frobenius) sensitivity of one release under replace-one neighbouring."""
    if convention == "sqrt2":
        return math.sqrt(2.0) * mu / n
    if convention == "paper":
        return mu / n
    raise ValueError(f"unknown sensitivity convention {convention!r}")


def closed_form_epsilon(releases: int, sigma: float, w: float, delta: float) -> float:
    """The paper's bound (Prop. 6.6, with the |D_j|^2 its proof has): r/2 + sqrt(2 r ln(1/delta)),
    r = T W^2 / sigma^2."""
    if releases == 0:
        return 0.0
    if sigma <= 0:
        return math.inf
    r = releases * w * w / (sigma * sigma)
    return r / 2 + math.sqrt(2 * r * math.log(1 / delta))


def rdp_epsilon(releases: int, sigma: float, w: float, delta: float) -> float:
    """epsilon after `releases` Gaussian releases of sensitivity w and noise std sigma, by
    Opacus' RDP accountant (models.privacy.gaussian_epsilon: noise multiplier sigma / w, sample
    rate 1, since the server knows whom it asked, so there is no amplification by sampling).
    At sample rate 1 the RDP of order a after T releases is T a / (2 z^2)."""
    if releases == 0:
        return 0.0
    if sigma <= 0:
        return math.inf
    return gaussian_epsilon(releases, sigma / w, delta)


def release_epsilon(
    releases: int,
    num_train: int,
    *,
    mu: float,
    noise_std: float,
    delta: float,
    convention: str,
) -> float:
    """Epsilon (Opacus' RDP accountant) of a client with `num_train` training examples after
    `releases` DP-CalR releases with clipping mu, noise std and delta, at the sensitivity of
    `convention` (the run's `fedsc.mu`, `fedsc.noise-std`, `fedsc.delta`,
    `fedsc.sensitivity`)."""
    w = sensitivity(mu, max(num_train, 1), convention)
    return rdp_epsilon(releases, noise_std, w, delta)


def calibrate_sigma(target_epsilon: float, releases: int, w: float, delta: float) -> float:
    """Noise std giving `target_epsilon` after `releases` releases under the closed form (the
    paper's calibration; Opacus' accountant then reports a somewhat smaller epsilon)."""
    log_term = 2 * math.log(1 / delta)
    a = math.sqrt(log_term + 2 * target_epsilon) - math.sqrt(log_term)
    return w * math.sqrt(releases) / a
