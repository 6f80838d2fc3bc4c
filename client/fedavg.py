"""FedAvg client: evaluate the received global model, then train it locally.

Evaluation rides in the training reply (no separate evaluation exchange per round): the reply's
test metrics describe the global model of the previous round on this client's test split.
"""

from __future__ import annotations

import dataclasses

import torch
from flwr.app import RecordDict

from client.common import generator, new_model, sgd_settings, tensors, test_metrics
from client.common import train as train_locally
from client.env import ClientEnv
from client.training import get_weights, set_weights
from pollen import protocol


def train(content: RecordDict, env: ClientEnv) -> RecordDict:
    torch.set_num_threads(1)
    rnd = protocol.round_of(content)
    model = new_model(env)
    set_weights(model, protocol.arrays_of(content))
    metrics = test_metrics(model, tensors(env.data.test, env.device))
    data = tensors(env.data.train, env.device)
    sgd = sgd_settings(env)
    lr = protocol.config_of(content).get("lr")
    if isinstance(lr, int | float) and not isinstance(lr, bool):
        sgd = dataclasses.replace(sgd, lr=float(lr))
    metrics["train-loss"] = train_locally(model, data, sgd, generator(env, rnd, "train"))
    metrics[protocol.NUM_EXAMPLES] = len(data)
    return protocol.reply(content, env.cid, metrics, arrays=get_weights(model))


def evaluate(content: RecordDict, env: ClientEnv) -> RecordDict:
    torch.set_num_threads(1)
    model = new_model(env)
    set_weights(model, protocol.arrays_of(content))
    metrics = test_metrics(model, tensors(env.data.test, env.device))
    metrics[protocol.NUM_EXAMPLES] = len(env.data.train)
    return protocol.reply(content, env.cid, metrics)


HANDLERS = {"train": train, "evaluate": evaluate}
