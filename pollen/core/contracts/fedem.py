"""FedEM's contract, shared by its server (strategies.fedem, strategies.dfedem,
strategies.clustered) and its clients (client.fedem, client.clustered): its settings, D-FedEM's,
and the message layout (M models travel as one flat array record)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from pollen.core.settings import SettingsGroup, setting


@dataclass(frozen=True)
class FedEMSettings(SettingsGroup):
    """FedEM's own settings (D-FedEM reads them too)."""

    PREFIX: ClassVar[str] = "fedem"

    components: int = setting(3, "number of mixture components M", minimum=1)
    aggregation: str = setting(
        "stale",
        "under client sampling: 'stale' counts unsampled clients with their copy of the previous "
        "model (reference code); 'renormalize' averages sampled clients only",
        choices=("stale", "renormalize"),
    )
    em_iterations: int = setting(
        100, "EM iterations an unseen client runs on its mixture weights", minimum=1
    )
    em_tolerance: float = setting(
        1e-6, "stop an unseen client's EM when pi changes less than this (L1)", minimum=0.0
    )
    unseen_protocol: str = setting(
        "converge",
        "how an unseen client fits pi: 'converge' runs EM to convergence at the final "
        "evaluation (em-iterations, em-tolerance); 'one-step' is the reference code's protocol, "
        "one EM iteration at each evaluation (before round 1, every unseen-every rounds and at "
        "the final evaluation) warm-started from the pi the client stored at the last one",
        choices=("converge", "one-step"),
    )
    unseen_every: int = setting(
        1,
        "with unseen-protocol=one-step: unseen clients are evaluated (one EM iteration each) "
        "before rounds 1, 1 + unseen-every, 1 + 2 unseen-every, ... (the reference code's "
        "log_freq)",
        minimum=1,
    )


@dataclass(frozen=True)
class DFedEMSettings(SettingsGroup):
    """D-FedEM's own settings (beside FedEM's)."""

    PREFIX: ClassVar[str] = "d-fedem"

    edge_probability: float = setting(
        0.5,
        "edge probability of the Erdős–Rényi communication graph",
        minimum=1e-6,
        maximum=1.0,
    )


def pack(components: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """M models in one flat record: `comp{m}.{state key}`."""
    return {f"comp{m}.{k}": v for m, comp in enumerate(components) for k, v in comp.items()}


def unpack(arrays: dict[str, np.ndarray], num: int) -> list[dict[str, np.ndarray]]:
    out: list[dict[str, np.ndarray]] = [{} for _ in range(num)]
    for key, value in arrays.items():
        head, _, rest = key.partition(".")
        out[int(head.removeprefix("comp"))][rest] = value
    return out
