"""FedEM's synthetic generator: the reference stream draw for draw, its slice bug, the fixed
modes, and the dataset built from it (predefined per-client splits, parameters, catalog)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from federated_data import (
    DataConfigError,
    DataSpec,
    load_client_data,
    load_server_test_data,
    partition_summary,
    registry,
    validate_spec,
)
from federated_data.catalog import CATALOG, dataset_info
from federated_data.client_data import SERVER_TEST
from federated_data.synthetic_fedem import (
    ClientArrays,
    FedEMSynthetic,
    client_sizes,
    generate_fedem_synthetic,
    labelled_rows,
)

# --- sizes: the first draw of the stream -----------------------------------------------------


def test_train_sizes_give_the_papers_total_for_seed_1234() -> None:
    sizes = client_sizes(300, seed=1234)
    assert sizes.dtype == np.int64 and sizes.shape == (300,)
    assert int(sizes.sum()) == 70_507
    assert int(sizes.sum()) + 300 * 5_000 == 1_570_507  # Table 1's total
    assert sizes.min() >= 50 and sizes.max() <= 1000
    assert (sizes == 1000).any() and (sizes == 50).any()  # both clips are reached


def test_train_sizes_for_the_readme_seed() -> None:
    assert int(client_sizes(300, seed=12345).sum()) == 67_758


def test_sizes_do_not_depend_on_the_later_parameters() -> None:
    gen = FedEMSynthetic(300, dimension=7, components=2, alpha=2.0, test_size=1, mode="clean")
    np.testing.assert_array_equal(gen.train_sizes, client_sizes(300, seed=1234))


def test_fixed_train_size_skips_the_size_draw() -> None:
    sizes = client_sizes(5, seed=3, train_size=40)
    assert sizes.tolist() == [40] * 5
    gen = FedEMSynthetic(5, dimension=4, components=2, alpha=0.5, seed=3, train_size=40)
    rs = np.random.RandomState(3)  # no lognormal call: the Dirichlet draws come first
    pi = np.stack([rs.dirichlet(0.5 * np.ones(2)) for _ in range(5)])
    np.testing.assert_array_equal(gen.true_pi, pi)
    np.testing.assert_array_equal(gen.true_theta, rs.uniform(-1, 1, size=(2, 4)))


def test_shared_draws_follow_the_reference_call_order() -> None:
    gen = FedEMSynthetic(6, dimension=5, components=3, alpha=0.4, seed=11)
    rs = np.random.RandomState(11)
    sizes = np.minimum(rs.lognormal(mean=4, sigma=2, size=6).astype(int) + 50, 1000)
    pi = np.stack([rs.dirichlet(0.4 * np.ones(3)) for _ in range(6)])
    np.testing.assert_array_equal(gen.train_sizes, sizes)
    np.testing.assert_array_equal(gen.true_pi, pi)
    np.testing.assert_array_equal(gen.true_theta, rs.uniform(-1, 1, size=(3, 5)))


# --- the whole reference stream ---------------------------------------------------------------


def _reference_generator(
    num_tasks: int,
    dim: int,
    num_components: int,
    alpha: float,
    noise: float,
    n_test: int,
    seed: int,
) -> tuple[list[list[np.ndarray]], np.ndarray, np.ndarray]:
    """The reference code's procedure written out: numpy's global RandomState and
    sklearn's shuffle, with the slice start never advanced."""
    from sklearn.utils import shuffle

    np.random.seed(seed)
    raw = np.random.lognormal(4, 2, num_tasks).astype(int)
    sizes = [min(int(v) + 50, 1000) for v in raw]
    weights = [np.random.dirichlet(alpha * np.ones(num_components)) for _ in range(num_tasks)]
    theta = np.random.uniform(-1.0, 1.0, size=(num_components, dim))
    tasks = []
    for task in range(num_tasks):
        arrays: list[np.ndarray] = []
        for n in (sizes[task], n_test):
            counts = np.random.multinomial(n, weights[task])
            x = np.random.uniform(-1.0, 1.0, size=(n, dim))
            y = np.zeros(n)
            for m in range(num_components):
                score = x[0 : counts[m]] @ theta[m]
                eps = np.random.normal(size=counts[m], scale=noise)
                y[0 : counts[m]] = np.round(1 / (1 + np.exp(-(score + eps)))).astype(int)
            arrays.extend(shuffle(x, y))
        tasks.append(arrays)
    return tasks, theta, np.stack(weights)


def test_reference_mode_reproduces_the_reference_stream_exactly() -> None:
    pytest.importorskip("sklearn")
    state = np.random.get_state()
    try:
        expected, theta, pi = _reference_generator(5, 8, 3, 0.4, 0.1, 40, 1234)
    finally:
        np.random.set_state(state)
    clients, got_theta, got_pi = generate_fedem_synthetic(5, 8, 3, 0.4, 0.1, 40, 1234)
    np.testing.assert_array_equal(got_theta, theta)
    np.testing.assert_array_equal(got_pi, pi)
    assert len(clients) == 5
    for (x_tr, y_tr, x_te, y_te), (ex_tr, ey_tr, ex_te, ey_te) in zip(
        clients, expected, strict=True
    ):
        np.testing.assert_array_equal(x_tr, ex_tr.astype(np.float32))
        np.testing.assert_array_equal(x_te, ex_te.astype(np.float32))
        np.testing.assert_array_equal(y_tr, ey_tr.astype(np.int64))
        np.testing.assert_array_equal(y_te, ey_te.astype(np.int64))


def test_outputs_have_the_documented_types_and_shapes() -> None:
    clients, theta, pi = generate_fedem_synthetic(4, 6, 2, 0.4, 0.1, 30, 9, "clean")
    sizes = client_sizes(4, seed=9)
    assert theta.shape == (2, 6) and pi.shape == (4, 2)
    np.testing.assert_allclose(pi.sum(axis=1), 1.0)
    for (x_tr, y_tr, x_te, y_te), n in zip(clients, sizes, strict=True):
        assert x_tr.shape == (n, 6) and x_te.shape == (30, 6)
        assert x_tr.dtype == x_te.dtype == np.float32
        assert y_tr.dtype == y_te.dtype == np.int64 and y_tr.shape == (n,)
        assert set(np.unique(np.concatenate([y_tr, y_te])).tolist()) <= {0, 1}
        assert np.abs(x_tr).max() <= 1.0
    again, _, _ = generate_fedem_synthetic(4, 6, 2, 0.4, 0.1, 30, 9, "clean")
    other, _, _ = generate_fedem_synthetic(4, 6, 2, 0.4, 0.1, 30, 10, "clean")
    for a, b, c in zip(clients, again, other, strict=True):
        assert all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))
        assert not np.array_equal(a[2], c[2])


def test_reference_labels_are_about_36_percent_ones() -> None:
    clients, _, _ = generate_fedem_synthetic(300, test_size=1, seed=1234)
    y_train = np.concatenate([c[1] for c in clients])
    assert len(y_train) == 70_507
    assert abs(float(y_train.mean()) - 0.3597) < 0.015
    clean, _, _ = generate_fedem_synthetic(300, test_size=1, seed=1234, mode="clean")
    assert abs(float(np.concatenate([c[1] for c in clean]).mean()) - 0.5) < 0.015


@pytest.mark.slow
def test_full_reference_dataset_has_the_known_label_fractions() -> None:
    """The paper's full data (1.57M rows) streamed client by client, never held at once."""
    gen = FedEMSynthetic(300)
    ones, total = np.zeros(2), np.zeros(2)
    for _x_train, y_tr, _x_test, y_te in gen.clients():
        ones += (y_tr.sum(), y_te.sum())
        total += (len(y_tr), len(y_te))
    assert total.tolist() == [70_507, 1_500_000]
    assert np.round(100 * ones / total, 2).tolist() == [35.97, 36.46]


def test_clients_continue_one_stream_and_cannot_restart() -> None:
    gen = FedEMSynthetic(2, dimension=3, test_size=5)
    list(gen.clients())
    with pytest.raises(RuntimeError, match="once"):
        next(gen.clients())


# --- labels before the shuffle: the slice bug and the fixed modes ------------------------------


def _last_component_of(row: int, counts: np.ndarray) -> int:
    owners = [m for m, c in enumerate(counts.tolist()) if row < c]
    return owners[-1] if owners else -1


def test_reference_slice_bug_relabels_the_leading_rows_and_leaves_the_rest_zero() -> None:
    theta = np.random.default_rng(0).uniform(-1, 1, size=(3, 10))
    pi = np.array([0.5, 0.2, 0.3])
    x, y, counts = labelled_rows(np.random.RandomState(4), 400, pi, theta, 0.0, "reference")
    assert counts.sum() == 400 and x.shape == (400, 10)
    top = int(counts.max())
    assert top < 400 and (y[top:] == 0).all()  # rows past the largest count are never labelled
    for i in range(top):
        m = _last_component_of(i, counts)
        assert y[i] == int(x[i] @ theta[m] > 0)
    # unlabelled rows are not all negatives of some rule: about half would score > 0
    assert 0.3 < float(np.mean(x[top:] @ theta[0] > 0)) < 0.7


def test_clean_mode_gives_each_component_its_own_rows() -> None:
    theta = np.random.default_rng(1).uniform(-1, 1, size=(3, 10))
    pi = np.array([0.5, 0.2, 0.3])
    x, y, counts = labelled_rows(np.random.RandomState(4), 400, pi, theta, 0.0, "clean")
    z = np.repeat(np.arange(3), counts)
    np.testing.assert_array_equal(y, (np.einsum("nd,nd->n", x, theta[z]) > 0).astype(np.int64))


def test_clean_mode_true_components_are_bayes_accurate() -> None:
    theta = np.random.default_rng(2).uniform(-1, 1, size=(3, 150))
    pi = np.array([0.2, 0.3, 0.5])
    x, y, counts = labelled_rows(np.random.RandomState(5), 3000, pi, theta, 0.1, "clean")
    z = np.repeat(np.arange(3), counts)
    predicted = np.einsum("nd,nd->n", x, theta[z]) > 0
    for m in range(3):
        assert counts[m] > 300
        assert float(np.mean(predicted[z == m] == y[z == m])) >= 0.95


def test_bernoulli_mode_draws_labels_from_the_logistic_probability() -> None:
    theta = np.random.default_rng(3).uniform(-1, 1, size=(2, 5))
    pi = np.array([0.4, 0.6])
    x, y, counts = labelled_rows(np.random.RandomState(6), 20_000, pi, theta, 0.0, "bernoulli")
    z = np.repeat(np.arange(2), counts)
    prob = 1 / (1 + np.exp(-np.einsum("nd,nd->n", x, theta[z])))
    # calibration: within score bins, the share of ones matches the mean probability
    bins = np.digitize(prob, np.linspace(0, 1, 6)[1:-1])
    for b in range(5):
        rows = bins == b
        if rows.sum() > 500:
            assert abs(float(y[rows].mean()) - float(prob[rows].mean())) < 0.03
    agreement = float(np.mean((prob > 0.5) == (y == 1)))
    assert abs(agreement - float(np.mean(np.maximum(prob, 1 - prob)))) < 0.015
    assert agreement < 0.95  # unlike the deterministic modes, the sign does not decide y


# --- the registered dataset ---------------------------------------------------------------------

PARAMS: tuple[tuple[str, int | float | str], ...] = (
    ("components", 2),
    ("dimension", 6),
    ("seed", 5),
    ("test_size", 25),
)
SPEC = DataSpec(
    "fedem-synthetic", 4, "natural", 0, val_fraction=0.25, test_fraction=0.2, dataset_params=PARAMS
)


def _generated(spec: DataSpec) -> list[ClientArrays]:
    params: dict[str, Any] = dict(spec.dataset_params)
    clients, _, _ = generate_fedem_synthetic(spec.num_clients, **params)
    return clients


def _row_set(x: np.ndarray) -> set[bytes]:
    return {row.tobytes() for row in x}


def test_natural_clients_get_their_own_generated_train_and_test_sets(tmp_path: Path) -> None:
    generated = _generated(SPEC)
    sizes = client_sizes(4, seed=5)
    for cid, (x_tr, y_tr, x_te, y_te) in enumerate(generated):
        data = load_client_data(SPEC, cid, tmp_path)
        np.testing.assert_array_equal(data.test.x, x_te)  # same rows, same order
        np.testing.assert_array_equal(data.test.y, y_te)
        assert len(data.test) == 25
        assert len(data.train) + len(data.val) == sizes[cid] == len(y_tr)
        assert len(data.val) == int(np.floor(0.25 * sizes[cid] + 0.5))
        own = np.concatenate([data.train.x, data.val.x])
        assert _row_set(own) == _row_set(x_tr)
        by_row = dict(zip((r.tobytes() for r in x_tr), y_tr.tolist(), strict=True))
        for split in (data.train, data.val):
            assert [by_row[r.tobytes()] for r in split.x] == split.y.tolist()
            assert split.input_shape == (6,) and split.num_classes == 2
            np.testing.assert_array_equal(split.features(), split.x)  # no normalisation
    summary = partition_summary(SPEC, tmp_path)
    assert summary["predefined_split"] is True and summary["has_official_test"] is False
    assert summary["input_shape"] == [6]


def test_test_fraction_is_ignored_and_val_fraction_carves_the_train_rows(tmp_path: Path) -> None:
    a = load_client_data(SPEC, 1, tmp_path)
    raw = SPEC.to_dict() | {"test_fraction": 0.0, "val_fraction": 0.0}
    b = load_client_data(DataSpec.from_dict(raw), 1, tmp_path)
    np.testing.assert_array_equal(a.test.x, b.test.x)
    assert len(b.val) == 0
    np.testing.assert_array_equal(b.train.x, _generated(SPEC)[1][0])  # generated order kept


def test_built_once_cached_and_identical_across_cache_dirs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    built: list[int] = []

    class Counting(FedEMSynthetic):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.append(kwargs["num_clients"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(registry, "FedEMSynthetic", Counting)
    first = [load_client_data(SPEC, cid, tmp_path / "a") for cid in range(4)]
    assert built == [4]  # T comes from the spec's num_clients
    files = sorted(p.name for p in (tmp_path / "a" / SPEC.key()).iterdir())
    clients = [f"client-{i}.npz" for i in range(4)]
    assert files == [".lock", *clients, "manifest.json", SERVER_TEST]
    assert not (tmp_path / "a" / "sources").exists()  # the client files are the only cache
    again = load_client_data(SPEC, 2, tmp_path / "a")
    assert built == [4]
    other = load_client_data(SPEC, 2, tmp_path / "b")
    assert built == [4, 4]
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(getattr(first[2], split).x, getattr(again, split).x)
        np.testing.assert_array_equal(getattr(first[2], split).x, getattr(other, split).x)
        np.testing.assert_array_equal(getattr(first[2], split).y, getattr(other, split).y)


def test_dataset_params_change_the_data_and_the_cache_key(tmp_path: Path) -> None:
    clean = DataSpec.from_dict(SPEC.to_dict() | {"dataset_params": [*PARAMS, ("mode", "clean")]})
    assert clean.key() != SPEC.key()
    a, b = load_client_data(SPEC, 0, tmp_path), load_client_data(clean, 0, tmp_path)
    np.testing.assert_array_equal(a.test.x, b.test.x)  # same draws until the labels
    assert not np.array_equal(a.test.y, b.test.y)
    wider = DataSpec.from_dict(SPEC.to_dict() | {"dataset_params": [("dimension", 9)]})
    assert load_client_data(wider, 0, tmp_path).train.input_shape == (9,)


def test_server_test_set_takes_at_most_200_rows_per_client(tmp_path: Path) -> None:
    big = DataSpec(
        "fedem-synthetic", 3, "natural", dataset_params=(("dimension", 4), ("test_size", 250))
    )
    joined = load_server_test_data(big, tmp_path)
    assert joined is not None and len(joined) == 600 and joined.input_shape == (4,)
    heads = [load_client_data(big, cid, tmp_path).test for cid in range(3)]
    np.testing.assert_array_equal(joined.x, np.concatenate([t.x[:200] for t in heads]))
    np.testing.assert_array_equal(joined.y, np.concatenate([t.y[:200] for t in heads]))
    small = load_server_test_data(SPEC, tmp_path)
    assert small is not None and len(small) == 4 * 25


@pytest.mark.parametrize("partitioner", ["iid", "dirichlet"])
def test_other_partitioners_are_refused_before_generating(tmp_path: Path, partitioner: str) -> None:
    params = (("alpha", 0.5),) if partitioner == "dirichlet" else ()
    spec = DataSpec("fedem-synthetic", 3, partitioner, params=params, dataset_params=PARAMS)
    message = f"'fedem-synthetic'.*predefined split.*'natural'.*got '{partitioner}'"
    with pytest.raises(DataConfigError, match=message):
        validate_spec(spec)
    with pytest.raises(DataConfigError, match=message):
        load_client_data(spec, 0, tmp_path)
    assert not (tmp_path / spec.key() / "manifest.json").exists()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ((("dimension", 0),), "dimension must be an integer >= 1, got 0"),
        ((("dimension", 2.5),), "dimension must be an integer"),
        ((("components", 0),), "components must be an integer >= 1"),
        ((("alpha", 0.0),), "alpha must be a finite number > 0"),
        ((("alpha", -1),), "alpha must be a finite number > 0"),
        ((("noise", -0.1),), "noise must be a finite number >= 0"),
        ((("test_size", 0),), "test_size must be an integer >= 1"),
        ((("train_size", -5),), "train_size must be an integer >= 0"),
        ((("seed", -1),), r"seed must be an integer in \[0, 4294967295\]"),
        ((("mode", "paper"),), "mode must be one of reference, clean, bernoulli, got 'paper'"),
        ((("dim", 3),), "has no parameter 'dim'; accepted: num_clients, dimension"),
    ],
)
def test_validate_spec_names_the_bad_dataset_parameter(
    tmp_path: Path, params: tuple[tuple[str, Any], ...], message: str
) -> None:
    spec = DataSpec("fedem-synthetic", 3, "natural", dataset_params=params)
    with pytest.raises(DataConfigError, match=message):
        validate_spec(spec)
    with pytest.raises(DataConfigError, match=message):
        load_client_data(spec, 0, tmp_path)


def test_num_clients_comes_from_the_spec_only() -> None:
    with pytest.raises(DataConfigError, match="dataset_params: num_clients is the spec's own"):
        DataSpec("fedem-synthetic", 3, "natural", dataset_params=(("num_clients", 3),))
    with pytest.raises(DataConfigError, match="num_clients must be >= 1"):
        DataSpec("fedem-synthetic", 0, "natural")
    with pytest.raises(DataConfigError, match="num_clients must be an integer >= 1, got 0"):
        generate_fedem_synthetic(0)


def test_parameters_for_a_dataset_without_any_are_refused(tmp_path: Path) -> None:
    spec = DataSpec("mnist-5k", 3, dataset_params=(("dimension", 3),))
    with pytest.raises(DataConfigError, match="'mnist-5k' takes no parameters, got 'dimension'"):
        validate_spec(spec)


def test_spec_dataset_params_are_sorted_canonical_and_round_trip() -> None:
    a = DataSpec("fedem-synthetic", 3, "natural", dataset_params=(("noise", 1), ("alpha", 0.4)))
    b = DataSpec("fedem-synthetic", 3, "natural", dataset_params=(("alpha", 0.4), ("noise", 1.0)))
    assert a.dataset_params == (("alpha", 0.4), ("noise", 1)) and a.key() == b.key()
    assert DataSpec.from_dict(json.loads(json.dumps(a.to_dict()))) == a
    assert a.identity()["dataset_params"] == [["alpha", 0.4], ["noise", 1]]
    plain = DataSpec("fedem-synthetic", 3, "natural")
    assert "dataset_params" not in plain.identity() and plain.key() != a.key()
    old = {k: v for k, v in plain.to_dict().items() if k != "dataset_params"}
    assert DataSpec.from_dict(old) == plain  # dicts written before the field existed
    not_a_value: Any = (("mode", None),)
    with pytest.raises(DataConfigError, match="dataset_params: mode must be an int, float or str"):
        DataSpec("fedem-synthetic", 3, "natural", dataset_params=not_a_value)


# --- catalog ------------------------------------------------------------------------------------


def test_catalog_shapes_follow_the_dimension() -> None:
    assert dataset_info("fedem-synthetic") == CATALOG["fedem-synthetic"]
    assert dataset_info("fedem-synthetic").input_shape == (150,)
    assert dataset_info("fedem-synthetic").num_classes == 2
    info = dataset_info("fedem-synthetic", dict(SPEC.dataset_params))
    assert info.input_shape == (6,) and info.num_classes == 2
    assert dataset_info("fedem-synthetic", {"dimension": 20.0}).input_shape == (20,)
    with pytest.raises(DataConfigError, match="dimension"):
        dataset_info("fedem-synthetic", {"dimension": 0})
    with pytest.raises(DataConfigError, match="no parameter 'dims'"):
        dataset_info("fedem-synthetic", {"dims": 3})
    assert dataset_info("cifar10").input_shape == (3, 32, 32)
    assert dataset_info("cifar10", {}) == dataset_info("cifar10")
    with pytest.raises(DataConfigError, match="'cifar10' takes no parameters"):
        dataset_info("cifar10", {"dimension": 3})
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'"):
        dataset_info("imagenet")
