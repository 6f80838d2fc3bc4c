"""Classification losses and probabilities for both output conventions: one logit (binary,
sigmoid/BCE, as linear models on binary tasks use) or one logit per class (softmax/CE).

Sequence models output logits N x C x T for targets N x T (a class at every position). An
example is then one sequence: its loss is the mean of its token losses (FedEM's one latent
variable per sequence), while accuracy counts tokens. `class_weights` (C,) scales the loss of
each target class, as FedEM's Shakespeare criterion does; None leaves the loss unweighted.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F  # noqa: N812


def per_sample_loss(
    logits: torch.Tensor, y: torch.Tensor, class_weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Negative log-likelihood of each label, shape (n,)."""
    if logits.shape[1] == 1:
        if class_weights is not None:
            raise ValueError("class weights need one logit per class, not a single logit")
        return F.binary_cross_entropy_with_logits(
            logits[:, 0], y.to(logits.dtype), reduction="none"
        )
    losses = F.cross_entropy(logits, y, weight=class_weights, reduction="none")
    return _per_example(losses)


def probability_loss(
    probabilities: torch.Tensor, y: torch.Tensor, class_weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Negative log-likelihood of each label under given class probabilities (n, C) or
    (n, C, T), shape (n,); probabilities are clamped to 1e-12 before the log."""
    picked = probabilities.gather(1, y.unsqueeze(1)).squeeze(1).clamp_min(1e-12)
    losses = -picked.log()
    if class_weights is not None:
        losses = losses * class_weights.to(losses.dtype)[y]
    return _per_example(losses)


def correct_predictions(probabilities: torch.Tensor, y: torch.Tensor) -> tuple[int, int]:
    """(correct, made) predictions, a prediction being the most probable class on dim 1: one
    per example, or one per position of a sequence."""
    return int((probabilities.argmax(1) == y).sum()), y.numel()


def class_probabilities(logits: torch.Tensor) -> torch.Tensor:
    """p(y | x) per class, shape (n, C) (or (n, C, T)); a single logit means two classes."""
    if logits.shape[1] == 1:
        p1 = torch.sigmoid(logits[:, 0])
        return torch.stack([1.0 - p1, p1], dim=1)
    return torch.softmax(logits, dim=1)


def _per_example(losses: torch.Tensor) -> torch.Tensor:
    # sequences (N x T): one loss per sequence, the mean over its positions
    return losses.flatten(1).mean(1) if losses.ndim > 1 else losses
