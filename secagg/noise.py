"""Integer noise for distributed differential privacy under secure aggregation: the symmetric
Skellam distribution Sk(V), the difference of two Poisson variables of mean V / 2 (variance V).
It is closed under summation, so when each of n clients adds Sk(V / n) to its encoded vector,
the unmasked sum carries exactly Sk(V), and the survivors' noise when some clients drop
(Agarwal, Kairouz and Liu, NeurIPS 2021, "The Skellam Mechanism for Differentially Private
Federated Learning"; its accounting is models.privacy's).

The variables come from NumPy's Poisson sampler (transformed rejection for large means) on a
generator the caller seeds from the client's secret: unknown to the server, the same when a
round is answered twice. Like the rest of Pollen's DP noise it is not hardened against
floating-point side channels (docs/privacy.md#randomness).
"""

from __future__ import annotations

import math

import numpy as np

TAIL_PROBABILITY = 2.0**-60
"""The chance, per coordinate, that the noise leaves the range the modulus leaves for it."""


def skellam(variance: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` draws of Sk(variance) as int64 (zeros for variance 0)."""
    if variance < 0 or not math.isfinite(variance):
        raise ValueError(f"the noise variance must be finite and >= 0, got {variance}")
    if variance == 0:
        return np.zeros(size, dtype=np.int64)
    half = variance / 2
    return rng.poisson(half, size).astype(np.int64) - rng.poisson(half, size).astype(np.int64)


def tail(variance: float, probability: float = TAIL_PROBABILITY) -> float:
    """t with P(|Sk(variance)| >= t) <= probability, by Bernstein's inequality for a sum of
    centred Poisson variables (sub-exponential with scale 1): P(|X| >= t) <= 2 exp(-t^2 /
    (2 (V + t / 3)))."""
    if variance <= 0:
        return 0.0
    log_term = math.log(2 / probability)
    return log_term / 3 + math.sqrt(log_term**2 / 9 + 2 * log_term * variance)
