"""FeDLRT's contract, shared by its server (strategies.fedlrt: FeDLRT and FedLin) and its clients
(client.fedlrt): its settings (FedLin reads them too and declares none of its own)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pollen.settings import SettingsGroup, setting


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
