"""Privacy accounting and DP-compatible models, on Opacus (docs/privacy.md).

Accounting. Every mechanism Pollen accounts is a (sub)sampled Gaussian mechanism: a sum of
contributions of l2 norm at most C per example, plus N(0, (z C)^2) noise on every coordinate,
z the noise multiplier, computed on a batch in which each example is present independently
with probability q (q = 1: the whole data set, as FedSC's DP-CalR releases). A ledger is the
list of (z, q, steps) its mechanism ran, Opacus' `RDPAccountant.history`; its epsilon at a
delta is Opacus' Renyi-DP analysis (`opacus.accountants.analysis.rdp`: Mironov et al., 2019,
for the sampled Gaussian mechanism; conversion to (epsilon, delta) by Balle et al., 2020,
Thm. 21) over Opacus' default orders, exactly what `RDPAccountant.get_epsilon` returns. The
neighbouring relation is Opacus': data sets that differ by adding or removing one example
(replacing one, for a release whose sensitivity is stated for replacement, as FedSC's).

Poisson sampling follows Opacus' `DPDataLoader` built from a loader of batch size B over n
examples: ceil(n / B) steps per epoch, sample rate q = 1 / ceil(n / B), and the noisy sum is
divided by the expected batch size int(n q).

Opacus is imported where it is used (`# lazy: opacus`): importing it costs seconds, which a
process that never accounts (a ClientApp without DP, `pollen --help`) should not pay.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from torch import nn

Entry = tuple[float, float, int]
"""(noise multiplier z, sample rate q, steps): one entry of Opacus' RDPAccountant.history."""


@dataclass(frozen=True)
class PoissonPlan:
    """How DP-SGD draws its batches from n examples at batch size B (Opacus' DPDataLoader)."""

    sample_rate: float
    """q: each example is in a batch independently with this probability."""
    steps_per_epoch: int
    """ceil(n / B): the batches of an epoch (0 without examples)."""
    expected_batch_size: int
    """int(n q): the noisy sum of clipped gradients is divided by it (Opacus' `mean`)."""


def poisson_plan(examples: int, batch_size: int) -> PoissonPlan:
    """Opacus' DPDataLoader.from_data_loader for a loader of `batch_size` over `examples`."""
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    if examples <= 0:
        return PoissonPlan(0.0, 0, 0)
    steps = math.ceil(examples / batch_size)
    q = 1.0 / steps
    return PoissonPlan(q, steps, max(int(examples * q), 1))


def add_steps(history: Iterable[Sequence[float]], z: float, q: float, steps: int) -> list[Entry]:
    """`history` with `steps` more steps at (z, q), merged into an entry of the same (z, q)."""
    out: list[Entry] = [(float(e[0]), float(e[1]), int(e[2])) for e in history]
    if steps <= 0:
        return out
    for i, (z0, q0, n0) in enumerate(out):
        if z0 == z and q0 == q:
            out[i] = (z0, q0, n0 + steps)
            return out
    out.append((float(z), float(q), int(steps)))
    return out


def _orders() -> np.ndarray:
    from opacus.accountants import RDPAccountant  # lazy: opacus

    return np.asarray(RDPAccountant.DEFAULT_ALPHAS, dtype=float)


@functools.lru_cache(maxsize=4096)
def _rdp_per_step(z: float, q: float) -> tuple[float, ...]:
    """RDP of one step of the sampled Gaussian mechanism at Opacus' default orders (RDP adds
    up over steps, so a ledger's RDP is steps x this). Cached: for q < 1 each value is a
    series, tens of milliseconds for all orders."""
    from opacus.accountants.analysis.rdp import compute_rdp  # lazy: opacus

    rdp = compute_rdp(q=q, noise_multiplier=z, steps=1, orders=list(_orders()))
    return tuple(float(v) for v in np.atleast_1d(rdp))


def epsilon(history: Iterable[Sequence[float]], delta: float) -> float:
    """Epsilon at `delta` after the steps of `history` (entries (z, q, steps)), as Opacus'
    RDPAccountant computes it; 0 without steps, infinite when a step had no noise (z = 0)."""
    entries = [(float(e[0]), float(e[1]), int(e[2])) for e in history if int(e[2]) > 0]
    if not entries:
        return 0.0
    if any(z <= 0 for z, _, _ in entries):
        return math.inf
    from opacus.accountants.analysis.rdp import get_privacy_spent  # lazy: opacus

    rdp = sum(steps * np.asarray(_rdp_per_step(z, q)) for z, q, steps in entries)
    with warnings.catch_warnings():
        # "Optimal order is the largest alpha": the bound holds, a larger order would tighten it
        warnings.filterwarnings("ignore", message="Optimal order", category=UserWarning)
        eps, _ = get_privacy_spent(orders=_orders(), rdp=rdp, delta=delta)
    return float(eps)


def gaussian_epsilon(releases: int, noise_multiplier: float, delta: float) -> float:
    """Epsilon after `releases` Gaussian releases at noise multiplier z = noise std /
    sensitivity, each over the whole data set (sample rate 1: RDP of order a is
    releases * a / (2 z^2))."""
    if releases <= 0:
        return 0.0
    return epsilon([(noise_multiplier, 1.0, releases)], delta)


@functools.lru_cache(maxsize=1024)
def noise_for_epsilon(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """The noise multiplier that brings `steps` steps at `sample_rate` to `target_epsilon` at
    `delta` (Opacus' get_noise_multiplier: a binary search on the RDP accountant, to within
    0.01 in epsilon, from below). ValueError when no noise level reaches the target."""
    if target_epsilon <= 0:
        raise ValueError(f"target epsilon must be positive, got {target_epsilon}")
    if steps <= 0:
        return 0.0
    from opacus.accountants.utils import get_noise_multiplier  # lazy: opacus

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Optimal order", category=UserWarning)
        try:
            return float(
                get_noise_multiplier(
                    target_epsilon=target_epsilon,
                    target_delta=delta,
                    sample_rate=sample_rate,
                    steps=steps,
                    accountant="rdp",
                )
            )
        except ValueError as exc:
            raise ValueError(
                f"no noise multiplier reaches epsilon {target_epsilon} at delta {delta} after "
                f"{steps} steps at sample rate {sample_rate:.4g} ({exc})"
            ) from None


# ---- distributed DP: the Skellam mechanism under secure aggregation -------------------------
INTEGER_ORDERS = tuple(range(2, 257))
"""The integer RDP orders of the Skellam accounting (its RDP bound holds at integer orders)."""
FRACTIONAL_ORDERS = tuple(2 + k / 20 for k in range(1, 20))
"""Orders between 2 and 3, where a sampled release's RDP is bounded from its base RDP at 2 and
3 (`fractional_subsampled_rdp`): the best order of moderate epsilons lies there."""
ORDERS = tuple(sorted((*INTEGER_ORDERS, *FRACTIONAL_ORDERS)))
"""Every order of the distributed accounting."""

Release = tuple[float, float, float, float, int]
"""A ledger entry of distributed DP: (noise variance of the sum, l1 and l2 sensitivity, all in
encoded units, the sample rate, the rounds released alike)."""


def skellam_rdp(order: int, variance: float, l1: float, l2: float) -> float:
    """RDP of order `order` (an integer > 1) of the Skellam mechanism whose noise has variance
    `variance` on every coordinate, for sensitivities `l1`, `l2` (Agarwal, Kairouz and Liu,
    NeurIPS 2021, "The Skellam Mechanism for Differentially Private Federated Learning",
    Cor. 3.6): a l2^2 / (2 V) + min(((2a - 1) l2^2 + 6 l1) / (4 V^2), 3 l1 / (2 V)). The first
    term is the Gaussian mechanism's of the same variance; the second, what the noise being
    integer costs."""
    if variance <= 0:
        return math.inf
    a = order
    return a * l2**2 / (2 * variance) + min(
        ((2 * a - 1) * l2**2 + 6 * l1) / (4 * variance**2), 3 * l1 / (2 * variance)
    )


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def poisson_subsampled_rdp(order: int, q: float, rdp: Callable[[int], float]) -> float:
    """RDP of order `order` (an integer > 1) of a *symmetric* mechanism of RDP curve `rdp`
    (its bound over every pair of neighbouring inputs) run on a Poisson sample of rate q:

      1/(a-1) log[ (1-q)^(a-1) (1 + (a-1) q)
                   + sum_{k=2..a} C(a,k) q^k (1-q)^(a-k) e^((k-1) rdp(k)) ],

    and never more than the mechanism's own RDP. Symmetric: for each pair of output
    distributions (P with one client's contribution, Q without), an involution T of the output
    space with P = Q o T (additive noise symmetric about 0 with an integer shift, as the
    Skellam's: T(x) = v - x). The sum is E_Q[((1-q) + q P/Q)^a] expanded (its k-th moment is
    e^((k-1) D_k(P||Q))): exactly the removal direction, as in Mironov, Talwar and Zhang's
    analysis of the sampled Gaussian (2019) and Zhu and Wang's (ICML 2019) tight form. For a
    symmetric pair the addition direction never exceeds it (docs/privacy.md#distributed-noise-
    under-secure-aggregation: T splits the pair into two-point pairs, each of which satisfies
    it), and the mixture over who else was sampled keeps the bound (Rényi divergence is jointly
    convex). For the Gaussian it is Opacus' `compute_rdp` at integer orders."""
    if q >= 1:
        return rdp(order)
    if q <= 0:
        return 0.0
    a = order
    log_q, log_1q = math.log(q), math.log1p(-q)
    terms = [(a - 1) * log_1q + math.log1p((a - 1) * q)]
    for ell in range(2, a + 1):
        terms.append(
            _log_comb(a, ell) + ell * log_q + (a - ell) * log_1q + (ell - 1) * rdp(ell)
        )  # fmt: skip
    top = max(terms)
    bound = (top + math.log(sum(math.exp(t - top) for t in terms))) / (a - 1)
    return min(bound, rdp(order))


_TOUCH = np.concatenate([np.linspace(0.0, 3.0, 31), np.geomspace(3.2, 200.0, 40)])
"""Where the dominating cubics of `fractional_subsampled_rdp` may touch the power function."""


def fractional_subsampled_rdp(order: float, q: float, rdp2: float, rdp3: float) -> float:
    """RDP of order a in (2, 3) of a symmetric mechanism (as `poisson_subsampled_rdp`) whose
    RDP at orders 2 and 3 is at most `rdp2`, `rdp3`, run on a Poisson sample of rate q.

    As at integer orders, with M = (1-q) Q + q P the output with the client and Q without it,
    D_a(M||Q) is log E_Q[f(L)] / (a - 1), f(L) = (1-q + q L)^a with L = P/Q, whose moments are
    E[L] = 1, E[L^2] = e^(D_2) <= M2 = e^(rdp2) and E[L^3] = e^(2 D_3) <= M3 = e^(2 rdp3), and
    D_a(Q||M) never exceeds it (the two-point argument of docs/privacy.md holds at every real
    order above 1). For 2 < a < 3 the fourth
    derivative of f is negative, so the cubic p that meets f with equal slope at two points
    L1, L2 lies above it on [0, inf): f - p = f^(4)(xi) / 24 (L - L1)^2 (L - L2)^2 <= 0
    (Hermite interpolation's error). Then E_Q[f(L)] <= E_Q[p(L)] = c0 + c1 + c2 E[L^2] + c3
    E[L^3], each moment taken at its bound where its coefficient is positive and at 1 (Jensen:
    E[L^k] >= 1) where it is negative; the least of these over a grid of touching points is the
    bound. For the sampled Gaussian it lies within 0.3 % of Opacus' exact fractional-order RDP
    at z = 2, 3.5 % at z = 1 and 10 % at z = 0.7 (tests/models/test_privacy.py), well under
    the log-convex interpolation between orders 2 and 3."""
    if not 2 < order < 3:
        raise ValueError(f"order {order} is not between 2 and 3")
    if q <= 0:
        return 0.0
    if q >= 1 or not (math.isfinite(rdp2) and math.isfinite(rdp3)):
        # no sample: the base mechanism's, by the log-convex interpolation between its orders
        # 2 and 3 ((a - 1) RDP(a) is convex in a)
        return ((3 - order) * rdp2 + (order - 2) * 2 * rdp3) / (order - 1)
    m2, m3 = math.exp(rdp2), math.exp(2 * rdp3)
    c0, c1, c2, c3 = dominating_cubics(order, q).T
    with np.errstate(over="ignore", invalid="ignore"):
        bound = c0 + c1 + np.where(c2 > 0, c2 * m2, c2) + np.where(c3 > 0, c3 * m3, c3)
    best = float(np.nanmin(bound)) * (1 + 1e-9)  # (the coefficients' rounding, covered)
    return math.log(best) / (order - 1) if best > 1 else 0.0


@functools.lru_cache(maxsize=64)
def dominating_cubics(order: float, q: float) -> np.ndarray:
    """Coefficients (c0, c1, c2, c3), one row per pair of touching points L1 < L2 of _TOUCH, of
    the cubics that meet f(L) = (1-q + q L)^order with equal slope at L1 and L2 (Hermite
    interpolation); for 2 < order < 3 each lies above f on [0, inf)."""
    a = order
    x1, x2 = np.meshgrid(_TOUCH, _TOUCH, indexing="ij")
    keep = x2 > x1 + 1e-9
    x1, x2 = x1[keep], x2[keep]
    base1, base2 = 1 - q + q * x1, 1 - q + q * x2
    f1, f2 = base1**a, base2**a
    d1, d2 = a * q * base1 ** (a - 1), a * q * base2 ** (a - 1)
    # Newton's form: p = f1 + d1 (L - x1) + u (L - x1)^2 + w (L - x1)^2 (L - x2)
    h = x2 - x1
    slope = (f2 - f1) / h
    u = (slope - d1) / h
    w = ((d2 - slope) / h - u) / h
    c3 = w
    c2 = u - w * (2 * x1 + x2)
    c1 = d1 - 2 * u * x1 + w * (x1 * x1 + 2 * x1 * x2)
    c0 = f1 - d1 * x1 + u * x1 * x1 - w * x1 * x1 * x2
    out = np.stack([c0, c1, c2, c3], axis=1)
    out.flags.writeable = False
    return out


@functools.lru_cache(maxsize=1024)
def _release_rdp(variance: float, l1: float, l2: float, q: float) -> tuple[float, ...]:
    """RDP of one sampled Skellam release at every order of ORDERS (cached: releases
    repeat)."""

    def base(order: int) -> float:
        return skellam_rdp(order, variance, l1, l2)

    at = {a: poisson_subsampled_rdp(a, q, base) for a in INTEGER_ORDERS}
    two, three = base(2), base(3)
    return tuple(
        at[int(a)] if float(a).is_integer() else fractional_subsampled_rdp(a, q, two, three)
        for a in ORDERS
    )


@functools.lru_cache(maxsize=1024)
def _gaussian_rdp(z: float, q: float) -> tuple[float, ...]:
    from opacus.accountants.analysis.rdp import compute_rdp  # lazy: opacus

    rdp = compute_rdp(q=q, noise_multiplier=z, steps=1, orders=list(ORDERS))
    return tuple(float(v) for v in np.atleast_1d(rdp))


def distributed_epsilon(
    releases: Iterable[Sequence[float]],
    delta: float,
    gaussian: Iterable[Sequence[float]] = (),
    amplified: bool = True,
) -> float:
    """Epsilon at `delta` of distributed DP's releases (entries `Release`) composed with
    Gaussian releases (entries (z, q, steps): a round whose sum the server noised itself), by
    RDP at ORDERS and Opacus' conversion; `amplified=False`: as if every release
    ran on the whole federation (sample rate 1), against a party that knows who was sampled.
    0 with nothing released."""
    skellam = [(*(float(v) for v in e[:4]), int(e[4])) for e in releases if int(e[4]) > 0]
    normal = [(float(e[0]), float(e[1]), int(e[2])) for e in gaussian if int(e[2]) > 0]
    if not skellam and not normal:
        return 0.0
    rdp = np.zeros(len(ORDERS))
    for variance, l1, l2, q, rounds in skellam:  # type: ignore[misc]
        rate = q if amplified else 1.0
        rdp += rounds * np.asarray(_release_rdp(variance, l1, l2, rate))
    for z, q, steps in normal:
        if z <= 0:
            return math.inf
        rdp += steps * np.asarray(_gaussian_rdp(z, q if amplified else 1.0))
    if not np.isfinite(rdp).all():
        return math.inf
    from opacus.accountants.analysis.rdp import get_privacy_spent  # lazy: opacus

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Optimal order", category=UserWarning)
        eps, _ = get_privacy_spent(orders=list(ORDERS), rdp=rdp, delta=delta)
    return float(eps)


@functools.lru_cache(maxsize=256)
def distributed_noise_for_epsilon(
    target_epsilon: float, delta: float, sample_rate: float, rounds: int, unit: float
) -> float:
    """The noise multiplier z (noise std of the sum over the clipping bound) whose `rounds`
    Skellam releases at `sample_rate`, with l2 sensitivity `unit` (the encoded clipping bound,
    before rounding), spend at most `target_epsilon` at `delta` (bisection, to within 0.01 in
    epsilon from below). ValueError when no noise reaches it."""
    if target_epsilon <= 0:
        raise ValueError(f"target epsilon must be positive, got {target_epsilon}")

    def spent(z: float) -> float:
        entry = ((z * unit) ** 2, math.sqrt(2) * unit, unit, sample_rate, rounds)
        return distributed_epsilon([entry], delta)

    low, high = 0.0, 1.0
    while spent(high) > target_epsilon:
        high *= 2
        if high > 1e6:
            raise ValueError(
                f"no noise multiplier reaches epsilon {target_epsilon} at delta {delta} after "
                f"{rounds} rounds at sample rate {sample_rate:.4g}"
            )
    while spent(high) < target_epsilon - 0.01 and high - low > 1e-6:
        middle = (low + high) / 2
        if spent(middle) > target_epsilon:
            low = middle
        else:
            high = middle
    return high


def dp_compatible(model: nn.Module) -> nn.Module:
    """`model` made trainable by Opacus' per-sample gradients: ModuleValidator.fix replaces
    what it can (BatchNorm by GroupNorm, nn.LSTM by Opacus' DPLSTM, whose state-dict keys are
    nn.LSTM's) and makes in-place activations out-of-place; ValueError naming the first module
    that still cannot be (a trainable module with buffers, say)."""
    from opacus import GradSampleModule  # lazy: opacus
    from opacus.validators import ModuleValidator  # lazy: opacus

    training = model.training
    fixed = ModuleValidator.fix(model).train()
    errors = [*ModuleValidator.validate(fixed), *GradSampleModule.validate(fixed)]
    if errors:
        reason = " ".join(str(errors[0]).split())
        raise ValueError(f"the model cannot train with DP-SGD (Opacus): {reason}")
    for module in fixed.modules():  # an in-place activation would overwrite the output that
        if getattr(module, "inplace", False):  # Opacus' backward hooks hold (mobilenet-v2's
            module.inplace = False  # ReLU6 after a GroupNorm): same values, one copy more
    _keep_renamed_keys(fixed)
    return fixed.train(training)


def _keep_renamed_keys(model: nn.Module) -> None:
    """Opacus' DPLSTM holds nn.LSTM's parameters under its own names too (`l0.ih.weight` beside
    `weight_ih_l0`) and hides them only when it is the root module. Inside a model, the model's
    state dict would carry both; these hooks keep only nn.LSTM's names, so the weights a client
    sends are the same keys as without DP-SGD."""
    renamed = [
        (f"{name}." if name else "", dict(module.old_to_new))
        for name, module in model.named_modules()
        if isinstance(getattr(module, "old_to_new", None), dict)
    ]
    if not renamed:
        return

    def drop(_module: nn.Module, state: dict, prefix: str, _meta: object) -> None:
        for path, names in renamed:
            for old in names:
                state.pop(f"{prefix}{path}{old}", None)

    def restore(_module: nn.Module, state: dict, prefix: str, *_args: object) -> None:
        for path, names in renamed:
            for old, new in names.items():
                if f"{prefix}{path}{new}" in state:
                    state.setdefault(f"{prefix}{path}{old}", state[f"{prefix}{path}{new}"])

    model.register_state_dict_post_hook(drop)
    model.register_load_state_dict_pre_hook(restore)
