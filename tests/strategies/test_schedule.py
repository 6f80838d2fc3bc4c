from __future__ import annotations

import itertools

import pytest

from pollen.core.settings import Scalar
from strategies.schedule import learning_rate


def test_cosine_anneals_to_lr_min() -> None:
    """FeDLRT's Table 2 schedule: 1e-3 cosine to 5e-4 over T rounds."""
    settings: dict[str, Scalar] = {
        "lr": 1e-3,
        "lr-min": 5e-4,
        "lr-schedule": "cosine",
        "num-rounds": 200,
    }
    assert learning_rate(settings, 1) == pytest.approx(1e-3)
    assert learning_rate(settings, 101) == pytest.approx(7.5e-4)
    assert learning_rate(settings, 200) == pytest.approx(5e-4, rel=1e-3)
    rates = [learning_rate(settings, t) for t in range(1, 201)]
    assert all(a >= b for a, b in itertools.pairwise(rates))


@pytest.mark.parametrize(("rounds", "last_full"), [(100, 75), (40, 30), (10, 7), (1, 1)])
def test_late_drop_divides_by_ten_after_three_quarters_of_the_rounds(
    rounds: int, last_full: int
) -> None:
    """ADEPT-DGM's reference schedule: x0.1 at epoch 75 of 100 (MultiStepLR, 0-based epochs),
    i.e. rounds 1-75 at lr and 76-100 at lr / 10."""
    settings: dict[str, Scalar] = {"lr": 1e-3, "lr-schedule": "late-drop", "num-rounds": rounds}
    rates = [learning_rate(settings, t) for t in range(1, rounds + 1)]
    assert rates[:last_full] == [1e-3] * last_full
    assert rates[last_full:] == pytest.approx([1e-4] * (rounds - last_full))
