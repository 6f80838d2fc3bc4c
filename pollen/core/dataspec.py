"""Run settings -> the data partition they describe (shared by clients, server and launcher)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import fields
from typing import TYPE_CHECKING

from pollen.core.protection import AttackSettings
from pollen.core.settings import (
    RunSettings,
    Scalar,
    SettingsKey,
    SyntheticSettings,
    kept,
    settings_key,
)

if TYPE_CHECKING:
    from federated_data import DataSpec
    from federated_data.catalog import DatasetInfo


def partition_params(settings: Mapping[str, Scalar]) -> dict[str, int | float | str]:
    """The partitioner's own parameters, taken from the run settings."""
    return _partition_params(RunSettings.of(settings))


def _partition_params(run: RunSettings) -> dict[str, int | float | str]:
    scheme = run.partitioner
    alpha = run.dirichlet_alpha
    k = run.classes_per_client
    if scheme == "dirichlet":
        return {"alpha": alpha}
    if scheme in ("classes", "one-class"):
        return {"classes_per_client": k}
    if scheme == "label-groups":
        return {"alpha": alpha, "groups": run.label_groups}
    if scheme == "pachinko":
        return {"alpha": alpha, "beta": run.pachinko_beta}
    return {}


def dataset_params(settings: Mapping[str, Scalar]) -> dict[str, int | float | str]:
    """The dataset's own parameters (only generated datasets take any)."""
    return _dataset_params(RunSettings.of(settings), SyntheticSettings.of(settings))


def _dataset_params(run: RunSettings, synthetic: SyntheticSettings) -> dict[str, int | float | str]:
    from federated_data.registry import dataset_param_names  # lazy: heavy data code

    names = set(dataset_param_names(run.dataset))
    return {f.name: getattr(synthetic, f.name) for f in fields(synthetic) if f.name in names}


def data_spec(settings: Mapping[str, Scalar], data_dir: str | None = None) -> DataSpec:
    """The run's data: one partition per client; in a run with simulated attackers
    (`attack.clients`), one per honest client (see `partition_of`). Kept by the settings'
    contents and `data_dir` (a simulation worker asks for it with every client it serves)."""
    contents = settings_key(settings)
    key = None if contents is None else (contents, data_dir)
    return kept(_SPECS, key, lambda: _data_spec(settings, data_dir))


_SPECS: dict[tuple[SettingsKey, str | None], DataSpec] = {}


def _data_spec(settings: Mapping[str, Scalar], data_dir: str | None) -> DataSpec:
    from federated_data import DataSpec  # lazy: heavy data code

    run = RunSettings.of(settings)
    return DataSpec(
        dataset=run.dataset,
        num_clients=run.num_clients - len(AttackSettings.of(settings).ids()),
        partitioner=run.partitioner,
        seed=run.seed,
        params=tuple(sorted(_partition_params(run).items())),
        val_fraction=run.val_fraction,
        test_fraction=run.test_fraction,
        data_dir=data_dir or (run.data_dir or None),
        download=run.download,
        dataset_params=tuple(sorted(_dataset_params(run, SyntheticSettings.of(settings)).items())),
        pool_test=run.pool_test,
        subsample=run.subsample,
    )


def partition_of(settings: Mapping[str, Scalar], cid: int) -> int:
    """The partition client `cid` holds. With simulated attackers the data is split over the
    honest clients alone, in id order, and the j-th attacker holds a copy of the (j mod h)-th
    honest partition: the honest federation is the same whatever the number of attackers, and
    the attackers know honest data, as the robustness literature's omniscient adversary does
    (docs/robustness.md#attacks)."""
    attackers = AttackSettings.of(settings).ids()
    if not attackers:
        return cid
    honest = [c for c in range(RunSettings.of(settings).num_clients) if c not in attackers]
    if cid in attackers:
        return honest.index(honest[attackers.index(cid) % len(honest)])
    return honest.index(cid)


def model_input(settings: Mapping[str, Scalar]) -> tuple[tuple[int, ...], int]:
    """(input shape, number of classes) of the run's dataset, without loading it."""
    info = _info(RunSettings.of(settings), SyntheticSettings.of(settings))
    return info.input_shape, info.num_classes


@functools.lru_cache(maxsize=64)
def _info(run: RunSettings, synthetic: SyntheticSettings) -> DatasetInfo:
    """The dataset's shape and classes (kept: clients ask for them with every message)."""
    from federated_data.catalog import dataset_info  # lazy: heavy data code

    return dataset_info(run.dataset, _dataset_params(run, synthetic) or None)


def check_model_fits(settings: Mapping[str, Scalar]) -> None:
    """Token data needs a sequence model and a sequence model token data (ValueError)."""
    from federated_data.catalog import dataset_info  # lazy: heavy data code
    from models.registry import SEQUENCE_MODEL_NAMES  # lazy: torch

    run = RunSettings.of(settings)
    model, dataset = run.model, run.dataset
    params = _dataset_params(run, SyntheticSettings.of(settings))
    tokens = dataset_info(dataset, params or None).tokens
    if tokens != (model in SEQUENCE_MODEL_NAMES):
        kind = "token sequences" if tokens else "images or feature vectors"
        raise ValueError(
            f"model {model!r} does not fit dataset {dataset!r}, whose examples are {kind}; "
            f"sequence models ({', '.join(SEQUENCE_MODEL_NAMES)}) take token data only"
        )


def class_weights(settings: Mapping[str, Scalar]) -> tuple[float, ...] | None:
    """The run's per-class loss weights (None: unweighted), without loading the data."""
    run = RunSettings.of(settings)
    if run.class_weights == "none":
        return None
    return _info(run, SyntheticSettings.of(settings)).class_weights
