"""Clustered FL (Sattler et al., 2020) math, independent of Flower, as the official
implementation and FedEM's reference code run it.

Every round all clients of a cluster train its model; a cluster is bipartitioned when its
members' updates nearly cancel on average (the cluster model sits near a stationary point of
the cluster's joint objective, ||mean update|| < tol_1) while some member still moves far
(max update norm > tol_2) and it has more than two members. The split is the two-cluster
complete-linkage agglomerative clustering of the members' pairwise cosine distances
1 - cos(dtheta_i, dtheta_j). Clusters never merge again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

MAX_NORMS = ("l2", "coordinate")


def flat_update(
    before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray], keys: Sequence[str]
) -> np.ndarray:
    """after - before over the given tensors (the trainable parameters), flattened in float64."""
    if not keys:
        return np.zeros(0)
    return np.concatenate(
        [(np.asarray(after[k], np.float64) - np.asarray(before[k], np.float64)).ravel()
         for k in keys]
    )  # fmt: skip


def cosine_similarities(updates: np.ndarray) -> np.ndarray:
    """S[i, j] = <u_i, u_j> / (||u_i|| ||u_j||) for the rows of `updates` (n, d); a zero update
    has similarity 0 to every other one (and 1 to itself)."""
    norms = np.linalg.norm(updates, axis=1)
    unit = updates / np.where(norms > 0, norms, 1.0)[:, None]
    sims = np.clip(unit @ unit.T, -1.0, 1.0)
    np.fill_diagonal(sims, 1.0)
    return sims


def bipartition(similarities: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the two clusters that complete-linkage agglomerative clustering on the
    distances 1 - S leaves when stopped at two clusters (the official rule; it runs on -S,
    which gives the same merges)."""
    from sklearn.cluster import AgglomerativeClustering  # lazy: sklearn, server only

    n = similarities.shape[0]
    if n < 2 or similarities.shape != (n, n):
        raise ValueError(
            f"need a square similarity matrix of at least 2 rows, got {similarities.shape}"
        )
    distances = 1.0 - np.asarray(similarities, np.float64)
    distances = np.maximum((distances + distances.T) / 2, 0.0)
    np.fill_diagonal(distances, 0.0)
    labels = AgglomerativeClustering(
        n_clusters=2, metric="precomputed", linkage="complete"
    ).fit_predict(distances)
    return np.flatnonzero(labels == 0), np.flatnonzero(labels == 1)


Robust = Callable[[np.ndarray], np.ndarray]
"""A robust rule over a cluster's updates (rows) -> the cluster's update."""


def update_norms(
    updates: np.ndarray, max_norm: str = "l2", f: int = 0, rule: Robust | None = None
) -> tuple[float, float]:
    """(||mean_i u_i||, max_i ||u_i||) over a cluster's updates (n, d), the mean unweighted as in
    both reference codes. max_norm='coordinate' takes the largest absolute coordinate instead
    of the largest L2 norm, as FedEM's reference code does (by accident of an axis).

    Against f Byzantine members (docs/robustness.md): the mean becomes `rule`'s combination and
    the maximum the (f+1)-th largest value, so that f members alone can neither make the
    cluster look stationary nor make it look divided."""
    if max_norm not in MAX_NORMS:
        raise ValueError(f"max_norm must be one of {MAX_NORMS}, got {max_norm!r}")
    if updates.shape[0] == 0:
        return 0.0, 0.0
    centre = updates.mean(axis=0) if rule is None else rule(updates)
    mean = float(np.linalg.norm(centre))
    if max_norm == "coordinate":
        values = np.abs(updates).max(axis=1)
    else:
        values = np.linalg.norm(updates, axis=1)
    if f == 0:
        return mean, float(values.max())
    return mean, float(np.sort(values)[::-1][min(f, len(values) - 1)])


def should_split(
    updates: np.ndarray,
    tol1: float,
    tol2: float,
    max_norm: str = "l2",
    f: int = 0,
    rule: Robust | None = None,
) -> bool:
    """||mean update|| < tol_1 and max update norm > tol_2 and more than two members (with f
    and a rule: their robust forms, update_norms)."""
    mean, largest = update_norms(updates, max_norm, f, rule)
    return updates.shape[0] > 2 and mean < tol1 and largest > tol2


def split_clusters(
    clusters: Sequence[Sequence[int]],
    updates: Mapping[int, np.ndarray],
    tol1: float,
    tol2: float,
    max_norm: str = "l2",
    f: int = 0,
    rule: Robust | None = None,
    min_size: int = 1,
) -> list[list[int]]:
    """One round's clustering step: each cluster whose members all sent an update and that
    meets the criterion is replaced by its two halves, in place (clusters keep their order).

    Members are client ids; a cluster with a member missing this round is left whole, since
    the missing member could not be placed. With f and a robust rule the criterion is robust
    (update_norms), and a split that would leave a half with fewer than `min_size` members
    (the rule's minimum) is not made."""
    out: list[list[int]] = []
    for members in clusters:
        members = list(members)
        if not members or any(c not in updates for c in members):
            out.append(members)
            continue
        stacked = np.stack([updates[c] for c in members])
        if not should_split(stacked, tol1, tol2, max_norm, f, rule):
            out.append(members)
            continue
        first, second = bipartition(cosine_similarities(stacked))
        if min(len(first), len(second)) < min_size:
            out.append(members)
            continue
        out += [[members[i] for i in first], [members[i] for i in second]]
    return out
