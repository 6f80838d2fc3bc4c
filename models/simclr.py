"""SimCLR's NT-Xent loss (Chen et al., ICML 2020), the FedAvg + SimCLR baseline of FedSC.

For a batch of b images and two views, the 2b representations are L2-normalised; each view's
positive is the other view of its image and its negatives are the other 2b - 2 views of the
batch. With one or two classes per client every negative is an image of the client's own
classes, the local-objective defect FedSC targets.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F  # noqa: N812


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over the 2b views of -log softmax over cosine similarities / temperature, at the
    view's positive, with the view itself excluded."""
    if z1.shape != z2.shape or z1.ndim != 2:
        shapes = f"{tuple(z1.shape)}, {tuple(z2.shape)}"
        raise ValueError(f"two views of shape (b, H) expected, got {shapes}")
    b = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    logits = z @ z.T / temperature
    logits = logits.masked_fill(torch.eye(2 * b, dtype=torch.bool, device=z.device), float("-inf"))
    positive = torch.cat([torch.arange(b, 2 * b), torch.arange(b)]).to(z.device)
    return F.cross_entropy(logits, positive)
