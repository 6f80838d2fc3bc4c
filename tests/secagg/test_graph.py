"""secagg.graph: SecAgg+'s k-regular neighbourhoods and the majority threshold."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from pollen.core.protection import SecAggSettings
from secagg import graph


@pytest.mark.parametrize(("n", "k"), [(2, 1), (5, 4), (16, 8), (100, 14), (1000, 20)])
def test_the_degree_grows_like_log_n(n: int, k: int) -> None:
    assert graph.degree(n) == k


def test_a_given_degree_is_made_even_and_capped() -> None:
    assert graph.degree(50, 5) == 6
    assert graph.degree(4, 10) == 3


@pytest.mark.parametrize(("k", "share", "t"), [(4, 0.5, 3), (20, 0.5, 11), (1, 0.5, 2),
                                               (8, 1.0, 9), (8, 0.75, 7)])  # fmt: skip
def test_the_threshold_is_more_than_the_share(k: int, share: float, t: int) -> None:
    assert graph.threshold(k, share) == t
    assert t > share * (k + 1) or t == k + 1


def test_a_threshold_share_below_half_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\[0\.5, 1\]"):
        graph.threshold(10, 0.4)


@pytest.mark.parametrize("n", [3, 9, 30, 257])
def test_neighbourhoods_are_symmetric_and_k_regular(n: int) -> None:
    clients = list(range(100, 100 + n))
    k = graph.degree(n)
    nbrs = graph.neighbours(clients, k, n.to_bytes(32, "big"))
    assert set(nbrs) == set(clients)
    for c, around in nbrs.items():
        assert c not in around and len(around) == k
        assert all(c in nbrs[j] for j in around)


def test_the_graph_is_drawn_from_every_client_s_keys_and_anew_for_each() -> None:
    """One seed draws one graph wherever it is drawn (in any order of the clients); another
    client's keys, another session or one client fewer draw another."""
    clients = list(range(40))
    digests = {c: bytes([c]) * 32 for c in clients}
    seed = graph.seed_of("1-train-00", digests)
    a = graph.neighbours(clients, 6, seed)
    assert graph.neighbours(list(reversed(clients)), 6, seed) == a
    assert graph.seed_of("1-train-00", dict(reversed(digests.items()))) == seed
    others = [
        graph.seed_of("1-train-00", {**digests, 7: bytes(32)}),
        graph.seed_of("1-train-01", digests),
        graph.seed_of("1-train-00", {c: d for c, d in digests.items() if c != 39}),
    ]
    for other in others:
        assert other != seed and graph.neighbours(clients, 6, other) != a
    # the order is close to uniform: each client's first place over many seeds
    firsts = [graph.order(range(8), bytes([i % 256, i // 256]) * 16)[0] for i in range(4000)]
    counts = np.bincount(firsts, minlength=8)
    assert counts.min() > 400 and counts.max() < 600  # 500 expected, sd ~21


# ---- k and t from secagg.dropout (Bell et al., CCS 2020, Sec. 4) ------------------------------


def _failure_bound(n: int, k: int, t: int, p: float) -> Fraction:
    """n P[Binomial(k, p) > k - t], summed term by term over the pmf in exact fractions."""
    q = Fraction(p)
    pmf = [math.comb(k, d) * q**d * (1 - q) ** (k - d) for d in range(k + 1)]
    assert sum(pmf) == 1
    return n * sum(pmf[k - t + 1 :], Fraction(0))


TARGET = Fraction(1, 2**20)


@pytest.mark.parametrize("n", [2, 3, 5, 10, 16, 17, 100, 257, 1000, 4096])
@pytest.mark.parametrize(("wanted", "share", "c"), [(0, 0.5, 0), (0, 0.5, 1), (0, 0.75, 3),
                                                    (6, 0.5, 0), (10, 0.6, 2)])  # fmt: skip
def test_no_dropout_keeps_today_s_k_and_t(n: int, wanted: int, share: float, c: int) -> None:
    k = graph.degree(n, wanted)
    try:
        t = graph.threshold(k, share, c)
    except ValueError:
        with pytest.raises(ValueError, match="needs a threshold"):
            graph.parameters(n, wanted, share, c, 0.0)
        return
    assert graph.parameters(n, wanted, share, c, 0.0) == (k, t)


@pytest.mark.parametrize(("n", "p", "c"), [(30, 0.05, 0), (100, 0.05, 0), (100, 0.1, 1),
                                           (1000, 0.1, 0), (1000, 0.2, 1), (1000, 0.01, 0),
                                           (500, 0.3, 2), (40, 0.02, 3)])  # fmt: skip
def test_the_fewest_neighbours_that_keep_t_shareholders(n: int, p: float, c: int) -> None:
    k, t = graph.parameters(n, 0, 0.5, c, p)
    assert t == graph.threshold(k, 0.5, c)
    assert k % 2 == 0 or k == n - 1
    assert _failure_bound(n, k, t, p) <= TARGET
    assert k >= min(graph.degree(n), n - 1)  # never below the default degree
    smaller = k - 2 if k % 2 == 0 else k - 1 - (k - 1) % 2  # the candidate before it
    if smaller >= graph.degree(n):
        try:
            t2 = graph.threshold(smaller, 0.5, c)
        except ValueError:
            return  # too few shares for the collusion at all
        assert _failure_bound(n, smaller, t2, p) > TARGET


def test_the_table_of_docs_security() -> None:
    got = {(p, c, n): graph.parameters(n, 0, 0.5, c, p) for p in (0.05, 0.1, 0.2)
           for c in (0, 1) for n in (100, 1000)}  # fmt: skip
    assert got == {
        (0.05, 0, 100): (22, 12), (0.05, 0, 1000): (24, 13),
        (0.05, 1, 100): (24, 14), (0.05, 1, 1000): (28, 16),
        (0.1, 0, 100): (34, 18), (0.1, 0, 1000): (38, 20),
        (0.1, 1, 100): (38, 21), (0.1, 1, 1000): (42, 23),
        (0.2, 0, 100): (74, 38), (0.2, 0, 1000): (84, 43),
        (0.2, 1, 100): (80, 42), (0.2, 1, 1000): (90, 47),
    }  # fmt: skip


def _sums_failed(n: int, k: int, t: int, p: float, trials: int, seed: int) -> int:
    """In how many of `trials` secure sums over H(k, n), each client lost with probability p,
    some client keeps fewer than t shareholders among its k neighbours (the order on the ring
    does not matter: the losses are independent)."""
    rng = np.random.default_rng(seed)
    failed = 0
    for _ in range(trials // 20_000):
        kept = rng.random((20_000, n)) >= p
        around = sum(np.roll(kept, d, axis=1) for d in range(-(k // 2), k // 2 + 1) if d)
        failed += int(np.any(around < t, axis=1).sum())
    return failed


def test_a_simulated_dropout_fails_sums_below_the_bound() -> None:
    n, p = 30, 0.05
    k, t = graph.parameters(n, 0, 0.5, 0, p)
    assert (k, t) == (20, 11)
    trials = 400_000
    # the bound is 2^-20: at most a few failures in 400,000 sums, where a small k fails often
    assert _sums_failed(n, k, t, p, trials, seed=1) <= 2
    small = _sums_failed(n, 4, 3, p, 40_000, seed=2) / 40_000
    assert 0.1 < small <= float(_failure_bound(n, 4, 3, p))


def test_the_exact_decision_agrees_with_the_float_screen(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [(n, p, c) for n in (30, 100, 1000) for p in (0.01, 0.05, 0.2) for c in (0, 1)]

    def both() -> list[tuple[int, int] | str]:
        out: list[tuple[int, int] | str] = []
        for n, p, c in cases:
            try:
                out.append(graph.parameters(n, 0, 0.5, c, p))
            except ValueError:
                out.append("refused")
        return out

    screened = both()
    assert screened.count("refused") == 2  # 30 clients at 0.2
    graph.parameters.cache_clear()
    monkeypatch.setattr(graph, "_SCREEN", 1e9)  # every decision in exact fractions
    try:
        assert both() == screened
    finally:
        graph.parameters.cache_clear()


def test_a_degree_too_small_for_the_dropout_is_refused() -> None:
    assert graph.parameters(1000, 38, 0.5, 0, 0.1) == (38, 20)
    with pytest.raises(ValueError, match=r"a degree of 8 \(secagg\.degree=8\) .* without t = 5"):
        graph.parameters(1000, 8, 0.5, 0, 0.1)
    with pytest.raises(ValueError, match=r"raise secagg\.degree"):
        graph.parameters(1000, 36, 0.5, 0, 0.1)


@pytest.mark.parametrize(("n", "p"), [(10, 0.05), (100, 0.3), (3, 0.01), (3000, 0.45)])
def test_a_dropout_no_graph_survives_is_refused(n: int, p: float) -> None:
    with pytest.raises(ValueError, match="complete graph included") as info:
        graph.parameters(n, 0, 0.5, 0, p)
    assert "secagg.dropout" in str(info.value) and "\n" not in str(info.value)
    if n <= 100:  # even the complete graph loses more than k - t with more than 2^-20
        t = graph.threshold(n - 1, 0.5)
        assert _failure_bound(n, n - 1, t, p) > TARGET


def test_a_dropout_of_half_or_more_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\[0, 0\.5\)"):
        graph.parameters(100, 0, 0.5, 0, 0.5)


def test_settings_give_the_graph() -> None:
    s = SecAggSettings.of({"secagg.dropout": 0.1, "secagg.collusion": 1})
    assert s.graph_for(100) == (38, 21) == graph.parameters(100, 0, 0.5, 1, 0.1)
    assert SecAggSettings.of({}).graph_for(100) == (14, 8)
    assert s.threshold_for(38) == 21
