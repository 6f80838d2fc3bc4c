"""Algorithm registry: a name resolves here to its server strategy, client handlers and settings.

Entries name their code by import path so that looking an algorithm up imports nothing heavy:
a ClientApp process imports only the handlers of the message it serves. A run's settings (the
common ones of pollen.settings and every algorithm's) are resolved and checked here too.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pollen.settings import COMMON_SETTINGS, Scalar, Setting, SettingsError

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
    uses: tuple[str, ...] = ()
    """Groups of other algorithms' settings this one reads too (`fedem` for D-FedEM)."""
    uses_torch: bool = True
    """Its client handlers import torch (with `client-timing` the ClientApp imports it first, to
    time the import apart)."""

    def setting_groups(self) -> set[str]:
        """The prefixes (`fedem` of `fedem.components`) of every setting this algorithm reads."""
        return {s.key.split(".")[0] for s in self.settings if "." in s.key} | set(self.uses)

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


FEDSC_SETTINGS = (
    Setting(
        "fedsc.encoder",
        "cnn",
        "backbone: 'cnn' (small, for 28x28/8x8 grayscale; BatchNorm), 'cnn-gn' (the same with "
        "per-sample GroupNorm/LayerNorm: for few classes per client), the paper's "
        "'fixup-resnet20' (SVHN, CIFAR-10) or 'resnet34-cifar' (CIFAR-100)",
        choices=("cnn", "cnn-gn", "fixup-resnet20", "resnet34-cifar"),
    ),
    Setting(
        "fedsc.dim", 64, "representation dimension H (projector output; paper: 512)", minimum=1
    ),
    Setting("fedsc.hidden", 0, "projector hidden width (0: twice the backbone's)", minimum=0),
    Setting(
        "fedsc.mu", 4.0, "representations are clipped to norm sqrt(mu) (paper: 2-5)", minimum=1e-9
    ),
    Setting(
        "fedsc.alpha-schedule",
        "linear",
        "'linear': alpha from 1 to alpha-min over the rounds (paper's experiments); 'constant': "
        "alpha-min; 'q': the client's data share q_j (the provable objective)",
        choices=("linear", "constant", "q"),
    ),
    Setting(
        "fedsc.alpha-min",
        0.2,
        "last alpha of 'linear', value of 'constant'",
        minimum=0.0,
        maximum=1.0,
    ),
    Setting(
        "fedsc.share",
        "every-round",
        "rounds in which correlation matrices are shared: 'every-round', 'after' (t > "
        "share-after), 'after-even' (t > share-after, t even), 'never'",
        choices=("every-round", "after", "after-even", "never"),
    ),
    Setting(
        "fedsc.share-after", 0, "first rounds without sharing ('after', 'after-even')", minimum=0
    ),
    Setting(
        "fedsc.noise-std",
        0.0,
        "DP noise std sigma on every correlation entry (0: no DP)",
        minimum=0.0,
    ),
    Setting(
        "fedsc.delta", 1e-5, "delta of the reported (epsilon, delta)", minimum=1e-12, maximum=1.0
    ),
    Setting(
        "fedsc.epsilon-budget",
        0.0,
        "stop a client's releases before its epsilon would exceed this (0: no budget)",
        minimum=0.0,
    ),
    Setting(
        "fedsc.sensitivity",
        "sqrt2",
        "sensitivity of a release: 'sqrt2' = sqrt(2) mu/|D_j| (replace-one bound), 'paper' = "
        "mu/|D_j|",
        choices=("sqrt2", "paper"),
    ),
    Setting("fedsc.passes", 5, "DP-CalR passes over the local data", minimum=1),
    Setting("fedsc.views-per-pass", 2, "augmented views per image and pass", minimum=1),
    Setting(
        "fedsc.loss-scale",
        2.0,
        "training loss = scale x paper loss (reference code: 2)",
        minimum=0.0,
    ),
    Setting("fedsc.grad-clip", 3.0, "local gradient-norm clipping (0: off)", minimum=0.0),
    Setting(
        "fedsc.weighting",
        "examples",
        "weights of clients in R and model averaging: 'examples' (q_j) or 'uniform'",
        choices=("examples", "uniform"),
    ),
    Setting("fedsc.knn-k", 200, "neighbours of the kNN monitor", minimum=1),
    Setting("fedsc.knn-temperature", 0.1, "temperature of the kNN votes", minimum=1e-6),
    Setting("fedsc.probe-epochs", 100, "epochs of the final linear probe (paper: 200)", minimum=1),
    Setting("fedsc.probe-lr", 3e-3, "Adam learning rate of the linear probe", minimum=0.0),
)

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
ADEPT_DGM_SETTINGS = (
    Setting(
        "adept-dgm.diffusion",
        "soft",
        "'soft': the authors' released corruption (1 - a) x + a U[0,1) noise and mixing "
        "sampler; 'vp': variance-preserving, cosine schedule, x-prediction, DDIM sampler",
        choices=("soft", "vp"),
    ),
    Setting("adept-dgm.channels", 32, "UNet widths c and 2c (authors: 32)", minimum=1),
    Setting("adept-dgm.kernel", 5, "UNet convolution kernel size (odd; authors: 5)", minimum=1),
    Setting("adept-dgm.samples", 200, "images each client samples at the end", minimum=0),
    Setting("adept-dgm.sample-steps", 500, "sampler steps (authors: 500)", minimum=1),
    Setting("adept-dgm.kid-subsets", 100, "random subsets the KID is averaged over", minimum=1),
    Setting(
        "adept-dgm.feature-epochs", 10, "epochs of the KID feature network's training", minimum=1
    ),
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
            uses=("fedem",),
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
            name="clustered",
            description="Clustered FL: one model per cluster of clients; a cluster is split in "
            "two by the cosine similarity of its members' updates once they cancel on average",
            strategy="strategies.clustered:Clustered",
            client="client.clustered",
            message_types=("train", "evaluate"),
            settings=(
                Setting(
                    "clustered.tol1",
                    0.4,
                    "split a cluster only while the norm of its mean update is below this",
                    minimum=0.0,
                ),
                Setting(
                    "clustered.tol2",
                    1.6,
                    "split a cluster only while some member's update norm is above this",
                    minimum=0.0,
                ),
                Setting(
                    "clustered.max-norm",
                    "l2",
                    "the member update norm compared with tol2: 'l2' (official code) or "
                    "'coordinate', the largest absolute entry (FedEM's reference code)",
                    choices=("l2", "coordinate"),
                ),
                Setting(
                    "clustered.warmup-rounds",
                    0,
                    "rounds before any split is allowed (FedEM's reference: 0; the official "
                    "code's example: 20)",
                    minimum=0,
                ),
            ),
        ),
        AlgorithmSpec(
            name="fedlrt",
            description="FeDLRT: federated dynamical low-rank training; chosen linear layers "
            "are U S V^T with server-side basis augmentation and SVD truncation, clients train "
            "the augmented coefficients with optional variance correction",
            strategy="strategies.fedlrt:FeDLRT",
            client="client.fedlrt",
            message_types=(
                "query.fedlrt_basis",
                "query.fedlrt_coef_grad",
                "train.fedlrt_coef",
                "evaluate",
            ),
            settings=(
                Setting(
                    "fedlrt.var-cor",
                    "simplified",
                    "variance correction: 'none' (2 phases), 'simplified' (2 phases, corrects "
                    "the non-augmented block), 'full' (3 phases)",
                    choices=("none", "simplified", "full"),
                ),
                Setting(
                    "fedlrt.tau",
                    0.01,
                    "truncation tolerance: discarded singular values have norm < tau*||S||_F "
                    "(relative) or < tau (absolute)",
                    minimum=0.0,
                ),
                Setting(
                    "fedlrt.truncation",
                    "relative",
                    "truncation threshold mode",
                    choices=("relative", "absolute"),
                ),
                Setting(
                    "fedlrt.rank",
                    0,
                    "initial rank of every factorized layer (0: the cap)",
                    minimum=0,
                ),
                Setting(
                    "fedlrt.max-rank",
                    0,
                    "rank cap of every factorized layer (0: floor(min(m, n)/2))",
                    minimum=0,
                ),
                Setting("fedlrt.min-rank", 1, "smallest rank truncation may leave", minimum=1),
                Setting(
                    "fedlrt.layers",
                    "hidden",
                    "linear layers to factorize: 'hidden' (all but the output layer), 'all', "
                    "or comma-separated module names",
                ),
                Setting(
                    "fedlrt.dense-correction",
                    True,
                    "with a variance correction, also correct the dense parameters FedLin-style",
                ),
            ),
        ),
        AlgorithmSpec(
            name="fedlin",
            description="FedLin: local SGD corrected by the difference between the average "
            "and the client's full gradient at the round's start (2 phases)",
            strategy="strategies.fedlrt:FedLin",
            client="client.fedlrt:FEDLIN_HANDLERS",
            message_types=("query.fedlin_grad", "train.fedlin", "evaluate"),
            uses=("fedlrt",),
        ),
        AlgorithmSpec(
            name="fedsc",
            description="FedSC: federated spectral contrastive self-supervised learning; "
            "clients share DP-protected correlation matrices of their representations",
            strategy="strategies.fedsc:FedSC",
            client="client.fedsc",
            message_types=("query.correlation", "train", "evaluate"),
            settings=FEDSC_SETTINGS,
        ),
        AlgorithmSpec(
            name="fedavg-sc",
            description="FedAvg + spectral contrastive loss (FedSC with alpha = 1 and nothing "
            "shared; uses the fedsc.* settings)",
            strategy="strategies.fedsc:FedAvgSC",
            client="client.fedsc",
            message_types=("train", "evaluate"),
            uses=("fedsc",),
        ),
        AlgorithmSpec(
            name="fedavg-simclr",
            description="FedAvg + SimCLR (NT-Xent loss on two views; nothing shared; uses the "
            "fedsc.* encoder, augmentation and evaluation settings)",
            strategy="strategies.fedsc:FedAvgSC",
            client="client.fedsc:SIMCLR_HANDLERS",
            message_types=("train", "evaluate"),
            uses=("fedsc",),
            settings=(
                Setting(
                    "simclr.temperature",
                    0.5,
                    "temperature of SimCLR's NT-Xent loss",
                    minimum=1e-6,
                ),
            ),
        ),
        AlgorithmSpec(
            name="fedavg-byol",
            description="FedAvg + BYOL (online network with predictor, EMA target reset to the "
            "global model each round; nothing shared; uses the fedsc.* encoder, augmentation "
            "and evaluation settings)",
            strategy="strategies.fedsc:FedAvgBYOL",
            client="client.fedsc:BYOL_HANDLERS",
            message_types=("train", "evaluate"),
            uses=("fedsc",),
            settings=(
                Setting(
                    "byol.ema",
                    0.99,
                    "rate of the target network's moving average, per step (paper's code: 0.99)",
                    minimum=0.0,
                    maximum=1.0,
                ),
            ),
        ),
        AlgorithmSpec(
            name="adept-pca",
            description="ADEPT-PCA: personal principal subspaces U_i and a global V on the "
            "Stiefel manifold, tied by a prior whose width sigma is learned",
            strategy="strategies.adept:ADEPTPCA",
            client="client.adept:PCA_HANDLERS",
            message_types=ADEPT_MESSAGES,
            settings=ADEPT_SETTINGS + ADEPT_PCA_SETTINGS,
        ),
        AlgorithmSpec(
            name="adept-ae",
            description="ADEPT-AE: personal autoencoders theta_i, a global mu and a per-weight "
            "sigma learned by the federation (uses the adept.* settings)",
            strategy="strategies.adept:ADEPTAE",
            client="client.adept:AE_HANDLERS",
            message_types=ADEPT_MESSAGES,
            uses=("adept",),
            settings=ADEPT_AE_SETTINGS,
        ),
        AlgorithmSpec(
            name="adept-dgm",
            description="ADEPT-DGM: personal UNet denoisers (diffusion models) theta_i, a global "
            "mu and a per-weight sigma (uses the adept.* settings and adept-ae's local-steps, "
            "prior-scale, mu-gradient, lazy-rounds)",
            strategy="strategies.adept:ADEPTDGM",
            client="client.adept:DGM_HANDLERS",
            message_types=ADEPT_MESSAGES,
            uses=("adept", "adept-ae"),
            settings=ADEPT_DGM_SETTINGS,
        ),
        AlgorithmSpec(
            name="scaffold",
            description="SCAFFOLD: local SGD corrected by control variates c - c_i (server's "
            "minus client's, option II), against client drift; c_i kept in the client state",
            strategy="strategies.scaffold:Scaffold",
            client="client.scaffold",
            message_types=("train", "evaluate"),
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
            uses_torch=False,
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


# ---- a run's settings: the common ones and every algorithm's, resolved and checked ----------


def _by_key(settings: Iterable[Setting]) -> dict[str, Setting]:
    out: dict[str, Setting] = {}
    for s in settings:
        if s.key in out:
            raise ValueError(f"setting '{s.key}' declared twice")
        out[s.key] = s
    return out


def all_settings() -> dict[str, Setting]:
    """Every declared setting: the common ones and each algorithm's own."""
    declared: list[Setting] = list(COMMON_SETTINGS)
    for spec in ALGORITHMS.values():
        declared.extend(spec.settings)
    return _by_key(declared)


def defaults() -> dict[str, Scalar]:
    return {key: s.default for key, s in all_settings().items()}


def resolve(
    overrides: Mapping[str, Any], base: Mapping[str, Any] | None = None
) -> dict[str, Scalar]:
    """Defaults, then `base`, then `overrides`; every key known, every value checked."""
    declared = all_settings()
    out: dict[str, Scalar] = {k: s.default for k, s in declared.items()}
    for layer in (base or {}, overrides):
        for key, value in layer.items():
            if key not in declared:
                raise SettingsError(f"unknown setting '{key}'{_closest(key, declared)}")
            out[key] = declared[key].coerce(value)
    _check_consistency(out)
    return out


def _check_consistency(cfg: Mapping[str, Scalar]) -> None:
    if cfg["algorithm"] not in ALGORITHMS:
        raise SettingsError(
            f"unknown algorithm {cfg['algorithm']!r}{_closest(str(cfg['algorithm']), ALGORITHMS)}"
            f"; known: {', '.join(sorted(ALGORITHMS))}"
        )
    if float(cfg["val-fraction"]) + float(cfg["test-fraction"]) >= 0.95:
        raise SettingsError("val-fraction + test-fraction must leave data to train on (< 0.95)")
    if int(cfg["min-replies"]) > int(cfg["num-clients"]):
        raise SettingsError(
            f"min-replies ({cfg['min-replies']}) exceeds num-clients ({cfg['num-clients']})"
        )
    if int(cfg["min-available-clients"]) > int(cfg["num-clients"]):
        raise SettingsError(
            f"min-available-clients ({cfg['min-available-clients']}) exceeds "
            f"num-clients ({cfg['num-clients']})"
        )


def _closest(name: str, known: Iterable[str]) -> str:
    """' (did you mean X?)' for the nearest known names, or ''."""
    import difflib

    names = list(known)
    close = difflib.get_close_matches(name, names, n=2, cutoff=0.6)
    close += [k for k in names if k.split(".")[-1] == name.split(".")[-1] and k not in close]
    return f" (did you mean {' or '.join(close[:3])}?)" if close else ""


def foreign_settings(algorithm: str, keys: Iterable[str]) -> dict[str, list[str]]:
    """The keys among `keys` that `algorithm` does not read, each with the algorithms that do
    (`fedprox.mu` for `fedavg`: ['fedprox']). Common settings belong to every algorithm."""
    spec = ALGORITHMS.get(algorithm)
    if spec is None:
        return {}
    mine = spec.setting_groups()
    out: dict[str, list[str]] = {}
    for key in keys:
        group = key.split(".")[0] if "." in key else None
        if group is None or group in mine:
            continue
        out[key] = sorted(n for n, a in ALGORITHMS.items() if group in a.setting_groups())
    return out


def from_run_config(run_config: Mapping[str, Any]) -> dict[str, Scalar]:
    """Settings of a running app: Flower's run config, checked like CLI input."""
    declared = all_settings()
    known = {k: v for k, v in run_config.items() if k in declared}
    return resolve(known)
