"""Pieces most classifier handlers share: tensors of the client's splits and its model."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from flwr.app import RecordDict
from torch import nn

from client.dp_sgd import train_private
from client.env import ClientEnv
from client.state import private_seed
from client.training import SGD, ProximalTerm, to_device, train_classifier
from federated_data import ArrayDataset
from models.evaluation import evaluate_classifier
from models.privacy import Entry, add_steps, epsilon
from pollen.core import protocol
from pollen.core.contracts.dp_sgd import EPSILON, LEDGER, NOISE, STEPS, ClientDP, client_dp, shown
from pollen.core.dataspec import class_weights
from pollen.core.runmodel import run_model


@dataclass(frozen=True)
class Tensors:
    """A split as model input and targets (labels, or next tokens for sequences), with the
    per-class loss weights every loss on it uses (None: unweighted)."""

    x: torch.Tensor
    y: torch.Tensor
    class_weights: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.y)


def tensors(
    ds: ArrayDataset, device: torch.device, class_weights: torch.Tensor | None = None
) -> Tensors:
    """A whole split on `device` (to_device: pinned memory and an asynchronous copy to CUDA)."""
    return Tensors(
        to_device(ds.features(), device),
        to_device(ds.targets(), device, torch.long),
        class_weights,
    )


def split_tensors(env: ClientEnv, split: str) -> Tensors:
    """The client's "train", "val" or "test" split with the run's class weights."""
    weights = class_weights(env.settings)
    return tensors(
        getattr(env.data, split),
        env.device,
        None if weights is None else torch.tensor(weights, dtype=torch.float32, device=env.device),
    )


def new_model(env: ClientEnv) -> nn.Module:
    """The run's model on the client's device; with DP-SGD, as Opacus can train it
    (models.privacy.dp_compatible: BatchNorm -> GroupNorm), as the server builds it too."""
    return run_model(env.settings, env.model_fn).to(env.device)


def generator(env: ClientEnv, server_round: int, tag: str) -> torch.Generator:
    return torch.Generator().manual_seed(env.seed(server_round, tag))


@dataclass(frozen=True)
class SGDSettings:
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    amp: bool = False
    """Mixed precision in the training loop (the run's `amp`; client.training.MixedPrecision)."""
    drop_last: bool = False
    """Skip each epoch's last, incomplete batch (the run's `drop-last`; client.training.batches)."""
    hflip: bool = False
    """Mirror training images at random (the run's `random-flip`; models.augment.random_hflip)."""
    steps: int = 0
    """Local SGD steps (batches) per round in place of `epochs` (the run's `local-steps`; 0:
    count in epochs)."""


def sgd_settings(env: ClientEnv) -> SGDSettings:
    run = env.run
    return SGDSettings(
        epochs=run.local_epochs,
        batch_size=run.batch_size,
        lr=run.lr,
        momentum=run.momentum,
        weight_decay=run.weight_decay,
        amp=run.amp,
        drop_last=run.drop_last,
        hflip=run.random_flip,
        steps=run.local_steps,
    )


def sgd_for_round(content: RecordDict, env: ClientEnv) -> SGDSettings:
    """The run's SGD settings with this round's learning rate (the server's schedule)."""
    sgd = sgd_settings(env)
    lr = protocol.config_of(content).get("lr")
    if isinstance(lr, int | float) and not isinstance(lr, bool):
        sgd = dataclasses.replace(sgd, lr=float(lr))
    return sgd


def optimizer(
    model: nn.Module,
    sgd: SGDSettings,
    env: ClientEnv,
    stored: Mapping[str, np.ndarray],
    prefix: str = "momentum",
) -> SGD:
    """SGD over the model's parameters; with `persist-momentum`, its buffers start from the
    ones stored under `prefix` (see `momentum_arrays`)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = SGD(params, sgd.lr, sgd.momentum, sgd.weight_decay)
    if env.run.persist_momentum and sgd.momentum > 0:
        for i in range(len(params)):
            saved = stored.get(f"{prefix}.{i}")
            if saved is not None and saved.shape == tuple(params[i].shape):
                opt.buffers[i] = to_device(saved, env.device)
    return opt


def momentum_arrays(opt: SGD, env: ClientEnv, prefix: str = "momentum") -> dict[str, np.ndarray]:
    if not env.run.persist_momentum:
        return {}
    return {
        f"{prefix}.{i}": buf.detach().cpu().numpy()
        for i, buf in enumerate(opt.buffers)
        if buf is not None
    }


@dataclass
class Privacy:
    """A client's DP-SGD in one round (client.dp_sgd): its noise and Poisson sampling for its
    data (pollen.core.contracts.dp_sgd.client_dp) and its privacy ledger, kept in its state."""

    dp: ClientDP
    history: list[Entry] = field(default_factory=list)
    secret: bytes = b""
    """The client's secret (client.state.StateStore.secret); empty: the operating system's
    entropy for every draw."""

    def generators(
        self, gen: torch.Generator, device: torch.device
    ) -> tuple[torch.Generator, torch.Generator]:
        """(Poisson sampling, noise) generators: seeded from the client's secret and `gen`'s
        seed (the round and the model trained), which nobody else knows, and the same when a
        round is answered twice (a resent instruction), so a repeated reply releases nothing
        new; with `dp.reproducible`, from `gen` (the run's seed: no privacy)."""
        noise = torch.Generator(device=device)
        if self.dp.reproducible:
            derived = np.random.SeedSequence([gen.initial_seed(), 0xD9]).generate_state(1)
            return gen, noise.manual_seed(int(derived[0]))
        sampling = torch.Generator().manual_seed(self._private(gen, "sampling"))
        return sampling, noise.manual_seed(self._private(gen, "noise"))

    def _private(self, gen: torch.Generator, tag: str) -> int:
        if not self.secret:
            return _entropy()
        return private_seed(self.secret, f"{gen.initial_seed()}/{tag}")

    def charge(self, steps: int) -> None:
        """Count `steps` DP-SGD steps at this client's noise multiplier and sample rate."""
        self.history = add_steps(
            self.history, self.dp.noise_multiplier, self.dp.plan.sample_rate, steps
        )

    def epsilon(self) -> float:
        return epsilon(self.history, self.dp.delta)

    def meta(self) -> dict[str, object]:
        """The ledger as the client's state stores it."""
        return {LEDGER: [list(e) for e in self.history]}

    def metrics(self) -> dict[str, int | float]:
        return {
            EPSILON: shown(self.epsilon()),
            STEPS: sum(e[2] for e in self.history),
            NOISE: self.dp.noise_multiplier,
        }


def _entropy() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1


def privacy(env: ClientEnv, passes: int = 1) -> Privacy | None:
    """The client's DP-SGD for this round, its ledger read from its newest state, None without
    DP-SGD. The newest state, not the one before this round: a round replayed after a restart
    was computed, and may have been sent, before, so its steps stay counted (docs/privacy.md)."""
    dp = client_dp(env.settings, len(env.data.train), passes)
    if dp is None:
        return None
    newest = env.state.load(before_round=sys.maxsize)
    ledger = newest[1].get(LEDGER, []) if newest is not None else []
    # (add_steps adds nothing: the entries as tuples)
    return Privacy(dp, add_steps(ledger, 0.0, 0.0, 0), env.state.secret())


def privacy_meta(privacy: Privacy | None) -> dict[str, object]:
    return {} if privacy is None else privacy.meta()


def privacy_metrics(privacy: Privacy | None) -> dict[str, int | float]:
    return {} if privacy is None else privacy.metrics()


def train(
    model: nn.Module,
    data: Tensors,
    sgd: SGDSettings,
    gen: torch.Generator,
    proximal: ProximalTerm | None = None,
    opt: SGD | None = None,
    sample_weights: torch.Tensor | None = None,
    privacy: Privacy | None = None,
) -> float:
    """`sgd.epochs` of local SGD from `gen`'s batches; with `privacy`, DP-SGD (its steps
    counted in its ledger). Returns the last epoch's mean training loss."""
    if privacy is not None:
        opt = opt or SGD(
            [p for p in model.parameters() if p.requires_grad], sgd.lr, sgd.momentum,
            sgd.weight_decay,
        )  # fmt: skip
        sampling, noise = privacy.generators(gen, data.x.device)
        loss, steps = train_private(
            model,
            data.x,
            data.y,
            epochs=sgd.epochs,
            plan=privacy.dp.plan,
            noise_multiplier=privacy.dp.noise_multiplier,
            max_grad_norm=privacy.dp.max_grad_norm,
            optimizer=opt,
            sampling=sampling,
            noise=noise,
            proximal=proximal,
            sample_weights=sample_weights,
            class_weights=data.class_weights,
            hflip=sgd.hflip,
        )
        privacy.charge(steps)
        return loss
    return train_classifier(
        model,
        data.x,
        data.y,
        epochs=sgd.epochs,
        batch_size=sgd.batch_size,
        lr=sgd.lr,
        momentum=sgd.momentum,
        weight_decay=sgd.weight_decay,
        generator=gen,
        proximal=proximal,
        optimizer=opt,
        sample_weights=sample_weights,
        class_weights=data.class_weights,
        amp=sgd.amp,
        drop_last=sgd.drop_last,
        hflip=sgd.hflip,
        steps=sgd.steps,
    )


def test_metrics(model: nn.Module, data: Tensors, split: str = "test") -> dict[str, int | float]:
    """Loss and accuracy on one of the client's splits (only the count when it is empty)."""
    metrics: dict[str, int | float] = {f"{split}-examples": len(data)}
    if len(data):
        loss, acc = evaluate_classifier(model, data.x, data.y, class_weights=data.class_weights)
        metrics.update({f"{split}-loss": loss, f"{split}-accuracy": acc})
    return metrics
