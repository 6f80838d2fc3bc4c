"""The server's copy of each client's DP-SGD privacy ledger (docs/privacy.md).

As FedSC's server does for its correlation releases, the server keeps its own account of every
client's privacy spending from what it asked: a client instructed to train in a round is
charged that round's DP-SGD steps (pollen.contracts.dp_sgd: passes x local-epochs x ceil(n /
batch-size) at sample rate 1 / ceil(n / batch-size)), whether or not its reply arrives, since a
lost reply may still have been computed and sent. The round's metrics carry the largest epsilon
over clients at `dp.delta`; each client's own figure (its ledger in its state, which also counts
rounds replayed after a restart) is in clients.jsonl. The ledger goes into the checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pollen.contracts.dp_sgd import EPSILON, client_dp, shown
from pollen.settings import DPSettings, Scalar
from strategies.base import ClientInfo

if TYPE_CHECKING:
    from models.privacy import Entry


class PrivacyLedger:
    """Per-client DP-SGD ledgers ([(noise multiplier, sample rate, steps)], as the clients keep
    theirs), charged when the server asks for training; inactive (no metrics, nothing
    checkpointed) in a run without DP-SGD. `passes`: models each client trains on its data per
    round (FedEM: its components)."""

    def __init__(self, settings: Mapping[str, Scalar], passes: int = 1) -> None:
        self.settings = settings
        self.passes = passes
        self.delta = DPSettings.of(settings).delta
        self.active = DPSettings.of(settings).enabled
        self.ledgers: dict[int, list[Entry]] = {}

    def charge(self, clients: Iterable[ClientInfo]) -> None:
        """One round of local training for each of `clients`, at the noise and sample rate of
        its number of examples (a resumed run with more rounds and `dp.target-epsilon`
        calibrates anew: its new rounds are a new entry)."""
        if not self.active:
            return
        from models.privacy import add_steps  # lazy: torch (models)

        for c in clients:
            dp = client_dp(self.settings, c.num_train, self.passes)
            assert dp is not None  # active
            self.ledgers[c.cid] = add_steps(
                self.ledgers.get(c.cid, []), dp.noise_multiplier, dp.plan.sample_rate,
                dp.steps_per_round,
            )  # fmt: skip

    def steps(self, cid: int) -> int:
        return sum(e[2] for e in self.ledgers.get(cid, []))

    def epsilon(self, cid: int) -> float:
        from models.privacy import epsilon  # lazy: torch (models), opacus

        return epsilon(self.ledgers.get(cid, []), self.delta)

    def metrics(self) -> dict[str, float]:
        """The largest epsilon over clients so far (-1: no guarantee) and the most steps."""
        if not self.active:
            return {}
        if not self.ledgers:
            return {EPSILON: 0.0, "dp-steps-max": 0.0}
        return {
            EPSILON: shown(max(self.epsilon(cid) for cid in self.ledgers)),
            "dp-steps-max": float(max(self.steps(cid) for cid in self.ledgers)),
        }

    def state(self) -> dict[str, Any]:
        """The ledgers for the checkpoint's meta (empty without DP-SGD)."""
        if not self.active:
            return {}
        return {"dp-ledgers": {str(k): [list(e) for e in v] for k, v in self.ledgers.items()}}

    def load_state(self, meta: Mapping[str, Any]) -> None:
        self.ledgers = {
            int(k): [(float(z), float(q), int(n)) for z, q, n in v]
            for k, v in meta.get("dp-ledgers", {}).items()
        }
