"""Clustered FL client: trains whatever model the server sends (its cluster's) exactly as a
FedAvg client does. Only the final evaluation of an unseen client differs: it never trained, so
no cluster holds it; it receives every cluster's model and keeps the one with the lowest loss
on its own training split.
"""

from __future__ import annotations

import torch
from flwr.app import RecordDict

from client import fedavg
from client.common import split_tensors, test_metrics
from client.env import ClientEnv
from client.fedem import packed_models
from pollen.core import protocol
from pollen.core.contracts.clustered import CLUSTERS


def evaluate(content: RecordDict, env: ClientEnv) -> RecordDict:
    config = protocol.config_of(content)
    if not config.get(protocol.UNSEEN):
        return fedavg.evaluate(content, env)
    torch.set_num_threads(1)
    models = packed_models(content, protocol.as_int(config[CLUSTERS]), env)
    train = split_tensors(env, "train")
    fits = [test_metrics(m, train, "train") for m in models]
    # with no training data there is nothing to choose by: the first (largest) cluster
    best = min(range(len(models)), key=lambda k: fits[k].get("train-loss", 0.0))
    metrics = {**test_metrics(models[best], split_tensors(env, "test")), **fits[best]}
    metrics[protocol.NUM_EXAMPLES] = len(train)
    return protocol.reply(content, env.cid, metrics)


HANDLERS = {"train": fedavg.train, "evaluate": evaluate}
