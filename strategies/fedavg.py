"""FedAvg (McMahan et al., 2017): sampled clients train the global model locally; the server
averages their weights, weighted by training examples. FedProx and FedAvg+ share this server
side; only their clients differ."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pollen import protocol
from strategies.aggregate import (
    aggregate_metrics,
    final_evaluation,
    num_examples,
    weighted_average,
)
from strategies.base import Federation
from strategies.classifier import ServerEvaluator, initial_weights
from strategies.global_model import GlobalModelStrategy
from strategies.schedule import learning_rate


class FedAvg(GlobalModelStrategy):
    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self._evaluator = ServerEvaluator(settings)

    def initialize(self, seed: int) -> None:
        self.weights = initial_weights(self.settings, seed)

    def run_round(self, fed: Federation) -> dict[str, float]:
        clients = fed.sample()
        config = {"lr": learning_rate(self.settings, fed.server_round)}
        payloads = {
            c.cid: protocol.instruction(fed.server_round, "train", config, arrays=self.weights)
            for c in clients
        }
        replies = fed.exchange("train", payloads, self.validate)
        models = [protocol.arrays_of(r) for r in replies.values()]
        self.weights = weighted_average(models, [num_examples(r) for r in replies.values()])
        return aggregate_metrics(replies)

    def finalize(self, fed: Federation) -> dict[str, float]:
        config = {"lr": learning_rate(self.settings, self.run.num_rounds)}
        return final_evaluation(
            fed,
            lambda c, new: protocol.instruction(
                fed.server_round, "evaluate", {**config, "unseen": new}, arrays=self.weights
            ),
        )

    def server_evaluate(self) -> dict[str, float]:
        return self._evaluator(self.weights)
