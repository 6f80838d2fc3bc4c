"""NT-Xent against a per-view loop written from SimCLR's definition."""

from __future__ import annotations

import math

import pytest
import torch

from models.simclr import nt_xent


def _reference(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> float:
    z = torch.cat([z1, z2]).double()
    z = z / z.norm(dim=1, keepdim=True)
    n, b = len(z), len(z1)
    total = 0.0
    for i in range(n):
        positive = (i + b) % n
        sims = [float(z[i] @ z[k]) / temperature for k in range(n) if k != i]
        total += -float(z[i] @ z[positive]) / temperature + math.log(sum(map(math.exp, sims)))
    return total / n


@pytest.mark.parametrize("temperature", [0.1, 0.5, 2.0])
def test_nt_xent_matches_the_definition(temperature: float) -> None:
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    assert float(nt_xent(z1, z2, temperature)) == pytest.approx(_reference(z1, z2, temperature))


def test_one_image_has_only_its_positive() -> None:
    """b = 1: the only candidate of each view is its positive, so the loss is 0."""
    z1, z2 = torch.tensor([[1.0, 2.0]]), torch.tensor([[-3.0, 0.5]])
    assert float(nt_xent(z1, z2, 0.5)) == pytest.approx(0.0, abs=1e-7)


def test_aligned_views_of_distinct_images_score_lower_than_swapped_ones() -> None:
    eye = torch.eye(4)
    aligned = nt_xent(eye, eye, 0.5)
    swapped = nt_xent(eye, eye.roll(1, dims=0), 0.5)
    assert float(aligned) < float(swapped)


def test_gradient_reaches_both_views() -> None:
    z1 = torch.randn(4, 3, requires_grad=True)
    z2 = torch.randn(4, 3, requires_grad=True)
    nt_xent(z1, z2, 0.5).backward()
    assert z1.grad is not None and z2.grad is not None
    assert float(z1.grad.abs().sum()) > 0 and float(z2.grad.abs().sum()) > 0


def test_mismatched_views_are_rejected() -> None:
    with pytest.raises(ValueError, match="two views"):
        nt_xent(torch.zeros(3, 2), torch.zeros(4, 2), 0.5)
