"""The round engine: runs a strategy's rounds over a Flower Grid.

It owns everything a strategy should not: finding clients (server.roster: a `query.hello` to
every new node maps Flower's node ids to stable client ids), sampling, each phase's exchange
(server.exchange: sending each client its instruction, waiting with a timeout, sending again
what went unanswered), checking every reply before the strategy sees it (server.checks),
metrics files, checkpoints and resume. A bad or missing reply is logged and skipped; too few
good replies stop the run with a clear reason.

A node normally hosts one client. A simulated node may host many (setting simulation-nodes): it
answers the hello with a packed reply (pollen.core.protocol.pack), and from then on gets one
packed message per phase carrying the instructions of its clients in that phase; strategies,
metrics, failures and checkpoints see the same per-client replies as with one node per client.
"""

from __future__ import annotations

import logging
import math
import resource
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from flwr.app import RecordDict
from flwr.serverapp import Grid

from pollen.core import protocol
from pollen.core.contracts import client_dp
from pollen.core.contracts import secagg as secagg_contract
from pollen.core.pacing import (
    AsyncSettings,
    HeterogeneitySettings,
    RoundSettings,
    devices,
    reference,
    slowness,
)
from pollen.core.protection import ClientDPSettings, SecAggSettings
from pollen.core.protocol import HELLO
from pollen.core.rundir import (
    COMPLETED,
    FAILED,
    SERVER_LOG,
    Event,
    FinalRecord,
    PhaseReport,
    RoundRow,
    Summary,
)
from pollen.core.settings import RunSettings, Scalar
from server import checkpoint, checks
from server.buffered import BufferedRounds
from server.exchange import Phase, PhaseFailed, grid_call
from server.results import ResultsWriter, brief
from server.roster import Roster
from server.summary import privacy_summary, round_line, threat_summary
from strategies.base import ClientInfo, Fold, Secured, Strategy, Summed, Validator

OWN_DATA = "data_fn"
"""summary.json's `dataset` when the clients loaded a Flower app's own data (pollen.flower)."""

log = logging.getLogger("flwr.pollen")
_T = TypeVar("_T")


__all__ = ["Engine", "PhaseFailed"]


class Engine:
    def __init__(
        self,
        grid: Grid,
        settings: Mapping[str, Scalar],
        strategy: Strategy,
        results: ResultsWriter,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        initial_arrays: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self.grid = grid
        self.initial_arrays = initial_arrays
        """What a fresh run's global model starts from in place of the strategy's own
        initialization (a Flower app's `initial_arrays`, pollen.flower; Strategy.start_from)."""
        self.settings = settings
        self.run_settings = RunSettings.of(settings)
        """The run's common settings, typed (`run` is the method that runs it)."""
        self.strategy = strategy
        self.results = results
        self.clock = clock
        self.sleep = sleep
        self.server_round = 0
        self.rng = np.random.default_rng(self.run_settings.seed)
        dp = ClientDPSettings.of(settings)
        self._poisson: np.random.Generator | None = None
        """Client-level DP's Poisson sampling of clients (noise on the server, or distributed):
        from the engine's generator with `client-dp.reproducible` (checkpointed with it), else
        from the system's entropy."""
        if client_dp.poisson_sampling(settings):
            self._poisson = self.rng if dp.reproducible else np.random.default_rng()
        self.roster = Roster()
        self.typical: dict[str, float] = {}  # message type -> last phase's typical reply time
        self.busy: dict[int, tuple[list[str], str, float]] = {}
        """Nodes still at work on an instruction a paced phase closed without (wall clock): the
        ids sent, which instruction, when (server.exchange.Phase._skip_busy)."""
        self.phases: list[PhaseReport] = []  # the round's phase reports
        # pacing (docs/pacing.md): deadline rounds, over-selection, the clients' devices
        pacing, het = RoundSettings.of(settings), HeterogeneitySettings.of(settings)
        self.deadline = pacing.deadline
        self.over_selection = pacing.over_selection
        self.virtual = het.virtual
        run = self.run_settings
        fleet = devices(settings, run.num_clients, run.seed)
        ref = reference(fleet).example_ms if fleet else 0.0
        self.device_records: list[dict[str, float | str]] = [
            {**d.to_json(), "clock": het.clock, "reference-ms": ref} for d in fleet
        ]
        self.device_slowness: list[float] = [] if self.virtual else slowness(fleet)
        """By client id, on the wall clock: how many times longer its device may take than the
        profile's best (a slow device's instruction is sent again that much later)."""
        self._target: int | None = None
        """The count of valid replies the round's first phase wants (over-selection)."""
        self._secure_sums: dict[tuple[int, str], list[frozenset[int]]] = {}
        """The member sets of the round's secure sums, by (round, phase): a later sum of one
        input differs from them by m clients at least (server.secagg)."""
        self.time = 0.0
        """The run's time when its last round ended (RoundRow.time); a resumed run's starts
        at the checkpoint's."""
        self.buffering = AsyncSettings.of(settings)
        self.buffered: BufferedRounds | None = None
        """FedBuff's model versions in place of synchronous rounds (async.buffer > 0)."""

    # ---- what strategies use -------------------------------------------------------------
    @property
    def first_unseen(self) -> int:
        return self.run_settings.training_clients

    def available(self) -> list[ClientInfo]:
        clients = self.roster.clients
        return [clients[c] for c in sorted(clients) if c < self.first_unseen]

    def unseen(self) -> list[ClientInfo]:
        clients = self.roster.clients
        return [clients[c] for c in sorted(clients) if c >= self.first_unseen]

    def sample(self, clients: Sequence[ClientInfo] | None = None) -> list[ClientInfo]:
        pool = list(self.available() if clients is None else clients)
        if not pool:
            raise PhaseFailed(f"round {self.server_round}: no clients available to sample")
        fraction = self.run_settings.fraction_train
        if fraction < 1 and self._poisson is not None:
            # client-level DP (noise on the server): each client independently, as its
            # privacy analysis assumes (pollen.core.contracts.client_dp); over-selection
            # samples at q (1 + o) and keeps the first ceil(q N) valid replies
            rate = min(1.0, fraction * (1 + self.over_selection))
            sampled = [c for c in pool if self._poisson.random() < rate]
            if self.over_selection > 0:
                self._target = math.ceil(fraction * len(pool))
            return sampled
        want = max(self.run_settings.min_train_clients, math.ceil(fraction * len(pool)))
        want = min(want, len(pool))
        take = want
        if self.over_selection > 0:
            # over-selection: the round's first phase keeps the first `want` valid replies
            take = min(len(pool), math.ceil(want * (1 + self.over_selection)))
            self._target = want
        if take == len(pool):
            return pool
        picked = self.rng.choice(len(pool), size=take, replace=False)
        return [pool[i] for i in sorted(picked)]

    def exchange(
        self,
        message_type: str,
        payloads: Mapping[int, RecordDict],
        validate: Validator | None = None,
        min_replies: int | None = None,
        fold: Fold | None = None,
    ) -> dict[int, RecordDict]:
        target, self._target = self._target, None
        if not payloads:  # nobody to ask (client-level DP's Poisson sample can be empty)
            return {}
        answered, failures = Phase(
            self, message_type, payloads, validate, fold=fold, target=target
        ).run()
        replies = {r.key: r.content for r in answered}
        self.require(message_type, len(replies), len(payloads), failures, min_replies)
        return replies

    def secure_exchange(
        self,
        message_type: str,
        payloads: Mapping[int, RecordDict],
        summed: Summed,
        min_replies: int | None = None,
    ) -> Secured:
        """The phase as a secure sum (server.secagg); nobody asked: an empty sum."""
        from server.secagg import SecureSum  # lazy: cryptography

        if len(payloads) < 2 and self._poisson is not None:
            # client-level DP's Poisson sample can hold fewer than the two clients a sum needs:
            # the round's release is then the server's noise alone (strategies.robust)
            if payloads:
                log.warning(
                    "round %s %s: the Poisson sample holds one client; secure aggregation sums "
                    "two at least, so it is left out of this round", self.server_round,
                    message_type,
                )  # fmt: skip
            return Secured({}, {}, 0.0)
        if not payloads:
            return Secured({}, {}, 0.0)
        target, self._target = self._target, None
        sizes = {cid: info.num_train for cid, info in self.roster.clients.items()}
        key = (self.server_round, message_type)
        self._secure_sums = {k: v for k, v in self._secure_sums.items() if k[0] == key[0]}
        earlier = self._secure_sums.setdefault(key, [])
        secured = SecureSum(
            self,
            message_type,
            payloads,
            summed,
            SecAggSettings.of(self.settings),
            secagg_contract.modulus_bits(self.settings),
            sizes,
            min_replies,
            target,
            earlier,
        ).run()
        earlier.append(frozenset(secured.clients))
        return secured

    def require(
        self,
        message_type: str,
        valid: int,
        asked: int,
        failures: Mapping[int, str],
        min_replies: int | None = None,
    ) -> None:
        """PhaseFailed, with every failed client's reason, when a phase that asked `asked`
        clients got fewer than min-replies (or `min_replies`) valid replies."""
        needed = self.run_settings.min_replies if min_replies is None else min_replies
        if valid < min(needed, asked):
            reasons = "; ".join(f"client {c}: {r}" for c, r in sorted(failures.items()))
            raise PhaseFailed(
                f"round {self.server_round}, phase {message_type}: {valid} valid "
                f"replies of {asked}, at least {min(needed, asked)} needed"
                + (f" ({reasons})" if reasons else "")
            )

    def screen(
        self,
        content: RecordDict,
        message_type: str,
        key: int,
        validate: Validator | None,
        expect_cid: bool = True,
    ) -> str | None:
        """Why a reply must be skipped (None: it may be used): server.checks.screen for this
        round."""
        return checks.screen(
            content, message_type, key, validate, self.server_round, self.run_settings, expect_cid
        )

    def call(self, what: str, call: Callable[[], _T]) -> _T:
        """A Grid call, made again after a transient failure (server.exchange.grid_call)."""
        return grid_call(what, call, self.results, self.server_round, self.sleep)

    # ---- clients -------------------------------------------------------------------------
    def discover(self) -> set[int]:
        """Greet nodes not seen before; drop nodes that left. Returns the nodes online."""
        online = self.call("list nodes", lambda: set(self.grid.get_node_ids()))
        new = self.roster.to_greet(online, self.server_round)
        if not new:
            return online
        hello = {n: protocol.instruction(self.server_round, HELLO) for n in new}
        replies, failures = Phase(self, HELLO, hello, self._check_hello, hello=True).run()
        self.roster.admit(replies, online, self.server_round, self.results)
        self.roster.failed(failures)
        return online

    def _dataset(self, run: RunSettings) -> str:
        """What the clients trained on, for summary.json: the `dataset` setting, unless they
        loaded a Flower app's own data (pollen.flower's data_fn)."""
        return OWN_DATA if self.roster.own_data else run.dataset

    def _check_hello(self, _node: int, content: RecordDict) -> None:
        checks.check_hello(content, self.run_settings.num_clients)

    def wait_for_clients(self) -> None:
        """Wait until every client of the run is connected. Once at least min-available-clients
        are, the run starts without the others as soon as they are seen to be lost (as many
        nodes are online as the run has clients, and each that is no client yet left its hello
        unanswered resend-limit + 1 times), or when wait-for-clients is over; one line (log and
        event `clients-missing`) names who is missing and why. Fewer than min-available-clients
        when wait-for-clients is over: PhaseFailed with the same line."""
        need = self.run_settings.min_available_clients
        want = self.run_settings.num_clients
        deadline = self.clock() + self.run_settings.wait_for_clients
        said = -1
        while True:
            online = self.discover()
            have = len(self.roster.clients)
            if have >= want:
                return
            over = self.clock() >= deadline
            resends = self.run_settings.resend_limit
            if have >= need and (over or self.roster.others_lost(online, want, resends)):
                reason = self.roster.missing(online, want)
                log.warning("round %s: starting with %s", self.server_round, reason)
                self.results.event(
                    Event.CLIENTS_MISSING,
                    round=self.server_round,
                    connected=have,
                    total=want,
                    missing=sorted(set(range(want)) - set(self.roster.clients)),
                    reason=reason,
                )
                return
            if have < need and self.roster.cannot_serve(online, want, resends):
                raise PhaseFailed(
                    f"only {have} of the {need} required clients can connect: "
                    f"{self.roster.missing(online, want)}"
                )
            if have != said:  # what the run waits for, each time it changes
                said = have
                self.results.event(
                    Event.WAITING_FOR_CLIENTS,
                    round=self.server_round,
                    connected=said,
                    needed=need,
                    timeout=self.run_settings.wait_for_clients,
                )
            if over:
                raise PhaseFailed(
                    f"only {have} of the {need} required clients connected within "
                    f"{self.run_settings.wait_for_clients:g} s: {self.roster.missing(online, want)}"
                )
            self.sleep(min(1.0, self.run_settings.poll_interval))


    # ---- the run -------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        settings = dict(self.settings)
        run = self.run_settings
        t0 = self.clock()
        threats = threat_summary(settings)
        if "attack" in threats:
            a = threats["attack"]
            log.warning("simulated attack: clients %s act as %s (evaluation, attack.*)",
                        a["clients"], a["kind"])  # fmt: skip
        try:
            start_round = self._start(settings)
            # a resumed run rewrites config.json once it has completed a round of its own, so a
            # resume that fails leaves the interrupted (or completed) run's files as they were
            pending_config = run.resume
            self.server_round = start_round
            self.wait_for_clients()
            if self.buffering.enabled:
                self.buffered = BufferedRounds(self, self.strategy, self.buffering)
            last: RoundRow | None = None
            for rnd in range(start_round, run.num_rounds + 1):
                row = self._round(rnd, settings)
                if pending_config:
                    self.results.write_config(settings)
                    pending_config = False
                log.info("round %s: %s", rnd, round_line(row.to_json()))
                last = row
            final = self._final() if run.final_eval else None
            model = self.strategy.global_arrays()
            if model is not None:
                self.results.final_model(model)
            privacy = privacy_summary(
                settings, last.train if last else {}, self.strategy.privacy_guarantees()
            )
            summary = Summary(
                status=COMPLETED,
                algorithm=run.algorithm,
                dataset=self._dataset(run),
                rounds=run.num_rounds,
                last_round=last,
                final=final,
                seconds=round(self.clock() - t0, 3),
                clients=sorted(self.roster.clients),
                peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                robust=threats.get("robust"),
                attack=threats.get("attack"),
                privacy=privacy.get("privacy"),
                secure_aggregation=threats.get("secure-aggregation"),
            )
            self.results.summary(summary)
            return summary.to_json()
        except BaseException as exc:
            log.error("the run failed", exc_info=exc)  # the full traceback, in the server log
            self.results.summary(
                Summary(
                    status=FAILED,
                    reason=brief(f"{type(exc).__name__}: {exc}", limit=600),
                    log=str(Path(self.results.dir) / SERVER_LOG),
                    algorithm=run.algorithm,
                    dataset=self._dataset(run),
                    last_completed_round=self.server_round - 1,
                    seconds=round(self.clock() - t0, 3),
                    robust=threats.get("robust"),
                    attack=threats.get("attack"),
                    secure_aggregation=threats.get("secure-aggregation"),
                )
            )
            raise

    def _start(self, settings: Mapping[str, Any]) -> int:
        """The strategy's state from the checkpoint (--resume) or fresh; the first round."""
        if not self.run_settings.resume:
            self.strategy.initialize(self.run_settings.seed)
            if self.initial_arrays:
                self.strategy.start_from(self.initial_arrays)
            self.results.write_config(settings)
            return 1
        ckpt = checkpoint.load(self.results.dir)
        checkpoint.check_compatible(ckpt.settings, settings)
        self.time = ckpt.time
        self.strategy.load_state(ckpt.arrays, ckpt.strategy_meta)
        self.rng.bit_generator.state = ckpt.rng_state
        self.results.truncate_after(ckpt.server_round)
        log.info("resuming after round %s", ckpt.server_round)
        return ckpt.server_round + 1

    def _round(self, rnd: int, settings: Mapping[str, Any]) -> RoundRow:
        """Round `rnd`, written to metrics.jsonl and checkpointed; its row."""
        run = self.run_settings
        self.server_round = rnd
        self.phases = []
        self._target = None
        r0 = self.clock()
        codec0 = protocol.codec_seconds()
        self.results.event(Event.ROUND_START, round=rnd, rounds=run.num_rounds)
        self.discover()
        if self.buffered is not None:
            train = self.buffered.round(rnd)
        else:
            train = self.strategy.run_round(self)
        server_eval = None
        if run.server_eval:
            self.results.event(Event.SERVER_EVAL_START, round=rnd)
            server_eval = self.strategy.server_evaluate()
        seconds = self.clock() - r0
        if self.virtual:  # the devices' time: each phase's, the hello's aside
            seconds_of_devices = sum(p.closed_at or 0.0 for p in self.phases if p.phase != HELLO)
            self.time += seconds_of_devices
        else:
            self.time += seconds
        row = RoundRow(
            round=rnd,
            train=dict(train),
            server_eval=None if server_eval is None else dict(server_eval),
            phases=self.phases,
            time=round(self.time, 4),
            late=sum(len(p.late or ()) for p in self.phases),
            seconds=round(seconds, 4),
            bytes_sent=sum(p.bytes_sent for p in self.phases),
            bytes_received=sum(p.bytes_received for p in self.phases),
            # arrays <-> record bytes in this process (encode instructions, decode replies)
            codec_seconds=round(protocol.codec_seconds() - codec0, 4),
        )
        self.results.round(row)
        self._checkpoint(rnd, settings)
        return row

    def _final(self) -> FinalRecord:
        """The final evaluation after the last round (final-eval)."""
        self.server_round = self.run_settings.num_rounds + 1
        self.phases = []
        self.results.event(Event.FINAL_START, round=self.server_round)
        self.discover()
        # the final evaluation measures every client, the slow ones too: no deadline
        deadline, self.deadline = self.deadline, 0.0
        try:
            evaluation = self.strategy.finalize(self)
        finally:
            self.deadline = deadline
        phases = self.phases
        server_eval = None
        if self.run_settings.server_eval:
            self.results.event(Event.SERVER_EVAL_START, round=self.server_round)
            server_eval = dict(self.strategy.server_evaluate())
        return FinalRecord(dict(evaluation), phases, server_eval)

    def _checkpoint(self, rnd: int, settings: Mapping[str, Any]) -> None:
        arrays, meta = self.strategy.state()
        checkpoint.save(
            Path(self.results.dir),
            checkpoint.Checkpoint(
                server_round=rnd,
                arrays=dict(arrays),
                strategy_meta=dict(meta),
                rng_state=dict(self.rng.bit_generator.state),
                settings=dict(settings),
                time=self.time,
            ),
        )
