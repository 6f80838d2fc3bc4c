"""ADEPT-PCA's synthetic task (Ozkara et al. 2025, App. F.1): clients whose principal
subspaces scatter around a shared one.

V* is uniform on St(d, r); client i's subspace is U_i* = R(V*, P_T(V*, E_i)) with E_i's entries
N(0, heterogeneity^2) (the paper's sigma*, read as a standard deviation); its samples are
x = U_i* z + eps, z ~ N(0, I_r), eps ~ N(0, noise^2 I_d). The true subspaces come first in the
random stream, so `true_subspaces` gives them without generating any sample (clients use them
to report their error against the true model's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from federated_data.errors import DataConfigError
from federated_data.params import typed_params

PARAM_DEFAULTS: dict[str, int | float | str] = {
    "num_clients": 10,
    "dimension": 100,
    "rank": 20,
    "noise": 0.2,
    "heterogeneity": 0.1,
    "train_size": 20,
    "test_size": 1000,
    "seed": 1234,
}

_WHERE = "dataset 'pca-synthetic'"


def check_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Every parameter, type-normalised; DataConfigError names a bad one. A train_size of 0
    (the run settings' default, shared with other generators) means the paper's 20."""
    out = typed_params(
        params,
        PARAM_DEFAULTS,
        _WHERE,
        ("num_clients", "dimension", "rank", "train_size", "test_size", "seed"),
        ("noise", "heterogeneity"),
    )
    if not 1 <= out["rank"] < out["dimension"]:
        raise DataConfigError(
            f"{_WHERE}: need 1 <= rank < dimension, got rank {out['rank']}, "
            f"dimension {out['dimension']}"
        )
    if out["num_clients"] < 1 or out["test_size"] < 1:
        raise DataConfigError(f"{_WHERE}: num_clients and test_size must be >= 1")
    return out


def _subspaces(rng: np.random.Generator, p: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    from models.stiefel import random_point, retract, tangent_projection  # lazy: torch

    d, r = p["dimension"], p["rank"]
    center = random_point(d, r, rng)
    personal = np.stack(
        [
            retract(
                center,
                tangent_projection(center, p["heterogeneity"] * rng.standard_normal((d, r))),
            )
            for _ in range(p["num_clients"])
        ]
    )
    return center, personal


def true_subspaces(params: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(V*, stacked U_i*) of the data generated with `params` (float64)."""
    p = check_params({**PARAM_DEFAULTS, **params})
    return _subspaces(np.random.default_rng(p["seed"]), p)


def generate_pca_synthetic(
    params: Mapping[str, Any],
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    """Every client's (x_train, x_test) as float32, then V* and the U_i*."""
    p = check_params({**PARAM_DEFAULTS, **params})
    rng = np.random.default_rng(p["seed"])
    center, personal = _subspaces(rng, p)
    d, r = p["dimension"], p["rank"]
    clients = []
    for u in personal:
        sets = []
        for n in (p["train_size"], p["test_size"]):
            x = rng.standard_normal((n, r)) @ u.T + p["noise"] * rng.standard_normal((n, d))
            sets.append(x.astype(np.float32))
        clients.append((sets[0], sets[1]))
    return clients, center, personal
