"""robust.attacks: each attack's defining formula recomputed directly, ALIE's z_max against
hand-computed normal quantiles, the adaptive attacks against the plain ones, Min-Max's
constraint, and the edge cases (no honest rows, one honest row, overflow)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from robust import rules
from robust.attacks import KINDS, alie_z_max, attack_rows, damage, min_max_row

H, K, D = 8, 3, 10


def _rows(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    center = rng.standard_normal(D)
    return center + 0.5 * rng.standard_normal((H, D)), center + 0.5 * rng.standard_normal((K, D))


def _attack(
    kind: str,
    honest: np.ndarray,
    own: np.ndarray,
    *,
    rule: rules.Rule | None = None,
    f: int = K,
    **factors: float,
) -> np.ndarray:
    """attack_rows against `rule` (the median by default), with a fixed generator."""
    return attack_rows(
        kind,
        honest,
        own,
        rule=rules.rule_function("median") if rule is None else rule,
        f=f,
        rng=np.random.default_rng(7),
        **factors,
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("h", [0, 1, 2, H])
@pytest.mark.parametrize("k", [1, K])
def test_every_kind_sends_k_finite_rows(kind: str, h: int, k: int) -> None:
    honest, own = _rows(h)
    out = _attack(kind, honest[:h], own[:k])
    assert out.shape == (k, D) and out.dtype == np.float64
    assert np.isfinite(out).all()


def test_the_settings_kinds_are_the_attacks() -> None:
    from pollen.core.protection import ATTACKS

    assert tuple(ATTACKS) == KINDS


def test_unknown_kinds_and_shapes_are_refused() -> None:
    honest, own = _rows()
    with pytest.raises(ValueError, match="unknown attack"):
        _attack("backdoor", honest, own)
    with pytest.raises(ValueError, match="do not match"):
        _attack("alie", honest[:, :4], own)
    with pytest.raises(ValueError, match=r"\(k, d\)"):
        _attack("alie", honest, own[0])
    assert _attack("alie", honest, own[:0]).shape == (0, D)


# --- the simple attacks ----------------------------------------------------------------------


def test_sign_flip() -> None:
    honest, own = _rows()
    np.testing.assert_array_equal(_attack("sign-flip", honest, own), -10.0 * own)
    np.testing.assert_array_equal(_attack("sign-flip", honest, own, scale=2.5), -2.5 * own)


def test_gaussian_is_noise_from_the_generator() -> None:
    honest, own = _rows()
    out = _attack("gaussian", honest, own, std=3.0)
    np.testing.assert_array_equal(out, np.random.default_rng(7).normal(0.0, 3.0, (K, D)))
    big = attack_rows(
        "gaussian",
        np.zeros((5, 500)),
        np.zeros((200, 500)),
        rule=rules.rule_function("mean"),
        f=0,
        rng=np.random.default_rng(1),
        std=3.0,
    )
    assert big.mean() == pytest.approx(0.0, abs=0.02)
    assert big.std() == pytest.approx(3.0, rel=0.01)


def test_model_replacement_boosts_the_reversed_update() -> None:
    honest, own = _rows()
    np.testing.assert_array_equal(_attack("model-replacement", honest, own, scale=4.0), -4 * own)
    # scale 0: gamma = n, so one attacker among n - 1 honest zero updates moves the mean to -u
    n = H + K
    np.testing.assert_array_equal(_attack("model-replacement", honest, own, scale=0.0), -n * own)
    u = own[:1]
    out = _attack("model-replacement", np.zeros((H, D)), u, scale=0.0)
    np.testing.assert_allclose(np.vstack([np.zeros((H, D)), out]).mean(axis=0), -u[0])


def test_label_flip_sends_the_update_unchanged() -> None:
    honest, own = _rows()
    out = _attack("label-flip", honest, own)
    np.testing.assert_array_equal(out, own)
    assert out is not own


def test_ipm_is_minus_epsilon_times_the_honest_mean() -> None:
    honest, own = _rows()
    mean = np.array([sum(col) / H for col in honest.T])
    np.testing.assert_allclose(_attack("ipm", honest, own), np.tile(-0.5 * mean, (K, 1)))
    np.testing.assert_allclose(
        _attack("ipm", honest, own, epsilon=2.0), np.tile(-2.0 * mean, (K, 1))
    )


# --- ALIE ------------------------------------------------------------------------------------


def _population_std(x: np.ndarray) -> np.ndarray:
    mu = x.sum(axis=0) / len(x)
    return np.sqrt(((x - mu) ** 2).sum(axis=0) / len(x))


def test_alie_is_mean_minus_z_std() -> None:
    honest, own = _rows()
    mu, sigma = honest.sum(axis=0) / H, _population_std(honest)
    np.testing.assert_allclose(
        _attack("alie", honest, own, z=1.5), np.tile(mu - 1.5 * sigma, (K, 1)), rtol=1e-12
    )
    z = alie_z_max(H + K, K)
    np.testing.assert_allclose(
        _attack("alie", honest, own), np.tile(mu - z * sigma, (K, 1)), rtol=1e-12
    )


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


@pytest.mark.parametrize(
    ("n", "k", "expected"),
    [
        # s = floor(n/2 + 1) - k supporters; z_max = Phi^{-1}((n - s) / n) from a normal table
        (50, 12, 0.5828415),  # s = 14, Phi^{-1}(0.72)
        (20, 4, 0.3853205),  # s = 7, Phi^{-1}(0.65)
        (100, 20, 0.4958503),  # s = 31, Phi^{-1}(0.69)
        (4, 2, 0.6744898),  # s = 1, Phi^{-1}(0.75)
        (11, 3, 0.6045853),  # s = 3, Phi^{-1}(8/11)
    ],
)
def test_alie_z_max(n: int, k: int, expected: float) -> None:
    z = alie_z_max(n, k)
    assert z == pytest.approx(expected, abs=1e-6)
    s = math.floor(n / 2 + 1) - k
    assert _phi(z) == pytest.approx((n - s) / n, abs=1e-9)


def test_alie_z_max_edge_cases() -> None:
    # one attacker among an even n: Phi^{-1}(1/2) = 0, replaced by a small positive z
    assert alie_z_max(10, 1) == pytest.approx(0.1)
    # an attacker majority: the argument is held below 1
    assert alie_z_max(5, 4) == pytest.approx(4.753424, abs=1e-5)
    assert math.isfinite(alie_z_max(1, 1))
    with pytest.raises(ValueError):
        alie_z_max(0, 0)


# --- the adaptive attacks --------------------------------------------------------------------


def _count(rule: rules.Rule) -> tuple[rules.Rule, list[int]]:
    calls = [0]

    def counted(x: np.ndarray, f: int) -> np.ndarray:
        calls[0] += 1
        return rule(x, f)

    return counted, calls


@pytest.mark.parametrize("name", ["median", "trimmed-mean", "krum", "geomed"])
@pytest.mark.parametrize(("plain", "opt"), [("alie", "opt-alie"), ("ipm", "opt-ipm")])
def test_adaptive_attacks_do_at_least_the_plain_damage(name: str, plain: str, opt: str) -> None:
    honest, own = _rows(3)
    rule, calls = _count(rules.rule_function(name))
    f = 2 if name == "krum" else K
    base = _attack(plain, honest, own, rule=rule, f=f)
    calls[0] = 0
    best = _attack(opt, honest, own, rule=rule, f=f)
    assert 0 < calls[0] <= 40
    assert damage(rule, honest, best, f) >= damage(rule, honest, base, f) - 1e-12
    assert np.array_equal(best, _attack(opt, honest, own, rule=rule, f=f))
    # the rows are the plain attack's, with some factor t in [0, 20]
    mu, sigma = honest.mean(axis=0), _population_std(honest)
    assert (best == best[0]).all()
    if opt == "opt-alie":
        t = float(np.dot(mu - best[0], sigma) / np.dot(sigma, sigma))
        np.testing.assert_allclose(best[0], mu - t * sigma, atol=1e-12)
    else:
        t = float(-np.dot(best[0], mu) / np.dot(mu, mu))
        np.testing.assert_allclose(best[0], -t * mu, atol=1e-12)
    assert 0 <= t <= 20 + 1e-9


@pytest.mark.parametrize(("name", "gain"), [("median", 1.1), ("trimmed-mean", 1.5)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_opt_alie_beats_alie_at_z_max(name: str, gain: float, seed: int) -> None:
    honest, own = _rows(seed)
    rule = rules.rule_function(name)
    base = damage(rule, honest, _attack("alie", honest, own, rule=rule), K)
    best = damage(rule, honest, _attack("opt-alie", honest, own, rule=rule), K)
    assert best > gain * base


def test_adaptive_attacks_fall_back_when_the_rule_refuses() -> None:
    honest, own = _rows()
    np.testing.assert_array_equal(
        _attack("opt-ipm", honest, own, rule=rules.rule_function("krum"), f=10, epsilon=0.7),
        np.tile(-0.7 * honest.mean(axis=0), (K, 1)),
    )


# --- Min-Max ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_min_max_meets_its_constraint_with_equality(seed: int) -> None:
    honest, own = _rows(seed)
    out = _attack("min-max", honest, own)
    assert (out == out[0]).all()
    row = out[0]
    bound = max(np.linalg.norm(a - b) for a in honest for b in honest)
    reach = max(np.linalg.norm(row - a) for a in honest)
    assert reach <= bound * (1 + 1e-12)
    assert reach == pytest.approx(bound, rel=1e-8)
    # the row is m - gamma std with gamma > 0
    mu, sigma = honest.mean(axis=0), _population_std(honest)
    gamma = float(np.dot(mu - row, sigma) / np.dot(sigma, sigma))
    assert gamma > 0
    np.testing.assert_allclose(row, mu - gamma * sigma, atol=1e-12)
    # a slightly larger gamma breaks the constraint
    assert max(np.linalg.norm(mu - 1.001 * gamma * sigma - a) for a in honest) > bound


def test_min_max_of_equal_rows_is_that_row() -> None:
    honest = np.tile(np.arange(1.0, D + 1), (4, 1))
    np.testing.assert_array_equal(min_max_row(honest), honest[0])


# --- no honest row, one honest row, overflow -------------------------------------------------


@pytest.mark.parametrize("kind", ["alie", "ipm", "min-max", "opt-alie", "opt-ipm"])
def test_without_honest_rows_the_attackers_use_their_own(kind: str) -> None:
    _, own = _rows()
    none = _attack(kind, np.zeros((0, D)), own, z=1.0)
    if kind == "alie":
        np.testing.assert_allclose(
            none, np.tile(own.mean(axis=0) - _population_std(own), (K, 1)), rtol=1e-12
        )
    if kind == "ipm":
        np.testing.assert_allclose(none, np.tile(-0.5 * own.mean(axis=0), (K, 1)), rtol=1e-12)
    if kind == "min-max":
        np.testing.assert_allclose(none, np.tile(min_max_row(own), (K, 1)), rtol=1e-12)
    assert np.isfinite(none).all()
    assert np.array_equal(_attack(kind, np.zeros(0), own, z=1.0), none)


@pytest.mark.parametrize("kind", ["alie", "opt-alie", "min-max"])
def test_one_honest_row_has_no_spread(kind: str) -> None:
    honest, own = _rows()
    out = _attack(kind, honest[:1], own)
    np.testing.assert_array_equal(out, np.tile(honest[0], (K, 1)))


def test_outputs_stay_finite() -> None:
    honest, own = _rows()
    huge = np.full((K, D), 1e308)
    assert np.isfinite(_attack("sign-flip", honest, huge)).all()
    assert np.isfinite(_attack("model-replacement", honest, huge, scale=0.0)).all()
    # a non-finite honest row is left out of the estimates
    bad = honest.copy()
    bad[0, 0] = np.nan
    bad[1, 3] = np.inf
    np.testing.assert_allclose(_attack("ipm", bad, own), _attack("ipm", honest[2:], own))
    assert np.isfinite(_attack("min-max", bad, own)).all()
