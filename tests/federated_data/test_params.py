"""The synthetic generators' shared parameter check."""

from __future__ import annotations

import pytest

from federated_data.errors import DataConfigError
from federated_data.params import typed_params

DEFAULTS = {"num_clients": 4, "train_size": 10, "noise": 0.1}


def _check(**params: object) -> dict[str, object]:
    return typed_params({**DEFAULTS, **params}, DEFAULTS, "dataset 'x'", ("num_clients",
                        "train_size"), ("noise",))  # fmt: skip


def test_values_are_typed_and_train_size_zero_is_the_default() -> None:
    out = _check(num_clients=3.0, train_size=0, noise=1)
    assert out == {"num_clients": 3, "train_size": 10, "noise": 1.0}
    assert isinstance(out["num_clients"], int) and isinstance(out["noise"], float)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"num_clients": 2.5}, "num_clients must be a non-negative integer, got 2.5"),
        ({"num_clients": True}, "num_clients must be a non-negative integer"),
        ({"train_size": -1}, "train_size must be a non-negative integer"),
        ({"noise": float("nan")}, "noise must be a finite number >= 0"),
        ({"noise": -0.1}, "noise must be a finite number >= 0"),
    ],
)
def test_a_bad_parameter_is_named(params: dict[str, object], message: str) -> None:
    with pytest.raises(DataConfigError, match=message) as err:
        _check(**params)
    assert str(err.value).startswith("dataset 'x': ")


def test_a_missing_parameter_is_named() -> None:
    with pytest.raises(DataConfigError, match="missing parameter\\(s\\) noise"):
        typed_params({"num_clients": 1, "train_size": 1}, DEFAULTS, "dataset 'x'", (), ())
