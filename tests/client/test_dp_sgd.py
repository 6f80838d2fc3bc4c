"""DP-SGD's loop (client.dp_sgd) against plain computations: without noise and clipping it is
full-batch SGD; clipping clips each example's (weighted) gradient, so FedEM's weights reach the
right examples; the noise has the stated scale; batches are Opacus' Poisson draws; an empty
batch still steps; data-independent terms are added unclipped."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from client.dp_sgd import train_private
from client.training import SGD, train_classifier
from models.losses import per_sample_loss
from models.privacy import PoissonPlan, poisson_plan

N, D, C = 12, 5, 3


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(N, D, generator=gen), torch.randint(0, C, (N,), generator=gen)


def _model(seed: int = 1) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, 4), nn.Tanh(), nn.Linear(4, C))


def _private(model: nn.Module, opt: SGD, plan: PoissonPlan, z: float, clip: float,
             epochs: int = 1, seed: int = 0, **kw: object) -> tuple[float, int]:  # fmt: skip
    x, y = _data()
    return train_private(
        model, x, y, epochs=epochs, plan=plan, noise_multiplier=z, max_grad_norm=clip,
        optimizer=opt, sampling=torch.Generator().manual_seed(seed),
        noise=torch.Generator().manual_seed(seed + 1), **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(("momentum", "weight_decay", "mu"), [(0.0, 0.0, 0.0), (0.9, 1e-2, 0.5)])
def test_without_noise_or_clipping_it_is_full_batch_sgd(
    momentum: float, weight_decay: float, mu: float
) -> None:
    """Sample rate 1 (batch size >= n: every example in every batch), no noise, a clipping
    bound no gradient reaches: the steps of the plain loop on one batch of all examples, with
    the same momentum, weight decay and proximal term."""
    x, y = _data()
    anchors = _params(_model())

    def proximal(m: nn.Module) -> torch.Tensor:
        pairs = zip(m.parameters(), anchors, strict=True)
        return 0.5 * mu * sum(((p - a) ** 2).sum() for p, a in pairs)  # type: ignore[return-value]

    private, plain = _model(), _model()
    opt = SGD(list(private.parameters()), 0.3, momentum, weight_decay)
    loss, steps = _private(private, opt, poisson_plan(N, 32), 0.0, 1e6, epochs=4,
                           proximal=proximal if mu else None)  # fmt: skip
    plain_loss = train_classifier(
        plain, x, y, epochs=4, batch_size=32, lr=0.3, momentum=momentum,
        weight_decay=weight_decay, proximal=proximal if mu else None,
    )  # fmt: skip
    assert steps == 4 and loss == pytest.approx(plain_loss, rel=1e-5)
    for a, b in zip(private.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert all(b is not None for b in opt.buffers) == (momentum > 0)  # buffers kept for state
    assert not any(hasattr(p, "grad_sample") for p in private.parameters())  # hooks removed


def _clipped_mean_step(model: nn.Module, clip: float, weights: torch.Tensor) -> list[torch.Tensor]:
    """One step's update by hand: each example's gradient of w_i * loss_i, clipped to `clip`
    over all parameters, summed and divided by n."""
    x, y = _data()
    total = [torch.zeros_like(p) for p in model.parameters()]
    for i in range(N):
        model.zero_grad()
        (weights[i] * per_sample_loss(model(x[i : i + 1]), y[i : i + 1])).sum().backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]  # type: ignore[union-attr]
        norm = torch.cat([g.flatten() for g in grads]).norm()
        scale = min(1.0, clip / (float(norm) + 1e-6))
        total = [t + scale * g for t, g in zip(total, grads, strict=True)]
    return [t / N for t in total]


def test_clipping_acts_on_each_examples_weighted_gradient() -> None:
    """The update is the mean of per-example clipped gradients of w_i * loss_i: an example of
    weight 0 contributes nothing, and the weights are looked up by example index."""
    weights = torch.tensor([0.0, 1.0, 0.5, 0.0, 1.0, 0.25, 1.0, 0.0, 0.75, 1.0, 0.1, 1.0])
    model = _model()
    before = _params(model)
    expected = _clipped_mean_step(_model(), 0.05, weights)
    _private(model, SGD(list(model.parameters()), 1.0), poisson_plan(N, 32), 0.0, 0.05,
             sample_weights=weights)  # fmt: skip
    for b, p, e in zip(before, model.parameters(), expected, strict=True):
        torch.testing.assert_close(b - p.detach(), e, rtol=1e-4, atol=1e-7)
    # permuting the weights changes the step: they reach particular examples
    other = _model()
    _private(other, SGD(list(other.parameters()), 1.0), poisson_plan(N, 32), 0.0, 0.05,
             sample_weights=weights.flip(0))  # fmt: skip
    assert not torch.allclose(next(other.parameters()), next(model.parameters()))


def test_noise_has_std_z_clip_over_the_expected_batch() -> None:
    """The same step with and without noise differs by N(0, (z C / E)^2) per coordinate (times
    the learning rate)."""
    torch.manual_seed(0)
    x, y = torch.randn(N, 400), torch.randint(0, C, (N,))

    def step(z: float) -> torch.Tensor:
        torch.manual_seed(2)
        model = nn.Linear(400, 50)
        train_private(model, x, y, epochs=1, plan=PoissonPlan(1.0, 1, 4), noise_multiplier=z,
                      max_grad_norm=0.5, optimizer=SGD(list(model.parameters()), 1.0),
                      sampling=torch.Generator().manual_seed(0),
                      noise=torch.Generator().manual_seed(7))  # fmt: skip
        return model.weight.detach().clone()

    diff = step(2.0) - step(0.0)
    assert float(diff.mean()) == pytest.approx(0.0, abs=0.02)
    assert float(diff.std()) == pytest.approx(2.0 * 0.5 / 4, rel=0.03)  # z C / E, E = 4


def test_batches_are_opacus_poisson_draws() -> None:
    """Every step sees the examples Opacus' UniformWithReplacementSampler draws from the same
    generator, ceil(n / B) steps an epoch."""
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    plan = poisson_plan(N, 5)
    seen: list[int] = []
    model = _model()
    model.register_forward_hook(lambda _m, inputs, _o: seen.append(len(inputs[0])))
    _, steps = _private(model, SGD(list(model.parameters()), 0.1), plan, 1.0, 1.0, epochs=2,
                        seed=5)  # fmt: skip
    sampler = UniformWithReplacementSampler(
        num_samples=N, sample_rate=plan.sample_rate, generator=torch.Generator().manual_seed(5),
        steps=plan.steps_per_epoch,
    )  # fmt: skip
    drawn = [len(b) for _ in range(2) for b in sampler]
    assert steps == 2 * 3 == len(drawn) and plan.sample_rate == pytest.approx(1 / 3)
    assert seen == [d for d in drawn if d > 0]


def test_an_empty_batch_still_takes_a_noisy_step() -> None:
    model = _model()
    before = _params(model)
    plan = PoissonPlan(1e-12, 3, 1)  # no example is ever drawn
    loss, steps = _private(model, SGD(list(model.parameters()), 1.0), plan, 0.0, 1.0)
    assert steps == 3 and loss == 0.0  # no example seen (the plain loop's figure then)
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    _, steps = _private(model, SGD(list(model.parameters()), 1.0), plan, 1.0, 1.0)
    assert steps == 3
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def test_random_flip_mirrors_drawn_images() -> None:
    x = torch.randn(N, 1, 2, 3, generator=torch.Generator().manual_seed(4))
    y = torch.randint(0, C, (N,), generator=torch.Generator().manual_seed(5))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(6, C))
    seen: list[torch.Tensor] = []
    model.register_forward_hook(lambda _m, inputs, _o: seen.append(inputs[0].detach().clone()))
    train_private(model, x, y, epochs=2, plan=poisson_plan(N, 32), noise_multiplier=0.0,
                  max_grad_norm=1.0, optimizer=SGD(list(model.parameters()), 0.1),
                  sampling=torch.Generator().manual_seed(0),
                  noise=torch.Generator().manual_seed(1), hflip=True)  # fmt: skip
    assert len(seen) == 2  # q = 1: every image drawn at each of the 2 steps
    flipped = [
        [torch.equal(batch[i], x[i].flip(-1)) and not torch.equal(batch[i], x[i]) for i in range(N)]
        for batch in seen
    ]
    assert all(
        torch.equal(batch[i], x[i]) or torch.equal(batch[i], x[i].flip(-1))
        for batch in seen
        for i in range(N)
    )
    assert 0 < sum(map(sum, flipped)) < 2 * N
