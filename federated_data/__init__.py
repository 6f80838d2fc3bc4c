"""Federated datasets: loading, partitioning over clients, and a per-client cache.

Importing this package imports numpy only; torch, torchvision, scikit-learn and mlxtend are
imported by the loaders that need them, so a client reading its cached partition starts fast.
"""

from federated_data.arrays import ArrayDataset
from federated_data.cachefiles import default_cache_dir
from federated_data.client_data import (
    ClientData,
    DataSpec,
    load_client_data,
    load_server_test_data,
    partition_summary,
    validate_spec,
)
from federated_data.errors import DataConfigError, DatasetNotFoundError
from federated_data.partition import (
    CIFAR100_COARSE_OF_FINE,
    SCHEMES,
    partition_labels,
    validate_partition_params,
)
from federated_data.registry import (
    DATASET_NAMES,
    SourceData,
    dataset_names,
    dataset_param_names,
    load_dataset,
    register_dataset,
    resolve_dataset_params,
)
from federated_data.synthetic_fedem import client_sizes, generate_fedem_synthetic

__all__ = [
    "CIFAR100_COARSE_OF_FINE",
    "DATASET_NAMES",
    "SCHEMES",
    "ArrayDataset",
    "ClientData",
    "DataConfigError",
    "DataSpec",
    "DatasetNotFoundError",
    "SourceData",
    "client_sizes",
    "dataset_names",
    "dataset_param_names",
    "default_cache_dir",
    "generate_fedem_synthetic",
    "load_client_data",
    "load_dataset",
    "load_server_test_data",
    "partition_labels",
    "partition_summary",
    "register_dataset",
    "resolve_dataset_params",
    "validate_partition_params",
    "validate_spec",
]
