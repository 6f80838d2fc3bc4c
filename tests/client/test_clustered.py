"""Clustered FL client: an unseen client keeps the cluster model that fits its training data."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from client import common
from client.clustered import evaluate
from client.common import new_model, tensors
from client.env import ClientEnv
from models.weights import get_weights, set_weights
from pollen.core import protocol
from pollen.core.contracts.fedem import pack
from tests.fakes import settings_of


def _env(run_config: dict[str, Any]) -> ClientEnv:
    cfg = settings_of({**run_config, "algorithm": "clustered"})
    node: dict[str, Any] = {"partition-id": 0, "num-partitions": 3}
    return ClientEnv.from_context(
        Context(run_id=1, node_id=1, node_config=node, state=RecordDict(), run_config=cfg)
    )


@pytest.mark.parametrize("good", [0, 2])
def test_unseen_client_keeps_the_lowest_training_loss_model(
    run_config: dict[str, Any], good: int
) -> None:
    env = _env(run_config)
    torch.manual_seed(0)
    models = [new_model(env) for _ in range(3)]
    for k, model in enumerate(models):  # confidently wrong guesses except for model `good`
        weights = get_weights(model)
        if k != good:
            weights = {n: (v * 20).astype(v.dtype) for n, v in weights.items()}
        set_weights(model, weights)
    train = tensors(env.data.train, env.device)
    losses = [float(common.test_metrics(m, train, "train")["train-loss"]) for m in models]
    assert int(np.argmin(losses)) == good

    content = protocol.instruction(
        4,
        "evaluate",
        {"unseen": True, "clusters": 3},
        arrays=pack([get_weights(m) for m in models]),
    )
    metrics = protocol.metrics_of(evaluate(content, env))
    assert metrics["train-loss"] == pytest.approx(losses[good])
    expected = common.test_metrics(models[good], tensors(env.data.test, env.device))
    assert metrics["test-accuracy"] == pytest.approx(expected["test-accuracy"])
    assert metrics["num-examples"] == len(train)


def test_training_client_evaluates_the_model_it_is_sent(run_config: dict[str, Any]) -> None:
    env = _env(run_config)
    model = new_model(env)
    content = protocol.instruction(4, "evaluate", {"unseen": False}, arrays=get_weights(model))
    metrics = protocol.metrics_of(evaluate(content, env))
    expected = common.test_metrics(model, tensors(env.data.test, env.device))
    assert metrics["test-loss"] == pytest.approx(expected["test-loss"])
    assert "train-loss" not in metrics
