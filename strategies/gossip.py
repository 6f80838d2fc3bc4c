"""Communication graphs and mixing matrices for decentralised training (NumPy only)."""

from __future__ import annotations

import numpy as np

from robust.flat import flatten, unflatten
from robust.rules import clip_rows


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


def clipped_gossip(
    models: list[dict[str, np.ndarray]], mixing: np.ndarray, t: int, tau: float | None, f: int
) -> dict[str, np.ndarray]:
    """Client t's ClippedGossip step (He, Karimireddy and Jaggi, 2022, "Byzantine-robust
    decentralized learning via ClippedGossip", Eq. 3): x_t + sum_s w_st clip(x_s - x_t, tau_t)
    over t's neighbourhood, each array in its dtype. tau_t: `tau`, or (None) the distance of
    t's (f+1)-th farthest neighbour, so that the f farthest are clipped to it (the paper's
    adaptive rule with a Byzantine weight of f neighbours); with f neighbours or fewer, t keeps
    its own model (they could all be Byzantine)."""
    neighbours = [int(s) for s in np.flatnonzero(mixing[:, t]) if s != t]
    keys = list(models[t])
    own = flatten(models[t], keys)
    if not neighbours:
        return dict(models[t])
    diffs = np.stack([flatten(models[s], keys) for s in neighbours]) - own
    if tau is None:
        if len(neighbours) <= f:
            return dict(models[t])
        distances = np.sort(np.linalg.norm(diffs, axis=1))[::-1]
        tau = float(distances[f])
    diffs = clip_rows(diffs, tau) if tau > 0 else np.zeros_like(diffs)
    step = mixing[neighbours, t] @ diffs
    return unflatten(own + step, models[t], keys)
