"""Clustered FL's contract, shared by its server (strategies.clustered) and its clients
(client.clustered): its settings. Its messages are FedEM's layout (pollen.core.contracts.fedem), one
model per cluster."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pollen.core.settings import SettingsGroup, setting

CLUSTERS = "clusters"
"""Config key of an unseen client's `evaluate` instruction: how many cluster models it holds."""


@dataclass(frozen=True)
class ClusteredSettings(SettingsGroup):
    PREFIX: ClassVar[str] = "clustered"

    tol1: float = setting(
        0.4, "split a cluster only while the norm of its mean update is below this", minimum=0.0
    )
    tol2: float = setting(
        1.6, "split a cluster only while some member's update norm is above this", minimum=0.0
    )
    max_norm: str = setting(
        "l2",
        "the member update norm compared with tol2: 'l2' (official code) or 'coordinate', the "
        "largest absolute entry (FedEM's reference code)",
        choices=("l2", "coordinate"),
    )
    warmup_rounds: int = setting(
        0,
        "rounds before any split is allowed (FedEM's reference: 0; the official code's "
        "example: 20)",
        minimum=0,
    )
