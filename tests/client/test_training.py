from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from client.training import SGD, batches, local_passes, train_classifier, train_two_views
from models.evaluation import evaluate_classifier
from models.weights import get_weights, set_weights
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


def _noisy(batch: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return batch + 0.1 * torch.randn(batch.shape, generator=generator)


def test_two_view_training_sees_two_views_and_skips_a_lone_image() -> None:
    """Batches of 2, 2 and 1 images: the objective gets two different views of each of the
    first two batches, the single image is skipped, and the mean objective is returned."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2, bias=False)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def objective(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        seen.append((z1.detach(), z2.detach()))
        return ((z1 - z2) ** 2).sum(dim=1).mean()

    x = torch.randn(5, 3)
    last = train_two_views(
        model, x, _noisy, objective, epochs=1, batch_size=2,
        opt=SGD(list(model.parameters()), 0.0), generator=torch.Generator().manual_seed(1),
    )  # fmt: skip
    assert [len(z1) for z1, _ in seen] == [2, 2]
    assert all(not torch.equal(z1, z2) for z1, z2 in seen)
    expected = np.mean([float(((z1 - z2) ** 2).sum(dim=1).mean()) for z1, z2 in seen])
    assert last == pytest.approx(expected)


def test_two_view_loss_scale_scales_the_step() -> None:
    """Without momentum, loss_scale 2 at lr 0.05 takes the same steps as scale 1 at lr 0.1."""
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(2))
    weights = []
    for scale, lr in ((2.0, 0.05), (1.0, 0.1)):
        torch.manual_seed(0)
        model = nn.Linear(3, 2, bias=False)
        train_two_views(
            model, x, _noisy, lambda a, b: -(a * b).sum(dim=1).mean() + (a**2).mean(),
            epochs=2, batch_size=4, opt=SGD(list(model.parameters()), lr),
            generator=torch.Generator().manual_seed(3), loss_scale=scale,
        )  # fmt: skip
        weights.append(model.weight.detach().clone())
    torch.testing.assert_close(weights[0], weights[1])


class _Recorder(nn.Module):
    """A linear classifier on flat inputs that records each batch it is given."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 2)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.detach().clone())
        out: torch.Tensor = self.linear(x.flatten(1))
        return out


@pytest.mark.parametrize(
    ("n", "batch", "drop_last", "sizes"),
    [
        (10, 4, False, [4, 4, 2]),
        (10, 4, True, [4, 4]),  # the incomplete last batch is skipped
        (8, 4, True, [4, 4]),  # nothing incomplete to skip
        (3, 4, True, [3]),  # one batch only: kept (FedEM's reference: n > batch)
        (4, 4, True, [4]),
    ],
)
def test_drop_last_skips_only_an_incomplete_last_batch(
    n: int, batch: int, drop_last: bool, sizes: list[int]
) -> None:
    model = _Recorder(3)
    x, y = torch.randn(n, 3), torch.randint(0, 2, (n,))
    train_classifier(model, x, y, epochs=2, batch_size=batch, lr=0.1,
                     generator=torch.Generator().manual_seed(0), drop_last=drop_last)  # fmt: skip
    assert [len(b) for b in model.seen] == sizes * 2


def test_random_flip_mirrors_about_half_the_images_and_nothing_else() -> None:
    n = 400
    x = torch.randn(n, 1, 2, 3)  # each image distinct, none symmetric
    y = torch.zeros(n, dtype=torch.long)
    model = _Recorder(6)
    train_classifier(model, x, y, epochs=1, batch_size=n, lr=0.0,
                     generator=None, hflip=True)  # fmt: skip
    assert torch.equal(model.seen[0], x)  # no generator: no random augmentation at all
    model = _Recorder(6)
    gen = torch.Generator().manual_seed(1)
    train_classifier(model, x, y, epochs=1, batch_size=n, lr=0.0, generator=gen, hflip=True)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    seen, original = model.seen[0], x[order]
    same = (seen == original).flatten(1).all(1)
    mirrored = (seen == original.flip(-1)).flatten(1).all(1)
    assert bool((same ^ mirrored).all())  # every image either as it was or mirrored
    assert 0.4 < float(mirrored.float().mean()) < 0.6


class PerExampleLogits(nn.Module):
    """One free row of logits per example; its input is the examples' indices."""

    def __init__(self, rows: torch.Tensor) -> None:
        super().__init__()
        self.rows = nn.Parameter(rows.clone())

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return self.rows[index]


def test_sample_weights_follow_their_examples_through_shuffled_batches() -> None:
    """FedEM's M-step (Marfoq et al., 2021, Alg. 2, LocalSolver): each minibatch I minimises
    (1/|I|) Σ_{i∈I} q_i l(θ; s_i), q_i looked up by the sample's index. With one free logit row
    per example and plain SGD, one shuffled epoch moves row i exactly once, by
    −η q_i/|B(i)| ∇l_i, B(i) the batch that held example i (the last batch is short); a zero
    weight leaves its row alone."""
    n, classes, batch, lr = 50, 3, 16, 0.5
    gen = torch.Generator().manual_seed(4)
    rows = torch.randn(n, classes, generator=gen)
    y = torch.randint(0, classes, (n,), generator=gen)
    weights = torch.rand(n, generator=gen) * 2
    weights[::7] = 0.0
    model = PerExampleLogits(rows)
    shuffle = torch.Generator().manual_seed(11)
    train_classifier(model, torch.arange(n), y, epochs=1, batch_size=batch, lr=lr,
                     generator=shuffle, sample_weights=weights)  # fmt: skip
    size = torch.empty(n)
    for idx in batches(n, batch, torch.Generator().manual_seed(11)):  # the same shuffle
        size[idx] = len(idx)
    assert sorted(set(size.tolist())) == [2.0, 16.0]
    grad = torch.softmax(rows, dim=1) - nn.functional.one_hot(y, classes)  # ∇ of CE per row
    expected = rows - lr * (weights / size)[:, None] * grad
    torch.testing.assert_close(model.rows.detach(), expected)
    assert torch.equal(model.rows.detach()[::7], rows[::7])
def test_local_passes_count_batches_in_epochs_or_in_steps() -> None:
    def flat(epochs: int, steps: int, n: int = 10) -> list[list[int]]:
        gen = torch.Generator().manual_seed(0)
        return [[len(idx) for idx in p] for p in local_passes(n, 4, gen, epochs, steps)]

    assert flat(2, 0) == [[4, 4, 2], [4, 4, 2]]  # epochs: whole passes
    assert flat(2, 7) == [[4, 4, 2], [4, 4, 2], [4]]  # 7 steps whatever the epochs
    assert flat(5, 2) == [[4, 4]]  # a budget shorter than a pass cuts it short
    assert flat(1, 3, n=0) == []  # nothing to step on
    gen = torch.Generator().manual_seed(0)
    passes = [torch.cat(list(p)) for p in local_passes(10, 4, gen, 1, 25)]
    for p in passes[:-1]:  # every full pass is a fresh permutation of the examples
        assert sorted(p.tolist()) == list(range(10))
    assert not torch.equal(passes[0], passes[1])


def _fit(steps: int, epochs: int) -> tuple[nn.Module, int]:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(50, 2, generator=gen)
    y = (x[:, 0] > 0).long()
    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    opt = SGD(list(model.parameters()), 0.1)
    taken = 0
    step = opt.step

    def counted() -> None:
        nonlocal taken
        taken += 1
        step()

    opt.step = counted  # type: ignore[method-assign]
    train_classifier(model, x, y, epochs=epochs, batch_size=16, lr=0.1, optimizer=opt,
                     generator=torch.Generator().manual_seed(1), steps=steps)  # fmt: skip
    return model, taken


def test_a_step_budget_takes_exactly_that_many_steps() -> None:
    assert _fit(steps=0, epochs=2)[1] == 8  # 2 epochs of ceil(50/16) = 4 batches
    assert _fit(steps=3, epochs=2)[1] == 3
    assert _fit(steps=11, epochs=1)[1] == 11
    # a budget of whole epochs draws the same batches as those epochs: the same model, bit for bit
    by_epochs, by_steps = _fit(steps=0, epochs=2)[0], _fit(steps=8, epochs=1)[0]
    for k, v in get_weights(by_epochs).items():
        np.testing.assert_array_equal(v, get_weights(by_steps)[k])
