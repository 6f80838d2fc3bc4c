"""The model a run's clients train, built the same way by both halves of an algorithm: the
`model` setting for the dataset's input shape and classes, or a Flower app's own (`model_fn`,
pollen.flower); with DP-SGD, made trainable by Opacus (models.privacy.dp_compatible:
BatchNorm -> GroupNorm)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from pollen.core.dataspec import model_input
from pollen.core.protection import DPSettings
from pollen.core.settings import RunSettings, Scalar

if TYPE_CHECKING:
    from torch import nn

    from federated_data import ClientData

ModelFn = Callable[[], "nn.Module"]
"""Builds the model a run's clients train in place of the `model` setting: a Flower app's own
(pollen.flower), a fresh `nn.Module` per call, given to both halves."""
DataFn = Callable[[int, int], "ClientData"]
"""Loads a client's data in place of the run's dataset partition (pollen.flower): (partition
id, number of partitions) -> its train/val/test splits."""


def run_model(settings: Mapping[str, Scalar], model_fn: ModelFn | None = None) -> nn.Module:
    """The run's model (on the CPU), or `model_fn`'s; with DP-SGD, as Opacus can train it."""
    if model_fn is not None:
        model = model_fn()
    else:
        from models import build_model  # lazy: torch

        shape, classes = model_input(settings)
        model = build_model(RunSettings.of(settings).model, shape, classes)
    if DPSettings.of(settings).enabled:
        from models.privacy import dp_compatible  # lazy: torch (models), opacus

        model = dp_compatible(model)
    return model
