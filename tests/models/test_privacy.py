"""Privacy accounting on Opacus (models.privacy): the Gaussian mechanism's closed forms, Opacus'
own accountant for the same steps, the noise calibration, Poisson sampling as Opacus' data
loader does it, and models made trainable by Opacus."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from models import build_model
from models.privacy import (
    add_steps,
    dp_compatible,
    epsilon,
    gaussian_epsilon,
    noise_for_epsilon,
    poisson_plan,
)
from models.weights import get_weights, set_weights


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def exact_delta(eps: float, z: float) -> float:
    """delta(eps) of the Gaussian mechanism with sensitivity 1 and noise std z, exactly (Balle &
    Wang, ICML 2018, Thm. 8: the analytic Gaussian mechanism)."""
    return _phi(1 / (2 * z) - eps * z) - math.exp(eps) * _phi(-1 / (2 * z) - eps * z)


def exact_epsilon(z: float, delta: float) -> float:
    """The smallest eps with exact_delta(eps, z) <= delta (bisection; delta decreases in eps)."""
    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if exact_delta(mid, z) <= delta else (mid, hi)
    return hi


def rdp_closed_form(releases: int, z: float, delta: float) -> float:
    """T releases of the Gaussian mechanism at sample rate 1: RDP of order a is T a / (2 z^2)
    (Mironov, 2017, Prop. 7 and composition), converted by Balle et al. (2020, Thm. 21) at
    Opacus' default orders. This is the formula Pollen computed by hand before using Opacus."""
    a = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)), dtype=float)
    rdp = releases * a / (2 * z**2)
    return float(np.nanmin(rdp - (math.log(delta) + np.log(a)) / (a - 1) + np.log((a - 1) / a)))


@pytest.mark.parametrize(
    ("releases", "z", "delta"),
    [(1, 1.0, 1e-5), (1, 5.0, 1e-5), (10, 3.0, 1e-5), (100, 20.0, 1e-3), (1, 0.5, 1e-6)],
)
def test_the_gaussian_mechanism_against_its_closed_forms(
    releases: int, z: float, delta: float
) -> None:
    """At sample rate 1 Opacus' RDP is T a / (2 z^2) at every order; the epsilon it gives is an
    upper bound of the exact one (T releases at noise z are one release at z / sqrt(T)), and
    not a loose one: within 25 % of it."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp

    orders = RDPAccountant.DEFAULT_ALPHAS
    rdp = compute_rdp(q=1.0, noise_multiplier=z, steps=releases, orders=orders)
    assert rdp == pytest.approx(releases * np.array(orders) / (2 * z**2), rel=1e-12)

    eps = gaussian_epsilon(releases, z, delta)
    assert eps == pytest.approx(rdp_closed_form(releases, z, delta), rel=1e-12)
    exact = exact_epsilon(z / math.sqrt(releases), delta)
    assert exact_delta(eps, z / math.sqrt(releases)) <= delta  # a valid guarantee
    assert exact <= eps <= 1.25 * exact


@pytest.mark.parametrize(
    "history",
    [
        [(1.0, 1 / 27, 81)],
        [(0.8, 0.01, 1000)],
        [(1.1, 0.05, 30), (0.7, 0.02, 200)],  # settings changed along the way
        [(2.0, 1.0, 5)],
    ],
)
def test_epsilon_is_opacus_accountants_for_the_same_steps(history: list) -> None:
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = list(history)
    for delta in (1e-5, 1e-3):
        assert epsilon(history, delta) == pytest.approx(accountant.get_epsilon(delta), rel=1e-12)


def test_epsilon_of_steps_taken_one_at_a_time() -> None:
    """Opacus' accountant stepped as its optimizer hook steps it, against the ledger."""
    from opacus.accountants import RDPAccountant

    accountant, ledger = RDPAccountant(), list[tuple[float, float, int]]()
    for _ in range(40):
        accountant.step(noise_multiplier=1.2, sample_rate=0.04)
        ledger = add_steps(ledger, 1.2, 0.04, 1)
    assert ledger == [(1.2, 0.04, 40)]
    assert epsilon(ledger, 1e-5) == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)


def test_epsilon_edges_and_monotonicity() -> None:
    assert epsilon([], 1e-5) == 0.0 and epsilon([(1.0, 0.1, 0)], 1e-5) == 0.0
    assert epsilon([(0.0, 0.1, 3)], 1e-5) == math.inf
    base = epsilon([(1.0, 0.05, 100)], 1e-5)
    assert epsilon([(1.0, 0.05, 200)], 1e-5) > base  # more steps
    assert epsilon([(2.0, 0.05, 100)], 1e-5) < base  # more noise
    assert epsilon([(1.0, 0.02, 100)], 1e-5) < base  # smaller batches: more amplification
    assert epsilon([(1.0, 0.05, 100)], 1e-3) < base  # larger delta


def test_add_steps_merges_equal_settings_only() -> None:
    ledger = add_steps([], 1.0, 0.1, 5)
    ledger = add_steps(ledger, 1.0, 0.1, 7)
    ledger = add_steps(ledger, 0.9, 0.1, 2)
    assert ledger == [(1.0, 0.1, 12), (0.9, 0.1, 2)]
    assert add_steps(ledger, 1.0, 0.1, 0) == ledger


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")
@pytest.mark.parametrize(("target", "q", "steps"), [(1.0, 0.02, 500), (3.0, 1 / 27, 81)])
def test_calibrated_noise_reaches_the_target_from_below(
    target: float, q: float, steps: int
) -> None:
    from opacus.accountants.utils import get_noise_multiplier

    z = noise_for_epsilon(target, 1e-5, q, steps)
    expected = get_noise_multiplier(
        target_epsilon=target, target_delta=1e-5, sample_rate=q, steps=steps
    )
    assert z == expected
    assert target - 0.01 <= epsilon([(z, q, steps)], 1e-5) <= target
    with pytest.raises(ValueError, match="no noise multiplier reaches epsilon"):
        noise_for_epsilon(1e-9, 1e-12, 1.0, 10**6)


@pytest.mark.parametrize(("n", "batch"), [(1000, 32), (31, 32), (32, 32), (33, 32), (421, 16)])
def test_poisson_plan_is_opacus_data_loaders(n: int, batch: int) -> None:
    """Sample rate, batches per epoch and expected batch size as Opacus' DPDataLoader and
    PrivacyEngine derive them from a DataLoader of the same batch size."""
    from opacus.data_loader import DPDataLoader
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.zeros(n, 1)), batch_size=batch)
    dp_loader = DPDataLoader.from_data_loader(loader)
    plan = poisson_plan(n, batch)
    assert plan.sample_rate == dp_loader.sample_rate
    assert plan.steps_per_epoch == len(dp_loader)
    assert plan.expected_batch_size == int(n * (1 / len(loader)))
    assert poisson_plan(0, batch).steps_per_epoch == 0


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_dp_compatible_replaces_batch_norm_by_group_norm() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(  # the shape of the registry's BatchNorm networks (mobilenet-v2's
        # in-place ReLU6 after a norm too), small
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU6(inplace=True), nn.Flatten(),
        nn.Linear(8 * 36, 16), nn.BatchNorm1d(16), nn.Linear(16, 10),
    )  # fmt: skip
    fixed = dp_compatible(model)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in fixed.modules())
    assert [m.num_channels for m in fixed.modules() if isinstance(m, nn.GroupNorm)] == [8, 16]
    assert fixed(torch.zeros(2, 3, 8, 8)).shape == (2, 10)
    # Opacus computes every parameter's per-example gradients (an in-place activation after a
    # hooked module would make autograd refuse the backward pass)
    from opacus import GradSampleModule

    private = GradSampleModule(fixed)
    private(torch.randn(5, 3, 8, 8)).sum().backward()
    assert all(p.grad_sample.shape == (5, *p.shape) for p in fixed.parameters())  # type: ignore[attr-defined]
    private._close()
    # state-dict keys without running statistics, the same on every side that builds it
    assert not any("running_mean" in k for k in fixed.state_dict())


def test_dp_compatible_keeps_the_lstm_state_dict_keys() -> None:
    torch.manual_seed(0)
    model = build_model("char-lstm-small", (20,), 30)
    fixed = dp_compatible(model)
    assert type(fixed.rnn).__name__ == "DPLSTM"
    # nn.LSTM's keys only (Opacus' own names of the same tensors are hidden), through a copy too
    assert set(fixed.state_dict()) == set(model.state_dict())
    assert set(copy.deepcopy(fixed).state_dict()) == set(model.state_dict())
    tokens = torch.randint(0, 30, (2, 20))
    assert torch.allclose(fixed(tokens), model(tokens), atol=1e-5)
    again = dp_compatible(build_model("char-lstm-small", (20,), 30))
    set_weights(again, get_weights(fixed))  # strict: every key known, none missing
    assert torch.equal(again(tokens), fixed(tokens))


def test_dp_compatible_leaves_a_supported_model_as_it_computes() -> None:
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10)
    fixed = dp_compatible(model)
    x = torch.randn(4, 1, 8, 8)
    assert torch.equal(fixed(x), model(x))


class _WithBuffer(nn.Module):
    """A trainable layer with a buffer no fixer knows: Opacus cannot train it privately."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3))
        self.register_buffer("seen", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def test_a_model_opacus_cannot_train_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match=r"cannot train with DP-SGD \(Opacus\)") as info:
        dp_compatible(nn.Sequential(nn.Linear(3, 3), _WithBuffer()))
    assert "\n" not in str(info.value)


# ---- distributed DP: the Skellam mechanism -----------------------------------------------------
def test_skellam_rdp_is_the_gaussian_s_plus_a_vanishing_surcharge() -> None:
    from models.privacy import skellam_rdp

    l2 = 2.0**21
    for z in (0.5, 1.0, 3.0):
        variance = (z * l2) ** 2
        for order in (2, 10, 100):
            gaussian = order / (2 * z * z)
            skellam = skellam_rdp(order, variance, math.sqrt(1e5) * l2, l2)
            assert gaussian <= skellam <= gaussian * (1 + 1e-6)
    # a small variance: the integer noise costs more than a Gaussian's of the same variance
    assert skellam_rdp(2, 4.0, 3.0, 1.0) > 2 / (2 * 4.0)


def test_the_subsampling_bound_is_the_exact_sampled_gaussian_for_the_gaussian() -> None:
    from opacus.accountants.analysis.rdp import compute_rdp

    from models.privacy import poisson_subsampled_rdp

    for z in (0.5, 1.0, 2.0, 4.0):

        def gaussian(a: int, z: float = z) -> float:
            return a / (2 * z * z)

        for q in (0.01, 0.1, 0.5, 0.9):
            for order in (2, 3, 8, 32, 128):
                exact = float(compute_rdp(q=q, noise_multiplier=z, steps=1, orders=[order])[0])
                bound = poisson_subsampled_rdp(order, q, gaussian)
                assert bound == pytest.approx(min(exact, gaussian(order)), rel=1e-9, abs=1e-15)
    assert poisson_subsampled_rdp(5, 1.0, lambda a: 0.3 * a) == pytest.approx(1.5)
    assert poisson_subsampled_rdp(5, 0.0, lambda a: 0.3 * a) == 0.0


def _log_renyi_moment(p: np.ndarray, q: np.ndarray, order: float) -> float:
    """log sum p^a q^(1-a) of two distributions given as log-probabilities (float64)."""
    terms = order * p + (1 - order) * q
    top = float(terms.max())
    return top + math.log(float(np.exp(terms - top).sum()))


def _mix(log_q: np.ndarray, log_p: np.ndarray, rate: float) -> np.ndarray:
    """log((1 - rate) Q + rate P)."""
    return np.logaddexp(math.log1p(-rate) + log_q, math.log(rate) + log_p)


def test_for_a_two_point_symmetric_pair_adding_never_costs_more_than_removing() -> None:
    # the lemma under the bound (docs/privacy.md): P = (p, 1-p), Q = (1-p, p), M = (1-q) Q + q P;
    # sum M^a Q^(1-a) >= sum Q^a M^(1-a), in 60-digit decimals
    from decimal import Decimal, localcontext

    with localcontext() as ctx:
        ctx.prec = 60
        for p in ("0.500001", "0.51", "0.6", "0.75", "0.9", "0.99", "0.999999"):
            pp = Decimal(p)
            big_q, big_p = (1 - pp, pp), (pp, 1 - pp)
            for rate in ("0.001", "0.05", "0.3", "0.5", "0.8", "0.99"):
                r = Decimal(rate)
                m = [(1 - r) * big_q[i] + r * big_p[i] for i in range(2)]
                for order in (2, 3, 5, 10, 40, 128, Decimal("2.3"), Decimal("2.75")):
                    removing = sum(m[i] ** order * big_q[i] ** (1 - order) for i in range(2))
                    adding = sum(big_q[i] ** order * m[i] ** (1 - order) for i in range(2))
                    assert 1 <= adding <= removing
                    if order > 2:
                        assert adding < removing
    # not for every pair: without the symmetry adding can cost far more (so the bound says so)
    log_p, log_q = np.log([1e-8, 1 - 1e-8]), np.log([0.06, 0.94])
    log_m = _mix(log_q, log_p, 0.9)
    assert _log_renyi_moment(log_q, log_m, 20) > 10 * _log_renyi_moment(log_m, log_q, 20)


def _skellam_log_pmf(variance: float, support: np.ndarray) -> np.ndarray:
    """log P(Sk(variance) = k) for k in `support`: Poisson(V/2) - Poisson(V/2), in log space."""
    mean = variance / 2
    j = np.arange(0, 600)
    log_poisson = j * math.log(mean) - mean - np.array([math.lgamma(i + 1) for i in j])
    out = []
    for k in support:
        a = abs(int(k))
        terms = log_poisson[a:] + log_poisson[: len(j) - a]
        top = terms.max()
        out.append(top + math.log(np.exp(terms - top).sum()))
    return np.array(out)


def test_the_sampled_skellam_s_exact_divergences_stay_under_the_bound() -> None:
    from models.privacy import fractional_subsampled_rdp, poisson_subsampled_rdp, skellam_rdp

    support = np.arange(-160, 161)
    for variance in (2.0, 8.0, 30.0):
        log_q = _skellam_log_pmf(variance, support)
        for shift in (1, 3):
            log_p = np.concatenate([np.full(shift, -np.inf), log_q[:-shift]])  # Sk + shift
            inner = support[shift:-shift]  # where both are known
            p_in, q_in = log_p[shift:-shift], log_q[shift:-shift]

            def exact(order: int, p_in: np.ndarray = p_in, q_in: np.ndarray = q_in) -> float:
                return _log_renyi_moment(p_in, q_in, order) / (order - 1)

            for rate in (0.1, 0.5, 0.9):
                log_m = _mix(log_q, log_p, rate)[shift:-shift]
                for order in (2, 4, 8, 16):
                    removing = _log_renyi_moment(log_m, q_in, order) / (order - 1)
                    adding = _log_renyi_moment(q_in, log_m, order) / (order - 1)
                    tight = poisson_subsampled_rdp(order, rate, exact)

                    def published(a: int, v: float = variance, s: int = shift) -> float:
                        return skellam_rdp(a, v, float(s), float(s))

                    assert adding <= removing + 1e-9
                    # the expansion is the removal direction itself, not only a bound on it
                    assert removing == pytest.approx(tight, rel=1e-7)
                    assert tight <= poisson_subsampled_rdp(order, rate, published) + 1e-12
                for frac in (2.1, 2.5, 2.9):  # between the integer orders
                    removing = _log_renyi_moment(log_m, q_in, frac) / (frac - 1)
                    adding = _log_renyi_moment(q_in, log_m, frac) / (frac - 1)
                    bound = fractional_subsampled_rdp(frac, rate, exact(2), exact(3))
                    assert adding <= removing + 1e-9 and removing <= bound + 1e-12
                    assert bound <= fractional_subsampled_rdp(
                        frac, rate, published(2), published(3)
                    ) + 1e-12  # fmt: skip
            assert len(inner) > 300


def test_distributed_epsilon_composes_and_counts_only_the_noise_released() -> None:
    from models.privacy import distributed_epsilon

    unit = 2.0**21
    full = ((1.0 * unit) ** 2, math.sqrt(2) * unit, unit, 0.5, 1)
    half = ((1.0 * unit) ** 2 / 2, math.sqrt(2) * unit, unit, 0.5, 1)  # half the clients dropped
    one = distributed_epsilon([full], 1e-5)
    assert 0 < one < distributed_epsilon([full, full], 1e-5)
    assert distributed_epsilon([half], 1e-5) > one  # less noise, more epsilon
    assert distributed_epsilon([(*full[:4], 5)], 1e-5) == pytest.approx(
        distributed_epsilon([full] * 5, 1e-5)
    )
    # without amplification (against the server, which knows whom it sampled): more
    assert distributed_epsilon([full], 1e-5, amplified=False) >= one
    assert distributed_epsilon([], 1e-5) == 0.0
    # a round the server noised itself composes as a Gaussian release
    assert distributed_epsilon([full], 1e-5, [(1.0, 0.5, 1)]) > one


def test_distributed_calibration_reaches_the_target_from_below() -> None:
    from models.privacy import distributed_epsilon, distributed_noise_for_epsilon

    unit = 2.0**21
    for target in (2.0, 8.0):
        z = distributed_noise_for_epsilon(target, 1e-5, 0.2, 30, unit)
        spent = distributed_epsilon([((z * unit) ** 2, math.sqrt(2) * unit, unit, 0.2, 30)], 1e-5)
        assert target - 0.01 <= spent <= target


@pytest.mark.parametrize("q", [0.05, 0.5, 0.95])
@pytest.mark.parametrize("order", [2.05, 2.4, 2.95])
def test_the_dominating_cubics_lie_above_the_power_function(order: float, q: float) -> None:
    from models.privacy import dominating_cubics

    cubics = dominating_cubics(order, q)
    x = np.concatenate([np.linspace(0.0, 10.0, 2001), np.geomspace(10.0, 1e5, 2000)])
    f = (1 - q + q * x) ** order
    powers = np.stack([np.ones_like(x), x, x**2, x**3])
    for c in cubics[:: max(1, len(cubics) // 300)]:
        assert np.all(c @ powers >= f * (1 - 1e-9) - 1e-9)


def test_fractional_orders_bound_the_sampled_gaussian_closely_from_above() -> None:
    # the Gaussian's moments E[L^k] = e^(k (k-1) / (2 z^2)) are exact, and Opacus computes
    # the sampled Gaussian exactly at fractional orders: the bound is above it, and within
    # 10 % (0.3 % at z = 2, 3.5 % at z = 1, 10 % at z = 0.7, q 0.1 to 0.9)
    from opacus.accountants.analysis.rdp import compute_rdp

    from models.privacy import fractional_subsampled_rdp

    for z in (0.7, 1.0, 2.0):
        for q in (0.1, 0.5, 0.9):
            for order in (2.05, 2.3, 2.5, 2.95):
                exact = float(compute_rdp(q=q, noise_multiplier=z, steps=1, orders=[order])[0])
                bound = fractional_subsampled_rdp(order, q, 1 / z**2, 3 / (2 * z**2))
                assert exact * (1 - 1e-9) <= bound <= 1.1 * exact
    with pytest.raises(ValueError, match="not between 2 and 3"):
        fractional_subsampled_rdp(3.5, 0.5, 1.0, 1.5)


def test_fractional_orders_bring_the_shared_out_noise_to_the_server_s() -> None:
    # at q = 0.5 and 20 rounds, epsilon 16.6 takes z = 1 on the server (Opacus' fractional
    # orders); the integer orders alone asked the shared-out noise for z = 1.04
    from models.privacy import distributed_noise_for_epsilon

    z = distributed_noise_for_epsilon(16.6, 1e-5, 0.5, 20, 2.0**21)
    assert 1.0 < z < 1.01
