"""FedSC's contract, shared by its server (strategies.fedsc) and its clients (client.fedsc): its
settings (which its baselines fedavg-sc, fedavg-simclr and fedavg-byol read too), the baselines'
own, and its record names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pollen.core.settings import SettingsGroup, setting

CORRELATION_PHASE = "query.correlation"
"""The phase before training: clients answer the (DP-protected) correlation matrix R_j of
their representations (paper, Alg. 1)."""
CORRELATION = "correlation"  # record of the correlation reply: {R: (H, H) float32}
OTHERS = "others"  # record of a train instruction: {R: Rbar_{-j}}
OTHERS_SUM = "others-sum"
"""Record of a train instruction under secure aggregation, from which the client computes
Rbar_{-j} itself: {SUM: sum_k q_k R~_k, WEIGHT: [sum_k q_k], OWN: [q_j, 0 when j is not in the
sum], SHARED_ROUND: [the round of the matrices summed]}."""
SUM, WEIGHT, OWN, SHARED_ROUND = "sum", "weight", "own", "round"
R = "r"  # the matrix's name in those records
ALPHA = "alpha"  # config key of a train instruction: the weight of the others' correlation
CLIPPED_FRACTION = "clipped-fraction"  # reply metric: the share of clipped representations


@dataclass(frozen=True)
class FedSCSettings(SettingsGroup):
    """FedSC's own settings (fedavg-sc, fedavg-simclr and fedavg-byol read them too)."""

    PREFIX: ClassVar[str] = "fedsc"

    encoder: str = setting(
        "cnn",
        "backbone: 'cnn' (small, for 28x28/8x8 grayscale; BatchNorm), 'cnn-gn' (the same with "
        "per-sample GroupNorm/LayerNorm: for few classes per client), the paper's "
        "'fixup-resnet20' (SVHN, CIFAR-10) or 'resnet34-cifar' (CIFAR-100)",
        choices=("cnn", "cnn-gn", "fixup-resnet20", "resnet34-cifar"),
    )
    dim: int = setting(64, "representation dimension H (projector output; paper: 512)", minimum=1)
    hidden: int = setting(0, "projector hidden width (0: twice the backbone's)", minimum=0)
    mu: float = setting(
        4.0, "representations are clipped to norm sqrt(mu) (paper: 2-5)", minimum=1e-9
    )
    alpha_schedule: str = setting(
        "linear",
        "'linear': alpha from 1 to alpha-min over the rounds (paper's experiments); 'constant': "
        "alpha-min; 'q': the client's data share q_j (the provable objective)",
        choices=("linear", "constant", "q"),
    )
    alpha_min: float = setting(
        0.2,
        "last alpha of 'linear', value of 'constant'",
        minimum=0.0,
        maximum=1.0,
    )
    share: str = setting(
        "every-round",
        "rounds in which correlation matrices are shared: 'every-round', 'after' (t > "
        "share-after), 'after-even' (t > share-after, t even), 'never'",
        choices=("every-round", "after", "after-even", "never"),
    )
    share_after: int = setting(0, "first rounds without sharing ('after', 'after-even')", minimum=0)
    noise_std: float = setting(
        0.0,
        "DP noise std sigma on every correlation entry (0: no DP)",
        minimum=0.0,
    )
    noise_at: str = setting(
        "client",
        "where DP-CalR's noise is added: 'client' (each release carries sigma), 'sum' (with "
        "secagg.enabled: shared out as integers among the clients of a sharing round, whose "
        "secure sum carries sigma once)",
        choices=("client", "sum"),
    )
    delta: float = setting(
        1e-5, "delta of the reported (epsilon, delta)", minimum=1e-12, maximum=1.0
    )
    epsilon_budget: float = setting(
        0.0,
        "stop a client's releases before its epsilon would exceed this (0: no budget)",
        minimum=0.0,
    )
    sensitivity: str = setting(
        "sqrt2",
        "sensitivity of a release: 'sqrt2' = sqrt(2) mu/|D_j| (replace-one bound), 'paper' = "
        "mu/|D_j|",
        choices=("sqrt2", "paper"),
    )
    passes: int = setting(5, "DP-CalR passes over the local data", minimum=1)
    views_per_pass: int = setting(2, "augmented views per image and pass", minimum=1)
    loss_scale: float = setting(
        2.0,
        "training loss = scale x paper loss (reference code: 2)",
        minimum=0.0,
    )
    grad_clip: float = setting(3.0, "local gradient-norm clipping (0: off)", minimum=0.0)
    weighting: str = setting(
        "examples",
        "weights of clients in R and model averaging: 'examples' (q_j) or 'uniform'",
        choices=("examples", "uniform"),
    )
    knn_k: int = setting(200, "neighbours of the kNN monitor", minimum=1)
    knn_temperature: float = setting(0.1, "temperature of the kNN votes", minimum=1e-6)
    probe_epochs: int = setting(100, "epochs of the final linear probe (paper: 200)", minimum=1)
    probe_lr: float = setting(3e-3, "Adam learning rate of the linear probe", minimum=0.0)


@dataclass(frozen=True)
class SimCLRSettings(SettingsGroup):
    """FedAvg + SimCLR's own settings (beside FedSC's)."""

    PREFIX: ClassVar[str] = "simclr"

    temperature: float = setting(0.5, "temperature of SimCLR's NT-Xent loss", minimum=1e-6)


@dataclass(frozen=True)
class BYOLSettings(SettingsGroup):
    """FedAvg + BYOL's own settings (beside FedSC's)."""

    PREFIX: ClassVar[str] = "byol"

    ema: float = setting(
        0.99,
        "rate of the target network's moving average, per step (paper's code: 0.99)",
        minimum=0.0,
        maximum=1.0,
    )
