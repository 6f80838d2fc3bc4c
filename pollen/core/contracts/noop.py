"""The no-op probe's contract, shared by its server (strategies.noop) and its client
(client.noop): its settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pollen.core.settings import SettingsGroup, setting


@dataclass(frozen=True)
class NoOpSettings(SettingsGroup):
    """The no-op probe's own settings."""

    PREFIX: ClassVar[str] = "noop"

    payload_kb: int = setting(0, "KB of random data each no-op message carries", minimum=0)
