"""FedSC client (Jing et al., ICML 2024): releases its DP-protected correlation matrix, trains
the spectral contrastive objective against the other clients' matrix, and reports a kNN monitor.

* `query.correlation`: DP-CalR at the received model. Clipping bound, noise and views come from
  the run's settings, never from the message; the noise is drawn from a generator seeded by
  the client's secret, which nobody else knows (a release asked twice is the same release). The
  client keeps its own privacy ledger (number of releases, epsilon) in its state store and
  refuses a release that would exceed `fedsc.epsilon-budget`; with `fedsc.noise-at=sum` the
  noise is the secure sum's (client.secagg) and the budget the server's.
* `train`: local epochs of the objective with the received Rbar_{-j} fixed (none: plain spectral
  contrastive loss). The reply's kNN accuracy describes the received model: the client's test
  split classified against its training split as memory bank (labels used only here).
* `evaluate`: the same kNN monitor on the final model.

`SIMCLR_HANDLERS` are the FedAvg + SimCLR baseline's: the same local loop with the NT-Xent loss
(`simclr.temperature`), nothing shared. `BYOL_HANDLERS` are FedAvg + BYOL's: the same loop on
BYOL's loss, with a target network that starts each round as the received model and follows
the online one by `byol.ema` after every step; backbone, projector and predictor are averaged.

Mixed precision (`amp`): the SimCLR and BYOL baselines run their forward passes under autocast
(client.training.train_two_views). FedSC and FedAvg + spectral contrastive never do: the
registry refuses amp=true for them and `train` passes amp=False whatever the run says, so the
correlation matrices (the released DP-CalR matrix, the objective's R_j and Rbar_{-j}) are those
of float32 representations (docs/deployment.md#gpu).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import numpy as np
import torch
from flwr.app import RecordDict

from client.common import generator, sgd_for_round, tensors
from client.env import ClientEnv, ClientHandler
from client.training import SGD, TwoViewObjective, to_device, train_two_views
from models.augment import Augmenter
from models.byol import BYOLPair
from models.dp_correlation import dp_correlation, release_epsilon
from models.simclr import nt_xent
from models.spectral import local_objective, norm_clip, others_from_sum
from models.ssl_eval import embed, knn_accuracy
from models.ssl_nets import ContrastiveNet, build_contrastive_net
from models.weights import set_weights, weights_view
from pollen.core import protocol
from pollen.core.contracts.fedsc import (
    ALPHA,
    CLIPPED_FRACTION,
    CORRELATION,
    CORRELATION_PHASE,
    OTHERS,
    OTHERS_SUM,
    OWN,
    SHARED_ROUND,
    SUM,
    WEIGHT,
    BYOLSettings,
    FedSCSettings,
    R,
    SimCLRSettings,
)
from pollen.core.dataspec import model_input


def _received(
    content: RecordDict, env: ClientEnv, fedsc: FedSCSettings, predictor: bool
) -> ContrastiveNet:
    """The received model; `predictor`: it has BYOL's predictor (FedAvg + BYOL)."""
    torch.set_num_threads(1)
    shape = model_input(env.settings)[0]
    net = build_contrastive_net(fedsc.encoder, shape, fedsc.dim, fedsc.hidden, predictor=predictor)
    model = net.to(env.device)
    set_weights(model, protocol.arrays_of(content))
    return model


def _augmenter(env: ClientEnv) -> Augmenter:
    train = env.data.train
    shape, _ = model_input(env.settings)
    return Augmenter(shape, train.mean, train.std)


def knn_metrics(
    model: ContrastiveNet, env: ClientEnv, fedsc: FedSCSettings
) -> dict[str, int | float]:
    """kNN accuracy of the client's test split against its training split (projector outputs)."""
    test = tensors(env.data.test, env.device)
    metrics: dict[str, int | float] = {"knn-examples": len(test)}
    if len(test) == 0 or len(env.data.train) == 0:
        return metrics
    train = tensors(env.data.train, env.device)
    model.eval()
    metrics["knn-accuracy"] = knn_accuracy(
        embed(model, train.x),
        train.y,
        embed(model, test.x),
        test.y,
        env.data.train.num_classes,
        k=fedsc.knn_k,
        temperature=fedsc.knn_temperature,
    )
    return metrics


def correlation(content: RecordDict, env: ClientEnv) -> RecordDict:
    """A DP-CalR release of the received model's correlation matrix, its noise drawn from the
    client's secret; with `fedsc.noise-at=sum` the release is clipped but not noised here: the
    secure sum it goes into adds this client's share of the noise (client.secagg), and the
    budget, which depends on what the sum carried, is the server's to keep."""
    rnd = protocol.round_of(content)
    fedsc = FedSCSettings.of(env.settings)
    shared = fedsc.noise_at == "sum"
    model = _received(content, env, fedsc, predictor=False)
    saved = env.state.load(before_round=rnd)
    releases = int(saved[1].get("releases", 0)) if saved else 0
    n = len(env.data.train)
    budget = fedsc.epsilon_budget
    ledger: dict[str, float] = {}
    if not shared:
        epsilon = release_epsilon(
            releases + 1,
            n,
            mu=fedsc.mu,
            noise_std=fedsc.noise_std,
            delta=fedsc.delta,
            convention=fedsc.sensitivity,
        )
        if budget > 0 and epsilon > budget:
            raise RuntimeError(
                f"privacy budget: release {releases + 1} would reach epsilon {epsilon:.3f} > "
                f"{budget}; refused"
            )
        ledger["epsilon"] = epsilon if math.isfinite(epsilon) else -1.0  # -1: none (sigma 0)
    model.eval()
    private = torch.Generator().manual_seed(env.private_seed(rnd, "correlation-noise"))
    r, clipped = dp_correlation(
        model,
        tensors(env.data.train, env.device).x,
        _augmenter(env),
        fedsc.mu,
        0.0 if shared else fedsc.noise_std,
        views=generator(env, rnd, "correlation-views"),
        noise=private,
        passes=fedsc.passes,
        views_per_pass=fedsc.views_per_pass,
        batch_size=env.run.batch_size,
    )
    r32 = r.cpu().numpy().astype(np.float32)
    # the release is kept: under secure aggregation the client computes Rbar_{-j} itself from
    # the sum of the releases, less its own (`_others`)
    env.state.save(rnd, {R: r32}, {"round": rnd, "releases": releases + 1, **ledger})
    metrics = {
        protocol.NUM_EXAMPLES: n,
        "releases": releases + 1,
        **ledger,
        CLIPPED_FRACTION: clipped,
    }
    return protocol.reply(content, env.cid, metrics, **{CORRELATION: {R: r32}})


def _others(content: RecordDict, env: ClientEnv) -> np.ndarray | None:
    """Rbar_{-j} as the server sent it, or (secure aggregation) computed here from the sum of
    the released matrices less this client's own release of that round
    (models.spectral.others_from_sum); None: nothing to train against."""
    if OTHERS in content:
        return protocol.arrays_of(content, OTHERS)[R]
    if OTHERS_SUM not in content:
        return None
    given = protocol.arrays_of(content, OTHERS_SUM)
    shared_round, own_weight = int(given[SHARED_ROUND][0]), float(given[OWN][0])
    own = np.zeros_like(given[SUM])
    if own_weight > 0:
        saved = env.state.load(before_round=shared_round + 1)
        if saved is None or saved[1].get("round") != shared_round or R not in saved[0]:
            raise RuntimeError(
                f"the sum of round {shared_round}'s correlation matrices counts this client's, "
                "which its state no longer holds"
            )
        own = saved[0][R]
    rbar = others_from_sum(given[SUM], float(given[WEIGHT][0]), own, own_weight)
    return None if rbar is None else rbar.astype(np.float32)


def _train(
    content: RecordDict,
    env: ClientEnv,
    fedsc: FedSCSettings,
    model: ContrastiveNet,
    objective: TwoViewObjective,
    loss_scale: float,
    metrics: dict[str, int | float],
    trained: torch.nn.Module | None = None,
    after_step: Callable[[], None] | None = None,
    amp: bool = False,
) -> RecordDict:
    """Local epochs of `objective` on two augmented views of `trained` (default: `model`,
    whose weights the reply carries), `after_step` after every step; `amp`: the forward passes
    under autocast."""
    sgd = sgd_for_round(content, env)
    trained = model if trained is None else trained
    params = [p for p in trained.parameters() if p.requires_grad]
    data = tensors(env.data.train, env.device)
    metrics["train-loss"] = train_two_views(
        trained,
        data.x,
        _augmenter(env),
        objective,
        epochs=sgd.epochs,
        batch_size=sgd.batch_size,
        opt=SGD(params, sgd.lr, sgd.momentum, sgd.weight_decay),
        generator=generator(env, protocol.round_of(content), "train"),
        loss_scale=loss_scale,
        grad_clip=fedsc.grad_clip,
        after_step=after_step,
        amp=amp,
    )
    metrics[protocol.NUM_EXAMPLES] = len(data)
    return protocol.reply(content, env.cid, metrics, arrays=weights_view(model))


def train(content: RecordDict, env: ClientEnv) -> RecordDict:
    fedsc = FedSCSettings.of(env.settings)
    model = _received(content, env, fedsc, predictor=False)
    metrics = knn_metrics(model, env, fedsc)
    received = _others(content, env)
    others = None if received is None else to_device(received, env.device)
    alpha = float(protocol.config_of(content).get(ALPHA, 1.0)) if others is not None else 1.0
    mu = fedsc.mu

    def objective(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        return local_objective(norm_clip(z1, mu), norm_clip(z2, mu), alpha, others)

    metrics[ALPHA] = alpha
    # float32 always (see the module's docstring): amp never touches the correlation matrices
    return _train(content, env, fedsc, model, objective, fedsc.loss_scale, metrics, amp=False)


def train_simclr(content: RecordDict, env: ClientEnv) -> RecordDict:
    """FedAvg + SimCLR's local step: NT-Xent on the projector outputs, nothing shared."""
    fedsc = FedSCSettings.of(env.settings)
    model = _received(content, env, fedsc, predictor=False)
    temperature = SimCLRSettings.of(env.settings).temperature

    def objective(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        return nt_xent(z1, z2, temperature)

    metrics = knn_metrics(model, env, fedsc)
    amp = sgd_for_round(content, env).amp
    return _train(content, env, fedsc, model, objective, 1.0, metrics, amp=amp)


def train_byol(content: RecordDict, env: ClientEnv) -> RecordDict:
    """FedAvg + BYOL's local step: the target starts as the received model (reset at sync)."""
    fedsc = FedSCSettings.of(env.settings)
    model = _received(content, env, fedsc, predictor=True)
    pair = BYOLPair(model, BYOLSettings.of(env.settings).ema)
    metrics = knn_metrics(model, env, fedsc)
    return _train(
        content, env, fedsc, model, pair.symmetric_loss, 1.0, metrics, pair, pair.update_target,
        amp=sgd_for_round(content, env).amp,
    )  # fmt: skip


def evaluate(content: RecordDict, env: ClientEnv, *, predictor: bool = False) -> RecordDict:
    fedsc = FedSCSettings.of(env.settings)
    metrics = knn_metrics(_received(content, env, fedsc, predictor), env, fedsc)
    metrics[protocol.NUM_EXAMPLES] = len(env.data.train)
    return protocol.reply(content, env.cid, metrics)


HANDLERS: dict[str, ClientHandler] = {
    CORRELATION_PHASE: correlation,
    "train": train,
    "evaluate": evaluate,
}
SIMCLR_HANDLERS: dict[str, ClientHandler] = {"train": train_simclr, "evaluate": evaluate}
BYOL_HANDLERS: dict[str, ClientHandler] = {
    "train": train_byol,
    "evaluate": partial(evaluate, predictor=True),
}
