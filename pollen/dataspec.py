"""Run settings -> the data partition they describe (shared by clients, server and launcher)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from pollen.settings import Scalar

if TYPE_CHECKING:
    from federated_data import DataSpec


def partition_params(settings: Mapping[str, Scalar]) -> dict[str, int | float | str]:
    """The partitioner's own parameters, taken from the run settings."""
    scheme = str(settings["partitioner"])
    alpha = float(settings["dirichlet-alpha"])
    k = int(settings["classes-per-client"])
    if scheme == "dirichlet":
        return {"alpha": alpha}
    if scheme in ("classes", "one-class"):
        return {"classes_per_client": k}
    if scheme == "label-groups":
        return {"alpha": alpha, "groups": int(settings["label-groups"])}
    if scheme == "pachinko":
        return {"alpha": alpha, "beta": float(settings["pachinko-beta"])}
    return {}


def dataset_params(settings: Mapping[str, Scalar]) -> dict[str, int | float | str]:
    """The dataset's own parameters (only generated datasets take any)."""
    from federated_data.registry import dataset_param_names

    names = set(dataset_param_names(str(settings["dataset"])))
    out: dict[str, int | float | str] = {}
    for key, value in settings.items():
        group, _, name = key.partition(".")
        if group == "synthetic" and name.replace("-", "_") in names:
            out[name.replace("-", "_")] = value  # type: ignore[assignment]
    return out


def data_spec(settings: Mapping[str, Scalar], data_dir: str | None = None) -> DataSpec:
    from federated_data import DataSpec

    return DataSpec(
        dataset=str(settings["dataset"]),
        num_clients=int(settings["num-clients"]),
        partitioner=str(settings["partitioner"]),
        seed=int(settings["seed"]),
        params=tuple(sorted(partition_params(settings).items())),
        val_fraction=float(settings["val-fraction"]),
        test_fraction=float(settings["test-fraction"]),
        data_dir=data_dir or (str(settings["data-dir"]) or None),
        download=bool(settings["download"]),
        dataset_params=tuple(sorted(dataset_params(settings).items())),
    )


def model_input(settings: Mapping[str, Scalar]) -> tuple[tuple[int, ...], int]:
    """(input shape, number of classes) of the run's dataset, without loading it."""
    from federated_data.catalog import dataset_info

    info = dataset_info(str(settings["dataset"]), dataset_params(settings) or None)
    return info.input_shape, info.num_classes


def check_model_fits(settings: Mapping[str, Scalar]) -> None:
    """Token data needs a sequence model and a sequence model token data (ValueError)."""
    from federated_data.catalog import dataset_info
    from models.registry import SEQUENCE_MODEL_NAMES

    model, dataset = str(settings["model"]), str(settings["dataset"])
    tokens = dataset_info(dataset, dataset_params(settings) or None).tokens
    if tokens != (model in SEQUENCE_MODEL_NAMES):
        kind = "token sequences" if tokens else "images or feature vectors"
        raise ValueError(
            f"model {model!r} does not fit dataset {dataset!r}, whose examples are {kind}; "
            f"sequence models ({', '.join(SEQUENCE_MODEL_NAMES)}) take token data only"
        )


def class_weights(settings: Mapping[str, Scalar]) -> tuple[float, ...] | None:
    """The run's per-class loss weights (None: unweighted), without loading the data."""
    from federated_data.catalog import dataset_info

    if settings["class-weights"] == "none":
        return None
    info = dataset_info(str(settings["dataset"]), dataset_params(settings) or None)
    return info.class_weights
