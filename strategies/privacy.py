"""The run's privacy ledger (docs/privacy.md): the server's copy of each client's DP-SGD
ledger (example-level), and the client-level DP account (`client-dp.*`).

As FedSC's server does for its correlation releases, the server keeps its own account of every
client's privacy spending from what it asked: a client instructed to train in a round is
charged that round's DP-SGD steps (pollen.core.contracts.dp_sgd: passes x local-epochs x ceil(n /
batch-size) at sample rate 1 / ceil(n / batch-size)), whether or not its reply arrives, since a
lost reply may still have been computed and sent. The round's metrics carry the largest epsilon
over clients at `dp.delta`; each client's own figure (its ledger in its state, which also counts
rounds replayed after a restart) is in clients.jsonl. The ledger goes into the checkpoint.

Client-level DP (pollen.core.contracts.client_dp) is charged in the same call: with the noise on
the server, one release of the sampled Gaussian mechanism per round (under FedBuff, one per
model version, `version`); with the noise on the clients, one release per client asked to
train. The round's metrics carry `client-epsilon` at
`client-dp.delta` (noise on the clients: the largest over clients). Distributed noise (on the
clients, under secure aggregation) is charged once the round's sum is known (`released`): the
Skellam mechanism with the noise of the clients in the sum, or, for a round without one, the
server's own Gaussian noise; beside `client-epsilon` (with the sampling's amplification,
against readers of the models) the metrics carry `client-epsilon-vs-server` (without it,
against the server, which knows whom it sampled, at the replace-one sensitivity 2C that the
noise on each client is accounted at too: docs/privacy.md#accounting).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pollen.core.contracts import client_dp as client_level
from pollen.core.contracts.dp_sgd import EPSILON, client_dp, shown
from pollen.core.protection import ClientDPSettings, DPSettings
from pollen.core.settings import RunSettings, Scalar, SettingsError
from strategies.base import ClientInfo, Secured

if TYPE_CHECKING:
    from models.privacy import Entry, Release


class PrivacyLedger:
    """Per-client DP-SGD ledgers ([(noise multiplier, sample rate, steps)], as the clients keep
    theirs), charged when the server asks for training, and client-level DP's ledgers (charged
    in the same call); inactive (no metrics, nothing checkpointed) in a run without either.
    `passes`: models each client trains on its data per round (FedEM: its components)."""

    def __init__(self, settings: Mapping[str, Scalar], passes: int = 1) -> None:
        self.settings = settings
        self.passes = passes
        self.delta = DPSettings.of(settings).delta
        self.active = DPSettings.of(settings).enabled
        self.ledgers: dict[int, list[Entry]] = {}
        self.client_level = client_level.mechanism(settings)
        self.released: dict[int, list[Entry]] = {}
        """Client-level DP's ledgers, [(noise multiplier, sample rate, releases)]: by client
        (noise on the clients), or the run's under -1 (on the server; distributed noise: the
        rounds the server noised itself)."""
        self.distributed: list[Release] = []
        """Distributed noise's releases (models.privacy.Release), the rounds that had a sum."""

    def charge(self, clients: Iterable[ClientInfo]) -> None:
        """One round of local training for each of `clients`, at the noise and sample rate of
        its number of examples (a resumed run with more rounds and `dp.target-epsilon`
        calibrates anew: its new rounds are a new entry); one round of client-level DP."""
        clients = list(clients)
        mech = self.client_level
        if mech is None and not self.active:
            return
        from models.privacy import add_steps  # lazy: torch (models)

        # (distributed noise: charged by `secured`; FedBuff's noisy sums: by `version`)
        if mech is not None and not mech.distributed and not mech.buffer:
            for key in [c.cid for c in clients] if mech.local else [-1]:
                self.released[key] = add_steps(self.released.get(key, []), *mech.ledger_entry(1))
        if not self.active:
            return

        for c in clients:
            dp = client_dp(self.settings, c.num_train, self.passes)
            assert dp is not None  # active
            self.ledgers[c.cid] = add_steps(
                self.ledgers.get(c.cid, []), dp.noise_multiplier, dp.plan.sample_rate,
                dp.steps_per_round,
            )  # fmt: skip

    def version(self) -> None:
        """Under FedBuff with the noise on the server, a model version's noisy sum: one
        release, whoever's replies were in it (pollen.core.contracts.client_dp)."""
        mech = self.client_level
        if mech is None or not mech.buffer:
            return
        from models.privacy import add_steps  # lazy: torch (models)

        self.released[-1] = add_steps(self.released.get(-1, []), *mech.ledger_entry(1))

    def secured(self, secured: Secured) -> None:
        """Distributed noise: the round's release, the Skellam mechanism of the sum `secured`
        (with the noise of the clients in it), or for a round without one, the Gaussian noise
        the server added itself; nothing otherwise."""
        mech = self.client_level
        if mech is None or not mech.distributed:
            return
        if secured.release is None:
            from models.privacy import add_steps  # lazy: torch (models)

            self.released[-1] = add_steps(self.released.get(-1, []), *mech.ledger_entry(1))
            return
        entry = mech.release(*secured.release)
        for i, old in enumerate(self.distributed):
            if tuple(old[:4]) == entry:
                self.distributed[i] = (*entry, int(old[4]) + 1)
                return
        self.distributed.append((*entry, 1))

    def steps(self, cid: int) -> int:
        return sum(e[2] for e in self.ledgers.get(cid, []))

    def epsilon(self, cid: int) -> float:
        from models.privacy import epsilon  # lazy: torch (models), opacus

        return epsilon(self.ledgers.get(cid, []), self.delta)

    def client_epsilon(self, amplified: bool = True) -> float:
        """Client-level DP's epsilon so far (local noise: the largest over the clients;
        distributed noise without `amplified`: against the server, every round at rate 1 and,
        as for the noise on each client, with the replace-one sensitivity 2C: the server knows
        whom it asked, so a neighbouring federation replaces a client's data, where against
        the readers of the models one adds or removes a client)."""
        mech = self.client_level
        if mech is not None and mech.distributed:
            from models.privacy import distributed_epsilon  # lazy: torch (models), opacus

            server, releases = self.released.get(-1, []), self.distributed
            if not amplified and mech.sensitivity < 2:  # (over-selection's is 2C already)
                grow = 2.0 / mech.sensitivity
                releases = [(v, grow * l1, grow * l2, q, n) for v, l1, l2, q, n in releases]
                server = [(z / grow, q, n) for z, q, n in server]
            return distributed_epsilon(releases, mech.delta, server, amplified)
        if mech is None or not self.released:
            return 0.0
        from models.privacy import epsilon  # lazy: torch (models), opacus

        return max(epsilon(entries, mech.delta) for entries in self.released.values())

    def metrics(self) -> dict[str, float]:
        """The largest DP-SGD epsilon over clients so far (-1: no guarantee) and the most
        steps; client-level DP's epsilon."""
        out: dict[str, float] = {}
        if self.client_level is not None:
            out[client_level.EPSILON] = shown(self.client_epsilon())
        if self.client_level is not None and self.client_level.distributed:
            out[client_level.EPSILON_VS_SERVER] = shown(self.client_epsilon(amplified=False))
        if not self.active:
            return out
        if not self.ledgers:
            return out | {EPSILON: 0.0, "dp-steps-max": 0.0}
        return out | {
            EPSILON: shown(max(self.epsilon(cid) for cid in self.ledgers)),
            "dp-steps-max": float(max(self.steps(cid) for cid in self.ledgers)),
        }

    def state(self) -> dict[str, Any]:
        """The ledgers for the checkpoint's meta (empty without DP)."""
        out: dict[str, Any] = {}
        if self.client_level is not None:
            out["client-dp-ledgers"] = {
                str(k): [list(e) for e in v] for k, v in self.released.items()
            }
            if self.distributed:
                out["client-dp-distributed"] = [list(e) for e in self.distributed]
        if self.active:
            out["dp-ledgers"] = {str(k): [list(e) for e in v] for k, v in self.ledgers.items()}
        return out

    def load_state(self, meta: Mapping[str, Any]) -> None:
        self.ledgers = {
            int(k): [(float(z), float(q), int(n)) for z, q, n in v]
            for k, v in meta.get("dp-ledgers", {}).items()
        }
        self.released = {
            int(k): [(float(z), float(q), int(n)) for z, q, n in v]
            for k, v in meta.get("client-dp-ledgers", {}).items()
        }
        self.distributed = [
            (float(v), float(l1), float(l2), float(q), int(n))
            for v, l1, l2, q, n in meta.get("client-dp-distributed", [])
        ]
        self._check_budget()

    def _check_budget(self) -> None:
        """A resumed run refuses to go on when the rounds it has left, at today's noise, would
        bring the ledger above `client-dp.max-epsilon` (the check before start-up assumed the
        same noise in every round; a resume may have changed it, with `--rounds` and
        `client-dp.target-epsilon`)."""
        mech, budget = self.client_level, ClientDPSettings.of(self.settings).max_epsilon
        if mech is None or budget <= 0 or not (self.released or self.distributed):
            return
        from models.privacy import add_steps, distributed_epsilon, epsilon  # lazy: opacus

        total = RunSettings.of(self.settings).num_rounds
        worst = 0.0
        if mech.distributed:
            done = sum(e[4] for e in self.distributed) + sum(
                e[2] for e in self.released.get(-1, [])
            )
            planned = [*self.distributed, mech.planned_release(max(total - done, 0))]
            worst = distributed_epsilon(planned, mech.delta, self.released.get(-1, []))
        for entries in [] if mech.distributed else self.released.values():
            left = total - sum(e[2] for e in entries)
            z, q, _ = mech.ledger_entry(0)
            worst = max(worst, epsilon(add_steps(entries, z, q, max(left, 0)), mech.delta))
        if worst > budget:
            raise SettingsError(
                f"client-dp: the rounds spent so far and the {total} rounds planned would spend "
                f"epsilon {worst:.3g} (delta {mech.delta:g}), above the budget "
                f"client-dp.max-epsilon={budget:g}; resume with fewer rounds or more noise"
            )


class SharedNoiseLedger:
    """FedSC's DP-CalR with its noise shared out in secure sums (`fedsc.noise-at=sum`,
    docs/privacy.md): per client, the Skellam mechanism on its weighted matrix in each sum it was
    in, whose noise protecting it is the other clients' shares (a client of the sum knows its own
    share and could take it out), at sample rate 1 (the server knows whom it asked); epsilon by
    models.privacy.distributed_epsilon."""

    def __init__(self, delta: float) -> None:
        self.delta = delta
        self.entries: dict[int, list[Release]] = {}

    def charge(self, cid: int, variance: float, l1: float, l2: float) -> None:
        """One release of client `cid`: noise of `variance` on its term of sensitivities l1, l2
        (encoded units)."""
        entries = self.entries.setdefault(cid, [])
        for i, old in enumerate(entries):
            if tuple(old[:3]) == (variance, l1, l2):
                entries[i] = (variance, l1, l2, 1.0, int(old[4]) + 1)
                return
        entries.append((variance, l1, l2, 1.0, 1))

    def epsilon(self, cid: int, planned: Release | None = None) -> float:
        """Client `cid`'s epsilon so far (and after a `planned` release)."""
        from models.privacy import distributed_epsilon  # lazy: torch (models), opacus

        entries = [*self.entries.get(cid, []), *([planned] if planned else [])]
        return distributed_epsilon(entries, self.delta, amplified=False)

    def state(self) -> dict[str, Any]:
        return {str(k): [list(e) for e in v] for k, v in self.entries.items()}

    def load_state(self, saved: Mapping[str, Any]) -> None:
        self.entries = {
            int(k): [(float(v), float(a), float(b), float(q), int(n)) for v, a, b, q, n in rows]
            for k, rows in saved.items()
        }
