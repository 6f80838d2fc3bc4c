"""Byzantine-robust aggregation rules and pre-aggregation steps (NumPy only, Flower-free).

Every function takes the clients' updates as the rows of one float64 matrix `x` (n clients x d
coordinates: each client's arrays flattened in one fixed key order) and returns one row (a rule)
or a new matrix (a pre-aggregation step). `f` is the number of Byzantine rows a rule is sized
for. The server's combiner (strategies.robust) flattens, calls these and unflattens; tests check
them against Flower's own Krum / Multi-Krum / median / trimmed mean and direct computations.

Rules (docs/robustness.md says what each guarantees):
  mean           the (weighted) mean; breaks with one Byzantine row.
  median         coordinate-wise median (Yin et al., ICML 2018, "Byzantine-Robust Distributed
                 Learning: Towards Optimal Statistical Rates", Sec. 3); needs n > 2f.
  trimmed-mean   coordinate-wise mean after dropping the f largest and f smallest values (Yin
                 et al. 2018, Sec. 3); needs n > 2f.
  krum           the row with the smallest sum of squared distances to its n - f - 2 nearest
                 others (Blanchard et al., NeurIPS 2017, Sec. 4); needs n > 2f + 2.
  multi-krum     the mean of the m = n - f rows of smallest Krum score (Blanchard et al. 2017,
                 Sec. 5); needs n > 2f + 2.
  geomed         the geometric median by smoothed Weiszfeld iterations (Pillutla, Kakade and
                 Harchaoui, IEEE TSP 2022, "Robust Aggregation for Federated Learning", Alg. 2);
                 breakdown point 1/2.
  centered-clip  v <- v + mean_i clip(x_i - v, tau), a few times from v = 0, the model the round
                 started from (Karimireddy, He and Jaggi, ICML 2021, "Learning from History for
                 Byzantine Robust Optimization", Eq. 2).
Pre-aggregation, applied in this order before the rule:
  clip           each row's norm clipped to a bound (fixed, or a quantile of the round's norms).
  nnm            nearest-neighbour mixing: each row replaced by the mean of its n - f nearest rows,
                 itself included (Allouah et al., AISTATS 2023, "Fixing by Mixing", Alg. 1).
  bucketing      rows shuffled and averaged in buckets of s (Karimireddy, He and Jaggi, ICLR 2022,
                 "Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing", Alg. 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

RULES = ("mean", "median", "trimmed-mean", "krum", "multi-krum", "geomed", "centered-clip")
"""The rules `aggregate` knows: the values of the setting `robust.rule`."""

Rule = Callable[[np.ndarray, int], np.ndarray]
"""A rule as the adaptive attacks see it: (updates, f) -> the aggregate row."""


def _rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"expected a non-empty (clients x coordinates) matrix, got {x.shape}")
    return x


def min_clients(rule: str, f: int) -> int:
    """The fewest rows `rule` needs to tolerate f Byzantine ones (n > 2f + 2 for Krum and
    Multi-Krum, n > 2f for the median, trimmed mean and geometric median; one otherwise)."""
    if rule in ("krum", "multi-krum"):
        return 2 * f + 3
    if rule in ("median", "trimmed-mean", "geomed"):
        return 2 * f + 1
    return 1


def mean(x: np.ndarray, weights: Sequence[float] | np.ndarray | None = None) -> np.ndarray:
    """The mean of the rows, weighted by `weights` when given."""
    x = _rows(x)
    if weights is None:
        return np.asarray(x.mean(axis=0))
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (x.shape[0],) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"invalid aggregation weights {list(w)!r}")
    return np.asarray(w @ x / w.sum())


def median(x: np.ndarray) -> np.ndarray:
    """The coordinate-wise median (the mean of the two middle values for an even n), by one
    sort along the clients (several times faster than np.median's partitions on (n, d))."""
    x = np.sort(_rows(x), axis=0)
    n = x.shape[0]
    if n % 2:
        return np.asarray(x[n // 2])
    return np.asarray((x[n // 2 - 1] + x[n // 2]) / 2)


def trimmed_mean(x: np.ndarray, f: int) -> np.ndarray:
    """Per coordinate, the mean of the values left when the f largest and f smallest go."""
    x = _rows(x)
    n = x.shape[0]
    if n <= 2 * f:
        raise ValueError(f"trimmed-mean with f={f} needs more than {2 * f} updates, got {n}")
    return np.asarray(np.sort(x, axis=0)[f : n - f].mean(axis=0))


def squared_distances(x: np.ndarray) -> np.ndarray:
    """The n x n matrix of squared Euclidean distances between rows (exact zero diagonal)."""
    x = _rows(x)
    gram = x @ x.T
    norms = np.diag(gram)
    d2 = np.maximum(norms[:, None] + norms[None, :] - 2.0 * gram, 0.0)
    np.fill_diagonal(d2, 0.0)
    return np.asarray(d2)


def krum_scores(x: np.ndarray, f: int) -> np.ndarray:
    """Each row's Krum score: the sum of its squared distances to its n - f - 2 nearest other
    rows."""
    x = _rows(x)
    n = x.shape[0]
    if n < min_clients("krum", f):
        raise ValueError(f"krum with f={f} needs at least {2 * f + 3} updates, got {n}")
    d2 = squared_distances(x)
    nearest = np.sort(d2, axis=1)[:, 1 : n - f - 1]  # column 0 is the row itself
    return np.asarray(nearest.sum(axis=1))


def krum(x: np.ndarray, f: int) -> np.ndarray:
    """The row of smallest Krum score (the first such row on a tie)."""
    return np.array(_rows(x)[int(np.argmin(krum_scores(x, f)))])


def multi_krum_selection(x: np.ndarray, f: int, m: int | None = None) -> np.ndarray:
    """Indices of the m rows of smallest Krum score (m = n - f by default), in score order."""
    scores = krum_scores(x, f)
    keep = len(scores) - f if m is None else m
    if not 1 <= keep <= len(scores):
        raise ValueError(f"multi-krum keeps between 1 and {len(scores)} updates, not {keep}")
    return np.argsort(scores, kind="stable")[:keep]


def multi_krum(x: np.ndarray, f: int, m: int | None = None) -> np.ndarray:
    """The unweighted mean of the rows Multi-Krum selects."""
    x = _rows(x)
    return np.asarray(x[multi_krum_selection(x, f, m)].mean(axis=0))


def geometric_median(
    x: np.ndarray,
    *,
    nu: float = 1e-6,
    iterations: int = 30,
    tolerance: float = 1e-7,
) -> np.ndarray:
    """argmin_z sum_i max(nu, ||z - x_i||) by smoothed Weiszfeld steps z <- sum_i b_i x_i /
    sum_i b_i, b_i = 1 / max(nu, ||z - x_i||), from the mean, until the objective improves by
    less than `tolerance` (relative) or after `iterations` steps."""
    x = _rows(x)
    z = x.mean(axis=0)

    def objective(dist: np.ndarray) -> float:
        return float(np.maximum(dist, nu).sum())

    dist = np.linalg.norm(x - z, axis=1)
    value = objective(dist)
    for _ in range(iterations):
        beta = 1.0 / np.maximum(dist, nu)
        z = beta @ x / beta.sum()
        dist = np.linalg.norm(x - z, axis=1)
        new = objective(dist)
        if abs(value - new) <= tolerance * max(new, 1e-300):
            break
        value = new
    return np.asarray(z)


def clip_rows(x: np.ndarray, bound: float, center: np.ndarray | None = None) -> np.ndarray:
    """Each row's distance to `center` (default 0) clipped to `bound`: center + (x_i - center)
    min(1, bound / ||x_i - center||)."""
    x = _rows(x)
    c = np.zeros(x.shape[1]) if center is None else np.asarray(center, dtype=np.float64)
    diff = x - c
    norms = np.linalg.norm(diff, axis=1)
    scale = np.minimum(1.0, bound / np.maximum(norms, 1e-300))
    return np.asarray(c + diff * scale[:, None])


def centered_clip(
    x: np.ndarray, tau: float, iterations: int = 3, center: np.ndarray | None = None
) -> np.ndarray:
    """Centered clipping from `center` (default 0): `iterations` times v <- v + mean_i clip(x_i
    - v, tau). Replacing one row by any other moves v by at most 2 tau / n per iteration."""
    x = _rows(x)
    if tau <= 0:
        raise ValueError(f"centered-clip needs a radius tau > 0, got {tau}")
    v = np.zeros(x.shape[1]) if center is None else np.asarray(center, dtype=np.float64).copy()
    for _ in range(iterations):
        v = v + (clip_rows(x, tau, v) - v).mean(axis=0)
    return np.asarray(v)


def norm_quantile(x: np.ndarray, q: float) -> float:
    """The q-quantile of the rows' norms (the adaptive clipping bound)."""
    return float(np.quantile(np.linalg.norm(_rows(x), axis=1), q))


def nearest_neighbour_mixing(x: np.ndarray, f: int) -> np.ndarray:
    """Each row replaced by the mean of its n - f nearest rows (itself, at distance 0,
    included)."""
    x = _rows(x)
    n = x.shape[0]
    if n <= f:
        raise ValueError(f"nearest-neighbour mixing with f={f} needs more than {f} updates")
    order = np.argsort(squared_distances(x), axis=1, kind="stable")[:, : n - f]
    mixing = np.zeros((n, n))
    np.put_along_axis(mixing, order, 1.0 / (n - f), axis=1)
    return np.asarray(mixing @ x)  # (n, n) x (n, d): no (n, n - f, d) gather


def bucketing(x: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """The rows in a random order, averaged in consecutive buckets of `size` (the last one may
    be smaller): ceil(n / size) rows."""
    x = _rows(x)
    if size <= 1:
        return x
    perm = rng.permutation(x.shape[0])
    buckets = [perm[i : i + size] for i in range(0, len(perm), size)]
    return np.stack([x[b].mean(axis=0) for b in buckets])


def median_distance(x: np.ndarray, center: np.ndarray | None = None) -> float:
    """The median of the rows' distances to `center` (default 0): centered-clip's radius when
    none is given. With fewer than half the rows Byzantine, it is bounded by honest distances."""
    x = _rows(x)
    c = np.zeros(x.shape[1]) if center is None else center
    return float(np.median(np.linalg.norm(x - c, axis=1)))


def aggregate(
    rule: str,
    x: np.ndarray,
    f: int,
    *,
    weights: Sequence[float] | np.ndarray | None = None,
    tau: float = 0.0,
    iterations: int = 3,
) -> np.ndarray:
    """`rule` (a `robust.rule` name) applied to the rows. Only `mean` reads `weights`; every
    robust rule counts each row once. centered-clip's radius is `tau`, or the median distance
    of the rows to 0 when `tau` is 0."""
    if rule == "mean":
        return mean(x, weights)
    if rule == "median":
        return median(x)
    if rule == "trimmed-mean":
        return trimmed_mean(x, f)
    if rule == "krum":
        return krum(x, f)
    if rule == "multi-krum":
        return multi_krum(x, f)
    if rule == "geomed":
        return geometric_median(x, iterations=10 * iterations)
    if rule == "centered-clip":
        radius = tau if tau > 0 else median_distance(x)
        if radius <= 0:  # every update is 0 (or most are): nothing to move
            return np.zeros(_rows(x).shape[1])
        return centered_clip(x, radius, iterations)
    raise ValueError(f"unknown rule {rule!r}")


def rule_function(rule: str, tau: float = 0.0, iterations: int = 3) -> Rule:
    """`rule` as a function (updates, f) -> aggregate, unweighted (what an adaptive attack
    optimises against)."""
    return lambda x, f: aggregate(rule, x, f, tau=tau, iterations=iterations)


def breakdown_note(rule: str) -> str:
    """One line on what `rule` tolerates (for refusals and docs)."""
    need = {"krum": "n > 2f + 2", "multi-krum": "n > 2f + 2", "median": "n > 2f",
            "trimmed-mean": "n > 2f", "geomed": "n > 2f"}  # fmt: skip
    return need.get(rule, "any n")


def clients_needed(rule: str, f: int, bucket: int = 0, nnm: bool = False) -> int:
    """The fewest updates a point needs for `rule` sized for f: its minimum counted after
    bucketing (ceil(n / bucket) rows reach the rule), and more than f for nearest-neighbour
    mixing."""
    need = min_clients(rule, f)
    n = need
    while rows_after_bucketing(n, bucket) < need:
        n += 1
    return max(n, f + 1 if nnm else 1)


def rows_after_bucketing(n: int, size: int) -> int:
    """How many rows the rule sees after bucketing n updates in buckets of `size`."""
    return -(-n // size) if size > 1 else n
