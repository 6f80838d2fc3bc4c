"""No-op exchanges, to measure the messaging floor of a runtime.

Setting `noop.payload-kb` makes each instruction carry that many KB of random float32 that the
client echoes back, to see how time grows with bytes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import RecordDict

from pollen.core import protocol
from pollen.core.contracts.noop import NoOpSettings
from pollen.core.settings import Scalar
from strategies.aggregate import expect_arrays
from strategies.base import Federation, Strategy


class NoOp(Strategy):
    def __init__(self, settings: Mapping[str, Scalar]) -> None:
        super().__init__(settings)
        self.noop = NoOpSettings.of(settings)

    def initialize(self, seed: int) -> None:
        kb = self.noop.payload_kb
        rng = np.random.default_rng(seed)
        self.payload = {"blob": rng.standard_normal(kb * 256).astype(np.float32)} if kb else {}

    def run_round(self, fed: Federation) -> dict[str, float]:
        blob = protocol.to_record(self.payload)
        one = (
            protocol.instruction(fed.server_round, "query.noop", arrays=blob)
            if self.payload
            else protocol.instruction(fed.server_round, "query.noop")
        )
        payloads = protocol.to_each((c.cid for c in fed.sample()), one)
        replies = fed.exchange("query.noop", payloads, self.validate)
        return {"clients": float(len(replies))}

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return dict(self.payload), {}

    def load_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        """The payload of the run being resumed (it is drawn once, in `initialize`)."""
        self.payload = {k: np.asarray(v) for k, v in arrays.items()}

    def validate(self, _cid: int, content: RecordDict) -> None:
        """The echo must be what was sent (keys, shapes, dtypes)."""
        if self.payload:
            expect_arrays(content, protocol.ARRAYS, self.payload)
