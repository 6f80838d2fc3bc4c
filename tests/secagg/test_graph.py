"""secagg.graph: SecAgg+'s k-regular neighbourhoods and the majority threshold."""

from __future__ import annotations

import numpy as np
import pytest

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
    nbrs = graph.neighbours(clients, k, np.random.default_rng(n))
    assert set(nbrs) == set(clients)
    for c, around in nbrs.items():
        assert c not in around and len(around) == k
        assert all(c in nbrs[j] for j in around)


def test_the_graph_is_drawn_anew() -> None:
    clients = list(range(40))
    a = graph.neighbours(clients, 6, np.random.default_rng(1))
    b = graph.neighbours(clients, 6, np.random.default_rng(2))
    assert a != b
