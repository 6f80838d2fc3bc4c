"""The server side of a strategy whose one global model is a classifier the clients train:
its initial model, the final evaluation on every client (the model of the last round, with that
round's learning rate for clients that fine-tune) and the evaluation on the server's test set.
Subclasses add their round: FedAvg's weighted average, SCAFFOLD's control variates."""

from __future__ import annotations

from collections.abc import Mapping

from pollen.core import protocol
from pollen.core.settings import Scalar
from strategies.aggregate import final_evaluation
from strategies.base import Federation
from strategies.classifier import ServerEvaluator, initial_weights
from strategies.global_model import GlobalModelStrategy
from strategies.schedule import learning_rate


class GlobalClassifierStrategy(GlobalModelStrategy):
    def __init__(self, settings: Mapping[str, Scalar]) -> None:
        super().__init__(settings)
        self._evaluator = ServerEvaluator(settings)

    def initialize(self, seed: int) -> None:
        self.weights = initial_weights(self.settings, seed, self.model_fn)

    def finalize(self, fed: Federation) -> dict[str, float]:
        config = {"lr": learning_rate(self.settings, self.run.num_rounds)}
        model = protocol.to_record(self.weights)
        return final_evaluation(
            fed,
            lambda c, new: protocol.instruction(
                fed.server_round, "evaluate", {**config, protocol.UNSEEN: new}, arrays=model
            ),
        )

    def server_evaluate(self) -> dict[str, float]:
        return self._evaluator(self.weights)
