"""The run's per-class loss weights: the dataset's own by default, none on request."""

from __future__ import annotations

from federated_data.shakespeare import reference_class_weights
from pollen.dataspec import class_weights
from pollen.settings import resolve


def test_class_weights_come_from_the_dataset_unless_switched_off() -> None:
    shakespeare = resolve({"dataset": "shakespeare", "model": "char-lstm"})
    assert shakespeare["class-weights"] == "dataset"
    assert class_weights(shakespeare) == reference_class_weights()
    assert class_weights({**shakespeare, "class-weights": "none"}) is None
    assert class_weights(resolve({"dataset": "digits"})) is None
