"""Classification losses and probabilities for both output conventions: one logit (binary,
sigmoid/BCE, as linear models on binary tasks use) or one logit per class (softmax/CE)."""

from __future__ import annotations

import torch
from torch.nn import functional as F  # noqa: N812


def per_sample_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood of each label, shape (n,)."""
    if logits.shape[1] == 1:
        return F.binary_cross_entropy_with_logits(
            logits[:, 0], y.to(logits.dtype), reduction="none"
        )
    losses = F.cross_entropy(logits, y, reduction="none")
    # sequence models (logits N x C x T): one loss per sequence, the mean over its positions
    return losses.flatten(1).mean(1) if losses.ndim > 1 else losses


def class_probabilities(logits: torch.Tensor) -> torch.Tensor:
    """p(y | x) per class, shape (n, C); a single logit means two classes."""
    if logits.shape[1] == 1:
        p1 = torch.sigmoid(logits[:, 0])
        return torch.stack([1.0 - p1, p1], dim=1)
    return torch.softmax(logits, dim=1)
