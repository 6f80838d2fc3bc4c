"""robust.rules against Flower 1.39's own aggregation functions, direct NumPy loops and what each
rule provably guarantees (bounded influence of f huge rows)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, RecordDict
from flwr.server.strategy.aggregate import (
    aggregate_krum,
    aggregate_median,
    aggregate_trimmed_avg,
)
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
from flwr.serverapp.strategy.multikrum import select_multikrum

from robust import rules

RULES = ("mean", "median", "trimmed-mean", "krum", "multi-krum", "geomed", "centered-clip")


def _layers(row: np.ndarray) -> list[np.ndarray]:
    """One flat row as Flower's list of arrays (two layers of different shapes)."""
    return [row[:6].reshape(2, 3), row[6:].copy()]


def _flat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


def _results(x: np.ndarray) -> list[tuple[list[np.ndarray], int]]:
    """Flower's (arrays, num-examples) pairs, with equal counts: Flower's averages then equal our
    unweighted ones."""
    return [(_layers(row), 10) for row in x]


def _data(n: int, d: int = 11, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d))


# --- against Flower 1.39 ---------------------------------------------------------------------


@pytest.mark.parametrize("n", [5, 6, 9])
def test_median_matches_flower_and_a_sort(n: int) -> None:
    x = _data(n)
    ours = rules.median(x)
    np.testing.assert_allclose(ours, _flat(aggregate_median(_results(x))), rtol=0, atol=1e-15)
    s = np.sort(x, axis=0)
    direct = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    np.testing.assert_allclose(ours, direct, rtol=0, atol=1e-15)


@pytest.mark.parametrize(("n", "f"), [(5, 1), (7, 3), (9, 2), (6, 0)])
def test_trimmed_mean_matches_flower_and_a_loop(n: int, f: int) -> None:
    x = _data(n, seed=n + f)
    ours = rules.trimmed_mean(x, f)
    # Flower cuts int(fraction * n) from each end, fraction < 1/2: (f + 1/4) / n cuts exactly f
    fraction = (f + 0.25) / n
    flower = _flat(aggregate_trimmed_avg(_results(x), fraction))
    np.testing.assert_allclose(ours, flower, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ours, trim_mean(x, fraction), rtol=1e-12, atol=1e-15)
    direct = np.empty(x.shape[1])
    for j in range(x.shape[1]):
        values = sorted(x[:, j])
        kept = values[f : n - f]
        direct[j] = sum(kept) / len(kept)
    np.testing.assert_allclose(ours, direct, rtol=1e-12, atol=1e-15)
    if f == 0:
        np.testing.assert_allclose(ours, x.mean(axis=0), rtol=1e-12)


def _krum_scores_loop(x: np.ndarray, f: int) -> np.ndarray:
    n = x.shape[0]
    scores = []
    for i in range(n):
        d2 = sorted(float(np.sum((x[i] - x[j]) ** 2)) for j in range(n) if j != i)
        scores.append(sum(d2[: n - f - 2]))
    return np.array(scores)


@pytest.mark.parametrize(("n", "f"), [(5, 1), (7, 2), (10, 3), (9, 0)])
def test_krum_matches_flower_and_a_loop(n: int, f: int) -> None:
    x = _data(n, seed=10 * n + f)
    x[0] += 3.0  # an outlier, so the winner is not arbitrary
    scores = _krum_scores_loop(x, f)
    np.testing.assert_allclose(rules.krum_scores(x, f), scores, rtol=1e-10)
    winner = int(np.argmin(scores))
    assert np.array_equal(rules.krum(x, f), x[winner])
    flower = _flat(aggregate_krum(_results(x), num_malicious=f, to_keep=0))
    assert np.array_equal(rules.krum(x, f), flower)


@pytest.mark.parametrize(("n", "f", "m"), [(7, 2, None), (10, 3, None), (10, 3, 4), (9, 1, 1)])
def test_multi_krum_matches_flower_and_a_loop(n: int, f: int, m: int | None) -> None:
    x = _data(n, seed=100 + n + f)
    keep = n - f if m is None else m
    chosen = rules.multi_krum_selection(x, f, m)
    expected = np.argsort(_krum_scores_loop(x, f), kind="stable")[:keep]
    assert chosen.tolist() == expected.tolist()
    ours = rules.multi_krum(x, f, m)
    np.testing.assert_allclose(ours, x[expected].mean(axis=0), rtol=1e-12, atol=1e-15)
    flower = _flat(aggregate_krum(_results(x), num_malicious=f, to_keep=keep))
    np.testing.assert_allclose(ours, flower, rtol=1e-12, atol=1e-15)
    # the message-API Multi-Krum's selection, in score order
    contents = [RecordDict({"arrays": ArrayRecord(_layers(row))}) for row in x]
    picked = select_multikrum(contents, f, keep)
    assert [next(i for i, c in enumerate(contents) if c is p) for p in picked] == chosen.tolist()
    if keep == 1:
        assert np.array_equal(ours, rules.krum(x, f))


def test_multi_krum_with_no_byzantine_and_every_row_is_the_mean() -> None:
    x = _data(6)
    np.testing.assert_allclose(rules.multi_krum(x, 0, m=6), x.mean(axis=0), rtol=1e-12)
    assert sorted(rules.multi_krum_selection(x, 0, m=6).tolist()) == list(range(6))


def test_squared_distances_match_a_loop() -> None:
    x = _data(6)
    d2 = rules.squared_distances(x)
    for i in range(6):
        for j in range(6):
            assert d2[i, j] == pytest.approx(float(np.sum((x[i] - x[j]) ** 2)), abs=1e-12)
    assert (np.diag(d2) == 0).all()


# --- geometric median ------------------------------------------------------------------------


def _objective(z: np.ndarray, x: np.ndarray) -> float:
    return float(np.linalg.norm(x - z, axis=1).sum())


def test_geometric_median_is_a_minimum() -> None:
    x = _data(9, d=4, seed=3)
    x[:2] *= 20.0  # two far rows: the geometric median is far from the mean
    z = rules.geometric_median(x)
    assert not np.allclose(z, x.mean(axis=0), atol=1e-2)
    # first-order optimality (no row coincides with z): sum_i (z - x_i) / ||z - x_i|| = 0
    z_exact = rules.geometric_median(x, iterations=5000, tolerance=0.0)
    unit = (z_exact - x) / np.linalg.norm(z_exact - x, axis=1)[:, None]
    assert np.linalg.norm(unit.sum(axis=0)) < 1e-6
    # the default run is close to it, and no small step improves the objective much
    np.testing.assert_allclose(z, z_exact, atol=1e-3)
    best = _objective(z_exact, x)
    rng = np.random.default_rng(0)
    for step in rng.standard_normal((200, 4)):
        for scale in (1e-1, 1e-3):
            assert _objective(z_exact + scale * step, x) >= best - 1e-12
    assert _objective(z, x) <= best * (1 + 1e-6)


@pytest.mark.parametrize("n", [3, 7, 11])
def test_geometric_median_of_scalars_is_the_median(n: int) -> None:
    x = np.random.default_rng(n).standard_normal((n, 1)) * 5
    assert rules.geometric_median(x)[0] == pytest.approx(float(np.median(x)), abs=1e-6)


def test_geometric_median_of_two_rows_is_their_mean() -> None:
    x = _data(2)
    np.testing.assert_allclose(rules.geometric_median(x), x.mean(axis=0), rtol=1e-12)


# --- centered clipping -----------------------------------------------------------------------


def test_one_centered_clip_iteration_is_the_formula() -> None:
    x = _data(6, d=5) * 3
    tau = 2.0
    direct = np.mean([r * min(1.0, tau / np.linalg.norm(r)) for r in x], axis=0)
    np.testing.assert_allclose(rules.centered_clip(x, tau, iterations=1), direct, rtol=1e-12)
    center = np.full(5, 0.5)
    direct = center + np.mean(
        [(r - center) * min(1.0, tau / np.linalg.norm(r - center)) for r in x], axis=0
    )
    np.testing.assert_allclose(
        rules.centered_clip(x, tau, iterations=1, center=center), direct, rtol=1e-12
    )
    # three iterations, by the same formula in a loop
    v = np.zeros(5)
    for _ in range(3):
        v = v + np.mean([(r - v) * min(1.0, tau / np.linalg.norm(r - v)) for r in x], axis=0)
    np.testing.assert_allclose(rules.centered_clip(x, tau, iterations=3), v, rtol=1e-12)


def test_centered_clip_with_a_huge_radius_is_the_mean() -> None:
    x = _data(6)
    np.testing.assert_allclose(rules.centered_clip(x, 1e12, iterations=1), x.mean(axis=0))
    np.testing.assert_allclose(rules.centered_clip(x, 1e12, iterations=4), x.mean(axis=0))


def test_clip_rows_and_the_median_distance() -> None:
    x = _data(5) * 4
    out = rules.clip_rows(x, 1.5)
    for row, clipped in zip(x, out, strict=True):
        norm = np.linalg.norm(row)
        expected = row if norm <= 1.5 else row * 1.5 / norm
        np.testing.assert_allclose(clipped, expected, rtol=1e-12)
    assert rules.median_distance(x) == pytest.approx(sorted(float(np.linalg.norm(r)) for r in x)[2])
    assert rules.norm_quantile(x, 0.5) == pytest.approx(rules.median_distance(x))


def test_centered_clip_without_a_radius_is_zero_for_zero_updates() -> None:
    assert np.array_equal(rules.aggregate("centered-clip", np.zeros((4, 3)), 1), np.zeros(3))


# --- pre-aggregation -------------------------------------------------------------------------


@pytest.mark.parametrize("f", [0, 1, 3])
def test_nearest_neighbour_mixing_matches_a_loop(f: int) -> None:
    x = _data(7, d=4, seed=f)
    out = rules.nearest_neighbour_mixing(x, f)
    for i in range(7):
        dist = [float(np.linalg.norm(x[i] - x[j])) for j in range(7)]
        nearest = sorted(range(7), key=lambda j: dist[j])[: 7 - f]
        assert nearest[0] == i
        np.testing.assert_allclose(out[i], x[nearest].mean(axis=0), rtol=1e-12)


@pytest.mark.parametrize(("n", "size"), [(7, 2), (9, 3), (5, 5), (6, 4)])
def test_bucketing_matches_a_loop(n: int, size: int) -> None:
    x = _data(n)
    out = rules.bucketing(x, size, np.random.default_rng(42))
    perm = np.random.default_rng(42).permutation(n)
    expected = []
    for start in range(0, n, size):
        bucket = perm[start : start + size]
        expected.append(sum(x[i] for i in bucket) / len(bucket))
    assert out.shape == (math.ceil(n / size), x.shape[1]) == (len(expected), x.shape[1])
    assert rules.rows_after_bucketing(n, size) == len(expected)
    np.testing.assert_allclose(out, np.array(expected), rtol=1e-12)


def test_bucketing_of_size_one_is_the_rows() -> None:
    x = _data(4)
    assert np.array_equal(rules.bucketing(x, 1, np.random.default_rng(0)), x)
    assert rules.rows_after_bucketing(4, 1) == rules.rows_after_bucketing(4, 0) == 4


# --- properties of every rule ----------------------------------------------------------------


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_ignores_the_order_of_rows(rule: str) -> None:
    x = _data(9, seed=7)
    x[2] += 4.0
    perm = np.random.default_rng(1).permutation(9)
    np.testing.assert_allclose(
        rules.aggregate(rule, x[perm], 2), rules.aggregate(rule, x, 2), rtol=1e-9, atol=1e-12
    )


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_of_equal_rows_is_that_row(rule: str) -> None:
    row = np.random.default_rng(5).standard_normal(8)
    x = np.tile(row, (7, 1))
    np.testing.assert_allclose(rules.aggregate(rule, x, 2), row, rtol=1e-12, atol=1e-15)


def test_the_mean_is_weighted() -> None:
    x = _data(3)
    w = [1.0, 2.0, 5.0]
    expected = (x[0] + 2 * x[1] + 5 * x[2]) / 8
    np.testing.assert_allclose(rules.aggregate("mean", x, 0, weights=w), expected, rtol=1e-12)
    np.testing.assert_allclose(rules.mean(x), x.mean(axis=0))
    # the robust rules count each row once
    np.testing.assert_allclose(
        rules.aggregate("median", x, 1, weights=w), np.median(x, axis=0), rtol=1e-12
    )


def test_rule_function_is_aggregate() -> None:
    x = _data(9)
    for rule in RULES:
        np.testing.assert_allclose(rules.rule_function(rule)(x, 2), rules.aggregate(rule, x, 2))
    np.testing.assert_allclose(
        rules.rule_function("centered-clip", tau=0.5, iterations=2)(x, 2),
        rules.centered_clip(x, 0.5, 2),
    )


def test_every_settings_rule_is_known() -> None:
    from pollen.core.protection import ROBUST_RULES

    assert set(ROBUST_RULES) == set(RULES)


# --- bounded influence -----------------------------------------------------------------------

N, F, D = 11, 3, 6


def _honest_and_attacked() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """N rows around a point, and the same with the last F replaced by huge vectors."""
    rng = np.random.default_rng(2024)
    center = rng.standard_normal(D) * 3
    clean = center + rng.standard_normal((N, D))
    attacked = clean.copy()
    attacked[N - F :] = 1e6 * rng.standard_normal((F, D))
    return clean, attacked, clean[: N - F]


def test_the_mean_breaks() -> None:
    clean, attacked, honest = _honest_and_attacked()
    spread = np.linalg.norm(honest - honest.mean(axis=0), axis=1).max()
    assert np.linalg.norm(rules.mean(attacked) - rules.mean(clean)) > 1e4 * spread


@pytest.mark.parametrize("rule", ["median", "trimmed-mean"])
def test_coordinatewise_rules_stay_in_the_honest_box(rule: str) -> None:
    _, attacked, honest = _honest_and_attacked()
    out = rules.aggregate(rule, attacked, F)
    assert (honest.min(axis=0) <= out).all() and (out <= honest.max(axis=0)).all()
    assert np.linalg.norm(rules.mean(attacked) - out) > 1e5


def test_krum_picks_an_honest_row() -> None:
    _, attacked, honest = _honest_and_attacked()
    out = rules.krum(attacked, F)
    assert any(np.array_equal(out, row) for row in honest)
    assert set(rules.multi_krum_selection(attacked, F).tolist()) == set(range(N - F))
    np.testing.assert_allclose(rules.multi_krum(attacked, F), honest.mean(axis=0), rtol=1e-12)


def test_geometric_median_stays_near_the_honest_rows() -> None:
    # F(z) <= F(c) for c the honest mean gives (n - f)(D - r) - f D <= (n - f) r, with
    # D = ||z - c|| and r the honest rows' largest distance to c: D <= 2 (n - f) r / (n - 2f)
    _, attacked, honest = _honest_and_attacked()
    c = honest.mean(axis=0)
    r = np.linalg.norm(honest - c, axis=1).max()
    out = rules.aggregate("geomed", attacked, F)
    assert _objective(out, attacked) <= _objective(c, attacked)
    assert np.linalg.norm(out - c) <= 2 * (N - F) * r / (N - 2 * F)


@pytest.mark.parametrize("iterations", [1, 3, 10])
def test_centered_clip_moves_by_at_most_two_tau_f_over_n_per_iteration(iterations: int) -> None:
    # v <- (1/n) sum_i T_i(v), T_i(v) = v + clip(x_i - v, tau) = x_i - (I - P)(x_i - v) with P
    # the projection on the tau-ball: T_i is 1-Lipschitz in v, and a replaced row changes its
    # term by at most 2 tau, so the runs on clean and attacked rows drift apart by at most
    # 2 f tau / n per iteration
    clean, attacked, _ = _honest_and_attacked()
    tau = 1.5
    a = rules.centered_clip(attacked, tau, iterations)
    b = rules.centered_clip(clean, tau, iterations)
    gap = float(np.linalg.norm(a - b))
    bound = iterations * 2 * F * tau / N
    assert gap <= bound + 1e-9
    if iterations <= 3:  # the bound is not vacuous here (later, both runs settle)
        assert gap > 0.5 * bound


def test_every_robust_rule_resists_where_the_mean_does_not() -> None:
    clean, attacked, honest = _honest_and_attacked()
    spread = np.linalg.norm(honest - honest.mean(axis=0), axis=1).max()
    moved = {
        rule: float(np.linalg.norm(rules.aggregate(rule, attacked, F, tau=1.0) - clean.mean(0)))
        for rule in RULES
    }
    assert moved["mean"] > 1e4
    for rule in RULES[1:]:
        assert moved[rule] < 5 * spread, rule


# --- sizes and errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "f", "n"),
    [
        ("krum", 0, 3),
        ("krum", 2, 7),
        ("multi-krum", 3, 9),
        ("median", 2, 5),
        ("trimmed-mean", 3, 7),
        ("geomed", 1, 3),
        ("mean", 4, 1),
        ("centered-clip", 4, 1),
    ],
)
def test_min_clients(rule: str, f: int, n: int) -> None:
    assert rules.min_clients(rule, f) == n
    x = _data(n)
    assert np.isfinite(rules.aggregate(rule, x, f)).all()
    if rule in ("krum", "multi-krum", "trimmed-mean"):
        with pytest.raises(ValueError, match="needs"):
            rules.aggregate(rule, x[:-1], f)


def test_errors() -> None:
    x = _data(4)
    with pytest.raises(ValueError, match="non-empty"):
        rules.median(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="non-empty"):
        rules.mean(np.zeros(3))
    with pytest.raises(ValueError, match="weights"):
        rules.mean(x, [1.0, -1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="weights"):
        rules.mean(x, [1.0, 1.0])
    with pytest.raises(ValueError, match="tau"):
        rules.centered_clip(x, 0.0)
    with pytest.raises(ValueError, match="keeps"):
        rules.multi_krum_selection(_data(5), 1, m=0)
    with pytest.raises(ValueError, match="nearest"):
        rules.nearest_neighbour_mixing(x, 4)
    with pytest.raises(ValueError, match="unknown rule"):
        rules.aggregate("bulyan", x, 0)
    assert rules.breakdown_note("krum") == "n > 2f + 2"
    assert rules.breakdown_note("mean") == "any n"
