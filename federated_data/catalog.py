"""Shapes of each dataset, known without loading it (the server may hold no data at all)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from federated_data.errors import DataConfigError
from federated_data.shakespeare import SEQUENCE_LENGTH, VOCABULARY, reference_class_weights
from federated_data.synthetic_ae import PARAM_DEFAULTS as _AE_SYNTHETIC
from federated_data.synthetic_ae import check_params as _check_ae_synthetic
from federated_data.synthetic_fedem import PARAM_DEFAULTS as _FEDEM_SYNTHETIC
from federated_data.synthetic_fedem import resolve_params as _resolve_fedem_synthetic
from federated_data.synthetic_pca import PARAM_DEFAULTS as _PCA_SYNTHETIC
from federated_data.synthetic_pca import check_params as _check_pca_synthetic


@dataclass(frozen=True)
class DatasetInfo:
    """`tokens`: examples are token sequences (next-token data, see ArrayDataset).
    `class_weights`: the per-class loss weights the dataset's reference training uses (None:
    every class weighs 1)."""

    input_shape: tuple[int, ...]
    num_classes: int
    tokens: bool = False
    class_weights: tuple[float, ...] | None = None


def _fedem_synthetic_info(params: Mapping[str, Any]) -> DatasetInfo:
    return DatasetInfo((_resolve_fedem_synthetic(params)["dimension"],), 2)


def _pca_synthetic_info(params: Mapping[str, Any]) -> DatasetInfo:
    return DatasetInfo((_check_pca_synthetic({**_PCA_SYNTHETIC, **params})["dimension"],), 1)


def _ae_synthetic_info(params: Mapping[str, Any]) -> DatasetInfo:
    return DatasetInfo((_check_ae_synthetic({**_AE_SYNTHETIC, **params})["dimension"],), 1)


# Datasets whose shapes depend on their parameters; CATALOG lists them with their defaults.
_SHAPED_BY_PARAMS: dict[str, Callable[[Mapping[str, Any]], DatasetInfo]] = {
    "fedem-synthetic": _fedem_synthetic_info,
    "pca-synthetic": _pca_synthetic_info,
    "ae-synthetic": _ae_synthetic_info,
}

CATALOG: dict[str, DatasetInfo] = {
    "mnist-5k": DatasetInfo((1, 28, 28), 10),
    "digits": DatasetInfo((1, 8, 8), 10),
    "mnist": DatasetInfo((1, 28, 28), 10),
    "fashion-mnist": DatasetInfo((1, 28, 28), 10),
    "emnist": DatasetInfo((1, 28, 28), 62),
    "femnist": DatasetInfo((1, 28, 28), 62),
    "cifar10": DatasetInfo((3, 32, 32), 10),
    "cifar100": DatasetInfo((3, 32, 32), 100),
    "svhn": DatasetInfo((3, 32, 32), 10),
    "fedem-synthetic": DatasetInfo((int(_FEDEM_SYNTHETIC["dimension"]),), 2),
    "shakespeare": DatasetInfo(
        (SEQUENCE_LENGTH,), len(VOCABULARY), tokens=True, class_weights=reference_class_weights()
    ),
    "pca-synthetic": DatasetInfo((int(_PCA_SYNTHETIC["dimension"]),), 1),
    "ae-synthetic": DatasetInfo((int(_AE_SYNTHETIC["dimension"]),), 1),
}


def dataset_info(name: str, params: Mapping[str, Any] | None = None) -> DatasetInfo:
    """Input shape and class count of `name` built with `params` (its dataset parameters,
    e.g. a DataSpec's `dataset_params`); bad parameters raise DataConfigError."""
    if name in _SHAPED_BY_PARAMS:
        return _SHAPED_BY_PARAMS[name](params or {})
    try:
        info = CATALOG[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(sorted(CATALOG))}") from None
    if params:
        raise DataConfigError(
            f"dataset {name!r} takes no parameters, got {', '.join(map(repr, sorted(params)))}"
        )
    return info
