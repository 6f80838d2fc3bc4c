"""Algorithm registry: a name resolves here to its server strategy, client handlers and settings.

Entries name their code by import path so that looking an algorithm up imports nothing heavy:
a ClientApp process imports only the handlers of the message it serves.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pollen.settings import Setting

if TYPE_CHECKING:
    from client.env import ClientHandler
    from strategies.base import Strategy


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    description: str
    strategy: str  # "module:Class"
    client: str  # "module" with HANDLERS, or "module:NAME": dict[message_type, handler]
    message_types: tuple[str, ...]
    settings: tuple[Setting, ...] = ()

    def strategy_class(self) -> type[Strategy]:
        module, _, attr = self.strategy.partition(":")
        cls: type[Strategy] = getattr(importlib.import_module(module), attr)
        return cls

    def client_handler(self, message_type: str) -> ClientHandler:
        module, _, attr = self.client.partition(":")
        handlers: dict[str, Any] = getattr(importlib.import_module(module), attr or "HANDLERS")
        if message_type not in handlers:
            raise KeyError(f"algorithm {self.name!r} has no client handler for {message_type!r}")
        handler: ClientHandler = handlers[message_type]
        return handler


ADEPT_MESSAGES = ("train", "evaluate")
ADEPT_SETTINGS = (
    Setting(
        "adept.method",
        "adept",
        "'adept'; or a baseline in the same framework: 'local' (no prior, nothing shared), "
        "'fedavg' (one global model), 'fedavg-ft' (FedAvg, then local fine-tuning)",
        choices=("adept", "local", "fedavg", "fedavg-ft"),
    ),
    Setting("adept.sigma-init", 1.0, "initial sigma (every entry)", minimum=1e-12),
    Setting("adept.xi", 1e-6, "hyper-prior xi: keeps sigma away from 0", minimum=0.0),
    Setting("adept.lr-global", 0.01, "step size eta2 of the client's copy of mu (V)", minimum=0.0),
    Setting("adept.lr-sigma", 1e-3, "step size eta3 of sigma", minimum=0.0),
    Setting(
        "adept.tune-round",
        0,
        "fedavg-ft: last FedAvg round before local fine-tuning (0: num-rounds // 2)",
        minimum=0,
    ),
)
ADEPT_PCA_SETTINGS = (
    Setting("adept-pca.rank", 20, "rank r of the learned subspaces", minimum=1),
    Setting("adept-pca.noise", 0.2, "sigma_eps of the probabilistic PCA model", minimum=1e-9),
    Setting("adept-pca.d-theta", 0.0, "d_theta of the sigma prior (0: d * r)", minimum=0.0),
    Setting(
        "adept-pca.gradient",
        "exact",
        "data-term gradient factor: 'exact' (n) or 'paper' (the printed n/2)",
        choices=("exact", "paper"),
    ),
)
ADEPT_AE_SETTINGS = (
    Setting("adept-ae.latent", 10, "latent size of the linear autoencoder", minimum=1),
    Setting("adept-ae.local-steps", 20, "local iterations tau per round", minimum=1),
    Setting(
        "adept-ae.prior-scale",
        0.0,
        "weight c of the prior beside the per-sample mean loss (0: 1/n_i; authors' code: 0.1)",
        minimum=0.0,
    ),
    Setting(
        "adept-ae.mu-gradient",
        "code",
        "client step of mu: 'code' 2(mu - theta) (authors' code), 'paper' c(mu - theta)/sigma^2",
        choices=("code", "paper"),
    ),
    Setting("adept-ae.lazy-rounds", 2, "rounds before sigma starts to move", minimum=0),
)

ALGORITHMS: dict[str, AlgorithmSpec] = {
    spec.name: spec
    for spec in (
        AlgorithmSpec(
            name="fedavg",
            description="FedAvg: local SGD, server average weighted by training examples",
            strategy="strategies.fedavg:FedAvg",
            client="client.fedavg",
            message_types=("train", "evaluate"),
        ),
        AlgorithmSpec(
            name="fedavg-plus",
            description="FedAvg+: FedAvg whose clients fine-tune the global model locally "
            "before every evaluation (the global model is unaffected)",
            strategy="strategies.fedavg:FedAvg",
            client="client.fedavg:ADAPTING_HANDLERS",
            message_types=("train", "evaluate"),
            settings=(
                Setting(
                    "fedavg-plus.adapt-epochs",
                    1,
                    "local epochs of fine-tuning before evaluation",
                    minimum=1,
                ),
            ),
        ),
        AlgorithmSpec(
            name="fedprox",
            description="FedProx: FedAvg with a proximal term (mu/2)||w - w_global||^2 on clients",
            strategy="strategies.fedavg:FedAvg",
            client="client.fedavg:PROXIMAL_HANDLERS",
            message_types=("train", "evaluate"),
            settings=(Setting("fedprox.mu", 0.01, "proximal term strength", minimum=0.0),),
        ),
        AlgorithmSpec(
            name="fedem",
            description="FedEM: each client a mixture of M shared component models, "
            "personal mixture weights fitted by EM",
            strategy="strategies.fedem:FedEM",
            client="client.fedem",
            message_types=("train", "evaluate"),
            settings=(
                Setting("fedem.components", 3, "number of mixture components M", minimum=1),
                Setting(
                    "fedem.aggregation",
                    "stale",
                    "under client sampling: 'stale' counts "
                    "unsampled clients with their copy of the previous model (reference "
                    "code); 'renormalize' averages sampled clients only",
                    choices=("stale", "renormalize"),
                ),
                Setting(
                    "fedem.em-iterations",
                    100,
                    "EM iterations an unseen client runs on its mixture weights",
                    minimum=1,
                ),
                Setting(
                    "fedem.em-tolerance",
                    1e-6,
                    "stop an unseen client's EM when pi changes less than this (L1)",
                    minimum=0.0,
                ),
            ),
        ),
        AlgorithmSpec(
            name="d-fedem",
            description="D-FedEM: decentralised FedEM; clients gossip their components over a "
            "random graph, no global model (uses the fedem.* settings)",
            strategy="strategies.dfedem:DFedEM",
            client="client.fedem",
            message_types=("train", "evaluate"),
            settings=(
                Setting(
                    "d-fedem.edge-probability",
                    0.5,
                    "edge probability of the Erdős–Rényi communication graph",
                    minimum=1e-6,
                    maximum=1.0,
                ),
            ),
        ),
        AlgorithmSpec(
            name="adept-pca",
            description="ADEPT-PCA: personal principal subspaces U_i and a global V on the "
            "Stiefel manifold, tied by a prior whose width sigma is learned",
            strategy="strategies.adept:ADEPT",
            client="client.adept",
            message_types=ADEPT_MESSAGES,
            settings=ADEPT_SETTINGS + ADEPT_PCA_SETTINGS,
        ),
        AlgorithmSpec(
            name="adept-ae",
            description="ADEPT-AE: personal autoencoders theta_i, a global mu and a per-weight "
            "sigma learned by the federation (uses the adept.* settings)",
            strategy="strategies.adept:ADEPT",
            client="client.adept",
            message_types=ADEPT_MESSAGES,
            settings=ADEPT_AE_SETTINGS,
        ),
        AlgorithmSpec(
            name="local",
            description="Local training only: each client keeps its own model, nothing is shared",
            strategy="strategies.local:LocalOnly",
            client="client.local",
            message_types=("train", "evaluate"),
        ),
        AlgorithmSpec(
            name="noop",
            description="No-op exchanges: measures the messaging floor of a runtime",
            strategy="strategies.noop:NoOp",
            client="client.noop",
            message_types=("query.noop",),
            settings=(
                Setting(
                    "noop.payload-kb", 0, "KB of random data each no-op message carries", minimum=0
                ),
            ),
        ),
    )
}

# Sent to every newly seen node before it takes part; answered by client.app directly.
HELLO = "query.hello"


def all_message_types() -> tuple[str, ...]:
    types = {HELLO}
    for spec in ALGORITHMS.values():
        types.update(spec.message_types)
    return tuple(sorted(types))


def get_algorithm(name: str) -> AlgorithmSpec:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise KeyError(
            f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}"
        ) from None
