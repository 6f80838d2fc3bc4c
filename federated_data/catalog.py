"""Shapes of each dataset, known without loading it (the server may hold no data at all)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetInfo:
    input_shape: tuple[int, ...]
    num_classes: int


CATALOG: dict[str, DatasetInfo] = {
    "mnist-5k": DatasetInfo((1, 28, 28), 10),
    "digits": DatasetInfo((1, 8, 8), 10),
    "mnist": DatasetInfo((1, 28, 28), 10),
    "fashion-mnist": DatasetInfo((1, 28, 28), 10),
    "emnist": DatasetInfo((1, 28, 28), 62),
    "cifar10": DatasetInfo((3, 32, 32), 10),
    "cifar100": DatasetInfo((3, 32, 32), 100),
    "svhn": DatasetInfo((3, 32, 32), 10),
}


def dataset_info(name: str) -> DatasetInfo:
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(sorted(CATALOG))}") from None
