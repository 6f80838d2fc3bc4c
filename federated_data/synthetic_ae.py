"""ADEPT-AE's synthetic task (Ozkara et al. 2025, Sec. 5.1 and Table 1): clients whose linear
decoders scatter around a shared one.

The shared decoder mu^{d,*} is one linear layer from `rank` latent units to `dimension` outputs
(paper: 5 -> 64), its weight and bias drawn N(0, sigma_mu^2) with sigma_mu = 0.1; client i's
true decoder adds N(0, heterogeneity^2) to every weight and bias entry (the paper's sigma*,
SNR = 20 log10(sigma_mu / sigma*) dB: 0.05 = 6 dB, 0.025 = 12 dB, 0.01 = 20 dB). Its samples
follow the paper's Eq. (5), x = psi_i(z) + eps with z ~ N(0, 0.5^2 I) and eps ~ N(0, noise^2 I)
(the authors' code: latent std 0.5, no noise). As in the authors' code, each client's training
set and its test set are each divided by their own scalar standard deviation (over all their
entries). The decoders come first in the random stream, so `true_decoders` gives them without
generating any sample (the Table 1 "Baseline" starts each client's decoder at its own).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from federated_data.errors import DataConfigError
from federated_data.params import typed_params

SHARED_STD = 0.1
"""sigma_mu: the standard deviation of the shared decoder's weight and bias entries."""
LATENT_STD = 0.5
"""Standard deviation of the latent z (the authors' code)."""

PARAM_DEFAULTS: dict[str, int | float | str] = {
    "num_clients": 50,
    "dimension": 64,
    "rank": 5,
    "noise": 0.0,
    "heterogeneity": 0.05,
    "train_size": 10,
    "test_size": 20,
    "seed": 1234,
}

_WHERE = "dataset 'ae-synthetic'"


def check_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Every parameter, type-normalised; DataConfigError names a bad one. A train_size of 0
    (the run settings' default, shared with other generators) means the paper's 10."""
    out = typed_params(
        params,
        PARAM_DEFAULTS,
        _WHERE,
        ("num_clients", "dimension", "rank", "train_size", "test_size", "seed"),
        ("noise", "heterogeneity"),
    )
    if out["rank"] < 1 or out["dimension"] < 1:
        raise DataConfigError(
            f"{_WHERE}: rank (the decoder's latent size) and dimension must be >= 1, got rank "
            f"{out['rank']}, dimension {out['dimension']}"
        )
    if out["num_clients"] < 1 or out["test_size"] < 2 or out["train_size"] < 2:
        raise DataConfigError(
            f"{_WHERE}: need num_clients >= 1 and train_size, test_size >= 2 (each split is "
            f"divided by its own standard deviation)"
        )
    return out


def _decoders(
    rng: np.random.Generator, p: Mapping[str, Any]
) -> tuple[tuple[np.ndarray, np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    d, k, het = p["dimension"], p["rank"], p["heterogeneity"]
    weight = SHARED_STD * rng.standard_normal((d, k))
    bias = SHARED_STD * rng.standard_normal(d)
    personal = [
        (weight + het * rng.standard_normal((d, k)), bias + het * rng.standard_normal(d))
        for _ in range(p["num_clients"])
    ]
    return (weight, bias), personal


def _raw_splits(p: Mapping[str, Any]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Every client's unscaled (x_train, x_test) and its decoder (weight | bias columns)."""
    rng = np.random.default_rng(p["seed"])
    _, personal = _decoders(rng, p)
    out = []
    for weight, bias in personal:
        sets = []
        for n in (p["train_size"], p["test_size"]):
            z = LATENT_STD * rng.standard_normal((n, p["rank"]))
            sets.append(z @ weight.T + bias + p["noise"] * rng.standard_normal((n, p["dimension"])))
        out.append((sets[0], sets[1], np.column_stack([weight, bias])))
    return out


def _scale(x: np.ndarray) -> float:
    return max(float(x.std(ddof=1)), 1e-12)


def true_decoders(
    params: Mapping[str, Any],
) -> tuple[tuple[np.ndarray, np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    """The shared decoder (weight (dimension, rank), bias (dimension,)) and every client's, as
    drawn for the data generated with `params` (float64, before the per-split scaling)."""
    p = check_params({**PARAM_DEFAULTS, **params})
    return _decoders(np.random.default_rng(p["seed"]), p)


def training_decoders(params: Mapping[str, Any]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every client's true decoder of its training split as generated: its weight and bias
    divided by the std its training split was divided by (float64)."""
    p = check_params({**PARAM_DEFAULTS, **params})
    out = []
    for train, _, decoder in _raw_splits(p):
        scaled = decoder / _scale(train)
        out.append((scaled[:, :-1], scaled[:, -1]))
    return out


def generate_ae_synthetic(params: Mapping[str, Any]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every client's (x_train, x_test) as float32, each divided by its own std."""
    p = check_params({**PARAM_DEFAULTS, **params})
    return [
        ((train / _scale(train)).astype(np.float32), (test / _scale(test)).astype(np.float32))
        for train, test, _ in _raw_splits(p)
    ]
