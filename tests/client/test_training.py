from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from client.training import SGD, evaluate_classifier, get_weights, set_weights, train_classifier
from tests.fakes import FixedLogits


@pytest.mark.parametrize(("momentum", "weight_decay"), [(0.0, 0.0), (0.9, 0.0), (0.9, 1e-2)])
def test_sgd_matches_torch_optim(momentum: float, weight_decay: float) -> None:
    torch.manual_seed(0)
    a, b = nn.Linear(5, 3), nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    ours = SGD(list(a.parameters()), lr=0.1, momentum=momentum, weight_decay=weight_decay)
    ref = torch.optim.SGD(b.parameters(), lr=0.1, momentum=momentum, weight_decay=weight_decay)
    x, y = torch.randn(16, 5), torch.randint(0, 3, (16,))
    for _ in range(5):
        for model, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb)


def test_training_fits_a_separable_problem_and_is_seeded() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(200, 2, generator=gen)
    y = (x[:, 0] > 0).long()

    def fit() -> tuple[nn.Module, float]:
        torch.manual_seed(0)
        model = nn.Linear(2, 2)
        loss = train_classifier(
            model,
            x,
            y,
            epochs=20,
            batch_size=16,
            lr=0.5,
            generator=torch.Generator().manual_seed(1),
        )
        return model, loss

    model, loss = fit()
    _, acc = evaluate_classifier(model, x, y)
    assert acc > 0.95 and loss < 0.3
    again, loss2 = fit()
    assert loss2 == loss
    for k, v in get_weights(model).items():
        np.testing.assert_array_equal(v, get_weights(again)[k])


def test_weights_round_trip_and_empty_split() -> None:
    a, b = nn.Linear(3, 2), nn.Linear(3, 2)
    set_weights(b, get_weights(a))
    torch.testing.assert_close(a.weight, b.weight)
    loss, acc = evaluate_classifier(a, torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))
    assert np.isnan(loss) and np.isnan(acc)


def test_sequences_score_accuracy_over_tokens_and_loss_per_sequence() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 4, 3, generator=gen)  # 5 sequences, 4 classes, 3 positions
    y = torch.randint(0, 4, (5, 3), generator=gen)
    weights = torch.tensor([0.5, 1.0, 2.0, 8.0])
    model, index = FixedLogits(logits), torch.arange(5)
    tokens = nn.functional.cross_entropy(logits, y, reduction="none")  # 5 x 3
    right = (logits.argmax(1) == y).float().mean()
    for w, token_losses in ((None, tokens), (weights, tokens * weights[y])):
        loss, acc = evaluate_classifier(model, index, y, batch_size=2, class_weights=w)
        assert acc == pytest.approx(float(right))
        assert loss == pytest.approx(float(token_losses.mean(1).mean()), rel=1e-6)
