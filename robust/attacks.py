"""Simulated Byzantine attacks on the clients' updates (NumPy only, Flower-free).

`attack_rows` says what the k attacking clients send instead of their honest updates, at one
aggregation point of one round. Updates are relative to the model the round started from (g), so
"the model g plus noise" is the update "noise". Rows are float64 (clients x coordinates), as in
robust.rules. The omniscient attacks (alie, ipm, opt-alie, opt-ipm, min-max) read the honest
clients' updates of the round; where none reach this aggregation point they use the attackers'
own honest updates as their estimate of them.

Kinds (the names of `attack.kind`, pollen.core.protection.ATTACKS):
  sign-flip          -scale x the attacker's own honest update.
  gaussian           pure noise N(0, std^2) per coordinate (the model g plus noise).
  model-replacement  explicit boosting (Bagdasaryan, Veit, Hua, Estrin and Shmatikov, AISTATS
                     2020, "How To Backdoor Federated Learning", Sec. 3.2): the attacker
                     wants the global model to become X = g - u (its own honest update u
                     reversed) and sends gamma (X - g) = -gamma u, boosted by gamma = scale, or
                     by gamma = n (the clients combined) when scale is 0, so that the mean of n
                     updates lands on X.
  label-flip         the attacker's update unchanged: the client itself trained on flipped
                     labels, nothing is left to do here.
  alie               "A Little Is Enough" (Baruch, Baruch and Goldberg, NeurIPS 2019, Sec. 3,
                     Alg. 1): every attacker sends mu - z sigma, the honest updates' coordinate-
                     wise mean and (population) standard deviation; z is `z`, or the paper's
                     z_max = Phi^{-1}((n - s) / n), s = floor(n/2 + 1) - k, the number of honest
                     "supporters" the attackers need, n = h + k. See `alie_z_max` for the edge
                     cases.
  ipm                inner product manipulation (Xie, Koyejo and Gupta, UAI 2020, "Fall of
                     Empires: Breaking Byzantine-tolerant SGD by Inner Product Manipulation",
                     Sec. 4): every attacker sends -epsilon x the honest updates' mean.
  opt-alie, opt-ipm  ALIE and IPM with their factor (z, epsilon) chosen against the server's
                     rule, as ByzFL's Opt-ALIE / Opt-IPM (González, Guerraoui, Pinot, Rizk,
                     Stephan and Taïani, arXiv 2025, "ByzFL: Research Framework for Robust
                     Federated Learning"): the factor in [0, 20] that maximises
                     ||rule(honest + attack rows, f) - mean(honest)||, by a fixed grid refined
                     once by golden-section search (at most 40 rule evaluations, deterministic).
                     The plain attack's factor is always a candidate, so the adaptive attack
                     never does less damage than the plain one. `honest` here is the attackers'
                     estimate (their own updates when no honest row reaches this point).
  min-max            Min-Max (Shejwalkar and Houmansadr, NDSS 2021, "Manipulating the Byzantine:
                     Optimizing Model Poisoning Attacks and Defenses for Federated Learning",
                     Sec. IV, the AGR-agnostic Min-Max with the inverse-standard-deviation
                     perturbation): every attacker sends m + gamma p, m the honest mean,
                     p = -std (or -m / ||m|| when every std is 0; then all honest rows are equal,
                     the bound below is 0 and the row is m), gamma the largest value with
                     max_i ||m + gamma p - h_i|| <= max_{i,j} ||h_i - h_j|| (bisection).

The output is always finite: honest rows with a non-finite value are left out of the estimates,
and whatever overflows is clipped to the largest finite float64 (NaN to 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import NormalDist

import numpy as np

from robust.rules import Rule

KINDS = (
    "sign-flip",
    "gaussian",
    "model-replacement",
    "label-flip",
    "alie",
    "ipm",
    "opt-alie",
    "opt-ipm",
    "min-max",
)
"""The attacks `attack_rows` knows: the values of the setting `attack.kind`."""

ALIE_Z_MIN = 0.1
"""ALIE's z when the paper's z_max is not positive (one attacker among an even n: s = n/2
supporters are needed, Phi^{-1}(1/2) = 0 and mu - 0 sigma would be the honest mean, no attack):
a small deviation that keeps the attack an attack while staying within the honest spread."""

_P_GUARD = 1e-6
"""Phi^{-1}'s argument is kept in [_P_GUARD, 1 - _P_GUARD] (|z| <= 4.75): with an attacker
majority (s <= 0) the paper's argument reaches 1 and z_max would be infinite."""

OPT_MAX_FACTOR = 20.0
"""opt-alie / opt-ipm search their factor in [0, OPT_MAX_FACTOR]."""

_OPT_GRID = np.concatenate([[0.0], np.geomspace(0.01, OPT_MAX_FACTOR, 23)])
"""The opt-* search's first pass: 0 and 23 log-spaced factors (24 rule evaluations)."""

_OPT_REFINE = 15
"""The opt-* search's second pass: golden-section steps between the best grid point's
neighbours (15 rule evaluations; with the plain factor, 40 in all)."""

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0

_BIG = float(np.finfo(np.float64).max)


def attack_rows(
    kind: str,
    honest: np.ndarray,
    own: np.ndarray,
    *,
    rule: Callable[[np.ndarray, int], np.ndarray],
    f: int,
    rng: np.random.Generator,
    scale: float = 10.0,
    std: float = 1.0,
    z: float = 0.0,
    epsilon: float = 0.5,
) -> np.ndarray:
    """The (k, d) rows the k attackers send instead of `own`, their honest updates, given
    `honest`, the (h, d) updates of this round's honest clients at this aggregation point (h may
    be 0), `rule` and `f`, the server's rule as (updates, f) -> aggregate and what it is sized
    for (read by opt-alie and opt-ipm), and `rng` (read by gaussian). Always finite; ValueError
    for an unknown kind or mismatched shapes."""
    if kind not in KINDS:
        raise ValueError(f"unknown attack {kind!r}; expected one of {', '.join(KINDS)}")
    own = np.asarray(own, dtype=np.float64)
    if own.ndim != 2:
        raise ValueError(f"expected the attackers' updates as a (k, d) matrix, got {own.shape}")
    k, d = own.shape
    honest = np.asarray(honest, dtype=np.float64)
    if honest.ndim == 1 and honest.size == 0:  # no honest row, as a flat empty array
        honest = honest.reshape(0, d)
    if honest.ndim != 2 or honest.shape[1] != d:
        raise ValueError(f"honest updates {honest.shape} do not match the attackers' {own.shape}")
    if k == 0:
        return np.zeros((0, d))
    honest = honest[np.isfinite(honest).all(axis=1)]
    own = np.nan_to_num(own, nan=0.0, posinf=0.0, neginf=0.0)
    h = honest.shape[0]
    ref = honest if h > 0 else own  # the attackers' picture of the honest updates
    with np.errstate(over="ignore", invalid="ignore"):
        out = _rows_for(
            kind, ref, own, rule, f, rng, n=h + k, scale=scale, std=std, z=z, epsilon=epsilon
        )
    return np.nan_to_num(np.asarray(out, dtype=np.float64), nan=0.0, posinf=_BIG, neginf=-_BIG)


def _rows_for(
    kind: str,
    ref: np.ndarray,
    own: np.ndarray,
    rule: Rule,
    f: int,
    rng: np.random.Generator,
    *,
    n: int,
    scale: float,
    std: float,
    z: float,
    epsilon: float,
) -> np.ndarray:
    k, d = own.shape
    if kind == "sign-flip":
        return -scale * own
    if kind == "gaussian":
        return rng.normal(0.0, std, (k, d))
    if kind == "model-replacement":
        gamma = scale if scale > 0 else float(n)
        return -gamma * own
    if kind == "label-flip":
        return own.copy()
    mu = ref.mean(axis=0)
    if kind in ("alie", "opt-alie"):
        sigma = ref.std(axis=0)  # ddof=0; all zero for a single row
        z0 = z if z > 0 else alie_z_max(n, k)
        if kind == "alie":
            return _repeat(mu - z0 * sigma, k)
        best = _search(lambda t: _repeat(mu - t * sigma, k), ref, rule, f, z0)
        return _repeat(mu - best * sigma, k)
    if kind in ("ipm", "opt-ipm"):
        if kind == "ipm":
            return _repeat(-epsilon * mu, k)
        best = _search(lambda t: _repeat(-t * mu, k), ref, rule, f, epsilon)
        return _repeat(-best * mu, k)
    # min-max
    return _repeat(min_max_row(ref), k)


def _repeat(row: np.ndarray, k: int) -> np.ndarray:
    return np.asarray(np.tile(row, (k, 1)))


def alie_z_max(n: int, k: int) -> float:
    """ALIE's z_max for k attackers among n clients (Baruch et al. 2019, Alg. 1):
    Phi^{-1}((n - s) / n), s = floor(n/2 + 1) - k. The argument is kept in [1e-6, 1 - 1e-6]
    (an attacker majority, s <= 0, would make it 1), and a z_max that is not positive (one
    attacker among an even n gives exactly 0) becomes ALIE_Z_MIN."""
    if n <= 0 or k <= 0:
        raise ValueError(f"ALIE needs n >= k >= 1 clients, got n={n}, k={k}")
    s = math.floor(n / 2 + 1) - k
    p = min(max((n - s) / n, _P_GUARD), 1.0 - _P_GUARD)
    z_max = NormalDist().inv_cdf(p)
    return z_max if z_max > 0 else ALIE_Z_MIN


def damage(rule: Rule, honest: np.ndarray, attack: np.ndarray, f: int) -> float:
    """||rule(honest rows then attack rows, f) - mean(honest)||: how far the attack moves the
    aggregate from the honest mean (what opt-alie and opt-ipm maximise)."""
    out = rule(np.vstack([honest, attack]), f)
    return float(np.linalg.norm(np.asarray(out) - honest.mean(axis=0)))


def _search(
    rows: Callable[[float], np.ndarray], ref: np.ndarray, rule: Rule, f: int, plain: float
) -> float:
    """The factor t in [0, OPT_MAX_FACTOR] (or `plain`, the plain attack's) whose rows(t) do the
    most damage: `plain` and a fixed grid, then golden-section search between the neighbours of
    the best grid point. A rule that refuses the rows (ValueError: too few of them) or returns
    something non-finite scores -inf; if every candidate does, `plain` is kept."""

    def score(t: float) -> float:
        try:
            value = damage(rule, ref, rows(t), f)
        except ValueError:
            return -math.inf
        return value if math.isfinite(value) else -math.inf

    best_t, best = plain, score(plain)
    grid_scores = [score(float(t)) for t in _OPT_GRID]
    i = int(np.argmax(grid_scores))
    if grid_scores[i] > best:
        best_t, best = float(_OPT_GRID[i]), grid_scores[i]
    if not math.isfinite(max(grid_scores)):
        return best_t
    lo = float(_OPT_GRID[max(i - 1, 0)])
    hi = float(_OPT_GRID[min(i + 1, len(_OPT_GRID) - 1)])
    a, b = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
    fa, fb = score(a), score(b)
    evaluations = 2
    while True:
        for t, value in ((a, fa), (b, fb)):
            if value > best:
                best_t, best = t, value
        if evaluations >= _OPT_REFINE:
            break
        if fa >= fb:  # keep [lo, b]
            hi, b, fb = b, a, fa
            a = hi - _GOLDEN * (hi - lo)
            fa = score(a)
        else:  # keep [a, hi]
            lo, a, fa = a, b, fb
            b = lo + _GOLDEN * (hi - lo)
            fb = score(b)
        evaluations += 1
    return best_t


def min_max_row(honest: np.ndarray, tolerance: float = 1e-10) -> np.ndarray:
    """Min-Max's row m + gamma p (Shejwalkar and Houmansadr 2021, Sec. IV): m the mean of
    `honest`, p = -std (or -m / ||m|| when every std is 0), gamma the largest value with
    max_i ||m + gamma p - h_i|| <= max_{i,j} ||h_i - h_j||, found by doubling then bisection to
    a relative `tolerance`. The left side is convex in gamma and at most the right at gamma = 0,
    so the feasible gammas are an interval around 0 and the bisection finds its upper end."""
    honest = np.asarray(honest, dtype=np.float64)
    m = honest.mean(axis=0)
    p = -honest.std(axis=0)
    if not p.any():
        norm = float(np.linalg.norm(m))
        p = -m / norm if norm > 0 else p
    # pairwise, one row at a time (no h x h x d array; exact, unlike the Gram-matrix form)
    bound = max(float(np.linalg.norm(honest - row, axis=1).max()) for row in honest)

    def feasible(gamma: float) -> bool:
        return float(np.linalg.norm(m + gamma * p - honest, axis=1).max()) <= bound

    if not p.any() or bound <= 0:
        return np.asarray(m)
    lo, hi = 0.0, 1.0
    for _ in range(1000):  # g(gamma) grows linearly: doubling ends within ~log2(bound/|p|)
        if not feasible(hi):
            break
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        if hi - lo <= tolerance * hi:
            break
        mid = 0.5 * (lo + hi)
        if feasible(mid):
            lo = mid
        else:
            hi = mid
    return np.asarray(m + lo * p)
