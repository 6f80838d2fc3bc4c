"""Client-level differential privacy of an aggregate (NumPy only, Flower-free): DP-FedAvg's
clipped, noised sum (McMahan, Ramage, Talwar and Zhang, ICLR 2018, "Learning Differentially
Private Recurrent Language Models", Alg. 1 and Sec. 3) with adaptive clipping (Andrew,
Thakkar, McMahan and Ramaswamy, NeurIPS 2021, "Differentially Private Learning with Adaptive
Clipping", Alg. 1).

A round's aggregate of one client's contribution (its model update, or everything it sends
in the round: FedEM's M components, SCAFFOLD's delta_y and delta_c, flattened into one row
around what it started from) is

    Delta = (sum_i clip(Delta_i, C) + N(0, (z_Delta C)^2 I)) / m

with clip(v, C) = v min(1, C / ||v||) and a fixed denominator m (the expected number of
clients per round, McMahan et al. Sec. 3's "fixed-denominator estimator"): adding or removing
one client changes the sum by at most C in l2 norm, so the release is the Gaussian mechanism
of sensitivity C and noise multiplier z_Delta, whatever the number of replies. Every client
counts once (unweighted: weighting by the example counts clients report would make the
sensitivity depend on an unchecked claim).

Adaptive clipping (target quantile gamma > 0): the fraction of clients whose update was not
clipped is released too, b = (sum_i 1[||Delta_i|| <= C] + N(0, sigma_b^2)) / m, and the
next round's bound is C exp(-eta_C (b - gamma)) (Andrew et al., geometric update). To spend
the same privacy as one release at noise multiplier z, the update's noise multiplier becomes
z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2) (Andrew et al., Thm. 1; Flower's
`compute_adaptive_noise_params`), which needs sigma_b > z / 2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from robust.flat import flatten, unflatten

Arrays = Mapping[str, np.ndarray]

DEFAULT_COUNT_STD_SHARE = 1 / 20
"""sigma_b = m / 20 when not given: Andrew et al.'s choice (Sec. 3), Flower's default."""


def noise_std(noise_multiplier: float, clip: float, denominator: float) -> float:
    """The standard deviation of the noise on each coordinate of the released mean: z C / m
    (Flower's `compute_stdv` with m the number of sampled clients)."""
    if denominator <= 0:
        raise ValueError(f"the denominator must be positive, got {denominator}")
    return noise_multiplier * clip / denominator


def clip_row(row: np.ndarray, bound: float) -> tuple[np.ndarray, bool]:
    """`row` scaled to l2 norm at most `bound`, and whether it already was (the row itself,
    unscaled, when it was)."""
    norm = float(np.linalg.norm(row))
    if norm <= bound:
        return row, True
    return row * (bound / norm), False


def count_std(denominator: float, given: float = 0.0) -> float:
    """sigma_b, the noise on the count of unclipped updates: `given`, or m / 20."""
    return given if given > 0 else DEFAULT_COUNT_STD_SHARE * denominator


def update_noise_multiplier(noise_multiplier: float, count_noise: float) -> float:
    """z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2): the update's noise multiplier that, with the
    count released at noise sigma_b, spends what one release at z spends (Andrew et al.,
    Thm. 1). ValueError unless sigma_b > z / 2."""
    if noise_multiplier <= 0:
        return 0.0
    if count_noise <= noise_multiplier / 2:
        raise ValueError(
            f"adaptive clipping with noise multiplier {noise_multiplier} needs the count's "
            f"noise above {noise_multiplier / 2:g} (it is {count_noise:g}): raise "
            "client-dp.count-std or sample more clients"
        )
    return (noise_multiplier**-2 - (2 * count_noise) ** -2) ** -0.5


def next_clip(clip: float, unclipped_share: float, target_quantile: float, lr: float) -> float:
    """The geometric update C exp(-eta_C (b - gamma)) of Andrew et al.'s Alg. 1: the bound
    shrinks while more than the target quantile of the updates fit under it, and grows
    otherwise."""
    return clip * math.exp(-lr * (unclipped_share - target_quantile))


class NoisySum:
    """The fixed-denominator DP mean of clients' contributions added one at a time, each as a
    model around `reference` (memory of one model): `add` clips the client's update and folds
    the clipped model reference + clip(x - reference, C) into a float64 sum of models, as
    `strategies.aggregate.RunningMean` folds with weight 1; `result` adds the noise. With no
    update clipped, no noise and m replies, the result is that of RunningMean's unit-weight
    mean of the same models, bit for bit."""

    def __init__(self, reference: Arrays, clip: float) -> None:
        if not clip > 0:
            raise ValueError(f"the clipping bound must be positive, got {clip}")
        self.keys = list(reference)
        self.template = reference
        self.base = flatten(reference, self.keys)
        self.clip = clip
        self.total = np.zeros_like(self.base)
        self.count = 0
        self.unclipped = 0

    def add(self, arrays: Arrays) -> None:
        """One client's model (around the reference)."""
        row = flatten(arrays, self.keys)
        update, fits = clip_row(row - self.base, self.clip)
        self.total += row if fits else self.base + update
        self.count += 1
        self.unclipped += int(fits)

    def add_sum(self, updates: np.ndarray, count: int) -> None:
        """The sum of `count` clients' updates, each already clipped to the bound (by the
        clients themselves, under secure aggregation), a flat row in `keys` order."""
        self.total += count * self.base + np.asarray(updates, dtype=np.float64)
        self.count += count

    def add_update(self, update: np.ndarray) -> None:
        """One client's update, a flat row around the reference in `keys` order."""
        clipped, fits = clip_row(np.asarray(update, dtype=np.float64), self.clip)
        self.total += self.base + clipped
        self.count += 1
        self.unclipped += int(fits)

    def result(
        self, denominator: float, noise_multiplier: float, rng: np.random.Generator
    ) -> dict[str, np.ndarray]:
        """reference + (sum of clipped updates + N(0, (z C)^2)) / m, each array in its
        reference's dtype."""
        if denominator <= 0:
            raise ValueError(f"the denominator must be positive, got {denominator}")
        if self.count == denominator:
            mean = self.total / float(self.count)
        else:  # (sum of clipped models - count x reference) / m + reference
            mean = self.base + (self.total - self.count * self.base) / denominator
        if noise_multiplier > 0:
            mean = mean + rng.normal(0.0, noise_std(noise_multiplier, self.clip, denominator),
                                     size=mean.shape)  # fmt: skip
        return unflatten(mean, self.template, self.keys)


def noisy_count(count: int, denominator: float, noise: float, rng: np.random.Generator) -> float:
    """The released share of unclipped updates, (count + N(0, sigma_b^2)) / m."""
    return (count + (rng.normal(0.0, noise) if noise > 0 else 0.0)) / denominator


def privatize_update(
    update: np.ndarray, clip: float, noise_multiplier: float, rng: np.random.Generator
) -> np.ndarray:
    """What a client sends when it adds the noise itself (client-dp.noise-at=client): its
    update clipped to C plus N(0, (z C)^2) on every coordinate. Against a party that sees this
    one row (the server), replacing the client's data moves the clipped update by up to 2C:
    the Gaussian mechanism at noise multiplier z / 2."""
    clipped, _ = clip_row(update, clip)
    if noise_multiplier <= 0:
        return clipped
    return clipped + rng.normal(0.0, noise_multiplier * clip, size=clipped.shape)
