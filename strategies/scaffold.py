"""SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1, option II): FedAvg's local SGD with
every gradient corrected by c - c_i, the difference between the server's control variate and
the client's own; the server applies the mean model update and moves c by sum(delta_c)/N.

The server's state is the model x and c (one array per trainable parameter); both go into the
checkpoint. Each client's c_i lives in its state store (client.scaffold). The update rules are
models.scaffold's. A robust rule, or client-level DP, combines (delta_y, delta_c) as one update
per client: one clipping bound covers everything a client sends in a round.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import RecordDict

from models.scaffold import norm, robust_server_update, server_update, zeros_like
from pollen.core import protocol
from pollen.core.contracts.scaffold import CONTROL, CONTROL_DELTA
from pollen.core.settings import Scalar
from strategies.aggregate import aggregate_metrics, expect_arrays, num_examples
from strategies.base import Federation
from strategies.classifier import parameter_keys
from strategies.global_classifier import GlobalClassifierStrategy
from strategies.schedule import learning_rate

GLOBAL_LR = 1.0  # eta_g, the global step of the paper's experiments
_STATE = f"{CONTROL}/"  # checkpoint keys of c (state-dict keys are dotted module paths)
_MODEL = "model/"  # delta_y's keys beside delta_c's in one robust combination


class Scaffold(GlobalClassifierStrategy):
    def __init__(self, settings: Mapping[str, Scalar]) -> None:
        super().__init__(settings)
        self.control: dict[str, np.ndarray] = {}

    def initialize(self, seed: int) -> None:
        super().initialize(seed)
        self.control = zeros_like(self.weights, parameter_keys(self.settings, self.model_fn))

    def validate(self, cid: int, content: RecordDict) -> None:
        """delta_y with the model's keys, shapes and dtypes; delta_c with c's."""
        super().validate(cid, content)
        expect_arrays(content, CONTROL_DELTA, self.control)

    def run_round(self, fed: Federation) -> dict[str, float]:
        clients = fed.sample()
        config = {"lr": learning_rate(self.settings, fed.server_round)}
        model, control = protocol.to_record(self.weights), protocol.to_record(self.control)
        payloads = protocol.to_each(
            (c.cid for c in clients),
            protocol.instruction(
                fed.server_round, "train", config, arrays=model, **{CONTROL: control}
            ),
        )
        self.privacy.charge(clients)
        if self.combiner.secure:
            replies = self._secure_update(fed, payloads)
        elif self.combiner.plain:  # the paper's update, as always
            replies = fed.exchange("train", payloads, self.validate)
            delta_ys = [protocol.arrays_of(r) for r in replies.values()]
            delta_cs = [protocol.arrays_of(r, CONTROL_DELTA) for r in replies.values()]
            self.weights, self.control = server_update(
                self.weights,
                self.control,
                delta_ys,
                delta_cs,
                self.run.training_clients,  # N, connected or not: c is the mean of their c_i
                GLOBAL_LR,
            )
        else:
            replies = fed.exchange(
                "train", payloads, self.validate, min_replies=self.combiner.min_replies()
            )
            self._robust_update(fed.server_round, replies)
        metrics = aggregate_metrics(replies)
        metrics["server-control-norm"] = norm(self.control)
        metrics.update(self.privacy.metrics())
        metrics.update(self.combiner.metrics())
        return metrics

    def _secure_update(
        self, fed: Federation, payloads: Mapping[int, RecordDict]
    ) -> dict[int, RecordDict]:
        """x and c moved under secure aggregation: the server sees only the sums of delta_y and
        of delta_c over the clients (each client once; one update under client-level DP), so
        x moves by their mean and c by their sum / N, the paper's update; under client-level
        DP both means are over the fixed denominator m and carry the noise
        (robust_server_update, as for a robust combination)."""
        zero = {
            protocol.ARRAYS: {k: np.zeros_like(v) for k, v in self.weights.items()},
            CONTROL_DELTA: {k: np.zeros_like(v) for k, v in self.control.items()},
        }
        summed = self.combiner.summed(zero)
        secured = fed.secure_exchange(
            "train", payloads, summed, min_replies=self.combiner.min_replies()
        )
        means = self.combiner.secured(fed.server_round, "updates", secured, zero)
        self.privacy.secured(secured)
        replied = self.combiner.denominator if self.combiner.dp is not None else secured.weight
        self.weights, self.control = robust_server_update(
            self.weights,
            self.control,
            means[protocol.ARRAYS],
            means[CONTROL_DELTA],
            replied,
            self.run.training_clients,
            GLOBAL_LR,
        )
        return secured.replies

    def _robust_update(self, server_round: int, replies: Mapping[int, RecordDict]) -> None:
        """x and c moved by the robust rule's combination of (delta_y, delta_c), taken together
        as one update per client so that a selecting rule (Krum) keeps the same clients for
        both; the control step keeps its |S|/N scale (models.scaffold.robust_server_update)."""
        joint = {
            cid: {f"{_MODEL}{k}": v for k, v in protocol.arrays_of(r).items()}
            | {f"{_STATE}{k}": v for k, v in protocol.arrays_of(r, CONTROL_DELTA).items()}
            for cid, r in replies.items()
        }
        weights = {cid: num_examples(r) for cid, r in replies.items()}
        # under client-level DP (noise on the server) the clients' updates are clipped and
        # noised around 0, and a round may have no reply at all: the zero update gives the shape
        zero = None
        replied: float = len(replies)
        if self.combiner.server_dp:
            zero = {f"{_MODEL}{k}": np.zeros_like(v) for k, v in self.weights.items()} | {
                f"{_STATE}{k}": np.zeros_like(v) for k, v in self.control.items()
            }
            replied = self.combiner.denominator  # the noisy mean is over m = qN clients
        combined = self.combiner.combine(server_round, "updates", joint, zero, weights)
        self.weights, self.control = robust_server_update(
            self.weights,
            self.control,
            {k.removeprefix(_MODEL): v for k, v in combined.items() if k.startswith(_MODEL)},
            {k.removeprefix(_STATE): v for k, v in combined.items() if k.startswith(_STATE)},
            replied,
            self.run.training_clients,
            GLOBAL_LR,
        )

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = dict(self.weights)
        arrays.update({f"{_STATE}{k}": v for k, v in self.control.items()})
        return arrays, self.privacy.state() | self.combiner.state()

    def load_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        self.weights = {k: v for k, v in arrays.items() if not k.startswith(_STATE)}
        self.control = {
            k.removeprefix(_STATE): v for k, v in arrays.items() if k.startswith(_STATE)
        }
        self.privacy.load_state(meta)
        self.combiner.load_state(meta)
