"""Local-only client: a personal model trained on local data alone, kept in the state store."""

from __future__ import annotations

import torch
from flwr.app import RecordDict
from torch import nn

from client.common import generator, new_model, tensors, train_settings
from client.env import ClientEnv
from client.training import evaluate_classifier, get_weights, set_weights, train_classifier
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
    rnd = int(content[protocol.ENVELOPE]["round"])  # type: ignore[call-overload]
    model = _personal_model(env, rnd)
    tr = tensors(env.data.train, env.device)
    loss = train_classifier(model, tr.x, tr.y, generator=generator(env, rnd, "train"),
                            **train_settings(env))  # type: ignore[arg-type]
    env.state.save(rnd, get_weights(model), {"round": rnd})
    test = tensors(env.data.test, env.device)
    test_loss, test_acc = evaluate_classifier(model, test.x, test.y)
    metrics: dict[str, int | float] = {
        protocol.NUM_EXAMPLES: len(tr), "train-loss": loss, "test-examples": len(test)
    }
    if len(test):
        metrics.update({"test-loss": test_loss, "test-accuracy": test_acc})
    return protocol.reply(content, env.cid, metrics)


def evaluate(content: RecordDict, env: ClientEnv) -> RecordDict:
    torch.set_num_threads(1)
    rnd = int(content[protocol.ENVELOPE]["round"])  # type: ignore[call-overload]
    model = _personal_model(env, rnd)
    test = tensors(env.data.test, env.device)
    loss, acc = evaluate_classifier(model, test.x, test.y)
    metrics: dict[str, int | float] = {
        protocol.NUM_EXAMPLES: len(env.data.train), "test-examples": len(test)
    }
    if len(test):
        metrics.update({"test-loss": loss, "test-accuracy": acc})
    return protocol.reply(content, env.cid, metrics)


HANDLERS = {"train": train, "evaluate": evaluate}
