"""Buffered asynchronous aggregation (FedBuff: Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek,
Huba, "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022;
docs/pacing.md#buffered-asynchronous-aggregation).

The server keeps `async.concurrency` clients training, each on the newest model when it was
sent; every `async.buffer` valid replies make the next model version (the strategy's
`buffered_step`: staleness-weighted updates), which is one round of the run: its row in
metrics.jsonl, its checkpoint, its server evaluation. A reply trained on a model
`async.max-staleness` versions older than the newest or more is dropped as stale. A client
that answered is free again, and is handed the newest model unless it already trained on it
or its reply is in the version being gathered (a version takes at most one reply of each
client).

On the wall clock replies are taken as they come. On the virtual clock
(heterogeneity.clock=virtual) a reply arrives at the virtual time its client was sent plus its
device's time (its `device-seconds`): the earliest is taken once every reply in flight is known,
and the client sent next starts at that time, so a run's versions and times are the same on
any machine.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from flwr.app import Message, RecordDict

from pollen.core import protocol
from pollen.core.pacing import AsyncSettings
from pollen.core.rundir import ClientRow, Event, PhaseReport
from server import checks, exchange
from server.exchange import PhaseFailed, message
from server.results import brief
from strategies.base import BufferedReply, ClientInfo, Strategy

log = logging.getLogger("flwr.pollen")

PHASE = "train"


class Host(exchange.Host, Protocol):
    """What the buffered rounds use of the engine that runs them (server.engine.Engine): what
    a phase uses, and the engine's generator, its time and its clients."""

    rng: np.random.Generator
    time: float

    def available(self) -> list[ClientInfo]: ...


@dataclass
class InFlight:
    """A client training: the round whose model it was sent, when (on the run's clock, and on
    the wall clock for the timeout), and, on the virtual clock, its outcome once pulled."""

    cid: int
    node_id: int
    server_round: int
    sent_at: float
    wall_sent: float
    outcome: RecordDict | str | None = None  # the reply, or why there is none
    arrival: float = math.inf
    received: int = 0  # bytes of array data in its reply


@dataclass
class Version:
    """What one round (model version) has gathered."""

    buffer: list[BufferedReply] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    stale: list[int] = field(default_factory=list)
    sent: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    push_seconds: float = 0.0


class BufferedRounds:
    """The run's rounds as FedBuff's model versions (module docstring)."""

    def __init__(self, host: Host, strategy: Strategy, settings: AsyncSettings) -> None:
        self.host = host
        self.strategy = strategy
        self.settings = settings
        run = host.run_settings
        pool = run.training_clients
        wanted = max(run.min_train_clients, math.ceil(run.fraction_train * pool))
        self.concurrency = min(settings.concurrency or wanted, pool)
        self.flight: dict[str, InFlight] = {}  # message id -> the client it went to
        self.last_round: dict[int, int] = {}  # client -> the round whose model it last trained
        self.now = host.time
        """The run's time (virtual: the devices'); a resumed run's starts at its checkpoint's,
        its clients in flight before the interruption forgotten."""

    # ---- one round: one model version ------------------------------------------------------
    def round(self, server_round: int) -> dict[str, float]:
        host, k = self.host, self.settings.buffer
        started, wall = self.now, host.clock()
        v = Version()
        host.results.event(
            Event.PHASE_START, round=server_round, phase=PHASE, clients=self.concurrency,
            messages=len(self.flight),
        )  # fmt: skip
        self._fill(server_round, v)
        while len(v.buffer) < k:
            flight = self._next(server_round)
            self._settle(server_round, flight, v)
            if len(v.failed) - len(v.stale) >= max(host.run_settings.training_clients, k):
                reasons = "; ".join(f"client {c}: {r}" for c, r in sorted(v.failed.items()))
                raise PhaseFailed(
                    f"round {server_round}, buffered phase {PHASE}: {len(v.failed)} replies "
                    f"failed before {k} valid ones came ({reasons})"
                )
            if len(v.buffer) < k:  # else the next round hands out the new version
                self._fill(server_round, v)
        metrics = self.strategy.buffered_step(server_round, v.buffer)
        self._report(server_round, v, started, wall)
        return metrics

    def _settle(self, server_round: int, flight: InFlight, v: Version) -> None:
        """A client's outcome into the version: a reply to buffer, a stale one, a failure."""
        cid, outcome = flight.cid, flight.outcome
        self.last_round[cid] = flight.server_round
        if isinstance(outcome, str) or outcome is None:
            v.failed[cid] = outcome or "no outcome"
            return
        staleness = server_round - flight.server_round
        if staleness > self.settings.max_staleness:
            v.failed[cid] = (
                f"stale: trained on round {flight.server_round}'s model, {staleness} versions "
                f"old (async.max-staleness {self.settings.max_staleness})"
            )
            v.stale.append(cid)
            return
        v.buffer.append(BufferedReply(cid, outcome, flight.server_round, staleness))
        v.bytes_received += flight.received

    # ---- sending ---------------------------------------------------------------------------
    def _fill(self, server_round: int, v: Version) -> None:
        """Hand the newest model to free clients until `concurrency` are training. A client
        whose reply is in the version being gathered waits for it to be made: a version
        takes at most one reply of each client (a stale reply's client would otherwise train
        on this round's model and could answer into the same buffer)."""
        host = self.host
        busy = {f.cid for f in self.flight.values()}
        buffered = {r.cid for r in v.buffer}
        free = [
            c for c in host.available()
            if c.cid not in busy | buffered and self.last_round.get(c.cid) != server_round
        ]  # fmt: skip
        want = self.concurrency - len(busy)
        if want <= 0 or not free:
            return
        picked = host.rng.choice(len(free), size=min(want, len(free)), replace=False)
        clients = [free[i] for i in sorted(picked)]
        messages = []
        for c in clients:
            content = self.strategy.buffered_instruction(c, server_round)
            if host.device_records:
                content = protocol.with_device(content, host.device_records[c.cid])
            v.bytes_sent += protocol.payload_bytes(content)
            if c.node_id in host.roster.packed:
                content = protocol.pack({c.cid: content})
            messages.append(message(content, c.node_id, PHASE, server_round))
        pushed = host.clock()
        ids = host.call("push", lambda: list(host.grid.push_messages(messages)))
        v.push_seconds += host.clock() - pushed
        sent_at = self.now if host.virtual else pushed
        for c, mid in zip(clients, ids, strict=True):
            self.flight[mid] = InFlight(c.cid, c.node_id, server_round, sent_at, pushed)
        v.sent += len(clients)

    # ---- receiving -------------------------------------------------------------------------
    def _next(self, server_round: int) -> InFlight:
        """The next client whose outcome the round takes: on the wall clock the first to come,
        on the virtual clock the earliest arrival once every client in flight is known."""
        host = self.host
        if not self.flight:
            raise PhaseFailed(
                f"round {server_round}, buffered phase {PHASE}: no client to train (every "
                "connected client trained on this round's model already, or none is connected)"
            )
        waited = 0.0
        while True:
            self._pull()
            self._time_out()
            known = [(mid, f) for mid, f in self.flight.items() if f.outcome is not None]
            if self.host.virtual and len(known) == len(self.flight):
                mid, flight = min(known, key=lambda item: (item[1].arrival, item[1].cid))
                self.now = max(self.now, flight.arrival)
                return self.flight.pop(mid)
            if not self.host.virtual and known:
                mid, flight = min(known, key=lambda item: item[1].arrival)
                return self.flight.pop(mid)
            wait = min(host.run_settings.poll_interval, max(0.005, 0.25 * waited))
            host.sleep(wait)
            waited += wait

    def _pull(self) -> None:
        host = self.host
        pending = [mid for mid, f in self.flight.items() if f.outcome is None]
        if not pending:
            return
        grid = host.grid
        for msg in host.call("pull", lambda: list(grid.pull_messages(pending))):
            flight = self.flight.get(msg.metadata.reply_to_message_id)
            if flight is not None and flight.outcome is None:
                self._take(flight, msg)

    def _take(self, flight: InFlight, msg: Message) -> None:
        host = self.host
        flight.arrival = host.clock()  # the virtual clock's: set below
        if msg.has_error():
            flight.outcome = "error reply: " + brief(msg.error.reason or "")
            return
        content = msg.content
        if flight.node_id in host.roster.packed:
            try:
                parts = protocol.unpack(content)
            except Exception as exc:  # a malformed reply must never stop the server
                flight.outcome = f"invalid packed reply: {exc}"
                return
            if flight.cid not in parts:
                flight.outcome = "no reply in its node's packed reply"
                return
            content = parts[flight.cid]
            reason = protocol.error_of(content)
            if reason is not None:
                flight.outcome = "error: " + brief(reason)
                return
        reason = checks.screen(
            content, PHASE, flight.cid, self.strategy.buffered_check, flight.server_round,
            host.run_settings,
        )  # fmt: skip
        if reason is None and host.virtual:
            seconds = protocol.device_seconds(content)
            if seconds is None:
                reason = f"invalid reply: no valid {protocol.DEVICE_SECONDS} metric"
            else:
                flight.arrival = flight.sent_at + seconds
        if reason is not None:
            flight.outcome = reason
            return
        flight.outcome = content
        flight.received = protocol.payload_bytes(content)

    def _time_out(self) -> None:
        """A client that has not answered within phase-timeout (wall clock) has failed."""
        host = self.host
        timeout = host.run_settings.phase_timeout
        for flight in self.flight.values():
            if flight.outcome is None and host.clock() - flight.wall_sent >= timeout:
                flight.outcome = f"no reply within {timeout:g} s"
                flight.arrival = flight.sent_at if host.virtual else host.clock()

    # ---- the round's report ------------------------------------------------------------------
    def _report(self, server_round: int, v: Version, started: float, wall: float) -> None:
        host = self.host
        for key, reason in sorted(v.failed.items()):
            if key not in v.stale:
                log.warning(
                    "round %s %s: client %s skipped: %s", server_round, PHASE, key, reason
                )
        report = PhaseReport(
            phase=PHASE,
            sent=v.sent,
            valid=len(v.buffer),
            failed={str(k): r for k, r in sorted(v.failed.items())},
            seconds=round(host.clock() - wall, 4),
            push_seconds=round(v.push_seconds, 4),
            bytes_sent=v.bytes_sent,
            bytes_received=v.bytes_received,
            late=sorted(v.stale),
            # the version's time: on the devices' clock, or the wall's
            closed_at=round(self.now - started if host.virtual else host.clock() - wall, 4),
        )
        host.phases.append(report)
        host.results.event(
            Event.PHASE_END, round=server_round, messages=v.sent, **report.to_json(),
            **({"clock": "virtual"} if host.virtual else {}),
        )  # fmt: skip
        for r in sorted(v.buffer, key=lambda r: r.cid):
            metrics = dict(r.content[protocol.METRICS])  # type: ignore[arg-type]
            metrics["staleness"] = r.staleness
            host.results.client(ClientRow(server_round, r.cid, PHASE, metrics))
