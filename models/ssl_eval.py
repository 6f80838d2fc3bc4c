"""Evaluation of self-supervised representations (labels are used here only).

* kNN monitor: weighted kNN (InstDisc style) with cosine similarity on L2-normalised features,
  votes exp(sim / temperature) over the k nearest memory-bank entries.
* Linear probe: a linear classifier trained with Adam on frozen features, test accuracy of the
  last epoch (and the best epoch's, for reference).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F  # noqa: N812


@torch.no_grad()
def embed(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, batch_size: int = 1024
) -> torch.Tensor:
    parts = [fn(x[s : s + batch_size]) for s in range(0, len(x), batch_size)]
    return torch.cat(parts) if parts else torch.zeros(0, 0)


@torch.no_grad()
def knn_accuracy(
    bank: torch.Tensor,
    bank_labels: torch.Tensor,
    queries: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    k: int = 200,
    temperature: float = 0.1,
) -> float:
    if len(queries) == 0 or len(bank) == 0:
        return float("nan")
    bank = F.normalize(bank.double(), dim=1)
    queries = F.normalize(queries.double(), dim=1)
    sim = queries @ bank.T
    top, idx = sim.topk(min(k, len(bank)), dim=1)
    votes = torch.zeros(len(queries), num_classes, dtype=torch.float64, device=queries.device)
    votes.scatter_add_(1, bank_labels[idx], (top / temperature).exp())
    return float((votes.argmax(1) == labels).double().mean())


def linear_probe(
    train: torch.Tensor,
    train_labels: torch.Tensor,
    test: torch.Tensor,
    test_labels: torch.Tensor,
    num_classes: int,
    epochs: int = 100,
    lr: float = 3e-3,
    batch_size: int = 512,
    generator: torch.Generator | None = None,
) -> tuple[float, float]:
    """(last-epoch test accuracy, best-epoch test accuracy) of Linear(features, classes).
    Features are standardised with the training set's mean and std first (an affine map, so the
    same linear classifiers are reachable; it only keeps the optimisation well scaled)."""
    train, test = train.detach().float(), test.detach().float()
    mean, std = train.mean(0), train.std(0).clamp_min(1e-6)
    train, test = (train - mean) / std, (test - mean) / std
    head = torch.nn.Linear(train.shape[1], num_classes)
    if generator is not None:  # PyTorch's default init, drawn from the generator: reproducible
        bound = 1.0 / train.shape[1] ** 0.5
        with torch.no_grad():
            head.weight.uniform_(-bound, bound, generator=generator)
            head.bias.uniform_(-bound, bound, generator=generator)
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    last = best = float("nan")
    for _ in range(epochs):
        order = torch.randperm(len(train), generator=generator)
        for s in range(0, len(train), batch_size):
            idx = order[s : s + batch_size]
            opt.zero_grad()
            F.cross_entropy(head(train[idx]), train_labels[idx]).backward()
            opt.step()
        with torch.no_grad():
            last = float((head(test).argmax(1) == test_labels).float().mean())
        best = last if best != best else max(best, last)
    return last, best
