"""The settings of FedAvg's variants, shared by their server (strategies.fedavg) and their
clients (client.fedavg): FedAvg+ (local fine-tuning before evaluation) and FedProx (a proximal
term). FedAvg itself reads only the common settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pollen.core.settings import SettingsGroup, setting


@dataclass(frozen=True)
class FedAvgPlusSettings(SettingsGroup):
    PREFIX: ClassVar[str] = "fedavg-plus"

    adapt_epochs: int = setting(1, "local epochs of fine-tuning before evaluation", minimum=1)


@dataclass(frozen=True)
class FedProxSettings(SettingsGroup):
    PREFIX: ClassVar[str] = "fedprox"

    mu: float = setting(0.01, "proximal term strength", minimum=0.0)
