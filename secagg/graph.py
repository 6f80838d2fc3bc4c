"""Who shares secrets with whom in SecAgg+ (Bell et al., CCS 2020, Sec. 3 and 4): instead of
every pair of clients (SecAgg's complete graph), each client masks with and shares its secrets
among its k neighbours in a random k-regular graph, with k = O(log n): its cost grows like
log n, the server's like n log n.

The graph is the Harary graph H(k, n) (the n clients on a ring, each joined to the k/2 nearest
on either side) over a permutation of the clients drawn from public randomness: the SHA-256 of
the session and of every client's advertised keys (`seed_of`), which the server learns only
once the clients answered the keys stage, and from which every client draws the same graph and
checks the neighbourhood it is handed. A client's secrets are rebuilt from t of the k + 1
shares its neighbourhood holds (its own included); t is more than half of the neighbourhood,
so that no server can collect the shares of both of a client's secrets by telling half of its
neighbours that it dropped and the other half that it did not. With clients expected to drop
out (`secagg.dropout`), `parameters` sizes k so that every neighbourhood keeps t of its
shareholders (Bell et al., CCS 2020).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Mapping, Sequence
from fractions import Fraction
from functools import lru_cache

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


CORRECTNESS_BITS = 20
"""Bell et al.'s correctness parameter eta (CCS 2020): with `secagg.dropout` > 0, k is chosen
so that a sum fails for lack of shares with probability at most 2^-eta."""

_SCREEN = 1e-9
"""How far (relative, in log space) a float estimate of a failure probability must lie from the
target to decide by it; closer, the decision is made in exact rational arithmetic, so that the
server and every client, whatever their floating point, find the same k."""


@lru_cache(maxsize=4096)
def parameters(
    clients: int, wanted: int, share: float, collusion: int, dropout: float
) -> tuple[int, int]:
    """(k, t) for a sum of `clients` clients. With `dropout` 0: k = degree(clients, wanted) and
    t = threshold(k, share, collusion), as ever. With `dropout` = p > 0, each client expected to
    drop out between the keys stage and the unmasking independently with probability p, k meets
    Bell et al.'s correctness condition (CCS 2020): the probability that some client of
    the sum keeps fewer than t shareholders among its k neighbours, by a union bound
    n P[Binomial(k, p) > k - t], is at most 2^-CORRECTNESS_BITS. A `wanted` degree (secagg.degree)
    is kept and refused (ValueError) when it fails that; otherwise k is the smallest even k, no
    smaller than the default 2 ceil(log2 n) (which keeps the survivors' graph connected, Bell et
    al.'s other condition, with high probability), or n - 1 (the complete graph), that meets
    it; ValueError when none does.

    t stays threshold(k, share, collusion), the worst case of every colluder in one
    neighbourhood, never a bound on how many colluders a random graph puts in one: the server
    can draw the graph again by dropping clients at the keys stage, so Pollen does not rely on
    the graph to keep colluders apart."""
    if dropout == 0 or clients < 2:
        k = degree(clients, wanted)
        return k, threshold(k, share, collusion)
    if not 0 < dropout < 0.5:
        raise ValueError(f"secagg.dropout must be in [0, 0.5), got {dropout}")
    if wanted > 0:
        k = degree(clients, wanted)
        t = threshold(k, share, collusion)
        if not _correct(clients, k, t, dropout):
            raise ValueError(
                f"a degree of {k} (secagg.degree={wanted}) leaves some neighbourhood of a sum of "
                f"{clients} clients without t = {t} shareholders with probability above "
                f"2^-{CORRECTNESS_BITS} when each drops out with probability {dropout:g} "
                "(secagg.dropout); raise secagg.degree (0: the fewest that hold) or lower "
                "secagg.dropout"
            )
        return k, t
    floor = degree(clients)  # never below the default 2 ceil(log2 n): the graph stays connected
    for k in [*range(floor, clients - 1, 2), clients - 1]:
        try:
            t = threshold(k, share, collusion)
        except ValueError:
            continue  # too few shares for the collusion: a larger k may hold them
        if _correct(clients, k, t, dropout):
            return k, t
    raise ValueError(
        f"no degree, the complete graph included, keeps t shareholders in every neighbourhood "
        f"of a sum of {clients} clients but with probability 2^-{CORRECTNESS_BITS} when each "
        f"drops out with probability {dropout:g} (secagg.dropout; t by secagg.threshold="
        f"{share:g} and secagg.collusion={collusion}); lower secagg.dropout or sum more clients"
    )


def _correct(clients: int, k: int, t: int, p: float) -> bool:
    """Whether n P[Binomial(k, p) > k - t] <= 2^-CORRECTNESS_BITS: decided from log-space bounds
    where they are far from the target, exactly where they are not."""
    m = k - t + 1  # the fewest lost neighbours that leave fewer than t
    if m > k:
        return True
    if m <= 0:
        return False
    target = -CORRECTNESS_BITS * math.log(2) - math.log(clients)
    margin = _SCREEN * abs(target)
    log_p, log_q = math.log(p), math.log1p(-p)

    def log_pmf(d: int) -> float:
        return (
            math.lgamma(k + 1) - math.lgamma(d + 1) - math.lgamma(k - d + 1)
            + d * log_p + (k - d) * log_q
        )  # fmt: skip

    first = log_pmf(m)  # the tail's first term, a lower bound of it
    if first > target + margin:
        return False
    ratio = (k - m) / (m + 1) * p / (1 - p)  # the largest ratio of two successive terms
    if ratio < 1 and first - math.log1p(-ratio) < target - margin:
        return True  # below the geometric series that bounds the tail
    logs = [log_pmf(d) for d in range(m, k + 1)]
    top = max(logs)
    tail = top + math.log(math.fsum(math.exp(x - top) for x in logs))
    if abs(tail - target) > margin:
        return tail < target
    return _tail(k, m, Fraction(p)) * clients * 2**CORRECTNESS_BITS <= 1


def _tail(k: int, m: int, p: Fraction) -> Fraction:
    """P[Binomial(k, p) >= m], exactly."""
    q = 1 - p
    return sum((math.comb(k, d) * p**d * q ** (k - d) for d in range(m, k + 1)), Fraction(0))


def seed_of(session: str, advertised: Mapping[int, bytes]) -> bytes:
    """The graph's seed: SHA-256 of the session and of each client's id and the digest of the
    keys it advertised (secagg.keys.bundle_digest), in id order."""
    h = hashlib.sha256(b"pollen-secagg-graph/" + session.encode())
    for c in sorted(advertised):
        digest = advertised[c]
        h.update(c.to_bytes(8, "big") + len(digest).to_bytes(2, "big") + digest)
    return h.digest()


def order(clients: Collection[int], seed: bytes) -> list[int]:
    """The clients in the order of SHA-256(seed, id): a permutation anyone holding the seed
    draws alike (no generator whose stream could differ between library versions)."""
    return sorted(clients, key=lambda c: (hashlib.sha256(seed + c.to_bytes(8, "big")).digest(), c))


def harary(ring: Sequence[int], k: int) -> dict[int, frozenset[int]]:
    """Each client's k neighbours in H(k, n) over `ring`, the clients in their order on the ring
    (k even, or n - 1: the complete graph)."""
    ids = list(ring)
    n = len(ids)
    if k >= n - 1:
        return {c: frozenset(ids) - {c} for c in ids}
    if k % 2:
        raise ValueError(f"a Harary graph of {n} nodes needs an even degree below n - 1, got {k}")
    half = k // 2
    return {
        c: frozenset(ids[(pos + d) % n] for d in range(-half, half + 1) if d != 0)
        for pos, c in enumerate(ids)
    }


def neighbours(clients: Collection[int], k: int, seed: bytes) -> dict[int, frozenset[int]]:
    """Each client's k neighbours in H(k, n) over the order `seed` draws (`order`)."""
    return harary(order(clients, seed), k)


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
