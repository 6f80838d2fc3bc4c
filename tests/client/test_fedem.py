"""FedEM's personalised predictor on sequences: per-token probabilities mixed with pi."""

from __future__ import annotations

import pytest
import torch

from client.common import Tensors
from client.fedem import mixture_metrics
from tests.fakes import FixedLogits


@pytest.mark.parametrize("weighted", [False, True])
def test_sequence_mixture_metrics_mix_each_token(weighted: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    logits = [torch.randn(7, 5, 4, generator=gen) for _ in range(2)]  # N x C x T per component
    y = torch.randint(0, 5, (7, 4), generator=gen)
    weights = torch.rand(5, generator=gen) * 8 if weighted else None
    pi = torch.tensor([0.3, 0.7], dtype=torch.float64)
    data = Tensors(torch.arange(7), y, weights)
    metrics = mixture_metrics([FixedLogits(lg) for lg in logits], pi, data, batch_size=3)

    mixed = sum(p * torch.softmax(lg.double(), 1) for p, lg in zip(pi, logits, strict=True))
    assert isinstance(mixed, torch.Tensor)
    nll = -mixed.gather(1, y.unsqueeze(1)).squeeze(1).log()  # 7 x 4
    if weights is not None:
        nll = nll * weights.double()[y]
    assert metrics["test-examples"] == 7
    assert metrics["test-accuracy"] == pytest.approx(float((mixed.argmax(1) == y).double().mean()))
    assert metrics["test-loss"] == pytest.approx(float(nll.mean(1).mean()))
