"""Communication graphs and mixing matrices for decentralised training (NumPy only)."""

from __future__ import annotations

import numpy as np


def erdos_renyi(num: int, p: float, rng: np.random.Generator, tries: int = 100) -> np.ndarray:
    """Adjacency (bool, no self-loops) of a connected G(num, p); redrawn until connected."""
    if num < 1 or not 0 < p <= 1:
        raise ValueError(f"need num >= 1 and 0 < p <= 1, got num={num}, p={p}")
    for _ in range(tries):
        upper = np.triu(rng.random((num, num)) < p, k=1)
        adjacency = upper | upper.T
        if is_connected(adjacency):
            return adjacency
    raise ValueError(f"no connected G({num}, {p}) in {tries} draws; raise the edge probability")


def is_connected(adjacency: np.ndarray) -> bool:
    seen = np.zeros(len(adjacency), dtype=bool)
    frontier = [0]
    seen[0] = True
    while frontier:
        node = frontier.pop()
        for nxt in np.flatnonzero(adjacency[node] & ~seen):
            seen[nxt] = True
            frontier.append(int(nxt))
    return bool(seen.all())


def metropolis_hastings(adjacency: np.ndarray) -> np.ndarray:
    """Symmetric, doubly stochastic mixing weights: w_st = 1/(1 + max(deg_s, deg_t)) on edges,
    the remainder on the diagonal."""
    degree = adjacency.sum(axis=1)
    pair_max = np.maximum.outer(degree, degree)
    weights = np.where(adjacency, 1.0 / (1.0 + pair_max), 0.0)
    np.fill_diagonal(weights, 1.0 - weights.sum(axis=1))
    return weights
