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
from collections.abc import Collection, Mapping, Sequence

import numpy as np


def degree(clients: int, wanted: int = 0) -> int:
    """k for a sum of `clients` clients: `wanted` (made even, at most clients - 1), or by default
    2 ceil(log2 n), the complete graph for small n."""
    if clients < 2:
        return 0
    k = wanted if wanted > 0 else 2 * math.ceil(math.log2(clients))
    k += k % 2
    return min(k, clients - 1)


def threshold(k: int, share: float, collusion: int = 0) -> int:
    """t: the fewest of the k + 1 shares of a neighbourhood that rebuild a secret, more than
    `share` of them (share >= 1/2), at least 2, and with `collusion` clients colluding with the
    server, 2t > k + 1 + c: a server that tells some of a victim's neighbours it dropped and the
    others it survived gets each honest neighbour's share of one secret only, and the c
    colluders' of both, so it holds t of both only when 2t <= k + 1 + c (Bonawitz et al., CCS
    2017, Sec. 6; Bell et al., CCS 2020, Sec. 4). ValueError when no t of k + 1 shares can
    meet both."""
    if not 0.5 <= share <= 1:
        raise ValueError(f"the threshold share must be in [0.5, 1], got {share}")
    if collusion < 0:
        raise ValueError(f"the collusion must be >= 0, got {collusion}")
    split = (k + 1 + collusion) // 2 + 1
    if split > k + 1:
        raise ValueError(
            f"with {collusion} colluding clients a neighbourhood of {k + 1} needs a threshold of "
            f"{split} shares, more than it holds; raise secagg.degree or lower secagg.collusion"
        )
    return max(split, min(k + 1, max(2, math.floor(share * (k + 1)) + 1)))


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


def components(
    neighbours: Mapping[int, frozenset[int]], members: Collection[int]
) -> list[set[int]]:
    """The connected components of the graph `neighbours` restricted to `members`: the pairwise
    masks of a sum cancel only within one, so a sum over more than one unmasks as each one's
    own sum."""
    left, out = set(members), []
    while left:
        start = left.pop()
        part, todo = {start}, [start]
        while todo:
            for j in neighbours[todo.pop()] & left:
                left.discard(j)
                part.add(j)
                todo.append(j)
        out.append(part)
    return out


def fewer(clients: Sequence[int], m: int, rng: np.random.Generator) -> list[int]:
    """`clients` less m of them drawn by `rng`, in order: the clients of a later sum of an input
    already summed over `clients` (a restart), whose difference from it is then a sum of m
    clients, never the input of fewer."""
    left = sorted(clients)
    out = set(rng.choice(left, size=min(m, len(left)), replace=False).tolist())
    return [c for c in left if c not in out]
