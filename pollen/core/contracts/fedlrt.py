"""FeDLRT's contract, shared by its server (strategies.fedlrt: FeDLRT and FedLin) and its clients
(client.fedlrt): the phases of a round, the records and keys its messages carry, and its
settings (FedLin reads them too and declares none of its own)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pollen.core.settings import SettingsGroup, setting

# ---- phases (message types), in the order of a round ----------------------------------------
WARM_START = "train.fedlrt_warm_start"
"""Before round 1 (fedlrt.warm-start > 0): the first client's SGD steps on the dense model."""
BASIS = "query.fedlrt_basis"
"""Clients get U, s, V and answer the full local gradients at that point."""
COEF_GRAD = "query.fedlrt_coef_grad"
"""Full variance correction only: clients get the augmented bases and answer the gradient
of the augmented coefficients."""
TRAIN = "train.fedlrt_coef"
"""Clients train the augmented coefficients (with their correction) and answer them."""
FEDLIN_GRAD = "query.fedlin_grad"
"""FedLin's first phase: the full local gradient at the round's start point."""
FEDLIN_TRAIN = "train.fedlin"
"""FedLin's corrected local training."""
EVALUATE = "evaluate"
FEDLRT_PHASES = (WARM_START, BASIS, COEF_GRAD, TRAIN, EVALUATE)
FEDLIN_PHASES = (WARM_START, FEDLIN_GRAD, FEDLIN_TRAIN, EVALUATE)

# ---- records of a message's content, beside the model's arrays -------------------------------
GRADS = "grads"
"""A client's gradients (basis phase: w.r.t. U, V, S and the dense parameters)."""
BASES = "bases"
"""The augmented bases Ubar, Vbar of each factorized layer (`<layer>.Ubar`, `<layer>.Vbar`)."""
CORRECTIONS = "corrections"
"""A client's variance corrections for the train phase."""
MEAN_GRADS = "mean-grads"
"""The train phase's mean gradients G (the same for every client), from which each client
computes its correction G - G_c itself (OWN_CORRECTION), in place of CORRECTIONS."""
START = "start"
"""The point a train phase starts from (S̃ of each layer, the dense parameters), which the
client's reply is an update of (under secure aggregation the clients sum their updates)."""
UBAR, VBAR = "Ubar", "Vbar"
"""Array name suffixes of a layer's augmented bases."""

# ---- configuration keys of an instruction ----------------------------------------------------
VAR_COR = "var-cor"
"""The variance correction of the round ('none', 'simplified', 'full')."""
DENSE_GRADS = "dense-grads"
"""Whether the dense parameters are corrected too (fedlrt.dense-correction)."""
STEPS = "steps"
"""Warm start: the number of SGD steps."""
OWN_CORRECTION = "own-correction"
"""The round's gradients stay with the client, which keeps them in its state for the train
phase: the server sees only their sum (secure aggregation) and sends MEAN_GRADS."""


@dataclass(frozen=True)
class FeDLRTSettings(SettingsGroup):
    """FeDLRT's own settings (FedLin's strategy reads them too)."""

    PREFIX: ClassVar[str] = "fedlrt"

    var_cor: str = setting(
        "simplified",
        "variance correction: 'none' (2 phases), 'simplified' (2 phases, corrects the "
        "non-augmented block), 'full' (3 phases)",
        choices=("none", "simplified", "full"),
    )
    tau: float = setting(
        0.01,
        "truncation tolerance: discarded singular values have norm < tau*||S||_F (relative) or "
        "< tau (absolute)",
        minimum=0.0,
    )
    truncation: str = setting(
        "relative", "truncation threshold mode", choices=("relative", "absolute")
    )
    rank: int = setting(0, "initial rank of every factorized layer (0: the cap)", minimum=0)
    max_rank: int = setting(
        0,
        "rank cap of every factorized layer (0: floor(min(m, n)/2), which augmentation can "
        "always double; up to min(m, n), full rank)",
        minimum=0,
    )
    min_rank: int = setting(1, "smallest rank truncation may leave", minimum=1)
    layers: str = setting(
        "hidden",
        "linear layers to factorize: 'hidden' (all but the output layer), 'all', or "
        "comma-separated module names",
    )
    dense_correction: bool = setting(
        True, "with a variance correction, also correct the dense parameters FedLin-style"
    )
    warm_start: int = setting(
        0,
        "mini-batch SGD steps the first client takes on the dense initial model before round "
        "1, whose result (then factorized) every client starts from (the paper's ResNet-18 "
        "runs: 5); 0: none",
        minimum=0,
    )
