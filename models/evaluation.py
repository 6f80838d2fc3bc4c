"""Evaluation of a classifier on a labelled split (clients' local splits, the server's test set)."""

from __future__ import annotations

import torch
from torch import nn

from models.losses import class_probabilities, correct_predictions, per_sample_loss
from models.modes import set_training


@torch.no_grad()
def evaluate_classifier(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 1024,
    class_weights: torch.Tensor | None = None,
) -> tuple[float, float]:
    """(mean cross-entropy per example, accuracy over predicted labels, i.e. tokens for
    sequences); (nan, nan) on an empty split."""
    if len(y) == 0:
        return float("nan"), float("nan")
    set_training(model, False)
    loss_sum, correct, made = 0.0, 0, 0
    for start in range(0, len(y), batch_size):
        logits = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        loss_sum += float(per_sample_loss(logits, target, class_weights).sum())
        right, count = correct_predictions(class_probabilities(logits), target)
        correct, made = correct + right, made + count
    return loss_sum / len(y), correct / made
