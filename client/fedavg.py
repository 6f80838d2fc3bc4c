"""FedAvg client: evaluate the received global model, then train it locally.

Evaluation rides in the training reply (no separate evaluation exchange per round): the reply's
test metrics describe the global model of the previous round on this client's test split.
"""

from __future__ import annotations

import torch
from flwr.app import RecordDict

from client.common import generator, new_model, tensors, train_settings
from client.env import ClientEnv
from client.training import evaluate_classifier, get_weights, set_weights, train_classifier
from pollen import protocol


def _round(content: RecordDict) -> int:
    return int(content[protocol.ENVELOPE]["round"])  # type: ignore[call-overload]


def train(content: RecordDict, env: ClientEnv) -> RecordDict:
    torch.set_num_threads(1)
    rnd = _round(content)
    model = new_model(env)
    set_weights(model, protocol.from_record(content[protocol.ARRAYS]))  # type: ignore[arg-type]
    data = env.data
    test = tensors(data.test, env.device)
    test_loss, test_acc = evaluate_classifier(model, test.x, test.y)
    tr = tensors(data.train, env.device)
    cfg = protocol.config_of(content)
    hp = train_settings(env)
    if "lr" in cfg:
        hp["lr"] = float(cfg["lr"])
    train_loss = train_classifier(model, tr.x, tr.y, generator=generator(env, rnd, "train"),
                                  **hp)  # type: ignore[arg-type]
    metrics = {
        protocol.NUM_EXAMPLES: len(tr),
        "train-loss": train_loss,
        "test-examples": len(test),
    }
    if len(test):
        metrics.update({"test-loss": test_loss, "test-accuracy": test_acc})
    return protocol.reply(content, env.cid, metrics, arrays=get_weights(model))


def evaluate(content: RecordDict, env: ClientEnv) -> RecordDict:
    torch.set_num_threads(1)
    model = new_model(env)
    set_weights(model, protocol.from_record(content[protocol.ARRAYS]))  # type: ignore[arg-type]
    test = tensors(env.data.test, env.device)
    loss, acc = evaluate_classifier(model, test.x, test.y)
    metrics: dict[str, int | float] = {
        protocol.NUM_EXAMPLES: len(env.data.train),
        "test-examples": len(test),
    }
    if len(test):
        metrics.update({"test-loss": loss, "test-accuracy": acc})
    return protocol.reply(content, env.cid, metrics)


HANDLERS = {"train": train, "evaluate": evaluate}
