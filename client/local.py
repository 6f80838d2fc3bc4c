"""Local-only client: a personal model trained on local data alone, kept in the state store."""

from __future__ import annotations

import torch
from flwr.app import RecordDict
from torch import nn

from client.common import generator, new_model, sgd_settings, tensors, test_metrics
from client.common import train as train_locally
from client.env import ClientEnv
from client.training import get_weights, set_weights
from pollen import protocol


def _personal_model(env: ClientEnv, rnd: int) -> nn.Module:
    saved = env.state.load(before_round=rnd)
    torch.manual_seed(env.seed(0, "init"))
    model = new_model(env)
    if saved is not None:
        set_weights(model, saved[0])
    return model


def train(content: RecordDict, env: ClientEnv) -> RecordDict:
    torch.set_num_threads(1)
    rnd = protocol.round_of(content)
    model = _personal_model(env, rnd)
    data = tensors(env.data.train, env.device)
    loss = train_locally(model, data, sgd_settings(env), generator(env, rnd, "train"))
    env.state.save(rnd, get_weights(model), {"round": rnd})
    metrics = test_metrics(model, tensors(env.data.test, env.device))
    metrics.update({protocol.NUM_EXAMPLES: len(data), "train-loss": loss})
    return protocol.reply(content, env.cid, metrics)


def evaluate(content: RecordDict, env: ClientEnv) -> RecordDict:
    torch.set_num_threads(1)
    model = _personal_model(env, protocol.round_of(content))
    metrics = test_metrics(model, tensors(env.data.test, env.device))
    metrics[protocol.NUM_EXAMPLES] = len(env.data.train)
    return protocol.reply(content, env.cid, metrics)


HANDLERS = {"train": train, "evaluate": evaluate}
