"""Server-side pieces of algorithms that train one global classifier."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from federated_data import ArrayDataset, load_server_test_data
from pollen.core.dataspec import class_weights, data_spec
from pollen.core.paths import cache_dir
from pollen.core.runmodel import ModelFn, run_model
from pollen.core.settings import Scalar

if TYPE_CHECKING:
    from torch import nn


def _model(settings: Mapping[str, Scalar], model_fn: ModelFn | None = None) -> nn.Module:
    """The run's model as the clients build it (pollen.core.runmodel)."""
    return run_model(settings, model_fn)


def initial_weights(
    settings: Mapping[str, Scalar], seed: int, model_fn: ModelFn | None = None
) -> dict[str, np.ndarray]:
    import torch  # lazy: torch

    from models.weights import get_weights  # lazy: torch

    torch.manual_seed(seed)
    return get_weights(_model(settings, model_fn))


def parameter_keys(settings: Mapping[str, Scalar], model_fn: ModelFn | None = None) -> list[str]:
    """Names of the model's trainable tensors among its weights (buffers such as batch-norm
    statistics excluded)."""
    return [name for name, p in _model(settings, model_fn).named_parameters() if p.requires_grad]


class ServerEvaluator:
    """Evaluates a global classifier on held-out data the server can load (the dataset's
    official test split, else the union of the clients' test splits)."""

    def __init__(
        self,
        settings: Mapping[str, Scalar],
        load: Callable[[Any, Mapping[str, np.ndarray]], Any] | None = None,
    ) -> None:
        """`load(model, weights)` returns the model holding the weights (default: the weights
        are the built model's own state dict)."""
        self.settings = settings
        self.load = load

    @cached_property
    def data(self) -> ArrayDataset | None:
        try:
            return load_server_test_data(data_spec(self.settings), cache_dir(self.settings))
        except Exception as exc:  # the server may hold no data at all
            logging.getLogger("flwr.pollen").warning("server-side evaluation disabled: %s", exc)
            return None

    def __call__(self, weights: Mapping[str, np.ndarray]) -> dict[str, float]:
        data = self.data
        if data is None or len(data) == 0:
            return {}
        import torch  # lazy: torch

        from models.evaluation import evaluate_classifier  # lazy: torch
        from models.weights import set_weights  # lazy: torch

        model = _model(self.settings)
        if self.load is None:
            set_weights(model, weights)
        else:
            model = self.load(model, weights)
        x = torch.from_numpy(data.features())
        y = torch.from_numpy(data.targets()).long()
        loss_weights = class_weights(self.settings)
        loss, acc = evaluate_classifier(
            model,
            x,
            y,
            class_weights=None if loss_weights is None else torch.tensor(loss_weights),
        )
        return {"test-loss": loss, "test-accuracy": acc, "test-examples": float(len(y))}
