"""Losses for sequences (one loss per sequence, the mean over its tokens), class weights, and
mixtures of per-token probabilities."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F  # noqa: N812

from models.losses import (
    class_probabilities,
    correct_predictions,
    per_sample_loss,
    probability_loss,
)
from models.mixture import mixture_probabilities


def _sequence_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, 5, generator=gen, dtype=torch.float64)  # N x C x T
    y = torch.randint(0, 6, (4, 5), generator=gen)
    weights = torch.rand(6, generator=gen, dtype=torch.float64) * 8
    return logits, y, weights


def test_a_sequence_loss_is_the_mean_of_its_weighted_token_losses() -> None:
    logits, y, weights = _sequence_batch()
    log_p = torch.log_softmax(logits, dim=1)
    for i in range(4):
        tokens = [-log_p[i, y[i, t], t] for t in range(5)]
        weighted = [weights[y[i, t]] * tokens[t] for t in range(5)]
        assert per_sample_loss(logits, y)[i] == pytest.approx(float(sum(tokens) / 5))
        assert per_sample_loss(logits, y, weights)[i] == pytest.approx(float(sum(weighted) / 5))


def test_weighted_classifier_loss_scales_each_label() -> None:
    logits, y, weights = _sequence_batch()
    flat, labels = logits[:, :, 0], y[:, 0]
    plain = per_sample_loss(flat, labels)
    torch.testing.assert_close(per_sample_loss(flat, labels, weights), weights[labels] * plain)
    assert torch.equal(plain, F.cross_entropy(flat, labels, reduction="none"))
    with pytest.raises(ValueError, match="one logit per class"):
        per_sample_loss(flat[:, :1], labels.clamp(max=1), weights)


def test_probability_loss_agrees_with_the_logit_loss() -> None:
    logits, y, weights = _sequence_batch()
    probs = class_probabilities(logits)
    for w in (None, weights):
        torch.testing.assert_close(probability_loss(probs, y, w), per_sample_loss(logits, y, w))
        flat_p, flat_y = probs[:, :, 2], y[:, 2]
        torch.testing.assert_close(
            probability_loss(flat_p, flat_y, w), per_sample_loss(logits[:, :, 2], flat_y, w)
        )


def test_accuracy_counts_tokens() -> None:
    probs = torch.zeros(2, 3, 4)
    probs[0, 1, :] = 1.0  # sequence 0 predicts class 1 everywhere
    probs[1, 2, :] = 1.0  # sequence 1 predicts class 2 everywhere
    y = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 2]])
    assert correct_predictions(probs, y) == (4, 8)
    assert correct_predictions(probs[:, :, 0], y[:, 0]) == (1, 2)


def test_sequence_mixture_mixes_each_position_with_the_same_weights() -> None:
    gen = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(3, 4, 6, 5, generator=gen, dtype=torch.float64), dim=2)
    pi = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    mixed = mixture_probabilities(pi, probs)
    assert mixed.shape == (4, 6, 5)
    for t in range(5):
        torch.testing.assert_close(mixed[:, :, t], mixture_probabilities(pi, probs[:, :, :, t]))
    torch.testing.assert_close(mixed.sum(1), torch.ones(4, 5, dtype=torch.float64))
