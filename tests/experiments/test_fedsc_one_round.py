"""The one-round script: FedSC's round reduces to FedAvg + SC's at alpha 1, and differs below."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import pytest

from experiments.fedsc_objective import client_splits
from experiments.fedsc_one_round import exact_correlations, one_round, step_counts
from experiments.fedsc_probe_features import initial_weights
from tests.fakes import settings_of


def test_alpha_one_is_fedavg_sc_and_smaller_alpha_is_not(run_config: dict[str, Any]) -> None:
    cfg = settings_of({
        **run_config, "algorithm": "fedsc", "num-clients": 3, "partitioner": "one-class",
        "classes-per-client": 2, "fedsc.dim": 8, "seed": 0,
    })  # fmt: skip
    start = initial_weights(cfg)
    splits = client_splits(cfg)
    shared = exact_correlations(cfg, splits, start)
    assert set(shared) == {0, 1, 2} and all(np.allclose(r, r.T) for r in shared.values())
    fedavg = one_round(cfg, splits, start, 0.3, 2, 0.05, None)
    same = one_round(cfg, splits, start, 1.0, 2, 0.05, shared)
    fedsc = one_round(cfg, splits, start, 0.3, 2, 0.05, shared)
    floats = [k for k in start if start[k].dtype.kind == "f"]
    moved = [k for k in floats if not np.allclose(fedavg[k], start[k])]
    assert moved
    for k in start:
        np.testing.assert_array_equal(same[k], fedavg[k])
    assert any(not np.allclose(fedsc[k], fedavg[k]) for k in moved)


def test_step_counts_are_checked() -> None:
    assert step_counts("1,5,25") == [1, 5, 25]
    for bad in ("1,x", "0,5", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            step_counts(bad)
