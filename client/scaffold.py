"""SCAFFOLD client (Karimireddy et al., ICML 2020, Algorithm 1, option II).

From the received model x and server control variate c, the client runs the usual local SGD
(`local-epochs` x batches = K steps) with every gradient corrected by c - c_i: the correction
enters the objective as the linear term <c - c_i, w>, whose gradient it is, so the shared
training loop (momentum, weight decay, class weights) is used unchanged. It then forms
c_i+ = c_i - c + (x - y_i)/(K eta_l), keeps c_i+ in its state store (zeros before its first
round) and answers delta_y = y_i - x and delta_c = c_i+ - c_i.

As in FedAvg, the reply's test metrics describe the received model, before training on it.
With DP-SGD (`dp.*`) the K steps are Poisson-sampled DP-SGD steps and the correction is added to
the noisy gradient, unclipped (client.dp_sgd).
"""

from __future__ import annotations

import math

import numpy as np
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
from client.env import ClientEnv
from client.training import ProximalTerm
from client.warm import received_model
from models.scaffold import control_update, correction, difference, norm
from models.weights import get_weights
from pollen.core import protocol
from pollen.core.contracts.scaffold import CONTROL, CONTROL_DELTA, STORED_PREFIX


def stored_control(
    stored: dict[str, np.ndarray], reference: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The client's c_i from its stored state: zeros for every parameter it has none of (its
    first round), or whose stored shape no longer fits."""
    out: dict[str, np.ndarray] = {}
    for key, ref in reference.items():
        saved = stored.get(STORED_PREFIX + key)
        if saved is not None and saved.shape == ref.shape:
            out[key] = saved.astype(ref.dtype)
        else:
            out[key] = np.zeros_like(ref)
    return out


def linear_term(model: nn.Module, corr: dict[str, np.ndarray]) -> ProximalTerm:
    """<corr, w> over the named parameters: adds corr to each of their gradients."""
    device = next(model.parameters()).device
    tensors = {k: torch.tensor(np.asarray(v), device=device) for k, v in corr.items()}

    def term(m: nn.Module) -> torch.Tensor:
        params = dict(m.named_parameters())
        return sum((params[k] * t).sum() for k, t in tensors.items())  # type: ignore[return-value]

    return term


def local_step_count(examples: int, batch_size: int, epochs: int, steps: int = 0) -> int:
    """K: the SGD steps of the local training loop (one per batch and epoch, or `steps` when
    the run counts local work in steps; none without examples)."""
    if steps > 0:
        return steps if examples > 0 else 0
    return epochs * math.ceil(examples / batch_size)


def train(content: RecordDict, env: ClientEnv) -> RecordDict:
    torch.set_num_threads(1)
    rnd = protocol.round_of(content)
    x = protocol.arrays_of(content)
    c = protocol.arrays_of(content, CONTROL)
    model = received_model(env, x)
    metrics = test_metrics(model, split_tensors(env, "test"))

    saved = env.state.load(before_round=rnd)
    stored = saved[0] if saved is not None else {}
    c_local = stored_control(stored, c)
    data = split_tensors(env, "train")
    sgd = sgd_for_round(content, env)
    opt = optimizer(model, sgd, env, stored)
    term = linear_term(model, correction(c, c_local))
    private = privacy(env)
    metrics["train-loss"] = train_locally(
        model, data, sgd, generator(env, rnd, "train"), term, opt, privacy=private
    )
    y = get_weights(model)
    steps = local_step_count(len(data), sgd.batch_size, sgd.epochs, sgd.steps)
    c_new = control_update(c_local, c, x, y, steps, sgd.lr)

    state = {STORED_PREFIX + k: v for k, v in c_new.items()}
    state.update(momentum_arrays(opt, env))
    env.state.save(rnd, state, {"round": rnd, "local-steps": steps, **privacy_meta(private)})
    metrics.update(privacy_metrics(private))
    metrics.update(
        {protocol.NUM_EXAMPLES: len(data), "local-steps": steps, "control-norm": norm(c_new)}
    )
    return protocol.reply(
        content,
        env.cid,
        metrics,
        arrays=difference(y, x),
        **{CONTROL_DELTA: difference(c_new, c_local)},
    )


def evaluate(content: RecordDict, env: ClientEnv) -> RecordDict:
    """The received model on the test split (unseen clients: on their train split too)."""
    torch.set_num_threads(1)
    model = received_model(env, protocol.arrays_of(content, copy=False))
    metrics = test_metrics(model, split_tensors(env, "test"))
    if protocol.config_of(content).get(protocol.UNSEEN):
        metrics.update(test_metrics(model, split_tensors(env, "train"), "train"))
    metrics[protocol.NUM_EXAMPLES] = len(env.data.train)
    return protocol.reply(content, env.cid, metrics)


HANDLERS = {"train": train, "evaluate": evaluate}
