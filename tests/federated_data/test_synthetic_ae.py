"""ADEPT-AE's synthetic generator (Table 1): decoders scattered around a shared one, samples
on each client's decoder, per-split scaling, and the dataset built from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from federated_data import DataConfigError, DataSpec, load_client_data, validate_spec
from federated_data.catalog import dataset_info
from federated_data.synthetic_ae import (
    LATENT_STD,
    SHARED_STD,
    generate_ae_synthetic,
    training_decoders,
    true_decoders,
)

SMALL = {"num_clients": 4, "dimension": 16, "rank": 3, "heterogeneity": 0.05, "seed": 3}


def test_decoders_scatter_around_the_shared_one_by_the_heterogeneity() -> None:
    (weight, bias), personal = true_decoders({**SMALL, "num_clients": 200, "dimension": 64})
    assert weight.shape == (64, 3) and bias.shape == (64,) and len(personal) == 200
    shared = np.concatenate([weight.ravel(), bias])
    assert abs(float(shared.std()) - SHARED_STD) < 0.02
    offsets = np.concatenate([np.concatenate([(w - weight).ravel(), b - bias])
                              for w, b in personal])  # fmt: skip
    assert abs(float(offsets.std()) - 0.05) < 0.001 and abs(float(offsets.mean())) < 0.001
    _, same = true_decoders({**SMALL, "heterogeneity": 0.0})
    assert all(np.array_equal(w, same[0][0]) and np.array_equal(b, same[0][1]) for w, b in same)


def test_samples_lie_on_the_clients_decoder_and_each_split_has_unit_std() -> None:
    clients = generate_ae_synthetic(SMALL)
    decoders = training_decoders(SMALL)
    assert len(clients) == 4
    for (train, test), (weight, bias) in zip(clients, decoders, strict=True):
        assert train.shape == (10, 16) and test.shape == (20, 16) and train.dtype == np.float32
        assert abs(float(train.std(ddof=1)) - 1) < 1e-5 and abs(float(test.std(ddof=1)) - 1) < 1e-5
        # no noise: x = W z + b for the decoder scaled like the training split
        z, *_ = np.linalg.lstsq(weight, (train - bias).T.astype(np.float64), rcond=None)
        np.testing.assert_allclose(z.T @ weight.T + bias, train, atol=1e-5)
        assert abs(float(z.std()) - LATENT_STD) < 0.3  # z ~ N(0, 0.5^2), 30 draws
    noisy = generate_ae_synthetic({**SMALL, "noise": 0.1})[0][0]
    w, b = training_decoders({**SMALL, "noise": 0.1})[0]
    z, *_ = np.linalg.lstsq(w, (noisy - b).T.astype(np.float64), rcond=None)
    assert np.abs(z.T @ w.T + b - noisy).max() > 0.05  # noise leaves the decoder's range


def test_same_parameters_same_data_and_the_seed_changes_them() -> None:
    a, b = generate_ae_synthetic(SMALL), generate_ae_synthetic(SMALL)
    np.testing.assert_array_equal(a[2][1], b[2][1])
    c = generate_ae_synthetic({**SMALL, "seed": 4})
    assert not np.allclose(a[0][0], c[0][0])


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"rank": 0}, "rank"),
        ({"heterogeneity": -1.0}, "heterogeneity must be a finite number >= 0"),
        ({"test_size": 1}, "train_size, test_size >= 2"),
        ({"dimension": 2.5}, "dimension must be a non-negative integer"),
    ],
)
def test_bad_parameters_are_named(params: dict[str, Any], message: str) -> None:
    with pytest.raises(DataConfigError, match=message):
        generate_ae_synthetic({**SMALL, **params})


def test_natural_clients_get_their_generated_splits(tmp_path: Path) -> None:
    params = (("dimension", 16), ("heterogeneity", 0.05), ("noise", 0.0), ("rank", 3),
              ("seed", 3), ("test_size", 20), ("train_size", 0))  # fmt: skip
    spec = DataSpec("ae-synthetic", 4, "natural", 0, val_fraction=0.0, dataset_params=params)
    validate_spec(spec)
    generated = generate_ae_synthetic(SMALL)  # train_size 0 means the paper's 10
    for cid in range(4):
        data = load_client_data(spec, cid, tmp_path)
        np.testing.assert_array_equal(data.test.x, generated[cid][1])
        np.testing.assert_array_equal(data.train.x, generated[cid][0])
        assert data.train.input_shape == (16,)
    assert dataset_info("ae-synthetic", dict(params)).input_shape == (16,)
