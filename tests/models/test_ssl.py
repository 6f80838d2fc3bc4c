"""Contrastive networks, augmentations and representation evaluation."""

from __future__ import annotations

import pytest
import torch

from models.augment import Augmenter
from models.ssl_eval import knn_accuracy, linear_probe
from models.ssl_nets import build_contrastive_net


@pytest.mark.parametrize("shape", [(1, 28, 28), (1, 8, 8)])
@pytest.mark.parametrize("encoder", ["cnn", "cnn-gn"])
def test_small_encoder_takes_embedded_images(shape: tuple[int, int, int], encoder: str) -> None:
    net = build_contrastive_net(encoder, shape, dim=32)
    x = torch.randn(5, *shape)
    assert net(x).shape == (5, 32)
    assert net.backbone(x).shape == (5, 128)


@pytest.mark.slow
def test_paper_backbones_have_the_published_sizes() -> None:
    """Fixup ResNet-20 x8 has 17,108,399 parameters and the 512-1024-512 projector 1,050,112;
    the CIFAR-100 ResNet gives 512-d features."""
    net = build_contrastive_net("fixup-resnet20", (3, 32, 32), dim=512)
    assert sum(p.numel() for p in net.backbone.parameters()) == 17_108_399
    assert sum(p.numel() for p in net.projector.parameters()) == 1_050_112
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 512)
    resnet = build_contrastive_net("resnet34-cifar", (3, 32, 32), dim=512)
    assert resnet.backbone(torch.randn(2, 3, 32, 32)).shape == (2, 512)


def test_per_sample_encoder_does_not_couple_the_batch() -> None:
    """'cnn-gn': an image's representation is the same whatever else is in the batch and in
    train or eval mode (what DP-CalR shares is what training sees); 'cnn' (BatchNorm) is not."""
    torch.manual_seed(0)
    x, other = torch.randn(4, 1, 28, 28), torch.randn(4, 1, 28, 28) + 2.0
    gn = build_contrastive_net("cnn-gn", (1, 28, 28), dim=16).train()
    alone = gn(x)
    torch.testing.assert_close(gn(torch.cat([x, other]))[:4], alone)
    torch.testing.assert_close(gn.eval()(x), alone)
    bn = build_contrastive_net("cnn", (1, 28, 28), dim=16).train()
    assert not torch.allclose(bn(torch.cat([x, other]))[:4], bn(x), atol=1e-4)


def test_unknown_encoder_and_non_images_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown encoder"):
        build_contrastive_net("vgg", (1, 8, 8), dim=8)
    with pytest.raises(ValueError, match="image input"):
        build_contrastive_net("cnn", (64,), dim=8)


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32)])
def test_augmentations_are_per_image_and_reproducible(shape: tuple[int, int, int]) -> None:
    aug = Augmenter(shape, mean=[0.5] * shape[0], std=[0.25] * shape[0])
    x = torch.rand(1, *shape).repeat(4, 1, 1, 1)
    a = aug(x, torch.Generator().manual_seed(3))
    b = aug(x, torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, b)
    assert a.shape == x.shape
    assert not torch.allclose(a[0], a[1])  # same image, different draws
    assert not torch.allclose(a, aug(x, torch.Generator().manual_seed(4)))


def _clusters(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    centers = 4 * torch.eye(5)[:3]
    return centers[y] + 0.3 * torch.randn(n, 5, generator=gen), y


def test_knn_and_probe_separate_clusters_and_not_shuffled_labels() -> None:
    bank, by = _clusters(90, 0)
    query, qy = _clusters(30, 1)
    assert knn_accuracy(bank, by, query, qy, 3, k=10) == 1.0
    shuffled = by[torch.randperm(90, generator=torch.Generator().manual_seed(2))]
    assert knn_accuracy(bank, shuffled, query, qy, 3, k=10) < 0.7
    last, best = linear_probe(bank, by, query, qy, 3, epochs=50, lr=0.05)
    assert last == 1.0 and best == 1.0


def test_probe_with_a_generator_ignores_the_global_random_state() -> None:
    """The server's final probe must not depend on what else drew random numbers before it."""
    bank, by = _clusters(90, 0)
    bank = bank + 3 * torch.randn(90, 5, generator=torch.Generator().manual_seed(5))
    query, qy = _clusters(30, 1)

    def probe(global_seed: int) -> tuple[float, float]:
        torch.manual_seed(global_seed)
        gen = torch.Generator().manual_seed(7)
        return linear_probe(bank, by, query, qy, 3, epochs=1, lr=0.01, generator=gen)

    assert probe(0) == probe(1)
