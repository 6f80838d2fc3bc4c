"""Kernel Inception Distance, computed with a feature network trained inside the project.

KID (Binkowski et al. 2018) is the unbiased estimate of the squared MMD between real and
generated feature sets under the cubic polynomial kernel k(a, b) = (a.b/D + 1)^3, averaged
over random subsets (as torchmetrics' KernelInceptionDistance, which the ADEPT authors used).
The features here are NOT Inception's: they are the penultimate layer of a small CNN
(models.classifiers.SmallCNN) trained on the embedded dataset's training images, so values are
comparable between our methods but not with the paper's Inception-based KID.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from models.classifiers import SmallCNN


def polynomial_kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a @ b.T / a.shape[1] + 1.0) ** 3


def mmd2_unbiased(real: np.ndarray, fake: np.ndarray) -> float:
    """Unbiased MMD^2 (diagonals of the within-set kernel matrices excluded)."""
    m, n = len(real), len(fake)
    if m < 2 or n < 2:
        raise ValueError(f"KID needs at least 2 samples on each side, got {m} and {n}")
    kxx, kyy = polynomial_kernel(real, real), polynomial_kernel(fake, fake)
    kxy = polynomial_kernel(real, fake)
    return float(
        (kxx.sum() - np.trace(kxx)) / (m * (m - 1))
        + (kyy.sum() - np.trace(kyy)) / (n * (n - 1))
        - 2 * kxy.mean()
    )


def kid(
    real: np.ndarray, fake: np.ndarray, subsets: int = 100, subset_size: int = 100,
    rng: np.random.Generator | None = None,
) -> tuple[float, float]:  # fmt: skip
    """(mean, std) of the unbiased MMD^2 over `subsets` random subsets of each set, each of
    min(subset_size, len(real), len(fake)) samples drawn without replacement."""
    rng = rng if rng is not None else np.random.default_rng(0)
    size = min(subset_size, len(real), len(fake))
    values = [
        mmd2_unbiased(
            real[rng.choice(len(real), size, replace=False)],
            fake[rng.choice(len(fake), size, replace=False)],
        )
        for _ in range(subsets)
    ]
    return float(np.mean(values)), float(np.std(values))


def train_feature_net(
    x: np.ndarray, y: np.ndarray, num_classes: int, epochs: int, seed: int, batch: int = 64,
    lr: float = 1e-3,
) -> SmallCNN:  # fmt: skip
    """A SmallCNN classifier trained with Adam on images x in [0, 1] (N, C, H, W) and labels y."""
    torch.manual_seed(seed)
    net = SmallCNN(tuple(x.shape[1:]), num_classes)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    xt, yt = torch.from_numpy(x).float(), torch.from_numpy(y).long()
    g = torch.Generator().manual_seed(seed)
    net.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(xt), generator=g).split(batch):
            opt.zero_grad()
            nn.functional.cross_entropy(net(xt[idx]), yt[idx]).backward()
            opt.step()
    return net.eval()


@torch.no_grad()
def features(net: SmallCNN, x: torch.Tensor) -> np.ndarray:
    """The feature net's penultimate activations (the ReLU output before the last Linear)."""
    out = net.head[:-1](net.features(x.float()))
    assert isinstance(out, torch.Tensor)
    return np.asarray(out.double().numpy())
