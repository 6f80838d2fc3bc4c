"""No-op exchanges, to measure the messaging floor of a runtime.

Setting `noop.payload-kb` makes each instruction carry that many KB of random float32 that the
client echoes back, to see how time grows with bytes."""

from __future__ import annotations

import numpy as np
from flwr.app import RecordDict

from pollen import protocol
from strategies.aggregate import expect_arrays
from strategies.base import Federation, Strategy


class NoOp(Strategy):
    def initialize(self, seed: int) -> None:
        kb = int(self.settings.get("noop.payload-kb", 0))
        rng = np.random.default_rng(seed)
        self.payload = {"blob": rng.standard_normal(kb * 256).astype(np.float32)} if kb else {}

    def run_round(self, fed: Federation) -> dict[str, float]:
        payloads = {
            c.cid: protocol.instruction(fed.server_round, "query.noop", arrays=self.payload)
            if self.payload
            else protocol.instruction(fed.server_round, "query.noop")
            for c in fed.sample()
        }
        replies = fed.exchange("query.noop", payloads, self.validate)
        return {"clients": float(len(replies))}

    def validate(self, _cid: int, content: RecordDict) -> None:
        """The echo must be what was sent (keys, shapes, dtypes)."""
        if self.payload:
            expect_arrays(content, protocol.ARRAYS, self.payload)
