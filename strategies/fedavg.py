"""FedAvg (McMahan et al., 2017): sampled clients train the global model locally; the server
averages their weights, weighted by training examples. FedProx and FedAvg+ share this server
side; only their clients differ. A robust rule (`robust.*`, docs/robustness.md) combines the
model updates w_i - w instead; client-level DP (`client-dp.*`, docs/privacy.md) makes the
average DP-FedAvg's (McMahan et al., ICLR 2018, Alg. 1). With `async.buffer` the rounds are
FedBuff's model versions (strategies.global_model.buffered_step)."""

from __future__ import annotations

from pollen.core import protocol
from pollen.core.settings import Scalar
from strategies.aggregate import aggregate_metrics, num_examples
from strategies.base import Federation
from strategies.global_classifier import GlobalClassifierStrategy
from strategies.schedule import learning_rate


class FedAvg(GlobalClassifierStrategy):
    def run_round(self, fed: Federation) -> dict[str, float]:
        clients = fed.sample()
        config = {"lr": learning_rate(self.settings, fed.server_round)}
        model = protocol.to_record(self.weights)  # encoded once, the same for every client
        payloads = protocol.to_each(
            (c.cid for c in clients),
            protocol.instruction(fed.server_round, "train", config, arrays=model),
        )
        self.privacy.charge(clients)
        replies = self.train_model(fed, payloads, num_examples)
        return {**aggregate_metrics(replies), **self.privacy.metrics(), **self.combiner.metrics()}

    def buffered_config(self, server_round: int) -> dict[str, Scalar]:
        return {"lr": learning_rate(self.settings, server_round)}
