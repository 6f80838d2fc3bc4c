"""Clustered FL math: update similarity, the complete-linkage bipartition, the split rule."""

from __future__ import annotations

import numpy as np
import pytest

from models.clustered import (
    bipartition,
    cosine_similarities,
    flat_update,
    should_split,
    split_clusters,
    update_norms,
)


def _two_directions(
    rng: np.random.Generator, sizes: tuple[int, int], scale: float = 2.0, noise: float = 0.05
) -> tuple[np.ndarray, list[int]]:
    """Updates of clients from two opposing populations (their sum nearly cancels), labelled."""
    d = 30
    direction = rng.normal(size=d)
    direction /= np.linalg.norm(direction)
    other = rng.normal(size=d)
    other -= (other @ direction) * direction
    other /= np.linalg.norm(other)
    rows, labels = [], []
    for group, (n, sign) in enumerate(zip(sizes, (1.0, -1.0), strict=True)):
        for _ in range(n):
            # opposite main directions, plus a shared orthogonal part and noise
            u = sign * direction + 0.1 * other + noise * rng.normal(size=d)
            rows.append(scale * u / np.linalg.norm(u))
            labels.append(group)
    order = rng.permutation(len(rows))
    return np.stack(rows)[order], [labels[i] for i in order]


def test_flat_update_concatenates_the_named_tensors_in_order() -> None:
    before = {"a": np.zeros((2, 2), np.float32), "b": np.ones(3, np.float32), "n": np.array(4)}
    after = {"a": np.arange(4, dtype=np.float32).reshape(2, 2), "b": np.full(3, 3.0, np.float32),
             "n": np.array(9)}  # fmt: skip
    np.testing.assert_array_equal(flat_update(before, after, ["b", "a"]), [2, 2, 2, 0, 1, 2, 3])
    assert flat_update(before, after, []).shape == (0,)


def test_cosine_similarities_match_their_definition() -> None:
    u = np.array([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    s = cosine_similarities(u)
    np.testing.assert_allclose(s, s.T)
    assert s[0, 1] == pytest.approx(0.0) and s[0, 2] == pytest.approx(-1.0)
    assert s[0, 3] == pytest.approx(1 / np.sqrt(2)) and s[1, 3] == pytest.approx(1 / np.sqrt(2))
    np.testing.assert_allclose(np.diag(s), 1.0)
    np.testing.assert_allclose(s[4, :4], 0.0)  # a zero update is unlike every other


@pytest.mark.parametrize("sizes", [(5, 5), (3, 9), (2, 1)])
def test_bipartition_separates_two_update_directions(sizes: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(sizes))
    updates, labels = _two_directions(rng, sizes)
    first, second = bipartition(cosine_similarities(updates))
    groups = {frozenset(labels[i] for i in first), frozenset(labels[i] for i in second)}
    assert groups == {frozenset({0}), frozenset({1})}
    assert sorted(np.concatenate([first, second]).tolist()) == list(range(sum(sizes)))


def test_bipartition_is_complete_linkage() -> None:
    """Against SciPy's hierarchical clustering, an independent implementation of the same rule,
    on similarities without a clear two-group structure."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    for seed in range(5):
        s = cosine_similarities(np.random.default_rng(seed).normal(size=(12, 6)))
        first, _ = bipartition(s)
        dist = 1.0 - s
        np.fill_diagonal(dist, 0.0)
        labels = fcluster(linkage(squareform(dist, checks=False), "complete"), 2, "maxclust")
        expected = {frozenset(np.flatnonzero(labels == k).tolist()) for k in (1, 2)}
        assert frozenset(first.tolist()) in expected


def test_split_criterion() -> None:
    rng = np.random.default_rng(0)
    split, _ = _two_directions(rng, (4, 4), scale=2.0)  # cancel on average, each norm 2
    mean, largest = update_norms(split)
    assert mean < 0.4 and largest == pytest.approx(2.0)
    assert should_split(split, 0.4, 1.6)
    assert not should_split(split, 0.4, 2.5)  # no member moves far enough
    assert not should_split(split * 0.5, 0.4, 1.6)
    assert not should_split(split[:2], 10.0, 0.0)  # two members are never split
    aligned = np.abs(split)  # all pull the same way: far from a stationary point
    assert update_norms(aligned)[0] > 0.4 and not should_split(aligned, 0.4, 1.6)


def test_coordinate_max_norm_is_the_largest_entry() -> None:
    u = np.array([[3.0, 4.0], [-1.0, 0.0], [0.0, -2.5]])
    assert update_norms(u, "l2") == pytest.approx((np.linalg.norm(u.mean(0)), 5.0))
    assert update_norms(u, "coordinate")[1] == pytest.approx(4.0)
    with pytest.raises(ValueError, match="max_norm"):
        update_norms(u, "linf")


def test_split_clusters_keeps_client_ids_and_order() -> None:
    rng = np.random.default_rng(3)
    updates, labels = _two_directions(rng, (3, 4))
    ids = [3, 7, 8, 10, 12, 15, 21]  # not positions: a second-level split must keep real ids
    by_id = dict(zip(ids, updates, strict=True))
    small = {1: np.ones(30), 2: -np.ones(30)}
    clusters = split_clusters([[1, 2], ids], {**by_id, **small}, 0.4, 1.6)
    assert clusters[0] == [1, 2]  # too small to split, stays first
    halves = {frozenset(clusters[1]), frozenset(clusters[2])}
    truth = {frozenset(i for i, g in zip(ids, labels, strict=True) if g == k) for k in (0, 1)}
    assert len(clusters) == 3 and halves == truth


def test_no_split_when_the_criterion_fails_or_a_member_is_missing() -> None:
    rng = np.random.default_rng(4)
    updates, _ = _two_directions(rng, (4, 4))
    by_id = dict(enumerate(updates))
    assert split_clusters([list(by_id)], by_id, 0.4, 3.0) == [list(by_id)]
    assert split_clusters([list(by_id)], by_id, 0.0, 1.6) == [list(by_id)]
    missing = {k: v for k, v in by_id.items() if k != 5}
    assert split_clusters([list(by_id)], missing, 0.4, 1.6) == [list(by_id)]
    assert len(split_clusters([list(by_id)], by_id, 0.4, 1.6)) == 2
