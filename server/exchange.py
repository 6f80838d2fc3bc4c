"""One phase's exchange: send each client its instruction, wait for the replies, check each,
send again what went unanswered, and report the phase.

One message goes to each node: a simulated node hosting several clients (setting
simulation-nodes) gets theirs packed into one (pollen.core.protocol.pack) and answers packed; the
reply is split back into per-client replies, each checked on its own (server.checks), so
strategies, metrics and failures see the same per-client replies as with one node per client.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import NamedTuple, Protocol, TypeVar

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from pollen.core import protocol
from pollen.core.protocol import HELLO
from pollen.core.rundir import ClientRow, Event, PhaseReport
from pollen.core.settings import RunSettings
from server.resend import Sends, resend_after
from server.results import ResultsWriter, brief
from server.roster import Roster
from strategies.base import Fold, Validator

log = logging.getLogger("flwr.pollen")
_T = TypeVar("_T")

WAITING_NAMED = 5
"""A `phase-progress` event names the clients still awaited when at most this many are."""

GRID_RETRIES = 5
"""Consecutive failures of one Grid call (push, pull, list nodes) taken for transient: Flower's
SuperLink answers HTTP 500 while its SQLite database is locked (`--database`, many SuperNodes on
a loaded machine). The call is made again after GRID_RETRY_WAIT seconds; the next failure is
raised. Repeating them is safe: a pull or a listing reads, and an instruction pushed twice is
answered twice, of which the engine uses the first reply it knows."""
GRID_RETRY_WAIT = 2.0

NOT_REPEATABLE: dict[str, str] = {}
"""Message types that are never sent twice within a phase, with the reason. Every other one is
safe to repeat: the hello reads only the partition's sizes, and every phase's handler computes
its reply from the instruction, the client's state stored before the round
(client.state.StateStore.load) and seeds fixed by run, client and round, so a second answer
equals the first (tests/server/test_resend.py checks this for every algorithm and phase). A
phase listed here waits for its reply up to phase-timeout, as before."""


LATE = "late"
"""How the reason of a client whose reply a paced phase closed without starts."""


class PhaseFailed(RuntimeError):
    """A phase got fewer valid replies than the run requires."""


class Reply(NamedTuple):
    node_id: int
    key: int  # the client id; for a hello to a node of one client, the node id
    content: RecordDict


class Host(Protocol):
    """What a phase uses of the engine that runs it (server.engine.Engine)."""

    grid: Grid
    results: ResultsWriter
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    run_settings: RunSettings
    server_round: int
    roster: Roster
    typical: dict[str, float]  # message type -> its last phase's typical reply time
    phases: list[PhaseReport]  # the round's phase reports
    deadline: float  # round.deadline: seconds a phase waits at most (0: up to phase-timeout)
    virtual: bool  # phases paced by the devices' virtual time (heterogeneity.clock=virtual)
    device_records: list[dict[str, float | str]]  # by client id (empty: no devices)
    device_slowness: list[float]  # by client id, on the wall clock (empty: no devices)
    busy: dict[int, tuple[list[str], str, float]]  # node -> a late instruction's ids, which
    # one, when it was sent

    def call(self, what: str, call: Callable[[], _T]) -> _T: ...

    def require(
        self,
        message_type: str,
        valid: int,
        asked: int,
        failures: Mapping[int, str],
        min_replies: int | None = None,
    ) -> None: ...

    def screen(
        self,
        content: RecordDict,
        message_type: str,
        key: int,
        validate: Validator | None,
        expect_cid: bool = True,
    ) -> str | None: ...


def grid_call(
    what: str,
    call: Callable[[], _T],
    results: ResultsWriter,
    server_round: int,
    sleep: Callable[[float], None],
) -> _T:
    """`call()`, made again after a failure up to GRID_RETRIES times in a row."""
    for attempt in range(GRID_RETRIES + 1):
        try:
            return call()
        except Exception as exc:
            if attempt == GRID_RETRIES:
                raise
            log.warning(
                "round %s: %s failed (%s); trying again in %g s",
                server_round,
                what,
                brief(f"{type(exc).__name__}: {exc}"),
                GRID_RETRY_WAIT,
            )
            results.event(Event.GRID_RETRY, round=server_round, call=what)
            sleep(GRID_RETRY_WAIT)
    raise AssertionError("unreachable")


class Phase:
    """The exchange of one phase: `payloads` by client id (for the hello: by node id). `run()`
    returns the valid replies in client order and the reasons of the clients skipped. With
    `fold`, each valid reply goes to it in client order once every client before it is settled,
    and only its non-array records are kept (Federation.exchange). `record_clients`: each valid
    reply's metrics go to clients.jsonl (not for the stages of a secure sum, which report
    none).

    Paced (docs/pacing.md): the phase closes once `target` clients (default: all) sent valid
    replies, or once the host's deadline passed; the valid replies that came later, and the
    clients still awaited, are late: skipped with a reason starting LATE, and counted in the
    report. On the virtual clock every reply is awaited and each arrives at its device's time
    (its `device-seconds`), by which the same rule picks the replies kept."""

    def __init__(
        self,
        host: Host,
        message_type: str,
        payloads: Mapping[int, RecordDict],
        validate: Validator | None,
        hello: bool = False,
        fold: Fold | None = None,
        record_clients: bool = True,
        target: int | None = None,
        enough: Callable[[set[int]], bool] | None = None,
    ) -> None:
        self.host = host
        self.enough = enough
        """With a `target`: whether the clients of the first `target` replies suffice (a secure
        sum's masked stage: every neighbourhood keeps its threshold); while they do not, the
        phase keeps the next replies in order of arrival too."""
        self.record_clients = record_clients and not hello
        self.message_type = message_type
        self.payloads = payloads
        self.validate = validate
        self.hello = hello
        self.fold = fold
        self.started = host.clock()
        self.target = len(payloads) if target is None else min(target, len(payloads))
        self.deadline = 0.0 if hello else host.deadline
        self.virtual = host.virtual and not hello
        self.paced = self.deadline > 0 or self.target < len(payloads)
        self.arrivals: dict[int, float] = {}  # client -> its valid reply's (virtual) arrival
        self.late: list[int] = []
        self.closed_at: float | None = None  # seconds after the start the phase closed
        devices = () if hello else host.device_records
        slow = () if hello else host.device_slowness
        # one message per node: a node hosting several clients gets theirs packed into one
        self.batches: dict[int, dict[int, RecordDict]] = {}
        self.patience: dict[int, float] = {}  # node -> its slowest device's slowness (> 1)
        self.bytes_sent = 0
        for key, content in payloads.items():
            node_id = key if hello else host.roster.clients[key].node_id
            if devices:
                content = protocol.with_device(content, devices[key])
            if slow and slow[key] > 1:
                self.patience[node_id] = max(self.patience.get(node_id, 1.0), slow[key])
            self.batches.setdefault(node_id, {})[key] = content
            self.bytes_sent += protocol.payload_bytes(content)
        self.messages = []
        for node_id, batch in self.batches.items():
            if node_id in host.roster.packed and not hello:
                content = protocol.pack(batch)
            else:
                (content,) = batch.values()  # a node of one client
            self.messages.append(message(content, node_id, message_type, host.server_round))
        # an unanswered instruction that is safe to repeat is sent again (a reply lost on its
        # way, e.g. to the SuperLink's "database is locked"); of its replies the first is used
        self.repeat = 0 if message_type in NOT_REPEATABLE else host.run_settings.resend_limit
        self.replies: list[Reply] = []
        self.failures: dict[int, str] = {}
        self.busy_keys: set[int] = set()  # clients skipped: their node still busy (_skip_busy)
        self.order = sorted(payloads) if fold is not None else []
        self.settled = 0  # order[:settled] are folded or failed
        self.ready: dict[int, Reply] = {}  # valid, waiting for the clients before them
        self.bytes_received = 0
        self.reported = -1

    def run(self) -> tuple[list[Reply], dict[int, str]]:
        host, run = self.host, self.host.run_settings
        host.results.event(
            Event.PHASE_START,
            round=host.server_round,
            phase=self.message_type,
            clients=len(self.payloads),  # for the hello: the nodes greeted
            messages=len(self.messages),
        )
        if not self.hello and host.busy:
            self._skip_busy()
        self._push()
        waits = run.phase_timeout
        if self.deadline > 0 and not self.virtual:
            waits = min(waits, self.deadline)
        deadline = self.started + waits
        while self.pending:
            pulled = host.call("pull", partial(_pull, host.grid, list(self.pending)))
            for msg in pulled:
                self._take(msg)
            if self.fold is not None and not self.paced:
                self._release()
            self._progress()
            if not self.pending:
                break
            if host.clock() >= deadline:
                break
            if self.paced and not self.virtual and self._has_enough():
                break  # the phase has the replies it wants: the others are late
            if self._send_again():
                break  # every node left was asked repeat + 1 times: greeted again later
            # poll fast first (in-memory simulation answers in milliseconds), then back off in
            # proportion to the time already waited: a reply is picked up at most ~25% late
            # (doubling waits picked it up up to 100% late: 0.5 s instead of 0.25 s per round)
            wait = min(run.poll_interval, max(0.005, 0.25 * (host.clock() - self.started)))
            host.sleep(min(wait, max(0.0, deadline - host.clock())))
        self._give_up()
        if self.paced or self.virtual:
            self._close()
        if self.fold is not None:
            self._release()  # every client is settled now
        if self.late:
            log.info(
                "round %s %s: closed after %.1f %sseconds with %s valid replies; %s late",
                host.server_round,
                self.message_type,
                self.closed_at or 0.0,
                "virtual " if self.virtual else "",
                len(self.arrivals),
                len(self.late),
            )
        for key, reason in sorted(self.failures.items()):
            if key in self.late:
                continue  # counted in the line above and in the report
            log.warning(
                "round %s %s: client %s skipped: %s",
                host.server_round,
                self.message_type,
                key,
                reason,
            )
        self._report()
        # in client order, not arrival order: strategies sum replies in the order given, and
        # float sums in a different order differ in the last bits, which training amplifies
        return sorted(self.replies, key=lambda r: (r.key, r.node_id)), self.failures

    def _skip_busy(self) -> None:
        """Nodes still at work on an instruction a paced phase closed without (on the wall
        clock) are not sent another: it would answer only after working through the late one
        too (a deployed device's whole device time again). A node is free again once that late
        reply has come (pulled here, and left unused), or `phase-timeout` after it was sent (it
        is then asked again, and a node that is gone goes silent as usual); until then its
        clients are late."""
        host, busy = self.host, self.host.busy
        out = {mid: node for node, (ids, *_) in busy.items() for mid in ids}
        for msg in host.call("pull", partial(_pull, host.grid, list(out))):
            busy.pop(out.get(msg.metadata.reply_to_message_id, -1), None)
        now, timeout = host.clock(), host.run_settings.phase_timeout
        for node_id in [n for n, (*_, sent_at) in busy.items() if now - sent_at >= timeout]:
            del busy[node_id]
        skipped = [n for n in self.batches if n in busy]
        for node_id in skipped:
            what = busy[node_id][1]
            for key in self.batches.pop(node_id):
                self.failures[key] = f"{LATE}: its device is still at work on {what}"
                self.busy_keys.add(key)
        if skipped:
            self.messages = [m for m in self.messages if m.metadata.dst_node_id in self.batches]
            self.target = min(self.target, sum(len(b) for b in self.batches.values()))

    def _push(self) -> None:
        host = self.host
        pushed = host.clock()
        message_ids: list[str] = []
        if self.messages:  # (none when every node is still busy)
            message_ids = host.call("push", lambda: list(host.grid.push_messages(self.messages)))
        self.push_seconds = host.clock() - pushed
        self.by_message: dict[str, int] = {}  # message id -> its node (a resent one: two ids)
        for mid, msg in zip(message_ids, self.messages, strict=True):
            self.by_message[mid] = msg.metadata.dst_node_id
        self.pending = set(self.by_message)
        self.sent = Sends(self.messages, message_ids, pushed)

    def _take(self, msg: Message) -> None:
        """One reply pulled: its node's first is used, split into its clients' replies."""
        host = self.host
        mid = msg.metadata.reply_to_message_id
        if mid not in self.pending:
            return  # not a reply to this phase (or a node's second): never mixed in
        node_id = self.by_message[mid]
        self.pending.difference_update(self.sent.ids[node_id])  # its first reply is the one used
        self.sent.answered(node_id, host.clock())
        host.roster.silent.discard(node_id)
        keys = list(self.batches[node_id])
        if msg.has_error():
            log.warning("node %s's error reply, in full: %s", node_id, msg.error.reason)
            error = f"error reply (code {msg.error.code}): " + brief(msg.error.reason or "")
            self.failures.update(dict.fromkeys(keys, error))
            if not self.hello:
                host.roster.forget_node(node_id)
            return
        for key, named, part in self._parts(msg.content, node_id, keys):
            if isinstance(part, str):
                self.failures[key] = part
                continue
            reason = host.screen(part, self.message_type, key, self.validate, named)
            if reason is None and self.virtual:
                reason = self._arrival(key, part)
            elif reason is None:
                self.arrivals[key] = host.clock() - self.started
            if reason is not None:
                self.failures[key] = reason
                continue
            self.bytes_received += protocol.payload_bytes(part)
            if self.fold is None:
                self.replies.append(Reply(node_id, key, part))
            else:
                self.ready[key] = Reply(node_id, key, part)
                # folded now if its turn has come: its arrays, just read by the screening, are
                # still in the CPU's cache (a node's reply can be larger than the cache); a
                # paced phase folds once it knows which replies it keeps
                if not self.paced:
                    self._release()

    def _arrival(self, key: int, part: RecordDict) -> str | None:
        """On the virtual clock: record when the reply arrives (its device-seconds), or why
        it cannot be used."""
        value = protocol.device_seconds(part)
        if value is None:
            return (
                f"invalid reply: no valid {protocol.DEVICE_SECONDS} metric under "
                "heterogeneity.clock=virtual"
            )
        self.arrivals[key] = value
        return None

    def _has_enough(self) -> bool:
        """Whether the valid replies so far are all the phase wants (`target`, and `enough` of
        the first `target` of them and those after them)."""
        if len(self.arrivals) < self.target:
            return False
        return self.enough is None or self.enough(set(self.arrivals))

    def _close(self) -> None:
        """Which valid replies the phase keeps: those that arrived by the deadline, the first
        `target` of them in order of arrival (ties: lower client id first); the others, and
        the clients whose replies had not come, are late (class docstring)."""
        limit = self.deadline if self.deadline > 0 else math.inf
        order = sorted(self.arrivals.items(), key=lambda item: (item[1], item[0]))
        within = [k for k, t in order if t <= limit]
        kept = within[: self.target]
        while self.enough is not None and len(kept) < len(within) and not self.enough(set(kept)):
            kept.append(within[len(kept)])  # (a secure sum's neighbourhoods need more)
        keep = set(kept)
        if len(kept) >= self.target and kept:
            closed = self.arrivals[kept[-1]]
        elif self.deadline > 0:
            closed = self.deadline
        else:
            closed = max(self.arrivals.values(), default=0.0)
        if not self.virtual:
            closed = self.host.clock() - self.started
        self.closed_at = closed
        why = (
            f"late: the phase closed with the {self.target} valid replies it wanted"
            if len(kept) >= self.target
            else f"late: no valid reply within the deadline ({self.deadline:g} s)"
        )
        late = [k for k in self.arrivals if k not in keep]
        late += [k for k, r in self.failures.items() if r.startswith(LATE)]
        for key in late:
            if key not in self.busy_keys:  # (they keep why they were skipped)
                self.failures[key] = why
            self.arrivals.pop(key, None)
            self.ready.pop(key, None)
        self.late = sorted(set(late))
        if self.fold is None:
            self.replies = [r for r in self.replies if r.key not in self.failures]

    def _parts(
        self, content: RecordDict, node_id: int, keys: Sequence[int]
    ) -> list[tuple[int, bool, RecordDict | str]]:
        """A node's reply split into the replies of the clients it answers for, each as (key,
        whether the reply must carry the key as its client id, the reply or the reason it is
        missing). The key is the client id, except for the hello of a node of one client: its
        node id, its client being not known yet. A node hosting several clients answers the
        hello packed, naming them."""
        packed, hello = self.host.roster.packed, self.hello
        if not protocol.is_packed(content):
            if node_id in packed and not hello:
                return [(k, True, "invalid reply: a packed node answered unpacked") for k in keys]
            return [(keys[0], not hello, content)]
        try:
            parts = protocol.unpack(content)
        except Exception as exc:  # a malformed reply must never stop the server
            return [(k, True, f"invalid packed reply: {exc}") for k in keys]
        if hello:
            if not parts:
                return [(k, False, "invalid reply: a packed hello naming no client") for k in keys]
            packed.add(node_id)
            return [(cid, True, _part(part)) for cid, part in parts.items()]
        unasked = sorted(set(parts) - set(keys))
        if unasked:
            log.warning("node %s answered for clients it was not asked: %s", node_id, unasked)
        missing = "no reply in its node's packed reply"
        return [(k, True, _part(parts[k]) if k in parts else missing) for k in keys]

    def _release(self) -> None:
        """Fold the valid replies whose clients before them are all settled."""
        assert self.fold is not None
        while self.settled < len(self.order):
            key = self.order[self.settled]
            if key in self.ready:
                reply = self.ready.pop(key)
                self.fold(key, reply.content)
                self.replies.append(reply._replace(content=protocol.without_arrays(reply.content)))
            elif key not in self.failures:
                break
            self.settled += 1

    def _progress(self) -> None:
        """A `phase-progress` event each time the count of settled clients changes."""
        answered = len(self.replies) + len(self.ready) + len(self.failures)
        if answered == self.reported:
            return
        self.reported = answered
        # the clients the phase still waits for, named when few are left: the stragglers (not
        # for the hello, which knows nodes, not clients, yet). Each pending message holds a
        # client at least, so with more pending than that nothing is listed: a phase of 10,000
        # clients costs no sort per reply
        few = not self.hello and len(self.pending) <= WAITING_NAMED
        batches, by_message = self.batches, self.by_message
        awaited = sorted(k for m in self.pending for k in batches[by_message[m]]) if few else []
        named = 0 < len(awaited) <= WAITING_NAMED
        self.host.results.event(
            Event.PHASE_PROGRESS,
            round=self.host.server_round,
            phase=self.message_type,
            answered=answered,
            total=len(self.payloads),
            valid=len(self.replies) + len(self.ready),
            **({"waiting": awaited} if named else {}),
        )

    def _send_again(self) -> bool:
        """Send again the instructions due for it; True when the hello is to be given up
        (every node left was asked repeat + 1 times)."""
        host, sent = self.host, self.sent
        earlier = host.typical.get(self.message_type)
        after = resend_after(sent, earlier) if self.repeat and sent.waiting else None
        if after is None:
            return False
        again = sent.due(host.clock(), after, self.repeat, self.patience)
        if again:
            self.push_seconds += self._resend(again, after)
            for node_id in again:
                self.by_message[sent.ids[node_id][-1]] = node_id
                self.pending.add(sent.ids[node_id][-1])
            return False
        return self.hello and sent.lost(host.clock(), after, self.repeat)

    def _resend(self, nodes: Sequence[int], after: float) -> float:
        """Send `nodes` their instruction again; returns the seconds the push took."""
        host, sent, message_type = self.host, self.sent, self.message_type
        messages = [
            message(sent.content[n], n, message_type, host.server_round) for n in nodes
        ]
        pushed = host.clock()
        ids = host.call("push", lambda: list(host.grid.push_messages(messages)))
        took = host.clock() - pushed
        for node_id, mid in zip(nodes, ids, strict=True):
            sent.again(node_id, mid, host.clock())
        clients = sorted(k for n in nodes for k in self.batches[n])
        hello = message_type == HELLO
        log.warning(
            "round %s %s: no reply after %.0f s; sent again to %s %s",
            host.server_round,
            message_type,
            after,
            "nodes" if hello else "clients",
            list(nodes) if hello else clients,
        )
        host.results.event(
            Event.RESEND,
            round=host.server_round,
            phase=message_type,
            nodes=list(nodes),
            **({} if hello else {"clients": clients}),
            after=round(after, 1),
        )
        return took

    def _give_up(self) -> None:
        """The clients of the messages still unanswered fail; their nodes are silent."""
        host, sent = self.host, self.sent
        timeout = host.run_settings.phase_timeout
        waited = host.clock() - self.started
        closed = (
            self.paced
            and not self.virtual
            and (self._has_enough() or 0 < self.deadline <= waited < timeout)
        )
        for mid in self.pending:
            node_id = self.by_message[mid]
            times = len(sent.ids[node_id])
            if closed:  # a paced phase closed before this node answered: late, not silent
                reason = LATE
                what = f"round {host.server_round}'s {self.message_type} instruction"
                host.busy[node_id] = (list(sent.ids[node_id]), what, sent.last[node_id])
            elif self.hello and waited < timeout:
                reason = f"no reply to {times} hellos in {waited:.0f} s"
            else:
                reason = f"no reply within {timeout:g} s"
            for key in self.batches[node_id]:
                self.failures.setdefault(key, reason)
            if not closed:
                host.roster.silent.add(node_id)
        if self.hello:
            host.roster.greeted(sent.ids, sent.waiting, self.repeat, host.server_round)
        typical = sent.typical()
        if typical is not None:
            host.typical[self.message_type] = typical

    def _report(self) -> None:
        """The phase's report (in the round's row and a `phase-end` event) and, past the
        hello, each valid reply's metrics in clients.jsonl."""
        host = self.host
        seconds = host.clock() - self.started
        report = PhaseReport(
            phase=self.message_type,
            sent=len(self.payloads),  # clients instructed (messages: fewer when packed)
            valid=len(self.replies),
            failed={str(k): v for k, v in sorted(self.failures.items())},
            seconds=round(seconds, 4),
            push_seconds=round(self.push_seconds, 4),
            bytes_sent=self.bytes_sent,
            bytes_received=self.bytes_received,
            # instructions sent again for want of a reply (by client; the hello: by node)
            resent=self.sent.resent(self.batches) if self.sent.resends else None,
            late=self.late if self.paced or self.virtual else None,
            closed_at=None if self.closed_at is None else round(self.closed_at, 4),
        )
        host.phases.append(report)
        host.results.event(
            Event.PHASE_END,
            round=host.server_round,
            messages=len(self.messages),
            **report.to_json(),
            **({"clock": "virtual"} if self.virtual else {}),
        )
        if self.record_clients:
            for r in sorted(self.replies, key=lambda r: r.key):
                metrics = dict(r.content[protocol.METRICS])  # type: ignore[arg-type]
                host.results.client(ClientRow(host.server_round, r.key, self.message_type, metrics))


def message(content: RecordDict, node_id: int, message_type: str, server_round: int) -> Message:
    return Message(
        content, dst_node_id=node_id, message_type=message_type, group_id=str(server_round)
    )


def _pull(grid: Grid, message_ids: list[str]) -> list[Message]:
    return list(grid.pull_messages(message_ids))


def _part(content: RecordDict) -> RecordDict | str:
    """A client's part of a packed reply, or why it has none (its handler raised)."""
    reason = protocol.error_of(content)
    return content if reason is None else "error: " + brief(reason)
