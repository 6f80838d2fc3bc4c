"""strategies.base: what every server half shares; here, starting from given arrays
(`Strategy.start_from`, a Flower app's `initial_arrays`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from torch import nn

from pollen.core.runconfig import resolve
from strategies.base import InitialArraysError, layout_mismatch
from strategies.fedavg import FedAvg
from strategies.fedem import FedEM
from strategies.fedlrt import FeDLRT
from strategies.local import LocalOnly


def _settings(**extra: Any) -> dict[str, Any]:
    return dict(resolve({"dataset": "digits", "num-clients": 2, **extra}))


def test_layout_mismatch_names_the_first_difference() -> None:
    model = {"w": np.zeros((2, 3)), "b": np.zeros(3)}
    assert layout_mismatch(dict(model), model) == ""
    assert "1 array(s) missing" in layout_mismatch({"w": model["w"]}, model)
    assert "shape (3, 2), the model's (2, 3)" in layout_mismatch(
        {"w": np.zeros((3, 2)), "b": model["b"]}, model
    )


def test_a_global_model_starts_from_arrays_of_its_layout() -> None:
    half = FedAvg(_settings(algorithm="fedavg"))
    half.initialize(0)
    given = {k: np.full_like(v, 0.5) for k, v in half.weights.items()}
    half.start_from({k: v.astype(np.float64) for k, v in given.items()})
    for key, value in half.weights.items():
        assert value.dtype == given[key].dtype  # kept as the model's
        assert np.array_equal(value, given[key])
    with pytest.raises(InitialArraysError, match="do not fit the model"):
        half.start_from({"w": np.zeros(3)})


def test_fedem_takes_one_model_as_its_first_component() -> None:
    half = FedEM(_settings(algorithm="fedem", **{"fedem.components": 3}))
    half.initialize(0)
    before = half.components()
    one = {k: np.full_like(v, 0.25) for k, v in before[0].items()}
    half.start_from(one)
    after = half.components()
    assert all(np.array_equal(after[0][k], one[k]) for k in one)
    for m in (1, 2):  # the others as initialize drew them: apart from each other
        assert all(np.array_equal(after[m][k], before[m][k]) for k in one)


def test_a_user_model_builds_the_initial_model() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(64, 16)
            self.fc2 = nn.Linear(16, 10)

    half = FeDLRT(_settings(algorithm="fedlrt", **{"fedlrt.layers": "fc1"}))
    half.model_fn = Net
    half.initialize(0)
    assert set(half.factors) == {"fc1"}
    dense = {k: v.detach().numpy() for k, v in Net().state_dict().items()}
    half.start_from(dense)  # a dense model: factorized again
    assert np.allclose(half.dense["fc2.weight"], dense["fc2.weight"])


def test_a_strategy_without_a_global_model_takes_no_arrays() -> None:
    half = LocalOnly(_settings(algorithm="local"))
    half.initialize(0)
    half.start_from({})  # nothing given: nothing to refuse
    with pytest.raises(InitialArraysError, match="starts from its own initial state"):
        half.start_from({"w": np.zeros(2)})
