"""FedAvg-family clients: FedAvg, FedProx (proximal term) and FedAvg+ (local fine-tuning
before evaluation), one handler table each around the same training and evaluation code.

Evaluation rides in the training reply (no separate evaluation exchange per round): the reply's
test metrics describe the model the client received this round, before training on it. With
DP-SGD (`dp.*`) the local training is client.dp_sgd's and the client's privacy ledger is kept in
its state (client.common.Privacy); FedAvg+'s fine-tuned copy is never sent and is tuned without.
"""

from __future__ import annotations

import copy
import dataclasses
from functools import partial

import torch
from flwr.app import RecordDict
from torch import nn

from client.common import (
    generator,
    momentum_arrays,
    optimizer,
    privacy,
    privacy_meta,
    privacy_metrics,
    sgd_for_round,
    split_tensors,
    test_metrics,
)
from client.common import train as train_locally
from client.env import ClientEnv, ClientHandler
from client.training import ProximalTerm
from client.warm import received_model
from models.weights import weights_view
from pollen.core import protocol
from pollen.core.contracts.fedavg import FedAvgPlusSettings, FedProxSettings


def _received(content: RecordDict, env: ClientEnv) -> nn.Module:
    torch.set_num_threads(1)
    # read-only views, decoded once for all the clients of a packed message that share them
    return received_model(env, protocol.arrays_of(content, copy=False))


def _proximal(center: nn.Module, mu: float) -> ProximalTerm:
    anchors = [p.detach().clone() for p in center.parameters()]

    def term(model: nn.Module) -> torch.Tensor:
        total = sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchors, strict=True))
        return 0.5 * mu * total  # type: ignore[return-value]

    return term


def _model_metrics(
    model: nn.Module, content: RecordDict, env: ClientEnv, adapt: bool, split: str = "test"
) -> dict[str, int | float]:
    """Metrics of the client's model on a split. With `adapt` (FedAvg+) that model is a copy of
    the received one fine-tuned on local data (the copy is then dropped; it is never sent, and
    is fine-tuned without DP-SGD); the received model's figures are kept as global-*."""
    data = split_tensors(env, split)
    received = test_metrics(model, data, split)
    if not adapt:
        return received
    tuned = copy.deepcopy(model)
    # tuning is counted in epochs (FedAvg+: one pass over the local data), whatever local-steps
    sgd = dataclasses.replace(
        sgd_for_round(content, env),
        epochs=FedAvgPlusSettings.of(env.settings).adapt_epochs,
        steps=0,
    )
    if protocol.config_of(content).get(protocol.UNSEEN):
        # A newcomer's own schedule has not started: the reference code counts each client's own
        # local epochs, so it tunes at the initial rate, not at the decayed rate of the last round.
        sgd = dataclasses.replace(sgd, lr=env.run.lr)
    rnd = protocol.round_of(content)
    train_locally(tuned, split_tensors(env, "train"), sgd, generator(env, rnd, "adapt"))
    return {**test_metrics(tuned, data, split), **{f"global-{k}": v for k, v in received.items()}}


def _train(
    content: RecordDict, env: ClientEnv, *, adapt: bool = False, proximal: bool = False
) -> RecordDict:
    """A round of local SGD from the received model; `adapt`: FedAvg+'s metrics, `proximal`:
    FedProx's term."""
    rnd = protocol.round_of(content)
    model = _received(content, env)
    metrics = _model_metrics(model, content, env, adapt)
    term = _proximal(model, FedProxSettings.of(env.settings).mu) if proximal else None
    data = split_tensors(env, "train")
    sgd = sgd_for_round(content, env)
    saved = env.state.load(before_round=rnd) if env.run.persist_momentum else None
    opt = optimizer(model, sgd, env, saved[0] if saved else {})
    private = privacy(env)
    metrics["train-loss"] = train_locally(
        model, data, sgd, generator(env, rnd, "train"), term, opt, privacy=private
    )
    if env.run.persist_momentum or private is not None:
        env.state.save(rnd, momentum_arrays(opt, env), {"round": rnd, **privacy_meta(private)})
    metrics.update(privacy_metrics(private))
    metrics[protocol.NUM_EXAMPLES] = len(data)
    return protocol.reply(content, env.cid, metrics, arrays=weights_view(model))


def _evaluate(content: RecordDict, env: ClientEnv, *, adapt: bool = False) -> RecordDict:
    model = _received(content, env)
    metrics = _model_metrics(model, content, env, adapt)
    if protocol.config_of(content).get(protocol.UNSEEN):  # the paper reports their train split too
        metrics.update(_model_metrics(model, content, env, adapt, split="train"))
    metrics[protocol.NUM_EXAMPLES] = len(env.data.train)
    return protocol.reply(content, env.cid, metrics)


def train(content: RecordDict, env: ClientEnv) -> RecordDict:
    return _train(content, env)


def evaluate(content: RecordDict, env: ClientEnv) -> RecordDict:
    return _evaluate(content, env)


HANDLERS: dict[str, ClientHandler] = {"train": train, "evaluate": evaluate}  # FedAvg
PROXIMAL_HANDLERS: dict[str, ClientHandler] = {  # FedProx
    "train": partial(_train, proximal=True),
    "evaluate": evaluate,
}
ADAPTING_HANDLERS: dict[str, ClientHandler] = {  # FedAvg+
    "train": partial(_train, adapt=True),
    "evaluate": partial(_evaluate, adapt=True),
}
