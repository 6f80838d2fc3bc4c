"""Who shares secrets with whom in SecAgg+ (Bell et al., CCS 2020, Sec. 3 and 4): instead of
every pair of clients (SecAgg's complete graph), each client masks with and shares its secrets
among its k neighbours in a random k-regular graph, with k = O(log n): its cost grows like
log n, the server's like n log n.

The graph is the Harary graph H(k, n) (the n clients on a ring, each joined to the k/2 nearest
on either side) over a random permutation of the clients, drawn by the server for each secure
sum. A client's secrets are rebuilt from t of the k + 1 shares its neighbourhood holds (its
own included); t is more than half of the neighbourhood, so that no server can collect the
shares of both of a client's secrets by telling half of its neighbours that it dropped and the
other half that it did not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def degree(clients: int, wanted: int = 0) -> int:
    """k for a sum of `clients` clients: `wanted` (made even, at most clients - 1), or by default
    2 ceil(log2 n), the complete graph for small n."""
    if clients < 2:
        return 0
    k = wanted if wanted > 0 else 2 * math.ceil(math.log2(clients))
    k += k % 2
    return min(k, clients - 1)


def threshold(k: int, share: float) -> int:
    """t: the fewest of the k + 1 shares of a neighbourhood that rebuild a secret, more than
    `share` of them (share >= 1/2), and at least 2."""
    if not 0.5 <= share <= 1:
        raise ValueError(f"the threshold share must be in [0.5, 1], got {share}")
    return max(2, min(k + 1, math.floor(share * (k + 1)) + 1))


def neighbours(
    clients: Sequence[int], k: int, rng: np.random.Generator
) -> dict[int, frozenset[int]]:
    """Each client's k neighbours in H(k, n) over a random order of `clients` (k even, or
    n - 1: the complete graph)."""
    ids = list(clients)
    n = len(ids)
    if k >= n - 1:
        return {c: frozenset(ids) - {c} for c in ids}
    if k % 2:
        raise ValueError(f"a Harary graph of {n} nodes needs an even degree below n - 1, got {k}")
    order = [ids[i] for i in rng.permutation(n)]
    half = k // 2
    out: dict[int, frozenset[int]] = {}
    for pos, c in enumerate(order):
        out[c] = frozenset(order[(pos + d) % n] for d in range(-half, half + 1) if d != 0)
    return out
