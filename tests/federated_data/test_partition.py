"""Partitioners: disjoint, deterministic splits with the skew each scheme is meant to produce."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from federated_data import (
    CIFAR100_COARSE_OF_FINE,
    DataConfigError,
    partition_labels,
    validate_partition_params,
)


def _labels(num_labels: int = 10, per_label: int = 300, seed: int = 0) -> np.ndarray:
    labels = np.repeat(np.arange(num_labels), per_label)
    return np.random.default_rng(seed).permutation(labels)


LABELS = _labels()
FINE = _labels(100, 50, seed=1)  # CIFAR-100-like fine labels, 5,000 examples

RANDOM_SCHEMES: list[tuple[str, np.ndarray, dict[str, Any]]] = [
    ("iid", LABELS, {}),
    ("dirichlet", LABELS, {"alpha": 0.5}),
    ("classes", LABELS, {"classes_per_client": 2}),
    ("label-groups", LABELS, {"alpha": 0.5, "groups": 3}),
    ("pachinko", FINE, {"coarse_of_fine": CIFAR100_COARSE_OF_FINE}),
]


def _held_labels(labels: np.ndarray, part: np.ndarray, min_share: float = 0.0) -> set[int]:
    counts = np.bincount(labels[part], minlength=int(labels.max()) + 1)
    return {int(c) for c in np.flatnonzero(counts > min_share * max(len(part), 1))}


def _assert_disjoint(parts: list[np.ndarray], n: int) -> np.ndarray:
    everything = np.concatenate(parts)
    assert everything.dtype == np.int64
    assert len(np.unique(everything)) == len(everything), "an example went to two clients"
    assert everything.min() >= 0 and everything.max() < n
    for p in parts:
        assert np.all(np.diff(p) > 0), "indices must be sorted"
    return everything


@pytest.mark.parametrize(("scheme", "labels", "params"), RANDOM_SCHEMES)
def test_random_schemes_are_disjoint_cover_all_and_depend_only_on_the_seed(
    scheme: str, labels: np.ndarray, params: dict[str, Any]
) -> None:
    parts = partition_labels(labels, scheme, 10, seed=3, **params)
    assert len(parts) == 10
    everything = _assert_disjoint(parts, len(labels))
    # with 10 clients each of these schemes hands out every example
    assert len(everything) == len(labels)

    again = partition_labels(labels, scheme, 10, seed=3, **params)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = partition_labels(labels, scheme, 10, seed=4, **params)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_iid_sizes_differ_by_at_most_one_and_mix_labels() -> None:
    parts = partition_labels(LABELS[:2999], "iid", 7, seed=0)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 2999
    assert all(len(_held_labels(LABELS, p)) == 10 for p in parts)


def _mean_labels_held(parts: list[np.ndarray], labels: np.ndarray) -> float:
    return float(np.mean([len(_held_labels(labels, p, min_share=0.05)) for p in parts]))


def test_dirichlet_small_alpha_is_more_skewed_than_large_alpha() -> None:
    skewed = partition_labels(LABELS, "dirichlet", 10, seed=0, alpha=0.05)
    uniform = partition_labels(LABELS, "dirichlet", 10, seed=0, alpha=1000.0)
    assert _mean_labels_held(skewed, LABELS) <= 3.5
    assert _mean_labels_held(uniform, LABELS) == 10.0


def test_dirichlet_min_size_is_enforced_and_bounded() -> None:
    parts = partition_labels(LABELS, "dirichlet", 20, seed=0, alpha=0.1, min_size=40)
    assert min(len(p) for p in parts) >= 40
    assert len(np.concatenate(parts)) == len(LABELS)
    with pytest.raises(DataConfigError, match=r"min_size=140.*max_tries=3"):
        partition_labels(LABELS, "dirichlet", 20, seed=0, alpha=0.05, min_size=140, max_tries=3)


def test_classes_gives_each_client_exactly_k_labels_spread_evenly() -> None:
    k, n = 3, 7
    parts = partition_labels(LABELS, "classes", n, seed=5, classes_per_client=k)
    holders: dict[int, list[int]] = {}
    for client, part in enumerate(parts):
        held = _held_labels(LABELS, part)
        assert len(held) == k
        for label in held:
            holders.setdefault(label, []).append(client)
    # 21 slots over 10 labels: every label held by 2 or 3 clients
    assert sorted(holders) == list(range(10))
    assert {len(h) for h in holders.values()} <= {2, 3}
    for label, owners in holders.items():
        shares = [int(np.sum(LABELS[parts[c]] == label)) for c in owners]
        assert max(shares) - min(shares) <= 1 and sum(shares) == 300


def test_classes_refuses_a_label_too_small_to_share() -> None:
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2])
    with pytest.raises(DataConfigError, match="label 2 has 1 examples"):
        partition_labels(labels, "classes", 6, seed=0, classes_per_client=2)


def _owner_blocks(parts: list[np.ndarray], labels: np.ndarray) -> list[int]:
    """Labels grouped by the client holding most of them: the sizes of those groups."""
    owner = {}
    for label in range(10):
        counts = [int(np.sum(labels[p] == label)) for p in parts]
        assert max(counts) >= 0.9 * sum(counts), "tiny alpha should give a label to one client"
        owner[label] = int(np.argmax(counts))
    return sorted(list(owner.values()).count(o) for o in set(owner.values()))


def test_label_groups_tiny_alpha_sends_each_group_to_one_client() -> None:
    sums_of_groups = {3, 4, 6, 7, 10}  # unions of groups sized 3, 3 and 4
    seen = []
    for seed in range(6):
        parts = partition_labels(LABELS, "label-groups", 20, seed=seed, alpha=1e-5, groups=3)
        assert len(np.concatenate(parts)) == len(LABELS)
        blocks = _owner_blocks(parts, LABELS)
        assert sum(blocks) == 10 and set(blocks) <= sums_of_groups
        seen.append(blocks)
    assert [3, 3, 4] in seen
    # the label grouping itself changes with the seed (different owners' label sets)
    sets = set()
    for seed in range(3):
        parts = partition_labels(LABELS, "label-groups", 20, seed=seed, alpha=1e-5, groups=3)
        sets.add(frozenset(frozenset(_held_labels(LABELS, p)) for p in parts if len(p)))
    assert len(sets) > 1


def test_label_groups_one_group_per_label_and_large_alpha() -> None:
    parts = partition_labels(LABELS, "label-groups", 20, seed=0, alpha=1e-5, groups=-1)
    blocks = _owner_blocks(parts, LABELS)
    assert sum(blocks) == 10 and len(blocks) >= 6  # ten groups over 20 clients, few collide
    even = partition_labels(LABELS, "label-groups", 5, seed=0, alpha=1e4, groups=3)
    assert all(len(_held_labels(LABELS, p, min_share=0.05)) == 10 for p in even)
    assert max(len(p) for p in even) < 1.2 * min(len(p) for p in even)


def test_pachinko_sizes_reuse_and_skew() -> None:
    labels = FINE[:4990]  # 4,990 // 7 = 712 per client, 6 left over
    parts = partition_labels(labels, "pachinko", 7, seed=0, coarse_of_fine=CIFAR100_COARSE_OF_FINE)
    assert [len(p) for p in parts] == [712] * 7
    assert len(_assert_disjoint(parts, len(labels))) == 7 * 712

    def coarse_top_share(alpha: float) -> float:
        ps = partition_labels(
            FINE, "pachinko", 10, seed=1, coarse_of_fine=CIFAR100_COARSE_OF_FINE, alpha=alpha
        )
        tops = [
            np.bincount(CIFAR100_COARSE_OF_FINE[FINE[p]], minlength=20).max() / len(p) for p in ps
        ]
        return float(np.mean(tops))

    # Small alpha concentrates a client on few superclasses; exhausting labels is handled
    # (10 x 500 = every example is drawn, so exhausted labels were removed correctly).
    assert coarse_top_share(0.05) > 2 * coarse_top_share(100.0)


def test_pachinko_needs_labels_inside_the_map() -> None:
    with pytest.raises(DataConfigError, match="coarse_of_fine"):
        partition_labels(np.arange(10), "pachinko", 2, seed=0, coarse_of_fine=np.zeros(5, int))


def test_one_class_gives_client_i_labels_ki_to_ki_plus_k() -> None:
    parts = partition_labels(LABELS, "one-class", 3, seed=0, classes_per_client=3)
    for i, part in enumerate(parts):
        assert set(LABELS[part].tolist()) == {3 * i, 3 * i + 1, 3 * i + 2}
        assert len(part) == 900  # every example of those labels
    assert len(np.concatenate(parts)) == 2700
    # default: one label per client
    parts = partition_labels(LABELS, "one-class", 10, seed=0)
    assert [set(LABELS[p].tolist()) for p in parts] == [{i} for i in range(10)]


def test_natural_gives_client_i_the_ith_sorted_key() -> None:
    keys = np.array(["w3", "w1", "w2", "w1", "w3", "w0", "w2"])
    labels = np.zeros(len(keys), dtype=np.int64)
    parts = partition_labels(labels, "natural", 3, seed=0, keys=keys)
    assert [sorted(set(keys[p].tolist())) for p in parts] == [["w0"], ["w1"], ["w2"]]
    assert [p.tolist() for p in parts] == [[5], [1, 3], [2, 6]]


INVALID: list[tuple[str, int, dict[str, Any], str]] = [
    ("nope", 3, {}, "unknown partitioner 'nope'; valid: iid, dirichlet"),
    ("iid", 0, {}, "num_clients"),
    ("iid", 3001, {}, r"num_clients must be in \[1, 3000\]"),
    ("iid", 3, {"alpha": 1.0}, "'alpha'"),
    ("dirichlet", 3, {}, "'alpha'"),
    ("dirichlet", 3, {"alpha": 0.0}, "alpha must be a finite number > 0"),
    ("dirichlet", 3, {"alpha": -1}, "alpha"),
    ("dirichlet", 3, {"alpha": float("nan")}, "alpha"),
    ("dirichlet", 3, {"alpha": "big"}, "alpha"),
    ("dirichlet", 3, {"alpha": 1.0, "min_size": -1}, "min_size"),
    ("dirichlet", 3, {"alpha": 1.0, "min_size": 1001}, r"min_size must be in \[0, 1000\]"),
    ("dirichlet", 3, {"alpha": 1.0, "max_tries": 0}, "max_tries"),
    ("classes", 3, {}, "'classes_per_client'"),
    ("classes", 3, {"classes_per_client": 0}, r"classes_per_client must be in \[1, 10\]"),
    ("classes", 3, {"classes_per_client": 11}, r"classes_per_client must be in \[1, 10\]"),
    ("classes", 3, {"classes_per_client": 1.5}, "classes_per_client must be an integer"),
    ("label-groups", 3, {"alpha": 1.0, "groups": 0}, "groups must be -1 or in"),
    ("label-groups", 3, {"alpha": 1.0, "groups": 11}, "groups must be -1 or in"),
    ("label-groups", 3, {"groups": 3}, "'alpha'"),
    ("pachinko", 3, {}, "'coarse_of_fine'"),
    ("pachinko", 3, {"coarse_of_fine": CIFAR100_COARSE_OF_FINE, "beta": -1.0}, "beta"),
    ("pachinko", 3, {"coarse_of_fine": CIFAR100_COARSE_OF_FINE, "alpha": 0}, "alpha"),
    ("pachinko", 3, {"coarse_of_fine": np.zeros(4, int)}, "coarse_of_fine maps 4"),
    ("one-class", 4, {"classes_per_client": 3}, "num_clients \\* classes_per_client"),
    ("one-class", 4, {"classes_per_client": 0}, "classes_per_client"),
    ("natural", 3, {}, "'keys'"),
    ("natural", 3, {"keys": np.zeros(5)}, "keys must have one entry per example"),
    ("natural", 4, {"keys": np.arange(3000) % 3}, r"num_clients must be in \[1, 3\]"),
]


@pytest.mark.parametrize(("scheme", "n", "params", "message"), INVALID)
def test_invalid_parameters_are_named(
    scheme: str, n: int, params: dict[str, Any], message: str
) -> None:
    with pytest.raises(DataConfigError, match=message):
        validate_partition_params(scheme, n, 10, 3000, **params)
    with pytest.raises(DataConfigError, match=message):
        partition_labels(LABELS, scheme, n, seed=0, **params)


def test_validation_without_data_fills_defaults_and_skips_data_checks() -> None:
    resolved = validate_partition_params("label-groups", 50, None, None, alpha=0.4)
    assert resolved == {"alpha": 0.4, "groups": 3}
    assert validate_partition_params("dirichlet", 5, None, None, alpha=1)["min_size"] == 1
    pach = validate_partition_params(
        "pachinko", 5, 100, None, coarse_of_fine=CIFAR100_COARSE_OF_FINE
    )
    assert (pach["alpha"], pach["beta"]) == (0.4, 10.0)


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_seed_must_be_a_non_negative_integer(seed: Any) -> None:
    with pytest.raises(DataConfigError, match="seed"):
        partition_labels(LABELS, "iid", 3, seed=seed)


def test_labels_must_be_integers() -> None:
    with pytest.raises(DataConfigError, match="labels must be a 1-D integer array"):
        partition_labels(LABELS.astype(float), "iid", 3, seed=0)


def test_cifar100_map_has_five_fine_labels_per_superclass() -> None:
    assert len(CIFAR100_COARSE_OF_FINE) == 100
    assert np.bincount(CIFAR100_COARSE_OF_FINE).tolist() == [5] * 20
    assert CIFAR100_COARSE_OF_FINE[[0, 9, 99]].tolist() == [4, 3, 13]
