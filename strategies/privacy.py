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
from typing import Any

from pollen.contracts.dp_sgd import EPSILON, ClientDP, client_dp, shown
from pollen.settings import DPSettings, Scalar
from strategies.base import ClientInfo


class PrivacyLedger:
    """Per-client DP-SGD steps, charged when the server asks for training; inactive (no
    metrics, nothing checkpointed) in a run without DP-SGD. `passes`: models each client trains
    on its data per round (FedEM: its components)."""

    def __init__(self, settings: Mapping[str, Scalar], passes: int = 1) -> None:
        self.settings = settings
        self.passes = passes
        self.delta = DPSettings.of(settings).delta
        self.active = DPSettings.of(settings).enabled
        self.steps: dict[int, int] = {}
        self.sizes: dict[int, int] = {}

    def _dp(self, cid: int) -> ClientDP:
        dp = client_dp(self.settings, self.sizes.get(cid, 0), self.passes)
        assert dp is not None  # active
        return dp

    def charge(self, clients: Iterable[ClientInfo]) -> None:
        """One round of local training for each of `clients`."""
        if not self.active:
            return
        for c in clients:
            self.sizes[c.cid] = c.num_train
            self.steps[c.cid] = self.steps.get(c.cid, 0) + self._dp(c.cid).steps_per_round

    def epsilon(self, cid: int) -> float:
        from models.privacy import epsilon  # lazy: torch (models), opacus

        dp = self._dp(cid)
        return epsilon([(dp.noise_multiplier, dp.plan.sample_rate, self.steps.get(cid, 0))],
                       self.delta)  # fmt: skip

    def metrics(self) -> dict[str, float]:
        """The largest epsilon over clients so far (-1: no guarantee) and the most steps."""
        if not self.active:
            return {}
        if not self.steps:
            return {EPSILON: 0.0, "dp-steps-max": 0.0}
        return {
            EPSILON: shown(max(self.epsilon(cid) for cid in self.steps)),
            "dp-steps-max": float(max(self.steps.values())),
        }

    def state(self) -> dict[str, Any]:
        """The ledger for the checkpoint's meta (empty without DP-SGD)."""
        if not self.active:
            return {}
        return {
            "dp-steps": {str(k): v for k, v in self.steps.items()},
            "dp-sizes": {str(k): v for k, v in self.sizes.items()},
        }

    def load_state(self, meta: Mapping[str, Any]) -> None:
        self.steps = {int(k): int(v) for k, v in meta.get("dp-steps", {}).items()}
        self.sizes = {int(k): int(v) for k, v in meta.get("dp-sizes", {}).items()}
