"""The run's per-class loss weights: the dataset's own by default, none on request."""

from __future__ import annotations

import pytest

from federated_data.shakespeare import reference_class_weights
from pollen.core.dataspec import check_model_fits, class_weights, data_spec
from pollen.core.runconfig import resolve


def test_class_weights_come_from_the_dataset_unless_switched_off() -> None:
    shakespeare = resolve({"dataset": "shakespeare", "model": "char-lstm"})
    assert shakespeare["class-weights"] == "dataset"
    assert class_weights(shakespeare) == reference_class_weights()
    assert class_weights({**shakespeare, "class-weights": "none"}) is None
    assert class_weights(resolve({"dataset": "digits"})) is None


def test_sequence_models_and_token_data_go_together() -> None:
    check_model_fits(resolve({"dataset": "shakespeare", "model": "char-lstm-small"}))
    check_model_fits(resolve({"dataset": "digits", "model": "cnn"}))
    with pytest.raises(ValueError, match="model 'mlp' does not fit dataset 'shakespeare'"):
        check_model_fits(resolve({"dataset": "shakespeare", "model": "mlp"}))
    with pytest.raises(ValueError, match="examples are images or feature vectors"):
        check_model_fits(resolve({"dataset": "fedem-synthetic", "model": "char-lstm"}))


def test_the_data_spec_is_kept_by_the_settings_and_the_data_directory() -> None:
    settings = resolve({"dataset": "digits", "num-clients": 7})
    spec = data_spec(settings)
    assert spec.num_clients == 7 and spec.dataset == "digits"
    assert data_spec(dict(settings)) is spec  # equal contents: the same object
    elsewhere = data_spec(settings, "/data/elsewhere")
    assert elsewhere.data_dir == "/data/elsewhere" and elsewhere is not spec
    assert data_spec({**settings, "num-clients": 8}).num_clients == 8
