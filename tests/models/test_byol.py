"""BYOL's loss, target update and online/target pair against their definitions."""

from __future__ import annotations

import pytest
import torch

from client.training import SGD, train_two_views
from models.byol import BYOLPair, byol_loss, ema_update
from models.ssl_nets import build_contrastive_net


def test_byol_loss_is_two_minus_twice_the_cosine() -> None:
    g = torch.Generator().manual_seed(0)
    p, t = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    cos = [float(p[i] @ t[i]) / (float(p[i].norm()) * float(t[i].norm())) for i in range(5)]
    assert float(byol_loss(p, t)) == pytest.approx(sum(2 - 2 * c for c in cos) / 5, rel=1e-6)
    assert float(byol_loss(p, 3.0 * p)) == pytest.approx(0.0, abs=1e-6)  # scale-free
    assert float(byol_loss(p, -p)) == pytest.approx(4.0, rel=1e-6)


def test_byol_loss_treats_the_target_as_a_constant() -> None:
    p, t = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    byol_loss(p, t).backward()
    assert p.grad is not None and t.grad is None
    with pytest.raises(ValueError, match="shape"):
        byol_loss(torch.randn(3, 4), torch.randn(3, 5))


def test_ema_update_moves_parameters_and_copies_buffers() -> None:
    target, online = torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    with torch.no_grad():
        target.weight.fill_(1.0)
        online.weight.fill_(3.0)
        online.running_mean.fill_(5.0)  # type: ignore[union-attr]
    ema_update(target, online, 0.99)
    torch.testing.assert_close(target.weight, torch.full((3,), 0.99 + 0.01 * 3.0))
    torch.testing.assert_close(target.running_mean, torch.full((3,), 5.0))
    ema_update(target, online, 0.0)
    torch.testing.assert_close(target.weight, online.weight)


def _pair(beta: float = 0.9) -> BYOLPair:
    torch.manual_seed(0)
    return BYOLPair(build_contrastive_net("cnn-gn", (1, 8, 8), dim=4, predictor=True), beta)


def test_pair_gives_prediction_and_target_of_a_view() -> None:
    """The target starts as the received online network and is not trained; the forward of a
    view is [prediction | target projection] and the loss is BYOL's symmetrised one."""
    pair = _pair()
    x1, x2 = torch.randn(6, 1, 8, 8), torch.randn(6, 1, 8, 8)
    out1, out2 = pair(x1), pair(x2)
    assert out1.shape == (6, 8)
    torch.testing.assert_close(out1[:, :4], pair.online.predict(x1))
    torch.testing.assert_close(out1[:, 4:], pair.online(x1))  # target == online at the start
    assert all(not p.requires_grad for p in pair.target.parameters())
    expected = byol_loss(out1[:, :4], out2[:, 4:]) + byol_loss(out2[:, :4], out1[:, 4:])
    torch.testing.assert_close(pair.symmetric_loss(out1, out2), expected)


def test_pair_target_follows_the_online_network_after_each_step() -> None:
    """One step of the two-view loop with the pair's update: target = beta * start + (1 - beta)
    * online after the step; the predictor's weights move, the target has none."""
    beta = 0.9
    pair = _pair(beta)
    start = [p.detach().clone() for p in pair.target.parameters()]
    predictor = [p.detach().clone() for p in pair.online.predictor.parameters()]  # type: ignore[union-attr]
    params = [p for p in pair.parameters() if p.requires_grad]
    assert len(params) == len(list(pair.online.parameters()))
    train_two_views(
        pair, torch.randn(4, 1, 8, 8), lambda b, g: b + 0.1 * torch.randn(b.shape, generator=g),
        pair.symmetric_loss, epochs=1, batch_size=4, opt=SGD(params, 0.5),
        generator=torch.Generator().manual_seed(1), after_step=pair.update_target,
    )  # fmt: skip
    online = [*pair.online.backbone.parameters(), *pair.online.projector.parameters()]
    for kept, first, now in zip(pair.target.parameters(), start, online, strict=True):
        torch.testing.assert_close(kept, beta * first + (1 - beta) * now.detach())
    moved = zip(pair.online.predictor.parameters(), predictor, strict=True)  # type: ignore[union-attr]
    assert any(not torch.equal(p, q) for p, q in moved)


def test_pair_needs_a_predictor_and_a_rate_in_range() -> None:
    with pytest.raises(ValueError, match="predictor"):
        BYOLPair(build_contrastive_net("cnn", (1, 8, 8), dim=4), 0.99)
    with pytest.raises(ValueError, match="EMA rate"):
        BYOLPair(build_contrastive_net("cnn", (1, 8, 8), dim=4, predictor=True), 1.5)
    with pytest.raises(ValueError, match="no predictor"):
        build_contrastive_net("cnn", (1, 8, 8), dim=4).predict(torch.randn(2, 1, 8, 8))
