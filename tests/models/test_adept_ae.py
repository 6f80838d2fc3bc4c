"""ADEPT-AE math: the per-weight prior's gradients, per-weight sigma dynamics, clipping and
clamps, lazy sigma, the local-training limit and the server mean."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from client.training import SGD
from models.adept_ae import (
    AEHyper,
    average,
    clip_linf,
    local_round,
    mu_step,
    prior_term,
    sigma_gradient,
    sigma_step,
    theta_network,
)
from models.autoencoder import (
    ConvAutoencoder,
    LinearAutoencoder,
    reconstruction_metrics,
    squared_errors,
)

XI = 1e-3


def _tensors(seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (4,)]
    theta = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    mu = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    sigma = [0.5 + torch.rand(s, generator=g, dtype=torch.float64) for s in shapes]
    return theta, mu, sigma


def test_prior_gradients_match_autograd() -> None:
    theta, mu, sigma = _tensors(0)
    theta = [t.requires_grad_() for t in theta]
    mu = [m.requires_grad_() for m in mu]
    sigma = [s.requires_grad_() for s in sigma]
    grads = torch.autograd.grad(prior_term(theta, mu, sigma, XI), [*theta, *mu, *sigma])
    for i in range(2):
        t, m, s = theta[i].detach(), mu[i].detach(), sigma[i].detach()
        torch.testing.assert_close(grads[i], (t - m) / s**2)
        torch.testing.assert_close(grads[2 + i], (m - t) / s**2)
        torch.testing.assert_close(grads[4 + i], sigma_gradient(t, m, s, XI))


def test_per_weight_sigma_converges_to_its_stationary_value() -> None:
    mu = _tensors(9)[1]
    clients = [
        [m + 0.5 * t for m, t in zip(mu, _tensors(seed)[0], strict=True)] for seed in range(3)
    ]
    sigma = [torch.ones_like(m) for m in mu]
    xi = 0.05  # sigma_j >= sqrt(2 xi): the step 0.02 stays below sigma_j^2 (stable)
    hp = AEHyper(eta3=0.02, xi=xi, clip_sigma=1e9)
    for _ in range(400):
        replies = [sigma_step(theta, mu, sigma, hp) for theta in clients]
        sigma = [torch.stack([r[i] for r in replies]).mean(0) for i in range(2)]
    for i in range(2):
        spread = torch.stack([(c[i] - mu[i]) ** 2 for c in clients]).mean(0)
        torch.testing.assert_close(sigma[i] ** 2, 2 * xi + spread, rtol=1e-6, atol=1e-8)


def test_clip_rescales_jointly_and_sigma_is_clipped_per_tensor_and_clamped() -> None:
    a, b = torch.tensor([4.0, -1.0]), torch.tensor([0.5])
    ca, cb = clip_linf([a, b], 1.0)
    torch.testing.assert_close(ca, a / 4, rtol=1e-5, atol=0)
    torch.testing.assert_close(cb, b / 4, rtol=1e-5, atol=0)
    torch.testing.assert_close(clip_linf([b], 1.0)[0], b)
    # a tiny sigma has a huge negative gradient: clipped to 10, then clamped from below
    theta, mu = [torch.tensor([0.0, 0.0])], [torch.tensor([0.0, 5.0])]
    out = sigma_step(theta, mu, [torch.tensor([2e-3, 2e-3])], AEHyper(eta3=1.0, xi=0.0))
    assert torch.all(out[0] <= 100.0) and torch.all(out[0] >= 1e-3)
    # the second weight's gradient dominates and is clipped to -10: sigma rises by exactly eta3*10
    out = sigma_step(theta, mu, [torch.tensor([1.0, 1.0])], AEHyper(eta3=1e-3, xi=0.0))
    torch.testing.assert_close(out[0][1], torch.tensor(1.0 + 1e-2))


def test_mu_step_modes() -> None:
    theta, mu, sigma = _tensors(1)
    hp = AEHyper(eta2=0.1, clip_mu=1e9, prior_scale=0.5)
    code = mu_step(theta, mu, sigma, hp)
    torch.testing.assert_close(code[0], mu[0] - 0.1 * 2 * (mu[0] - theta[0]))
    paper = mu_step(theta, mu, sigma, AEHyper(eta2=0.1, clip_mu=1e9, prior_scale=0.5,
                                              mu_gradient="paper"))  # fmt: skip
    torch.testing.assert_close(paper[1], mu[1] - 0.1 * 0.5 * (mu[1] - theta[1]) / sigma[1] ** 2)


def _model_and_data() -> tuple[LinearAutoencoder, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = LinearAutoencoder((1, 4, 4), 3)
    x = torch.rand(40, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    return model, [x[i : i + 10] for i in range(0, 40, 10)]


def test_huge_fixed_sigma_reduces_to_local_training() -> None:
    model, batches = _model_and_data()
    twin, _ = _model_and_data()
    mu = [torch.zeros_like(p) for p in model.parameters()]
    sigma = [torch.full_like(p, 100.0) for p in model.parameters()]
    hp = AEHyper(eta2=0.0, eta3=0.0, prior_scale=0.1)
    opt = SGD(list(model.parameters()), 0.05, 0.9)
    mu_out, sig_out, _ = local_round(model, batches, opt, hp, mu, sigma, update_sigma=True)
    local_round(twin, batches, SGD(list(twin.parameters()), 0.05, 0.9), hp)
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=0)
    assert mu_out is not None and sig_out is not None
    assert all(torch.equal(s, torch.full_like(s, 100.0)) for s in sig_out)


def test_mu_optimizer_takes_the_steps_of_the_plain_path_or_adams_in_place() -> None:
    """A given optimizer over mu's tensors replaces the plain step: torch's SGD at eta2 gives
    exactly the plain path; Adam gives Adam's steps on the same clipped gradient 2(mu - theta)
    (theta frozen by lr 0, so every step sees the same theta), and moves mu's tensors in place."""
    model, batches = _model_and_data()
    params = list(model.parameters())
    start = [p.detach() + 0.3 for p in params]
    sigma = [torch.full_like(p, 1.0) for p in params]
    hp = AEHyper(eta2=0.05, eta3=0.0)
    plain, _, _ = local_round(model, batches, SGD(params, 0.0), hp, start, sigma)
    mu = [m.clone() for m in start]
    sgd, _, _ = local_round(model, batches, SGD(params, 0.0), hp, mu, sigma, False,
                            mu_optimizer=torch.optim.SGD(mu, lr=0.05))  # fmt: skip
    assert plain is not None and sgd is not None
    for a, b in zip(plain, sgd, strict=True):
        torch.testing.assert_close(a, b)
    mu = [m.clone() for m in start]
    adam = torch.optim.Adam(mu, lr=0.05)
    out, _, _ = local_round(model, batches, SGD(params, 0.0), hp, mu, sigma, False,
                            mu_optimizer=adam)  # fmt: skip
    ref = [m.clone().requires_grad_() for m in start]
    ref_opt = torch.optim.Adam(ref, lr=0.05)
    theta = [p.detach() for p in params]
    for _ in batches:
        grads = clip_linf([2 * (m.detach() - t) for m, t in zip(ref, theta, strict=True)], 1.0)
        for m, g in zip(ref, grads, strict=True):
            m.grad = g
        ref_opt.step()
    assert out is not None
    for got, want, moved in zip(out, ref, mu, strict=True):
        torch.testing.assert_close(got, want.detach())
        torch.testing.assert_close(moved, want.detach())  # the optimizer's own tensors moved
    assert int(adam.state[mu[0]]["step"]) == len(batches)
    assert not torch.allclose(out[0], plain[0])  # Adam's steps are not SGD's


def test_sigma_moves_once_per_round_and_only_when_not_lazy() -> None:
    model, batches = _model_and_data()
    params = list(model.parameters())
    mu = [p.detach() + 0.3 for p in params]
    sigma = [torch.full_like(p, 1.0) for p in params]
    hp = AEHyper(eta3=1e-2)
    opt = SGD(params, 0.0)
    _, frozen, _ = local_round(model, batches, opt, hp, mu, sigma, update_sigma=False)
    assert frozen is not None and all(torch.equal(s, t) for s, t in zip(frozen, sigma, strict=True))
    # lr 0: theta stays, so the round's sigma is exactly one step from (theta, mu, sigma)
    expected = sigma_step([p.detach() for p in params], mu, sigma, hp)
    _, moved, _ = local_round(model, batches, opt, hp, mu, sigma, update_sigma=True)
    assert moved is not None
    for s, e in zip(moved, expected, strict=True):
        torch.testing.assert_close(s, e)
    assert float(moved[0].mean()) < 1.0  # (theta - mu)^2 = 0.09 < sigma^2: sigma shrinks


def test_average_is_elementwise_unweighted_and_keeps_shapes() -> None:
    replies = [
        {"w": np.full((2, 3), float(k), np.float32), "s": np.array(k + 1.0)} for k in range(3)
    ]
    out = average(replies)
    assert out["w"].shape == (2, 3) and out["w"].dtype == np.float32
    np.testing.assert_allclose(out["w"], 1.0)
    assert out["s"].shape == () and float(out["s"]) == 2.0


def test_reconstruction_metrics_of_a_perfect_model() -> None:
    model = LinearAutoencoder((4,), 4)
    with torch.no_grad():
        model.encoder.weight.copy_(torch.eye(4))
        model.encoder.bias.zero_()
        model.decoder.weight.copy_(torch.eye(4))
        model.decoder.bias.zero_()
    out = reconstruction_metrics(model, torch.rand(5, 4) + 0.1)
    assert out["test-examples"] == 5 and out["test-error"] < 1e-10
    assert abs(out["test-energy"] - 1.0) < 1e-6


def test_the_cifar_autoencoder_is_the_authors_conv_model() -> None:
    """Conv(3 -> 16, 3x3, stride 2) -> ReLU -> Linear(3600 -> k) -> Linear(k -> 3600) ->
    ConvTranspose(16 -> 3, 3x3, stride 2) -> sigmoid (paper Sec. 5.1, the authors' code)."""
    torch.manual_seed(0)
    net = theta_network((3, 32, 32), False, latent=10, channels=32, kernel=5, architecture="conv")
    assert isinstance(net, ConvAutoencoder)
    shapes = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    assert shapes == {
        "conv.weight": (16, 3, 3, 3), "conv.bias": (16,),
        "encoder.weight": (10, 3600), "encoder.bias": (10,),
        "decoder.weight": (3600, 10), "decoder.bias": (3600,),
        "deconv.weight": (16, 3, 3, 3), "deconv.bias": (3,),
    }  # fmt: skip
    assert sum(p.numel() for p in net.parameters()) == 448 + 36_010 + 39_600 + 435
    x = torch.rand(4, 3, 32, 32)
    out = net(x)
    assert out.shape == x.shape and bool(((out > 0) & (out < 1)).all())
    squared_errors(net, x).sum().backward()  # type: ignore[no-untyped-call]
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in net.parameters())
    # any image side: the transposed convolution restores it (28: 13 inside, 27 + padding 1)
    assert ConvAutoencoder((1, 28, 28), 5)(torch.rand(2, 1, 28, 28)).shape == (2, 1, 28, 28)
    assert ConvAutoencoder((3, 31, 30), 5)(torch.rand(2, 3, 31, 30)).shape == (2, 3, 31, 30)
    linear = theta_network((1, 28, 28), False, latent=10, channels=32, kernel=5)
    assert not isinstance(linear, ConvAutoencoder)  # "linear" stays the default
    with pytest.raises(ValueError, match="unknown autoencoder architecture"):
        theta_network((3, 32, 32), False, latent=10, channels=32, kernel=5, architecture="x")
    with pytest.raises(ValueError, match="image input"):
        ConvAutoencoder((784,), 10)
