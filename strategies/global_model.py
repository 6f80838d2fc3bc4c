"""The common shape of a strategy with one global model: its state is the model's arrays."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import RecordDict

from pollen import protocol
from pollen.settings import Scalar
from strategies.aggregate import expect_arrays
from strategies.base import Strategy
from strategies.privacy import PrivacyLedger
from strategies.robust import Combiner


class GlobalModelStrategy(Strategy):
    """A strategy whose whole state is one flat dict of global arrays (FedAvg's model, FedEM's
    packed components): it is what the clients train, checkpoints and final model. With
    DP-SGD, `privacy` holds the server's copy of the clients' privacy ledgers, checkpointed
    beside the weights; `combiner` is the run's (robust) way of combining the clients."""

    def __init__(self, settings: Mapping[str, Scalar]) -> None:
        super().__init__(settings)
        self.weights: dict[str, np.ndarray] = {}
        self.privacy = PrivacyLedger(settings)
        self.combiner = Combiner(settings)

    def validate(self, _cid: int, content: RecordDict) -> None:
        """A training reply must carry exactly the global arrays' keys, shapes and dtypes."""
        expect_arrays(content, protocol.ARRAYS, self.weights)

    def global_arrays(self) -> dict[str, np.ndarray]:
        return self.weights

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return dict(self.weights), self.privacy.state() | self.combiner.state()

    def load_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        self.weights = dict(arrays)
        self.privacy.load_state(meta)
        self.combiner.load_state(meta)
