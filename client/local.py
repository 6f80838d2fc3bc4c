"""Local-only client: a personal model trained on local data alone, kept in the state store."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import RecordDict
from torch import nn

from client.common import (
    generator,
    momentum_arrays,
    new_model,
    optimizer,
    privacy,
    privacy_meta,
    privacy_metrics,
    sgd_for_round,
    split_tensors,
    test_metrics,
)
from client.common import train as train_locally
from client.env import ClientEnv
from models.weights import get_weights, set_weights
from pollen.core import protocol


def _personal_model(env: ClientEnv, rnd: int) -> tuple[nn.Module, dict[str, np.ndarray]]:
    """The personal model as of before round `rnd` (fresh, seeded, before the first round),
    and the stored state beside it (momentum buffers)."""
    saved = env.state.load(before_round=rnd)
    torch.manual_seed(env.seed(0, "init"))
    model = new_model(env)
    if saved is None:
        return model, {}
    stored = saved[0]
    set_weights(
        model, {k.removeprefix("model."): v for k, v in stored.items() if k.startswith("model.")}
    )
    return model, stored


def train(content: RecordDict, env: ClientEnv) -> RecordDict:
    torch.set_num_threads(1)
    rnd = protocol.round_of(content)
    model, stored = _personal_model(env, rnd)
    data = split_tensors(env, "train")
    sgd = sgd_for_round(content, env)
    opt = optimizer(model, sgd, env, stored)
    private = privacy(env)
    loss = train_locally(model, data, sgd, generator(env, rnd, "train"), opt=opt, privacy=private)
    state = {f"model.{k}": v for k, v in get_weights(model).items()}
    meta = {"round": rnd, **privacy_meta(private)}
    env.state.save(rnd, {**state, **momentum_arrays(opt, env)}, meta)
    metrics = test_metrics(model, split_tensors(env, "test"))
    metrics.update({protocol.NUM_EXAMPLES: len(data), "train-loss": loss})
    metrics.update(privacy_metrics(private))
    return protocol.reply(content, env.cid, metrics)


def evaluate(content: RecordDict, env: ClientEnv) -> RecordDict:
    torch.set_num_threads(1)
    model, _ = _personal_model(env, protocol.round_of(content))
    metrics = test_metrics(model, split_tensors(env, "test"))
    metrics[protocol.NUM_EXAMPLES] = len(env.data.train)
    return protocol.reply(content, env.cid, metrics)


HANDLERS = {"train": train, "evaluate": evaluate}
