"""FedEM client: E-step over the local training split, M-step for the mixture weights pi, then a
responsibility-weighted epoch of each component (Marfoq et al., 2021, Alg. 1-2).

pi (and, with `persist-momentum`, each component's momentum buffers) lives in the
client's state store, so it survives restarts. With DP-SGD (`dp.*`) each component's epoch is
DP-SGD on the responsibility-weighted losses, and the client's privacy ledger counts every
component's steps (docs/privacy.md). An unseen client fits only pi, by EM with the
received components frozen: to convergence from uniform weights (`fedem.unseen-protocol=converge`),
or one iteration per evaluation warm-started from the pi it stored at the previous one
(`one-step`, the reference code's protocol), which it stores in turn.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import RecordDict
from torch import nn

from client.common import (
    Tensors,
    generator,
    momentum_arrays,
    optimizer,
    privacy,
    privacy_meta,
    privacy_metrics,
    sgd_for_round,
    split_tensors,
)
from client.common import train as train_locally
from client.env import ClientEnv
from client.training import per_sample_losses, predict_probabilities
from client.warm import received_model
from models.losses import correct_predictions, probability_loss
from models.mixture import (
    fit_mixture_weights,
    log_weights,
    mixture_probabilities,
    mixture_weights,
    responsibilities,
)
from models.weights import weights_view
from pollen.core import protocol
from pollen.core.contracts.fedem import FedEMSettings, pack, unpack


def packed_models(content: RecordDict, num: int, env: ClientEnv) -> list[nn.Module]:
    """The `num` models packed in an instruction's arrays, as modules."""
    models = []
    for weights in unpack(protocol.arrays_of(content, copy=False), num):  # copied into them
        models.append(received_model(env, weights))
    return models


def _components(content: RecordDict, env: ClientEnv) -> list[nn.Module]:
    return packed_models(content, FedEMSettings.of(env.settings).components, env)


def _losses(models: list[nn.Module], data: Tensors) -> torch.Tensor:
    """L[i, m]: loss of example i under component m (eval mode, no gradients), on the CPU
    beside pi: the E- and M-steps are (n, M) float64 arithmetic, whatever the device."""
    if len(data) == 0:
        return torch.zeros(0, len(models))
    return (
        torch.stack(
            [
                per_sample_losses(m, data.x, data.y, class_weights=data.class_weights)
                for m in models
            ],
            dim=1,
        )
        .double()
        .cpu()
    )


def mixture_metrics(
    models: list[nn.Module],
    pi: torch.Tensor,
    data: Tensors,
    split: str = "test",
    batch_size: int = 1024,
) -> dict[str, int | float]:
    """Accuracy and log-loss of the personalised predictor sum_m pi_m p_m(y|x) (for sequences,
    per position: accuracy over tokens, loss per sequence), computed batch by batch."""
    metrics: dict[str, int | float] = {f"{split}-examples": len(data)}
    if len(data) == 0:
        return metrics
    losses, correct, made = [], 0, 0
    for start in range(0, len(data), batch_size):
        x, y = data.x[start : start + batch_size], data.y[start : start + batch_size]
        probs = torch.stack([predict_probabilities(m, x, batch_size) for m in models]).double()
        mixed = mixture_probabilities(pi, probs)
        losses.append(probability_loss(mixed, y, data.class_weights))
        right, count = correct_predictions(mixed, y)
        correct, made = correct + right, made + count
    metrics[f"{split}-loss"] = float(torch.cat(losses).mean())
    metrics[f"{split}-accuracy"] = correct / made
    return metrics


def _stored(env: ClientEnv, rnd: int) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
    """The client's pi as of before round `rnd` (uniform before its first round) and the rest
    of its stored state."""
    num = FedEMSettings.of(env.settings).components
    saved = env.state.load(before_round=rnd)
    stored = saved[0] if saved is not None else {}
    if "pi" in stored:
        return torch.from_numpy(stored["pi"]), stored
    return torch.full((num,), 1.0 / num, dtype=torch.float64), stored


def train(content: RecordDict, env: ClientEnv) -> RecordDict:
    torch.set_num_threads(1)
    rnd = protocol.round_of(content)
    models = _components(content, env)
    pi, stored = _stored(env, rnd)
    data = split_tensors(env, "train")

    # E-step with the received components and the stored pi, then the M-step for pi
    q = responsibilities(log_weights(pi.double()), _losses(models, data))
    pi = mixture_weights(q)
    metrics = mixture_metrics(models, pi, split_tensors(env, "test"))

    sgd = sgd_for_round(content, env)
    state: dict[str, np.ndarray] = {"pi": pi.numpy()}
    private = privacy(env, passes=len(models))  # each component's epoch spends privacy
    losses = []
    for m, model in enumerate(models):
        opt = optimizer(model, sgd, env, stored, prefix=f"momentum{m}")
        # component 0 draws the same batches a single FedAvg model would (M = 1 is FedAvg)
        tag = "train" if m == 0 else f"train{m}"
        weights = q[:, m].float().to(data.y.device)
        losses.append(
            train_locally(
                model, data, sgd, generator(env, rnd, tag), opt=opt, sample_weights=weights,
                privacy=private,
            )
        )
        state.update(momentum_arrays(opt, env, prefix=f"momentum{m}"))
    env.state.save(rnd, state, {"round": rnd, **privacy_meta(private)})
    metrics.update(privacy_metrics(private))
    metrics.update({
        protocol.NUM_EXAMPLES: len(data),
        "train-loss": float(np.sum(losses)),
        "pi-entropy": float(-(pi * log_weights(pi)).nan_to_num().sum()),
    })  # fmt: skip
    return protocol.reply(content, env.cid, metrics, arrays=pack([weights_view(m) for m in models]))


def evaluate(content: RecordDict, env: ClientEnv) -> RecordDict:
    """A training client mixes with its stored pi; an unseen one first fits pi by EM: to
    convergence from uniform weights, or (one-step) one iteration from its stored pi, which it
    then stores for the next evaluation."""
    torch.set_num_threads(1)
    rnd = protocol.round_of(content)
    models = _components(content, env)
    train_data = split_tensors(env, "train")
    metrics: dict[str, int | float] = {protocol.NUM_EXAMPLES: len(train_data)}
    if protocol.config_of(content).get(protocol.UNSEEN):
        fedem = FedEMSettings.of(env.settings)
        losses = _losses(models, train_data)
        if fedem.unseen_protocol == "one-step":
            pi, iterations = fit_mixture_weights(losses, 1, pi=_stored(env, rnd)[0])
            env.state.save(rnd, {"pi": pi.numpy()}, {"round": rnd})
        else:
            pi, iterations = fit_mixture_weights(losses, fedem.em_iterations, fedem.em_tolerance)
        metrics["em-iterations"] = iterations
        metrics.update(mixture_metrics(models, pi, train_data, split="train"))
    else:
        pi, _ = _stored(env, rnd)
    metrics.update(mixture_metrics(models, pi, split_tensors(env, "test")))
    return protocol.reply(content, env.cid, metrics)


HANDLERS = {"train": train, "evaluate": evaluate}
