"""FedEM server (Marfoq et al., 2021): M component models, each averaged over clients with
weights n_t/n (training-set sizes), the same weight for every component.

Under client sampling two behaviours exist: 'renormalize' averages the sampled clients only
(Flower's FedAvg rule); 'stale' is the reference code's rule, in which every training client
counts and unsampled ones contribute their copy of the previous model, so that
theta^k = theta^{k-1} + sum_{t in S_k} (n_t/n) (theta_t^k - theta^{k-1}).

Unseen clients (`unseen-fraction`) never train and are reported apart (`unseen-*`). With
`fedem.unseen-protocol=converge` they are evaluated once, after the last round: they receive the
components and run EM on their mixture weights to convergence. With `one-step` (the reference
code's protocol) they are evaluated before round 1, every `fedem.unseen-every` rounds and after
the last round, each time with the newest components and one EM iteration warm-started from the
pi they stored at the previous evaluation; the round's metrics carry that evaluation (of the
components the round starts from) as `unseen-*`.

With `async.buffer` the rounds are FedBuff's model versions: each component stepped by the
staleness-weighted buffer of the clients' component updates (strategies.global_model), the
mixture weights staying on the clients; `fedem.aggregation` does not apply there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import RecordDict

from pollen.core import protocol
from pollen.core.contracts.fedem import FedEMSettings, pack, unpack
from strategies.aggregate import (
    RunningMean,
    aggregate_metrics,
    final_evaluation,
    num_examples,
    weighted_average,
)
from strategies.base import ClientInfo, Federation, layout_mismatch
from strategies.classifier import initial_weights
from strategies.global_model import GlobalModelStrategy
from strategies.privacy import PrivacyLedger
from strategies.schedule import learning_rate


class FedEM(GlobalModelStrategy):
    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.fedem = FedEMSettings.of(settings)
        self.num = self.fedem.components
        self.privacy = PrivacyLedger(settings, passes=self.num)  # each component spends

    def initialize(self, seed: int) -> None:
        # components must differ, or the E-step can never tell them apart
        self.weights = pack(
            [initial_weights(self.settings, seed + m, self.model_fn) for m in range(self.num)]
        )

    def start_from(self, arrays: Mapping[str, np.ndarray]) -> None:
        """The M packed components (a FedEM model), or one model: the first component's start,
        the others kept as `initialize` drew them (components must start apart, Sec. 3.2)."""
        first = self.components()[0]
        if layout_mismatch(arrays, first):
            super().start_from(arrays)
            return
        components = self.components()
        components[0] = {k: np.asarray(arrays[k], dtype=v.dtype) for k, v in first.items()}
        self.weights = pack(components)

    def components(self) -> list[dict[str, np.ndarray]]:
        return unpack(self.weights, self.num)

    def model_arrays(self) -> list[dict[str, np.ndarray]]:
        """Each component, by the model's own names."""
        return self.components()

    def run_round(self, fed: Federation) -> dict[str, float]:
        unseen = self.evaluate_unseen(fed) if self.unseen_evaluation(fed.server_round) else {}
        pool = fed.available()
        clients = fed.sample(pool)
        config = {"lr": learning_rate(self.settings, fed.server_round)}
        model = protocol.to_record(self.weights)  # encoded once, the same for every client
        payloads = protocol.to_each(
            (c.cid for c in clients),
            protocol.instruction(fed.server_round, "train", config, arrays=model),
        )
        self.privacy.charge(clients)
        if self.combiner.secure:
            return self._secure_round(fed, payloads, pool) | unseen
        if not self.combiner.plain:
            return self._robust_round(fed, payloads, pool) | unseen
        mean = RunningMean()  # each reply folded in as it comes, in client order

        def fold(_cid: int, reply: RecordDict) -> None:
            mean.add(protocol.arrays_of(reply), num_examples(reply))

        replies = fed.exchange("train", payloads, self.validate, fold=fold)
        counts = [num_examples(r) for r in replies.values()]
        if self.fedem.aggregation == "renormalize":
            self.weights = mean.result()
        elif counts:
            self.weights = stale_mix(self.weights, mean.result(), counts,
                                     total=sum(c.num_train for c in pool))  # fmt: skip
        return {**aggregate_metrics(replies), **self.privacy.metrics()} | unseen

    def _secure_round(
        self, fed: Federation, payloads: Mapping[int, RecordDict], pool: list[ClientInfo]
    ) -> dict[str, float]:
        """The round under secure aggregation: the server sees only the sum of the clients'
        M component updates (each component weighted by the client's n_t, one vector per
        client), as the plain round's weighted mean; the mixture weights stay on the clients.
        Under 'stale' aggregation the replies' share of the round is their n over the pool's
        (client-level DP: every client counts once, the expected number over the pool's)."""
        previous = self.weights
        replies = self.train_model(fed, payloads, num_examples, point="components")
        if self.fedem.aggregation == "stale":
            if self.combiner.dp is not None:
                share = self.combiner.denominator / max(len(pool), 1)
            else:
                total = sum(c.num_train for c in pool)
                share = sum(num_examples(r) for r in replies.values()) / max(total, 1)
            self.weights = mix(previous, self.weights, min(share, 1.0))
        return {
            **aggregate_metrics(replies), **self.privacy.metrics(), **self.combiner.metrics()
        }  # fmt: skip

    def _robust_round(
        self, fed: Federation, payloads: Mapping[int, RecordDict], pool: list[ClientInfo]
    ) -> dict[str, float]:
        """The round's training combined by the robust rule, each component on its own (the
        mixture weights stay on the clients); under client-level DP with the noise on the
        server, the M components of a client as one update (clipped together: the client's
        whole contribution of the round). Every client counts once: under 'stale'
        aggregation the replies' share of the round is their number (DP: the expected number)
        over the pool's."""
        previous = self.weights
        if self.combiner.folds or self.combiner.server_dp:  # client-level DP: one update
            replies = self.train_model(fed, payloads, num_examples, point="components")
            mean = self.weights
            combined = self.combiner.denominator if self.combiner.server_dp else len(replies)
            share = combined / max(len(pool), 1)
        else:
            replies = fed.exchange(
                "train", payloads, self.validate, min_replies=self.combiner.min_replies()
            )
            counts = {cid: num_examples(r) for cid, r in replies.items()}
            mine = {cid: unpack(protocol.arrays_of(r), self.num) for cid, r in replies.items()}
            mean = pack([
                self.combiner.combine(fed.server_round, f"component-{m}",
                                      {cid: comps[m] for cid, comps in mine.items()}, start,
                                      counts)
                for m, start in enumerate(self.components())
            ])  # fmt: skip
            share = len(replies) / max(len(pool), 1)
        if self.fedem.aggregation == "renormalize":
            self.weights = mean
        else:
            self.weights = mix(previous, mean, min(share, 1.0))
        return {
            **aggregate_metrics(replies), **self.privacy.metrics(), **self.combiner.metrics()
        }  # fmt: skip

    def buffered_config(self, server_round: int) -> dict[str, Any]:
        return {"lr": learning_rate(self.settings, server_round)}

    def combine_buffer(
        self,
        server_round: int,
        contributions: Mapping[int, Mapping[str, np.ndarray]],
        counts: Mapping[int, float],
    ) -> dict[str, np.ndarray]:
        """The buffer's component updates (the mixture weights stay on the clients): the
        weighted mean of the packed components, or the robust rule on each component; under
        client-level DP noised here, a client's M components as one update (clipped together,
        as in a synchronous round)."""
        if self.combiner.plain or self.combiner.server_dp:
            return super().combine_buffer(server_round, contributions, counts)
        mine = {cid: unpack(dict(c), self.num) for cid, c in contributions.items()}
        return pack([
            self.combiner.combine(server_round, f"buffer-component-{m}",
                                  {cid: comps[m] for cid, comps in mine.items()}, None, counts)
            for m in range(self.num)
        ])  # fmt: skip

    def unseen_evaluation(self, server_round: int) -> bool:
        """Whether the unseen clients are evaluated before this round's training: under the
        one-step protocol before round 1 and every `unseen-every` rounds after it."""
        return (
            self.fedem.unseen_protocol == "one-step"
            and (server_round - 1) % self.fedem.unseen_every == 0
        )

    def evaluate_unseen(self, fed: Federation) -> dict[str, float]:
        """The unseen clients evaluated on the current components (each first takes one EM
        step on its pi), as `unseen-<metric>`; {} when there are none."""
        clients = fed.unseen()
        if not clients:
            return {}
        model = protocol.to_record(self.weights)
        config = {protocol.UNSEEN: True}
        payloads = protocol.to_each(
            (c.cid for c in clients),
            protocol.instruction(fed.server_round, "evaluate", config, arrays=model),
        )
        replies = fed.exchange("evaluate", payloads)
        return {f"unseen-{k}": v for k, v in aggregate_metrics(replies).items()}

    def finalize(self, fed: Federation) -> dict[str, float]:
        model = protocol.to_record(self.weights)
        return final_evaluation(
            fed,
            lambda c, new: protocol.instruction(
                fed.server_round, "evaluate", {protocol.UNSEEN: new}, arrays=model
            ),
        )


def stale_average(
    previous: Mapping[str, np.ndarray],
    models: Iterable[Mapping[str, np.ndarray]],
    counts: list[int],
    total: int,
) -> dict[str, np.ndarray]:
    """theta + sum_t (n_t/n)(theta_t - theta) over the replies, n counting every training
    client; with all clients replying this is the plain n_t-weighted average."""
    if not counts:
        return dict(previous)
    return stale_mix(previous, weighted_average(models, counts), counts, total)


def stale_mix(
    previous: Mapping[str, np.ndarray],
    mean: Mapping[str, np.ndarray],
    counts: list[int],
    total: int,
) -> dict[str, np.ndarray]:
    """`stale_average` given the replies' n_t-weighted mean."""
    if total <= 0 or sum(counts) > total:
        raise ValueError(f"client counts {counts} do not fit the total {total}")
    return mix(previous, mean, sum(counts) / total)


def mix(
    previous: Mapping[str, np.ndarray], mean: Mapping[str, np.ndarray], share: float
) -> dict[str, np.ndarray]:
    """(1 - share) previous + share mean, per array in float64, back in each dtype."""
    out = {}
    for key, old in previous.items():
        value = (1 - share) * old.astype(np.float64) + share * mean[key].astype(np.float64)
        out[key] = value.astype(old.dtype)
    return out
