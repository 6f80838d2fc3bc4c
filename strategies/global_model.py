"""The common shape of a strategy with one global model: its state is the model's arrays."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from pollen.core import protocol
from pollen.core.pacing import AsyncSettings
from pollen.core.settings import Scalar
from strategies.aggregate import (
    aggregate_metrics,
    expect_arrays,
    num_examples,
    staleness_weight,
)
from strategies.base import (
    BufferedReply,
    ClientInfo,
    Federation,
    InitialArraysError,
    Strategy,
    layout_mismatch,
)
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
        self.buffering = AsyncSettings.of(settings)
        self._bases: dict[int, tuple[dict[str, np.ndarray], ArrayRecord]] = {}
        """Buffered aggregation: the model each recent round's instructions carried, and its
        record (encoded once), by round: a reply's update is taken against it."""

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

    # ---- buffered asynchronous aggregation (FedBuff) ----------------------------------------
    def buffered_config(self, server_round: int) -> dict[str, Scalar]:
        """The config of a buffered training instruction (the learning rate, for instance)."""
        return {}

    def buffered_instruction(self, client: ClientInfo, server_round: int) -> RecordDict:
        """The newest model, as a synchronous round's `train` instruction carries it; the
        client's training charged to the privacy ledgers."""
        if server_round not in self._bases:
            self._bases[server_round] = (self.weights, protocol.to_record(self.weights))
        self.privacy.charge([client])
        record = self._bases[server_round][1]
        config = self.buffered_config(server_round)
        return protocol.instruction(server_round, "train", config, arrays=record)

    def buffered_check(self, cid: int, content: RecordDict) -> None:
        self.validate(cid, content)

    def buffered_step(self, server_round: int, buffer: Sequence[BufferedReply]) -> dict[str, float]:
        """FedBuff's server step (Nguyen et al., AISTATS 2022, Alg. 1): each reply's update
        against the model it trained from, weighted by its staleness's 1/(1+s)^a, combined
        over the buffer by the run's rule (the mean weighted by examples: sum n_i w_i d_i /
        sum n_i), and the model moved by server-lr times it. With no staleness and server-lr
        1 the step is FedAvg's mean of the buffer's models. Under client-level DP with the
        noise on the server the combination is the noisy sum of the weighted updates, each
        clipped, over the buffer's fixed K (DP-FedAvg's, McMahan et al. 2018), one release of
        the privacy ledger."""
        b = self.buffering
        contributions: dict[int, dict[str, np.ndarray]] = {}
        counts: dict[int, float] = {}
        for r in buffer:
            base = self._bases[r.server_round][0]
            trained = protocol.arrays_of(r.content, copy=False)
            w = staleness_weight(r.staleness, b.staleness_exponent)
            contributions[r.cid] = {
                k: w * (trained[k].astype(np.float64) - base[k]) for k in base
            }
            counts[r.cid] = num_examples(r.content)
        update = self.combine_buffer(server_round, contributions, counts)
        self.privacy.version()
        self.weights = {
            k: (v + b.server_lr * update[k]).astype(v.dtype) for k, v in self.weights.items()
        }
        oldest = server_round + 1 - b.max_staleness  # the next round's stalest usable model
        self._bases = {r: base for r, base in self._bases.items() if r >= oldest}
        stale = [float(r.staleness) for r in buffer]
        return {
            **aggregate_metrics({r.cid: r.content for r in buffer}),
            **self.privacy.metrics(),
            **self.combiner.metrics(),
            "staleness-mean": sum(stale) / max(len(stale), 1),
            "staleness-max": max(stale, default=0.0),
        }

    def combine_buffer(
        self,
        server_round: int,
        contributions: Mapping[int, Mapping[str, np.ndarray]],
        counts: Mapping[int, float],
    ) -> dict[str, np.ndarray]:
        """The buffer's updates combined into one by the run's rule (robust.*); under
        client-level DP noised here, their noisy mean (updates around zero, each clipped)."""
        reference = None
        if self.combiner.server_dp:
            reference = {k: np.zeros(v.shape) for k, v in self.weights.items()}
        return self.combiner.combine(server_round, "buffer", contributions, reference, counts)
