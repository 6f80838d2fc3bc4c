"""ADEPT's contract, shared by its server (strategies.adept) and its clients (client.adept,
client.adept_dgm): its settings (the adept.* ones every variant reads, and each variant's own),
the records mu and sigma, and the rounds in which clients send them back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pollen.core.settings import SettingsGroup, setting

MU, SIGMA = "mu", "sigma"
LR_GLOBAL = "lr-global"
"""Config key of a train instruction: the round's global learning rate."""


@dataclass(frozen=True)
class AdeptSettings(SettingsGroup):
    """The settings of every ADEPT variant (declared by adept-pca; adept-ae and adept-dgm use
    them)."""

    PREFIX: ClassVar[str] = "adept"

    method: str = setting(
        "adept",
        "'adept'; or a baseline in the same framework: 'local' (no prior, nothing shared), "
        "'fedavg' (one global model), 'fedavg-ft' (FedAvg, then local fine-tuning)",
        choices=("adept", "local", "fedavg", "fedavg-ft"),
    )
    sigma_init: float = setting(1.0, "initial sigma (every entry)", minimum=1e-12)
    xi: float = setting(1e-6, "hyper-prior xi: keeps sigma away from 0", minimum=0.0)
    lr_global: float = setting(0.01, "step size eta2 of the client's copy of mu (V)", minimum=0.0)
    lr_sigma: float = setting(1e-3, "step size eta3 of sigma", minimum=0.0)
    tune_round: int = setting(
        0,
        "fedavg-ft: last FedAvg round before local fine-tuning (0: num-rounds // 2)",
        minimum=0,
    )


@dataclass(frozen=True)
class AdeptPCASettings(SettingsGroup):
    """ADEPT-PCA's own settings (beside adept.*)."""

    PREFIX: ClassVar[str] = "adept-pca"

    rank: int = setting(20, "rank r of the learned subspaces", minimum=1)
    noise: float = setting(0.2, "sigma_eps of the probabilistic PCA model", minimum=1e-9)
    d_theta: float = setting(0.0, "d_theta of the sigma prior (0: d * r)", minimum=0.0)
    gradient: str = setting(
        "exact",
        "data-term gradient factor: 'exact' (n) or 'paper' (the printed n/2)",
        choices=("exact", "paper"),
    )


@dataclass(frozen=True)
class AdeptAESettings(SettingsGroup):
    """ADEPT-AE's own settings (beside adept.*; ADEPT-DGM reads them too, all but latent)."""

    PREFIX: ClassVar[str] = "adept-ae"

    latent: int = setting(10, "latent size of the autoencoder", minimum=1)
    architecture: str = setting(
        "linear",
        "autoencoder: 'linear' (Linear-Linear, the paper's MNIST/F-MNIST model) or 'conv' "
        "(conv 3x3 stride 2 -> ReLU -> Linear -> Linear -> transposed conv -> sigmoid, its "
        "CIFAR-10 model)",
        choices=("linear", "conv"),
    )
    local_steps: int = setting(20, "local iterations tau per round", minimum=1)
    prior_scale: float = setting(
        0.0,
        "weight c of the prior beside the per-sample mean loss (0: 1/n_i; authors' code: 0.1)",
        minimum=0.0,
    )
    mu_gradient: str = setting(
        "code",
        "client step of mu: 'code' 2(mu - theta) (authors' code), 'paper' c(mu - theta)/sigma^2",
        choices=("code", "paper"),
    )
    lazy_rounds: int = setting(2, "rounds before sigma starts to move", minimum=0)
    grad_clip: float = setting(
        1.0,
        "l_inf clip of the gradients of theta_i and mu (paper App. F.2, authors' code: 1; 0: "
        "off, Algorithm 1 as printed)",
        minimum=0.0,
    )
    init_decoder: str = setting(
        "random",
        "'random': each client's own random initialisation; 'truth' (dataset ae-synthetic): the "
        "decoder starts at the client's true generator (the paper's Table 1 'Baseline')",
        choices=("random", "truth"),
    )


@dataclass(frozen=True)
class AdeptDGMSettings(SettingsGroup):
    """ADEPT-DGM's own settings (beside adept.* and adept-ae.*)."""

    PREFIX: ClassVar[str] = "adept-dgm"

    diffusion: str = setting(
        "soft",
        "'soft': the authors' released corruption (1 - a) x + a U[0,1) noise and mixing "
        "sampler; 'vp': variance-preserving, cosine schedule, x-prediction, DDIM sampler",
        choices=("soft", "vp"),
    )
    channels: int = setting(32, "UNet widths c and 2c (authors: 32)", minimum=1)
    kernel: int = setting(5, "UNet convolution kernel size (odd; authors: 5)", minimum=1)
    samples: int = setting(200, "images each client samples at the end", minimum=0)
    sample_steps: int = setting(500, "sampler steps (authors: 500)", minimum=1)
    kid_subsets: int = setting(100, "random subsets the KID is averaged over", minimum=1)
    feature_epochs: int = setting(10, "epochs of the KID feature network's training", minimum=1)
    mu_optimizer: str = setting(
        "sgd",
        "optimizer of the client's copy of mu: 'sgd' (ADEPT-AE's plain step), 'adam' (the "
        "authors' DGM code: Adam at adept.lr-global, its moments kept in the client state)",
        choices=("sgd", "adam"),
    )


def shares(adept: AdeptSettings, server_round: int, num_rounds: int) -> bool:
    """Whether clients send mu and sigma back this round (all but local training)."""
    if adept.method == "fedavg-ft":
        return server_round <= tune_round(adept, num_rounds)
    return adept.method != "local"


def tune_round(adept: AdeptSettings, num_rounds: int) -> int:
    """fedavg-ft's last FedAvg round."""
    return adept.tune_round or num_rounds // 2
