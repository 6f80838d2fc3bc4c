"""FeDLRT and FedLin clients: one handler per phase (see strategies/fedlrt.py).

The basis phase stores the received model (U, s, V and the dense parameters) in the state store
under the round; later phases of the round read it back and append the new basis columns Ū, V̄
they receive, so the server never re-sends U, V. Test metrics of the received model ride in
the basis-phase reply. The warm start (`fedlrt.warm-start`) trains the dense model the server
sends for a given number of mini-batch steps and answers it whole.

When the round asks the client to compute its correction itself (`own-correction`: under
secure aggregation the server sees only the sum of the gradients), the basis and
coefficient-gradient phases keep the client's gradients in its state beside the model, and the
train phase gets the mean gradients G and corrects by G - G_c.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping

import numpy as np
import torch
from flwr.app import RecordDict
from torch import nn

from client.common import (
    Tensors,
    generator,
    new_model,
    sgd_for_round,
    tensors,
    test_metrics,
)
from client.common import train as train_locally
from client.env import ClientEnv
from client.training import SGD, batches, to_device
from client.warm import received_model
from models.augment import random_hflip
from models.fedlrt import padded_coefficients
from models.losses import per_sample_loss
from models.lowrank import factorized_layers, load_low_rank
from models.weights import weights_view
from pollen.core import protocol
from pollen.core.contracts import fedlrt as contract
from pollen.core.contracts.fedlrt import BASES, CORRECTIONS, GRADS, MEAN_GRADS, UBAR, VBAR

_OWN = "own-grad/"
"""State keys of the client's own gradients of the round (own-correction)."""


def _model(arrays: Mapping[str, np.ndarray], env: ClientEnv) -> nn.Module:
    torch.set_num_threads(1)
    return load_low_rank(new_model(env), arrays)


def full_gradient(
    model: nn.Module, data: Tensors, names: Iterable[str], batch_size: int = 1024
) -> dict[str, np.ndarray]:
    """∇ of the mean training loss over all local examples w.r.t. the named parameters
    (buffers such as BatchNorm statistics are restored afterwards)."""
    wanted = set(names)
    saved = {k: b.clone() for k, b in model.named_buffers()}
    model.train()
    model.zero_grad(set_to_none=True)
    for idx in batches(len(data), batch_size, None):
        loss = per_sample_loss(model(data.x[idx]), data.y[idx]).sum() / len(data)
        loss.backward()  # type: ignore[no-untyped-call]
    with torch.no_grad():
        for k, b in model.named_buffers():
            b.copy_(saved[k])
    out = {}
    for name, p in model.named_parameters():
        if name in wanted:
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            out[name] = grad.detach().cpu().numpy().copy()
    missing = wanted - set(out)
    if missing:
        raise KeyError(f"no parameters {sorted(missing)} in the model")
    return out


def _dense_parameter_names(model: nn.Module, layers: Iterable[str]) -> list[str]:
    factor = {f"{n}.{p}" for n in layers for p in ("U", "S", "V")}
    return [name for name, _ in model.named_parameters() if name not in factor]


def _stored_round(env: ClientEnv, rnd: int) -> dict[str, np.ndarray]:
    """The model this client received in this round's basis phase (and any bases since), and
    its own gradients of the round under `_OWN` when it keeps them."""
    saved = env.state.load(before_round=rnd + 1)
    if saved is None or saved[1].get("round") != rnd:
        raise RuntimeError(f"no basis-phase state for round {rnd}; the basis phase must come first")
    return saved[0]


def _split_own(
    stored: Mapping[str, np.ndarray],
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(the stored model and bases, the client's own gradients of the round)."""
    model = {k: v for k, v in stored.items() if not k.startswith(_OWN)}
    own = {k.removeprefix(_OWN): v for k, v in stored.items() if k.startswith(_OWN)}
    return model, own


def _kept(grads: Mapping[str, np.ndarray], config: Mapping[str, object]) -> dict[str, np.ndarray]:
    """The gradients to keep in the state for the train phase's own correction (none unless
    the round asks for it)."""
    if not config.get(contract.OWN_CORRECTION):
        return {}
    return {f"{_OWN}{k}": v for k, v in grads.items()}


def _augmented(stored: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Wire arrays of the augmented model Ũ S̃ Ṽ^T with S̃ = [[diag(s), 0], [0, 0]]."""
    layers = factorized_layers(stored)
    own = {f"{n}.{part}" for n in layers for part in ("U", "s", "V", UBAR, VBAR)}
    out = {k: v for k, v in stored.items() if k not in own}
    for name in layers:
        u_bar, v_bar = stored[f"{name}.{UBAR}"], stored[f"{name}.{VBAR}"]
        out[f"{name}.U"] = np.hstack([stored[f"{name}.U"], u_bar])
        out[f"{name}.V"] = np.hstack([stored[f"{name}.V"], v_bar])
        coef = padded_coefficients(stored[f"{name}.s"].astype(np.float64), u_bar.shape[1])
        out[f"{name}.S"] = coef.astype(np.float32)
    return out


def basis(content: RecordDict, env: ClientEnv) -> RecordDict:
    rnd = protocol.round_of(content)
    config = protocol.config_of(content)
    arrays = protocol.arrays_of(content)
    model = _model(arrays, env)
    metrics = test_metrics(model, tensors(env.data.test, env.device))
    layers = list(factorized_layers(arrays))
    names = [f"{n}.{side}" for n in layers for side in ("U", "V")]
    if config.get(contract.VAR_COR) == "simplified":
        names += [f"{n}.S" for n in layers]
    if config.get(contract.DENSE_GRADS):
        names += _dense_parameter_names(model, layers)
    data = tensors(env.data.train, env.device)
    started = time.perf_counter()
    grads = full_gradient(model, data, names)
    metrics["grad-seconds"] = time.perf_counter() - started
    env.state.save(rnd, {**arrays, **_kept(grads, config)}, {"round": rnd})
    metrics[protocol.NUM_EXAMPLES] = len(data)
    return protocol.reply(content, env.cid, metrics, **{GRADS: grads})


def coefficient_gradient(content: RecordDict, env: ClientEnv) -> RecordDict:
    """Full correction only: ∇_S̃ L_c at the round's start point, in the augmented bases."""
    rnd = protocol.round_of(content)
    stored = {**_stored_round(env, rnd), **protocol.arrays_of(content, BASES)}
    model_arrays, _ = _split_own(stored)
    model = _model(_augmented(model_arrays), env)
    data = tensors(env.data.train, env.device)
    grads = full_gradient(model, data, [f"{n}.S" for n in factorized_layers(model_arrays)])
    env.state.save(rnd, {**stored, **_kept(grads, protocol.config_of(content))}, {"round": rnd})
    return protocol.reply(content, env.cid, {protocol.NUM_EXAMPLES: len(data)}, **{GRADS: grads})


def train(content: RecordDict, env: ClientEnv) -> RecordDict:
    """Local training of S̃ and the dense parameters (U, V frozen), each gradient corrected by
    the constant V_c the server sent (a linear term <V_c, θ> in the objective)."""
    rnd = protocol.round_of(content)
    stored, own = _split_own(_stored_round(env, rnd))
    if BASES in content:
        stored.update(protocol.arrays_of(content, BASES))
    model = _model(_augmented(stored), env)
    layers = factorized_layers(stored)
    for name in layers:
        layer = model.get_submodule(name)
        layer.U.requires_grad_(False)
        layer.V.requires_grad_(False)
    params = dict(model.named_parameters())
    terms: list[tuple[nn.Parameter, torch.Tensor]] = []
    corrections = {}
    if CORRECTIONS in content:
        corrections = protocol.arrays_of(content, CORRECTIONS)
    elif MEAN_GRADS in content:  # V_c = G - G_c, computed here from the client's own G_c
        mean = protocol.arrays_of(content, MEAN_GRADS)
        missing = sorted(set(mean) - set(own))
        if missing:
            raise RuntimeError(f"no gradients of round {rnd} kept for {missing[:3]}")
        corrections = {k: (v - own[k]).astype(np.float32) for k, v in mean.items()}
    if corrections:
        for key, value in corrections.items():
            p = params[key]
            if value.shape != tuple(p.shape):  # simplified: only the r×r block of S̃
                full = np.zeros(tuple(p.shape), np.float32)
                full[: value.shape[0], : value.shape[1]] = value
                value = full
            terms.append((p, to_device(value, p.device)))

    def linear_term(_model: nn.Module) -> torch.Tensor:
        return sum(((p * v).sum() for p, v in terms), torch.zeros((), device=env.device))

    data = tensors(env.data.train, env.device)
    # float32 always: the registry refuses amp=true for FeDLRT and FedLin (their coefficient
    # steps and bases stay float32, docs/deployment.md#gpu); this keeps it so whatever the run
    sgd = dataclasses.replace(sgd_for_round(content, env), amp=False)
    started = time.perf_counter()
    loss = train_locally(model, data, sgd, generator(env, rnd, "train"),
                         proximal=linear_term if terms else None)  # fmt: skip
    metrics: dict[str, int | float] = {
        "train-loss": loss,
        "train-seconds": time.perf_counter() - started,
        "trained-parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        protocol.NUM_EXAMPLES: len(data),
    }
    frozen = {f"{n}.{side}" for n in layers for side in ("U", "V")}
    out = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items() if k not in frozen}
    return protocol.reply(content, env.cid, metrics, arrays=out)


def sgd_steps(
    model: nn.Module,
    data: Tensors,
    steps: int,
    opt: SGD,
    batch_size: int,
    gen: torch.Generator,
    drop_last: bool = False,
    hflip: bool = False,
) -> float:
    """`steps` mini-batch SGD steps on the mean training loss, passes over the shuffled data
    repeated as often as needed (`drop_last`, `hflip`: as in the shared training loop); returns
    the mean loss over the steps."""
    model.train()
    total, done = 0.0, 0
    while done < steps and len(data):
        for idx in batches(len(data), batch_size, gen, drop_last):
            opt.zero_grad()
            inputs = random_hflip(data.x[idx], gen) if hflip else data.x[idx]
            loss = per_sample_loss(model(inputs), data.y[idx], data.class_weights).mean()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            total += float(loss.detach())
            done += 1
            if done == steps:
                break
    return total / max(done, 1)


def warm_start(content: RecordDict, env: ClientEnv) -> RecordDict:
    """The dense model the server sent, after `steps` mini-batch SGD steps on this client's
    training split (the run's batch size, momentum and weight decay; the round's lr)."""
    torch.set_num_threads(1)
    rnd = protocol.round_of(content)
    steps = int(protocol.config_of(content).get(contract.STEPS, 0))
    model = received_model(env, protocol.arrays_of(content, copy=False))
    sgd = sgd_for_round(content, env)
    opt = SGD(list(model.parameters()), sgd.lr, sgd.momentum, sgd.weight_decay)
    data = tensors(env.data.train, env.device)
    loss = sgd_steps(model, data, steps, opt, sgd.batch_size, generator(env, rnd, "warm-start"),
                     sgd.drop_last, sgd.hflip)  # fmt: skip
    metrics = {"train-loss": loss, "steps": float(steps), protocol.NUM_EXAMPLES: len(data)}
    return protocol.reply(content, env.cid, metrics, arrays=weights_view(model))


def evaluate(content: RecordDict, env: ClientEnv) -> RecordDict:
    model = _model(protocol.arrays_of(content), env)
    metrics = test_metrics(model, tensors(env.data.test, env.device))
    metrics[protocol.NUM_EXAMPLES] = len(env.data.train)
    return protocol.reply(content, env.cid, metrics)


HANDLERS = {
    contract.WARM_START: warm_start,
    contract.BASIS: basis,
    contract.COEF_GRAD: coefficient_gradient,
    contract.TRAIN: train,
    contract.EVALUATE: evaluate,
}
FEDLIN_HANDLERS = {
    contract.WARM_START: warm_start,
    contract.FEDLIN_GRAD: basis,
    contract.FEDLIN_TRAIN: train,
    contract.EVALUATE: evaluate,
}
