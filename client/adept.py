"""ADEPT clients (PCA, AE and DGM): the personal model (U_i or theta_i) and theta_i's optimizer
state stay in the state store; each round moves the personal model, then the received mu and
sigma, and returns those two (see strategies.adept; the records and the rounds that send them
back are pollen.core.contracts.adept's). The baselines of `adept.method` run here too. ADEPT-DGM is
ADEPT-AE's loop with a UNet denoiser, the denoising loss and Adam for theta_i (argument
`denoiser` of the shared code). One handler table per variant: PCA_HANDLERS, AE_HANDLERS,
DGM_HANDLERS.

Metrics describe the client's own model after the round (FedAvg: the received global model):
reconstruction error on the test split (DGM: of clean inputs, the authors' selection measure),
for autoencoders also the energy captured, and on pca-synthetic the population error relative to
the client's true subspace. DGM's final evaluation also samples images and reports their KID
(client.adept_dgm).

Devices: ADEPT-AE and -DGM train on the client's device (`device`; their data, theta_i, mu and
sigma go there, everything sent or stored comes back as NumPy); ADEPT-PCA is NumPy linear
algebra on the CPU. None of them uses mixed precision (the registry refuses amp=true).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any

import numpy as np
import torch
from flwr.app import RecordDict

from client.adept_dgm import MU_ADAM, adam, adam_arrays, sample_report
from client.common import generator, momentum_arrays, optimizer, sgd_for_round
from client.env import ClientEnv, ClientHandler
from client.training import batches, to_device
from federated_data.synthetic_ae import training_decoders
from federated_data.synthetic_pca import true_subspaces
from models.adept_ae import AEHyper, local_round, theta_network
from models.adept_pca import PCAHyper, client_round, data_step, error_ratio, reconstruction_error
from models.autoencoder import reconstruction_metrics, squared_errors
from models.diffusion import denoising_errors
from models.stiefel import polar_factor, top_eigenvectors
from models.weights import get_weights, set_weights
from pollen.core import protocol
from pollen.core.contracts.adept import (
    LR_GLOBAL,
    MU,
    SIGMA,
    AdeptAESettings,
    AdeptDGMSettings,
    AdeptPCASettings,
    AdeptSettings,
    shares,
)
from pollen.core.dataspec import partition_of


def _inputs(env: ClientEnv, split: str) -> np.ndarray:
    """Raw inputs of a split: images in [0, 1] (the paper's AE inputs, not standardised),
    generated features as they are."""
    ds = env.data.train if split == "train" else env.data.test
    return ds.x.astype(np.float32) / 255.0 if ds.x.dtype == np.uint8 else ds.x


def _vectors(env: ClientEnv, split: str) -> np.ndarray:
    """PCA's samples as rows of R^d (images flattened, as the server's d = prod(shape) is)."""
    x = _inputs(env, split)
    return x.reshape(len(x), -1).astype(np.float64)


def _global_rate(content: RecordDict, adept: AdeptSettings) -> float:
    """eta2 of this round: the server's `lr-global` (adept.lr-global under the run's
    lr-schedule), or adept.lr-global itself."""
    rate = protocol.config_of(content).get(LR_GLOBAL)
    if isinstance(rate, int | float) and not isinstance(rate, bool):
        return float(rate)
    return adept.lr_global


def _phase(content: RecordDict, env: ClientEnv, adept: AdeptSettings) -> tuple[int, bool, str]:
    """(round, whether mu and sigma go back, this round's role of the personal model)."""
    rnd = protocol.round_of(content)
    share = shares(adept, rnd, env.run.num_rounds)
    role = "global" if adept.method in ("fedavg", "fedavg-ft") and share else adept.method
    return rnd, share, role


# --- ADEPT-PCA --------------------------------------------------------------------------------


def _pca_hyper(
    content: RecordDict, env: ClientEnv, adept: AdeptSettings, pca: AdeptPCASettings, d: int
) -> Any:
    return PCAHyper(
        eta1=sgd_for_round(content, env).lr,
        eta2=_global_rate(content, adept),
        eta3=adept.lr_sigma,
        xi=adept.xi,
        noise=pca.noise,
        d_theta=pca.d_theta or float(d * pca.rank),
        data_factor=1.0 if pca.gradient == "exact" else 0.5,
    )


def _pca_metrics(env: ClientEnv, u: np.ndarray) -> dict[str, int | float]:
    x = _vectors(env, "test")
    out: dict[str, int | float] = {"test-examples": len(x)}
    if len(x):
        out["test-error"] = reconstruction_error(u, x)
    if env.run.dataset == "pca-synthetic":
        params = {**dict(env.data_spec.dataset_params), "num_clients": env.data_spec.num_clients}
        truth = true_subspaces(params)[1][partition_of(env.settings, env.cid)]
        out["error-ratio"] = error_ratio(u, truth, float(params["noise"]))
    return out


def _pca_train(content: RecordDict, env: ClientEnv) -> RecordDict:
    adept = AdeptSettings.of(env.settings)
    rnd, share, role = _phase(content, env, adept)
    x = _vectors(env, "train")
    n, d = x.shape
    s = x.T @ x / max(n, 1)
    hp = _pca_hyper(content, env, adept, AdeptPCASettings.of(env.settings), d)
    v = protocol.arrays_of(content, MU)["V"]
    sigma = float(protocol.arrays_of(content, SIGMA)["V"][0])
    stored, meta = env.state.load(before_round=rnd) or ({}, {})
    if role == "fedavg-ft" and meta.get("role") != role:  # fine-tuning starts from the global V
        u = v
    else:  # first round: the local optimum, top-r eigenvectors of S_i
        u = stored["U"] if "U" in stored else top_eigenvectors(s, v.shape[1])
    if role == "global":  # one V for everyone: a step on the data term, retracted by the server
        u, v_out, sigma_out = v, data_step(v, s, n, hp), sigma
    elif role == "adept":
        u, v_out, sigma_out = client_round(u, v, sigma, s, n, hp)
    else:  # local training, or fine-tuning from the global V it started from
        u = polar_factor(data_step(u, s, n, hp))
        v_out, sigma_out = v, sigma
    env.state.save(rnd, {"U": u, "sigma": np.array(sigma_out)}, {"round": rnd, "role": role})
    metrics: dict[str, int | float] = {**_pca_metrics(env, u), protocol.NUM_EXAMPLES: n}
    if not share:
        return protocol.reply(content, env.cid, metrics)
    sent = {"V": np.array([sigma_out], dtype=np.float64)}
    return protocol.reply(content, env.cid, metrics, mu={"V": v_out}, sigma=sent)


def _pca_evaluate(content: RecordDict, env: ClientEnv) -> RecordDict:
    rnd, _, role = _phase(content, env, AdeptSettings.of(env.settings))
    stored, _ = env.state.load(before_round=rnd) or ({}, {})
    u = stored["U"] if role != "global" and "U" in stored else protocol.arrays_of(content, MU)["V"]
    metrics = {**_pca_metrics(env, u), protocol.NUM_EXAMPLES: len(env.data.train)}
    return protocol.reply(content, env.cid, metrics)


# --- ADEPT-AE ---------------------------------------------------------------------------------


def _ae_hyper(content: RecordDict, adept: AdeptSettings, ae: AdeptAESettings, n: int) -> Any:
    return AEHyper(
        eta2=_global_rate(content, adept),
        eta3=adept.lr_sigma,
        xi=adept.xi,
        prior_scale=ae.prior_scale or 1.0 / max(n, 1),
        mu_gradient=ae.mu_gradient,
        clip_theta=ae.grad_clip or math.inf,
        clip_mu=ae.grad_clip or math.inf,
    )


def _ae_model(
    env: ClientEnv,
    weights: Mapping[str, np.ndarray] | None,
    denoiser: bool,
    ae: AdeptAESettings,
    dgm: AdeptDGMSettings,
) -> Any:
    """The autoencoder (with `denoiser`: the UNet denoiser) with `weights`, or this client's own
    random initialisation (clients start from different points, as in the authors' code), its
    decoder at the client's true generator with adept-ae.init-decoder=truth."""
    torch.set_num_threads(1)
    torch.manual_seed(env.seed(0, "init"))
    model = theta_network(
        env.data.train.input_shape,
        denoiser,
        latent=ae.latent,
        channels=dgm.channels,
        kernel=dgm.kernel,
        architecture=ae.architecture,
    ).to(env.device)
    if weights is not None:
        set_weights(model, weights)
    elif ae.init_decoder == "truth":
        set_weights(model, {**get_weights(model), **_true_decoder(env)})
    return model


def _true_decoder(env: ClientEnv) -> dict[str, np.ndarray]:
    """The client's true decoder on ae-synthetic, scaled like its training split (the paper's
    Table 1 'Baseline' starts from it)."""
    params = {**dict(env.data_spec.dataset_params), "num_clients": env.data_spec.num_clients}
    weight, bias = training_decoders(params)[partition_of(env.settings, env.cid)]
    return {"decoder.weight": weight.astype(np.float32), "decoder.bias": bias.astype(np.float32)}


def _ae_metrics(env: ClientEnv, model: Any) -> dict[str, int | float]:
    return reconstruction_metrics(model, to_device(_inputs(env, "test"), env.device))


def _theta_optimizer(
    model: Any,
    content: RecordDict,
    env: ClientEnv,
    stored: Mapping[str, np.ndarray],
    denoiser: bool,
) -> Any:
    """SGD with momentum for the autoencoders; Adam for the DGM denoiser (all methods, as the
    authors), its moments kept across rounds like the momentum buffers."""
    sgd = sgd_for_round(content, env)
    if not denoiser:
        return optimizer(model, sgd, env, stored)
    return adam([p for p in model.parameters() if p.requires_grad], sgd.lr, stored)


def _optimizer_arrays(opt: Any, env: ClientEnv) -> dict[str, np.ndarray]:
    if isinstance(opt, torch.optim.Adam):
        return adam_arrays(opt)
    return momentum_arrays(opt, env)


def _mu_optimizer(
    tensors: list[torch.Tensor],
    content: RecordDict,
    adept: AdeptSettings,
    stored: Mapping[str, np.ndarray],
    adam_mu: bool,
) -> Any:
    """With `adam_mu` (adept-dgm.mu-optimizer=adam), Adam over the client's copy of mu at this
    round's eta2, resuming its moments from the state store (the authors' DGM code keeps this
    optimizer across rounds); otherwise None (plain SGD steps)."""
    return adam(tensors, _global_rate(content, adept), stored, MU_ADAM) if adam_mu else None


def _data_term(env: ClientEnv, rnd: int, denoiser: bool, dgm: AdeptDGMSettings) -> Any:
    """Per-sample errors of a batch: reconstruction (AE) or denoising of a freshly corrupted
    batch (DGM; the noise is seeded by client and round)."""
    if not denoiser:
        return squared_errors
    return partial(denoising_errors, kind=dgm.diffusion, generator=generator(env, rnd, "noise"))


def _personal_weights(stored: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    weights = {k.removeprefix("theta."): v for k, v in stored.items() if k.startswith("theta.")}
    return weights or None


def _ae_train(content: RecordDict, env: ClientEnv, *, denoiser: bool) -> RecordDict:
    adept = AdeptSettings.of(env.settings)
    ae, dgm = AdeptAESettings.of(env.settings), AdeptDGMSettings.of(env.settings)
    rnd, share, role = _phase(content, env, adept)
    x = to_device(_inputs(env, "train"), env.device)
    n = len(x)
    mu = protocol.arrays_of(content, MU)
    stored, meta = env.state.load(before_round=rnd) or ({}, {})
    # FedAvg trains the received model; fine-tuning starts from the last global model
    fresh = role == "global" or (role == "fedavg-ft" and meta.get("role") != role)
    model = _ae_model(env, mu if fresh else _personal_weights(stored), denoiser, ae, dgm)
    metrics = _ae_metrics(env, model) if role == "global" else {}
    steps = ae.local_steps
    order = batches(n, max(1, n // steps), generator(env, rnd, "train"))
    chunks = [x[idx] for _, idx in zip(range(steps), order, strict=False)]
    opt = _theta_optimizer(model, content, env, stored, denoiser)
    errors = _data_term(env, rnd, denoiser, dgm)
    hp = _ae_hyper(content, adept, ae, n)
    names = [name for name, _ in model.named_parameters()]
    mu_out: dict[str, np.ndarray] = mu
    sigma_out = protocol.arrays_of(content, SIGMA)
    mu_state: dict[str, np.ndarray] = {}
    if role == "adept":
        tensors = [to_device(torch.tensor(mu[k]), env.device) for k in names]
        sigmas = [to_device(torch.tensor(sigma_out[k]), env.device) for k in names]
        lazy = rnd <= ae.lazy_rounds
        adam_mu = denoiser and dgm.mu_optimizer == "adam"
        mu_opt = _mu_optimizer(tensors, content, adept, stored, adam_mu)
        new_mu, new_sigma, loss = local_round(
            model, chunks, opt, hp, tensors, sigmas, not lazy, errors, mu_opt
        )
        if mu_opt is not None:
            mu_state = adam_arrays(mu_opt, MU_ADAM)
        assert new_mu is not None and new_sigma is not None
        mu_out = {k: t.cpu().numpy() for k, t in zip(names, new_mu, strict=True)}
        sigma_out = {k: t.cpu().numpy() for k, t in zip(names, new_sigma, strict=True)}
    else:
        _, _, loss = local_round(model, chunks, opt, hp, errors=errors)
        if role == "global":
            mu_out = get_weights(model)
    theta = {f"theta.{k}": v for k, v in get_weights(model).items()}
    sig_state = {f"sigma.{k}": v for k, v in sigma_out.items()} if role == "adept" else {}
    env.state.save(
        rnd,
        {**theta, **sig_state, **_optimizer_arrays(opt, env), **mu_state},
        {"round": rnd, "role": role},
    )
    if role != "global":
        metrics = _ae_metrics(env, model)
    metrics.update({"train-loss": loss, protocol.NUM_EXAMPLES: n})
    if not share:
        return protocol.reply(content, env.cid, metrics)
    return protocol.reply(content, env.cid, metrics, mu=mu_out, sigma=sigma_out)


def _ae_evaluate(content: RecordDict, env: ClientEnv, *, denoiser: bool) -> RecordDict:
    ae, dgm = AdeptAESettings.of(env.settings), AdeptDGMSettings.of(env.settings)
    rnd, _, role = _phase(content, env, AdeptSettings.of(env.settings))
    saved = env.state.load(before_round=rnd)
    personal = _personal_weights(saved[0]) if saved and role != "global" else None
    model = _ae_model(env, personal or protocol.arrays_of(content, MU), denoiser, ae, dgm)
    metrics = {**_ae_metrics(env, model), protocol.NUM_EXAMPLES: len(env.data.train)}
    if denoiser:
        metrics.update(sample_report(env, dgm, model, _inputs(env, "test"), role))
    return protocol.reply(content, env.cid, metrics)


PCA_HANDLERS: dict[str, ClientHandler] = {"train": _pca_train, "evaluate": _pca_evaluate}
AE_HANDLERS: dict[str, ClientHandler] = {
    "train": partial(_ae_train, denoiser=False),
    "evaluate": partial(_ae_evaluate, denoiser=False),
}
DGM_HANDLERS: dict[str, ClientHandler] = {
    "train": partial(_ae_train, denoiser=True),
    "evaluate": partial(_ae_evaluate, denoiser=True),
}
