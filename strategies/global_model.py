"""The common shape of a strategy with one global model: its state is the model's arrays."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import RecordDict

from pollen.core import protocol
from pollen.core.settings import Scalar
from strategies.aggregate import expect_arrays
from strategies.base import Federation, InitialArraysError, Strategy, layout_mismatch
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

    def start_from(self, arrays: Mapping[str, np.ndarray]) -> None:
        """The global model from `arrays`: the same names and shapes as the model's."""
        reason = layout_mismatch(arrays, self.weights)
        if reason:
            raise InitialArraysError(f"the initial arrays do not fit the model: {reason}")
        self.weights = {k: np.asarray(arrays[k], dtype=v.dtype) for k, v in self.weights.items()}

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return dict(self.weights), self.privacy.state() | self.combiner.state()

    def load_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        self.weights = dict(arrays)
        self.privacy.load_state(meta)
        self.combiner.load_state(meta)

    def train_model(
        self,
        fed: Federation,
        payloads: Mapping[int, RecordDict],
        weight: Callable[[RecordDict], float],
        point: str = "model",
        weighted: bool = True,
    ) -> dict[int, RecordDict]:
        """One `train` exchange whose replies are models of the global arrays' layout, combined
        into the new global model: folded one at a time as they come, in client order, when the
        combiner folds (the weighted mean; client-level DP's noisy mean), else held and
        combined by the robust rule; under secure aggregation, summed as updates around the
        model sent (the server sees only their sum). `weight`: a reply's weight in the mean
        (`weighted`: it is the reply's num-examples, else 1 for every reply); `point`: the
        combination's name (its reproducible draws). The valid replies (folded ones without
        their arrays)."""
        if self.combiner.secure:
            summed = self.combiner.summed(
                {protocol.ARRAYS: self.weights}, {protocol.ARRAYS: protocol.ARRAYS}, weighted
            )
            secured = fed.secure_exchange(
                "train", payloads, summed, min_replies=self.combiner.min_replies()
            )
            combined = self.combiner.secured(
                fed.server_round, point, secured, {protocol.ARRAYS: self.weights}
            )
            self.weights = combined[protocol.ARRAYS]
            self.privacy.secured(secured)
            return secured.replies
        mean = self.combiner.accumulator(fed.server_round, point, self.weights)
        if mean is not None:
            acc = mean

            def fold(_cid: int, reply: RecordDict) -> None:
                acc.add(protocol.arrays_of(reply, copy=False), weight(reply))

            replies = fed.exchange("train", payloads, self.validate,
                                   min_replies=self.combiner.min_replies(), fold=fold)  # fmt: skip
            self.weights = mean.result()
            return replies
        replies = fed.exchange(
            "train", payloads, self.validate, min_replies=self.combiner.min_replies()
        )
        self.weights = self.combiner.combine(
            fed.server_round,
            point,
            {cid: protocol.arrays_of(r) for cid, r in replies.items()},
            self.weights,
            {cid: weight(r) for cid, r in replies.items()},
        )
        return replies
