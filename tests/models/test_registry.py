from __future__ import annotations

import pytest
import torch

from federated_data.catalog import CATALOG
from models import MODEL_NAMES, build_model


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("dataset", ["mnist-5k", "digits", "cifar10", "cifar100"])
def test_models_map_each_dataset_to_its_classes(name: str, dataset: str) -> None:
    info = CATALOG[dataset]
    model = build_model(name, info.input_shape, info.num_classes)
    out = model(torch.zeros(4, *info.input_shape))
    assert out.shape == (4, info.num_classes)


def test_unknown_model_and_wrong_input_are_named() -> None:
    with pytest.raises(ValueError, match="unknown model 'resnet'"):
        build_model("resnet", (1, 28, 28), 10)
    with pytest.raises(ValueError, match="image input"):
        build_model("cnn", (64,), 10)
