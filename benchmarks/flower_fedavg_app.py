"""Flower's own FedAvg (flwr.serverapp.strategy.FedAvg: a train and an evaluate exchange per
round) on Pollen's model, data and local training, for the comparison in benchmarks/run.py.

`benchmarks/run.py` bundles this module with Pollen's packages as a separate Flower app
(components `flower_fedavg_app:server` / `flower_fedavg_app:client`) and runs it through the
same launcher, SuperLink and SuperNodes as Pollen's FedAvg. Only the strategy and the message
flow differ: the ClientApp trains with the same code (client.common) on the same cached
partitions, and imports torch when a message arrives, as Pollen's does.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from client.env import ClientEnv
from pollen.core.runconfig import from_run_config

server = ServerApp()
client = ClientApp()


def _record(weights: dict[str, np.ndarray]) -> ArrayRecord:
    """Weights as Flower's own ArrayRecord: one Array (one object on the wire) per tensor, as
    Flower's examples send a model; Pollen's apps bundle a record into one
    (pollen.core.protocol)."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in weights.items()})


@server.main()
def main(grid: Grid, context: Context) -> None:
    from flwr.serverapp.strategy import FedAvg

    from strategies.classifier import initial_weights

    cfg = from_run_config(context.run_config)
    n = int(cfg["num-clients"])
    rounds = int(cfg["num-rounds"])
    strategy = FedAvg(min_train_nodes=n, min_evaluate_nodes=n, min_available_nodes=n)
    marks: list[float] = []
    test: list[dict[str, Any]] = []

    def mark(server_round: int, _arrays: ArrayRecord) -> MetricRecord | None:
        marks.append(time.monotonic())
        return None

    started = time.monotonic()
    result = strategy.start(
        grid,
        _record(initial_weights(cfg, int(cfg["seed"]))),
        num_rounds=rounds,
        train_config=ConfigRecord({"lr": float(cfg["lr"])}),
        evaluate_fn=mark,
    )
    for rnd in range(1, rounds + 1):
        metrics = result.evaluate_metrics_clientapp.get(rnd)
        test.append({k: v for k, v in metrics.items()} if metrics else {})
    out = Path(str(cfg["out-dir"]))
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "round-seconds": [round(b - a, 4) for a, b in itertools.pairwise(marks)],
        "seconds": round(time.monotonic() - started, 3),
        "client-eval": test,
    }
    (out / "flower-fedavg.json").write_text(json.dumps(report, indent=2) + "\n")


@client.train()
def train(msg: Message, context: Context) -> Message:
    import torch

    from client.common import generator, new_model, sgd_for_round, split_tensors
    from client.common import train as train_locally
    from models.weights import get_weights, set_weights

    env = ClientEnv.from_context(context)
    torch.set_num_threads(1)
    config = msg.content["config"]
    assert isinstance(config, ConfigRecord)
    rnd = int(str(config["server-round"]))
    model = new_model(env)
    record = msg.content["arrays"]
    assert isinstance(record, ArrayRecord)
    set_weights(model, {k: record[k].numpy() for k in record})
    data = split_tensors(env, "train")
    sgd = sgd_for_round(RecordDict({"config": config}), env)
    loss = train_locally(model, data, sgd, generator(env, rnd, "train"))
    reply = RecordDict(
        {
            "arrays": _record(get_weights(model)),
            "metrics": MetricRecord({"train-loss": loss, "num-examples": len(data)}),
        }
    )
    return Message(reply, reply_to=msg)


@client.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    import torch

    from client.common import new_model, split_tensors, test_metrics
    from models.weights import set_weights

    env = ClientEnv.from_context(context)
    torch.set_num_threads(1)
    model = new_model(env)
    record = msg.content["arrays"]
    assert isinstance(record, ArrayRecord)
    set_weights(model, {k: record[k].numpy() for k in record})
    data = split_tensors(env, "test")
    metrics: dict[str, Any] = {**test_metrics(model, data), "num-examples": len(data)}
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
