"""Spectral contrastive learning with correlation matrices (FedSC, Jing et al., ICML 2024).

Representations z (projection-head outputs, rows of Z) are clipped to norm sqrt(mu); a client's
correlation matrix is R_j = E[z z^T] over augmented views (uncentred, H x H) and its positive
correlation R+_j = E[z z+^T] over two views of one image. The spectral contrastive loss is
L = -Tr(R+) + 1/2 ||R||_F^2 (the trace form of HaoChen et al.'s loss, scaled by 1/2), and a
client's FedSC objective replaces the inter-client part of ||R||^2 by a detached estimate
Rbar_{-j} of the other clients' R:

    L_j = -Tr(R+_j) + alpha/2 ||R_j||_F^2 + (1 - alpha) Tr(R_j sg(Rbar_{-j})).

With alpha = q_j and Rbar_{-j} = R_{-j} the q-weighted sum of the clients' gradients is the
gradient of the global loss (paper Eq. 6); alpha = 1 is FedAvg + spectral contrastive.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch


def norm_clip(z: torch.Tensor, mu: float) -> torch.Tensor:
    """Rows rescaled to norm sqrt(mu) when longer (NormClip of DP-CalR), so ||z||^2 <= mu."""
    bound = math.sqrt(mu)
    norms = z.norm(dim=1, keepdim=True)
    scale = torch.where(norms < bound, torch.ones_like(norms), bound / norms.clamp_min(1e-30))
    return z * scale


def correlation(*views: torch.Tensor) -> torch.Tensor:
    """R = mean over the views' rows of z z^T (H x H)."""
    stacked = torch.cat(views)
    return stacked.T @ stacked / stacked.shape[0]


def positive_trace(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """Tr(R+) = mean_i <z1_i, z2_i> for two views of the same images."""
    return (z1 * z2).sum(dim=1).mean()


def local_objective(
    z1: torch.Tensor,
    z2: torch.Tensor,
    alpha: float,
    others: torch.Tensor | None = None,
) -> torch.Tensor:
    """FedSC's batch objective (paper Sec. 5.2 with alpha of App. C). Without `others` (no
    correlation matrix received yet) it is the plain spectral contrastive loss, alpha = 1.
    `others` is detached here: no gradient ever reaches Rbar_{-j}."""
    r = correlation(z1, z2)
    loss = -positive_trace(z1, z2)
    if others is None:
        return loss + 0.5 * (r * r).sum()
    rbar = others.detach().to(r.dtype)
    # Tr(R Rbar) = <R, Rbar^T>_F; R is symmetric so only Rbar's symmetric part matters
    return loss + 0.5 * alpha * (r * r).sum() + (1.0 - alpha) * (r * rbar.T).sum()


def global_objective(
    views: list[tuple[torch.Tensor, torch.Tensor]], q: list[float]
) -> torch.Tensor:
    """L = -Tr(sum_j q_j R+_j) + 1/2 ||sum_j q_j R_j||_F^2 over clients' (z1, z2) views."""
    pos = sum(qj * positive_trace(z1, z2) for (z1, z2), qj in zip(views, q, strict=True))
    r = sum(qj * correlation(z1, z2) for (z1, z2), qj in zip(views, q, strict=True))
    assert isinstance(r, torch.Tensor) and isinstance(pos, torch.Tensor)
    return -pos + 0.5 * (r * r).sum()


def objective_terms(
    views: list[tuple[torch.Tensor, torch.Tensor]], q: list[float]
) -> dict[str, float]:
    """The global objective split as in the paper's Eq. (4): contraction -sum_j q_j Tr(R+_j),
    intra-client contrast sum_j q_j^2/2 ||R_j||^2 and inter-client contrast (the rest of
    1/2 ||R||^2, which FedAvg + SC never sees); also the sum of the clients' own losses
    (FedAvg + SC's objective) and the effective rank Tr(R)^2 / ||R||_F^2 of the global R."""
    rs = [correlation(z1, z2) for z1, z2 in views]
    pos = [positive_trace(z1, z2) for z1, z2 in views]
    r = sum(qj * rj for qj, rj in zip(q, rs, strict=True))
    assert isinstance(r, torch.Tensor)
    contraction = -sum(qj * float(p) for qj, p in zip(q, pos, strict=True))
    intra = sum(0.5 * qj**2 * float((rj * rj).sum()) for qj, rj in zip(q, rs, strict=True))
    half_norm = 0.5 * float((r * r).sum())
    own = [-float(p) + 0.5 * float((rj * rj).sum()) for p, rj in zip(pos, rs, strict=True)]
    local = sum(qj * lj for qj, lj in zip(q, own, strict=True))
    return {
        "global": contraction + half_norm,
        "contraction": contraction,
        "intra-contrast": intra,
        "inter-contrast": half_norm - intra,
        "local-sum": local,
        "effective-rank": float(torch.trace(r)) ** 2 / max(2.0 * half_norm, 1e-30),
    }


def alpha_at(
    schedule: str, server_round: int, num_rounds: int, alpha_min: float, q: float
) -> float:
    """The alpha of a round: 'linear' 1 -> alpha_min over the rounds (paper App. C: 1 -> 0.2,
    alpha_t = 1 - (1 - alpha_min)(t - 1)/T), 'constant' alpha_min, 'q' the client's weight q_j
    (the provable Eq. 5)."""
    if schedule == "linear":
        return 1.0 - (1.0 - alpha_min) * (server_round - 1) / max(num_rounds, 1)
    if schedule == "constant":
        return alpha_min
    if schedule == "q":
        return q
    raise ValueError(f"unknown alpha schedule {schedule!r}")


# ---- server-side bookkeeping of the clients' (noisy) correlation matrices ----------------------


def aggregate(latest: Mapping[int, np.ndarray], q: Mapping[int, float]) -> np.ndarray:
    """R~ = sum_j q_j R~_j over the latest copy of every client (stale ones included),
    renormalised over the clients that have one."""
    keys = sorted(latest)
    weights = np.array([q[k] for k in keys], dtype=np.float64)
    stacked = np.stack([np.asarray(latest[k], dtype=np.float64) for k in keys])
    return np.tensordot(weights / weights.sum(), stacked, axes=1)


def others_from_sum(
    total: np.ndarray, weight: float, own: np.ndarray, own_weight: float
) -> np.ndarray | None:
    """Rbar_{-j} from the q-weighted sum of the clients' matrices, sum_k q_k R~_k, and its
    weight sum_k q_k (what secure aggregation gives the server), less the client's own term
    q_j R~_j (0 when it is not in the sum): the same matrix as `others`, computed by the client
    itself, which alone knows its R~_j. None when no other client is in the sum."""
    rest = weight - own_weight
    if rest <= 1e-9 * max(weight, 1.0):
        return None
    return (np.asarray(total, np.float64) - own_weight * np.asarray(own, np.float64)) / rest


def psd_projection(matrix: np.ndarray) -> np.ndarray:
    """The nearest symmetric positive semidefinite matrix in Frobenius norm (Higham, 1988):
    the symmetric part (M + M^T)/2 with its negative eigenvalues set to 0. A correlation
    matrix E[z z^T] is PSD; a robust rule (coordinate-wise median, trimmed mean) of PSD
    matrices need not be, so FedSC's server projects the combined Rbar_{-j} back."""
    m = np.asarray(matrix, dtype=np.float64)
    sym = 0.5 * (m + m.T)
    values, vectors = np.linalg.eigh(sym)
    out: np.ndarray = (vectors * np.maximum(values, 0.0)) @ vectors.T
    return 0.5 * (out + out.T)


def within_bound(matrix: np.ndarray, bound: float) -> np.ndarray:
    """A PSD matrix scaled down (never up) so that every entry is at most `bound` in absolute
    value. A PSD matrix's largest entry is on its diagonal (|R_ab| <= sqrt(R_aa R_bb)), so
    scaling by bound / max_a R_aa suffices, and it keeps the matrix symmetric and PSD."""
    m = np.asarray(matrix, dtype=np.float64)
    top = float(np.abs(m).max()) if m.size else 0.0
    return m * (bound / top) if top > bound else m


def others(latest: Mapping[int, np.ndarray], q: Mapping[int, float], cid: int) -> np.ndarray | None:
    """Rbar_{-j} = sum_{k != j} q_k R~_k / sum_{k != j} q_k (paper Alg. 1 line 20), None when
    no other client has shared yet."""
    rest = {k: v for k, v in latest.items() if k != cid}
    return aggregate(rest, q) if rest else None
