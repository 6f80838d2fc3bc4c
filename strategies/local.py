"""Local training only: every client trains its own model; the server only collects metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pollen.core import protocol
from pollen.core.settings import Scalar
from strategies.aggregate import aggregate_metrics
from strategies.base import Federation, Strategy
from strategies.privacy import PrivacyLedger


class LocalOnly(Strategy):
    def __init__(self, settings: Mapping[str, Scalar]) -> None:
        super().__init__(settings)
        self.privacy = PrivacyLedger(settings)  # with DP-SGD: the clients' ledgers

    def initialize(self, seed: int) -> None:
        """Nothing global to create."""

    def run_round(self, fed: Federation) -> dict[str, float]:
        clients = fed.sample()
        payloads = protocol.to_each(
            (c.cid for c in clients), protocol.instruction(fed.server_round, "train")
        )
        self.privacy.charge(clients)
        return {**aggregate_metrics(fed.exchange("train", payloads)), **self.privacy.metrics()}

    def finalize(self, fed: Federation) -> dict[str, float]:
        payloads = protocol.to_each(
            (c.cid for c in fed.available()), protocol.instruction(fed.server_round, "evaluate")
        )
        return aggregate_metrics(fed.exchange("evaluate", payloads))

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return {}, self.privacy.state()

    def load_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        self.privacy.load_state(meta)
