"""Local training only: every client trains its own model; the server only collects metrics."""

from __future__ import annotations

from pollen import protocol
from strategies.aggregate import aggregate_metrics
from strategies.base import Federation, Strategy


class LocalOnly(Strategy):
    def initialize(self, seed: int) -> None:
        """Nothing global to create."""

    def run_round(self, fed: Federation) -> dict[str, float]:
        payloads = {c.cid: protocol.instruction(fed.server_round, "train") for c in fed.sample()}
        return aggregate_metrics(fed.exchange("train", payloads))

    def finalize(self, fed: Federation) -> dict[str, float]:
        payloads = {
            c.cid: protocol.instruction(fed.server_round, "evaluate") for c in fed.available()
        }
        return aggregate_metrics(fed.exchange("evaluate", payloads))
