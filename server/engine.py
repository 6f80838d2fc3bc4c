"""The round engine: runs a strategy's rounds over a Flower Grid.

It owns everything a strategy should not: finding clients (a `query.hello` to every new node
maps Flower's node ids to stable client ids), sampling, sending each client its instruction,
waiting with a timeout, checking every reply before the strategy sees it, metrics files,
checkpoints and resume. A bad or missing reply is logged and skipped; too few good replies stop
the run with a clear reason.

A node normally hosts one client. A simulated node may host many (setting simulation-nodes): it
answers the hello with a packed reply (pollen.core.protocol.pack), and from then on gets one packed
message per phase carrying the instructions of its clients in that phase. The engine splits the
packed reply back into per-client replies and checks each on its own, so strategies, metrics,
failures and checkpoints see the same per-client replies as with one node per client.
"""

from __future__ import annotations

import logging
import math
import resource
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from pollen.core import protocol
from pollen.core.contracts import client_dp, dp_sgd
from pollen.core.protocol import HELLO
from pollen.core.rundir import SERVER_LOG, Event
from pollen.core.settings import (
    AttackSettings,
    ClientDPSettings,
    DPSettings,
    RobustSettings,
    RunSettings,
    Scalar,
)
from server import checkpoint
from server.results import ResultsWriter, brief
from strategies.base import ClientInfo, Fold, InvalidReply, Strategy, Validator

log = logging.getLogger("flwr.pollen")
_T = TypeVar("_T")

WAITING_NAMED = 5
"""A `phase-progress` event names the clients still awaited when at most this many are."""

RESEND_FLOOR = 10.0
"""Least seconds before an unanswered instruction is sent again (a deployed exchange takes 3-6 s
at best: the SuperNode pulls every 3 s)."""
RESEND_FACTOR = 2.0
"""An instruction is sent again once it has waited this many times the phase's typical reply
time (the time by which half of its messages were answered)."""

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


class PhaseFailed(RuntimeError):
    """A phase got fewer valid replies than the run requires."""


class Reply(NamedTuple):
    node_id: int
    key: int  # the client id; for a hello to a node of one client, the node id
    content: RecordDict


class Engine:
    def __init__(
        self,
        grid: Grid,
        settings: Mapping[str, Scalar],
        strategy: Strategy,
        results: ResultsWriter,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.grid = grid
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
        """Client-level DP's Poisson sampling of clients: from the engine's generator with
        `client-dp.reproducible` (checkpointed with it), else from the system's entropy."""
        if dp.enabled and dp.noise_at == "server":
            self._poisson = self.rng if dp.reproducible else np.random.default_rng()
        self._clients: dict[int, ClientInfo] = {}  # by client id
        self._node_cids: dict[int, list[int]] = {}  # node id -> the clients it hosts
        self._packed: set[int] = set()  # nodes hosting several clients (packed messages)
        self._silent: set[int] = set()  # nodes whose last instruction went unanswered
        self._replaced: set[int] = set()  # silent nodes whose client has restarted elsewhere
        self._refused: dict[int, int] = {}  # node -> the client it claimed from a live holder
        self._unanswered: dict[int, int] = {}  # node -> hellos sent that it never answered
        self._gave_up: dict[int, int] = {}  # node -> the round its hello was last given up in
        self._typical: dict[str, float] = {}  # message type -> last phase's typical reply time
        self._phases: list[dict[str, Any]] = []

    # ---- what strategies use -------------------------------------------------------------
    @property
    def first_unseen(self) -> int:
        return self.run_settings.training_clients

    def available(self) -> list[ClientInfo]:
        return [self._clients[c] for c in sorted(self._clients) if c < self.first_unseen]

    def unseen(self) -> list[ClientInfo]:
        return [self._clients[c] for c in sorted(self._clients) if c >= self.first_unseen]

    def sample(self, clients: Sequence[ClientInfo] | None = None) -> list[ClientInfo]:
        pool = list(self.available() if clients is None else clients)
        if not pool:
            raise PhaseFailed(f"round {self.server_round}: no clients available to sample")
        fraction = self.run_settings.fraction_train
        if fraction < 1 and self._poisson is not None:
            # client-level DP (noise on the server): each client independently, as its
            # privacy analysis assumes (pollen.core.contracts.client_dp)
            return [c for c in pool if self._poisson.random() < fraction]
        want = max(self.run_settings.min_train_clients, math.ceil(fraction * len(pool)))
        want = min(want, len(pool))
        if want == len(pool):
            return pool
        picked = self.rng.choice(len(pool), size=want, replace=False)
        return [pool[i] for i in sorted(picked)]

    def exchange(
        self,
        message_type: str,
        payloads: Mapping[int, RecordDict],
        validate: Validator | None = None,
        min_replies: int | None = None,
        fold: Fold | None = None,
    ) -> dict[int, RecordDict]:
        needed = self.run_settings.min_replies if min_replies is None else min_replies
        if not payloads:  # nobody to ask (client-level DP's Poisson sample can be empty)
            return {}
        answered, failures = self._exchange(message_type, payloads, validate, fold=fold)
        replies = {r.key: r.content for r in answered}
        if len(replies) < min(needed, len(payloads)):
            reasons = "; ".join(f"client {c}: {r}" for c, r in sorted(failures.items()))
            raise PhaseFailed(
                f"round {self.server_round}, phase {message_type}: {len(replies)} valid "
                f"replies of {len(payloads)}, at least {min(needed, len(payloads))} needed"
                + (f" ({reasons})" if reasons else "")
            )
        return replies

    # ---- messaging -----------------------------------------------------------------------
    def _exchange(
        self,
        message_type: str,
        payloads: Mapping[int, RecordDict],
        validate: Validator | None,
        hello: bool = False,
        fold: Fold | None = None,
    ) -> tuple[list[Reply], dict[int, str]]:
        """Send `payloads` (by client id; for the hello, by node id) and collect the valid
        replies in client order, and the reasons of the clients skipped. With `fold`, each
        valid reply goes to it in client order once every client before it is settled, and only
        its non-array records are kept (Federation.exchange)."""
        started = self.clock()
        # one message per node: a node hosting several clients gets theirs packed into one
        batches: dict[int, dict[int, RecordDict]] = {}
        bytes_sent = 0
        for key, content in payloads.items():
            node_id = key if hello else self._clients[key].node_id
            batches.setdefault(node_id, {})[key] = content
            bytes_sent += protocol.payload_bytes(content)
        messages = []
        for node_id, batch in batches.items():
            if node_id in self._packed and not hello:
                content = protocol.pack(batch)
            else:
                (content,) = batch.values()  # a node of one client
            messages.append(self._message(content, node_id, message_type))
        self.results.event(
            Event.PHASE_START,
            round=self.server_round,
            phase=message_type,
            clients=len(payloads),  # for the hello: the nodes greeted
            messages=len(messages),
        )
        pushed = self.clock()
        message_ids = self._grid("push", lambda: list(self.grid.push_messages(messages)))
        push_seconds = self.clock() - pushed
        by_message: dict[str, int] = {}  # message id -> its node (a resent one: two ids)
        for mid, msg in zip(message_ids, messages, strict=True):
            by_message[mid] = msg.metadata.dst_node_id
        pending = set(by_message)
        # an unanswered instruction that is safe to repeat is sent again (a reply lost on its
        # way, e.g. to the SuperLink's "database is locked"); of its replies the first is used
        repeat = 0 if message_type in NOT_REPEATABLE else self.run_settings.resend_limit
        sent = _Sends(messages, message_ids, pushed)
        replies: list[Reply] = []
        failures: dict[int, str] = {}
        order = sorted(payloads) if fold is not None else []
        settled = 0  # order[:settled] are folded or failed
        ready: dict[int, Reply] = {}  # valid, waiting for the clients before them

        def release() -> None:
            nonlocal settled
            assert fold is not None
            while settled < len(order):
                key = order[settled]
                if key in ready:
                    reply = ready.pop(key)
                    fold(key, reply.content)
                    replies.append(reply._replace(content=protocol.without_arrays(reply.content)))
                elif key not in failures:
                    break
                settled += 1

        bytes_received = 0
        deadline = started + self.run_settings.phase_timeout
        poll = self.run_settings.poll_interval
        reported = -1
        while pending:
            pulled = self._grid("pull", partial(_pull, self.grid, list(pending)))
            for msg in pulled:
                mid = msg.metadata.reply_to_message_id
                if mid not in pending:
                    continue  # not a reply to this phase (or a node's second): never mixed in
                node_id = by_message[mid]
                pending.difference_update(sent.ids[node_id])  # its first reply is the one used
                sent.answered(node_id, self.clock())
                self._silent.discard(node_id)
                keys = list(batches[node_id])
                if msg.has_error():
                    log.warning("node %s's error reply, in full: %s", node_id, msg.error.reason)
                    error = f"error reply (code {msg.error.code}): " + brief(msg.error.reason or "")
                    failures.update(dict.fromkeys(keys, error))
                    if not hello:
                        self._forget_node(node_id)
                    continue
                for key, named, part in self._parts(msg.content, node_id, keys, hello):
                    if isinstance(part, str):
                        failures[key] = part
                        continue
                    reason = self.screen(part, message_type, key, validate, named)
                    if reason is not None:
                        failures[key] = reason
                        continue
                    bytes_received += protocol.payload_bytes(part)
                    if fold is None:
                        replies.append(Reply(node_id, key, part))
                    else:
                        ready[key] = Reply(node_id, key, part)
            if fold is not None:
                release()
            answered = len(replies) + len(ready) + len(failures)
            if answered != reported:
                reported = answered
                # the clients the phase still waits for, named when few are left: the
                # stragglers (not for the hello, which knows nodes, not clients, yet). Each
                # pending message holds a client at least, so with more pending than that
                # nothing is listed: a phase of 10,000 clients costs no sort per reply
                few = not hello and len(pending) <= WAITING_NAMED
                awaited = sorted(k for m in pending for k in batches[by_message[m]]) if few else []
                named = 0 < len(awaited) <= WAITING_NAMED
                self.results.event(
                    Event.PHASE_PROGRESS,
                    round=self.server_round,
                    phase=message_type,
                    answered=answered,
                    total=len(payloads),
                    valid=len(replies) + len(ready),
                    **({"waiting": awaited} if named else {}),
                )
            if not pending:
                break
            if self.clock() >= deadline:
                break
            after = self._resend_after(message_type, sent) if repeat and sent.waiting else None
            if after is not None:
                again = sent.due(self.clock(), after, repeat)
                if again:
                    push_seconds += self._resend(message_type, again, after, sent, batches)
                    for node_id in again:
                        by_message[sent.ids[node_id][-1]] = node_id
                        pending.add(sent.ids[node_id][-1])
                elif hello and sent.lost(self.clock(), after, repeat):
                    break  # every node left was asked repeat + 1 times: greeted again later
            # poll fast first (in-memory simulation answers in milliseconds), then back off in
            # proportion to the time already waited: a reply is picked up at most ~25% late
            # (doubling waits picked it up up to 100% late: 0.5 s instead of 0.25 s per round)
            wait = min(poll, max(0.005, 0.25 * (self.clock() - started)))
            self.sleep(min(wait, max(0.0, deadline - self.clock())))
        timeout = self.run_settings.phase_timeout
        waited = self.clock() - started
        for mid in pending:
            node_id = by_message[mid]
            times = len(sent.ids[node_id])
            if hello and waited < timeout:
                reason = f"no reply to {times} hellos in {waited:.0f} s"
            else:
                reason = f"no reply within {timeout:g} s"
            for key in batches[node_id]:
                failures[key] = reason
            self._silent.add(node_id)
        if hello:
            for node_id in sent.ids:
                self._gave_up.pop(node_id, None)
                if node_id not in sent.waiting:
                    self._unanswered.pop(node_id, None)
                    continue
                self._unanswered[node_id] = len(sent.ids[node_id])
                if repeat and len(sent.ids[node_id]) > repeat:  # greeted again next round
                    self._gave_up[node_id] = self.server_round
        typical = sent.typical()
        if typical is not None:
            self._typical[message_type] = typical
        if fold is not None:
            release()  # every client is settled now
        for key, reason in sorted(failures.items()):
            log.warning(
                "round %s %s: client %s skipped: %s", self.server_round, message_type, key, reason
            )
        seconds = self.clock() - started
        report = {
            "phase": message_type,
            "sent": len(payloads),  # clients instructed (messages: fewer when nodes are packed)
            "valid": len(replies),
            "failed": {str(k): v for k, v in sorted(failures.items())},
            "seconds": round(seconds, 4),
            # Flower serializing the instructions and handing them to the SuperLink
            "push-seconds": round(push_seconds, 4),
            # instructions sent again for want of a reply (by client; the hello: by node)
            **({"resent": sent.resent(batches)} if sent.resends else {}),
            "bytes-sent": bytes_sent,
            "bytes-received": bytes_received,
        }
        self._phases.append(report)
        self.results.event(
            Event.PHASE_END, round=self.server_round, messages=len(messages), **report
        )
        if not hello:
            for r in sorted(replies, key=lambda r: r.key):
                self.results.client(
                    {
                        "round": self.server_round,
                        "client-id": r.key,
                        "phase": message_type,
                        "metrics": dict(r.content[protocol.METRICS]),
                    }
                )
        # in client order, not arrival order: strategies sum replies in the order given, and
        # float sums in a different order differ in the last bits, which training amplifies
        return sorted(replies, key=lambda r: (r.key, r.node_id)), failures

    def _grid(self, what: str, call: Callable[[], _T]) -> _T:
        """`call()`, made again after a failure up to GRID_RETRIES times in a row."""
        for attempt in range(GRID_RETRIES + 1):
            try:
                return call()
            except Exception as exc:
                if attempt == GRID_RETRIES:
                    raise
                log.warning(
                    "round %s: %s failed (%s); trying again in %g s",
                    self.server_round,
                    what,
                    brief(f"{type(exc).__name__}: {exc}"),
                    GRID_RETRY_WAIT,
                )
                self.results.event(Event.GRID_RETRY, round=self.server_round, call=what)
                self.sleep(GRID_RETRY_WAIT)
        raise AssertionError("unreachable")

    def _message(self, content: RecordDict, node_id: int, message_type: str) -> Message:
        return Message(
            content, dst_node_id=node_id, message_type=message_type, group_id=str(self.server_round)
        )

    def _resend_after(self, message_type: str, sent: _Sends) -> float | None:
        """Seconds an instruction waits for its reply before it is sent again: RESEND_FACTOR
        times the phase's typical reply time (that of the earlier phase of this type until half
        of this one's messages are answered), at least RESEND_FLOOR. A loaded machine answers
        slowly and so waits longer before asking again. None (no resend yet) with nothing to
        go by: a phase none of whose replies came may be slow, not lost, and sending it all
        again would only add to the load (a SuperNode starts a ClientApp process for every
        instruction it holds, even while an earlier one runs)."""
        typical = sent.typical()
        if typical is None:
            typical = self._typical.get(message_type)
        if typical is None:
            return None
        return max(RESEND_FLOOR, RESEND_FACTOR * typical)

    def _resend(
        self,
        message_type: str,
        nodes: Sequence[int],
        after: float,
        sent: _Sends,
        batches: Mapping[int, Mapping[int, RecordDict]],
    ) -> float:
        """Send `nodes` their instruction again; returns the seconds the push took."""
        messages = [self._message(sent.content[n], n, message_type) for n in nodes]
        pushed = self.clock()
        ids = self._grid("push", lambda: list(self.grid.push_messages(messages)))
        took = self.clock() - pushed
        for node_id, mid in zip(nodes, ids, strict=True):
            sent.again(node_id, mid, self.clock())
        clients = sorted(k for n in nodes for k in batches[n])
        who = "nodes" if message_type == HELLO else "clients"
        log.warning(
            "round %s %s: no reply after %.0f s; sent again to %s %s",
            self.server_round,
            message_type,
            after,
            who,
            list(nodes) if message_type == HELLO else clients,
        )
        self.results.event(
            Event.RESEND,
            round=self.server_round,
            phase=message_type,
            nodes=list(nodes),
            **({} if message_type == HELLO else {"clients": clients}),
            after=round(after, 1),
        )
        return took

    def _parts(
        self, content: RecordDict, node_id: int, keys: Sequence[int], hello: bool
    ) -> list[tuple[int, bool, RecordDict | str]]:
        """A node's reply split into the replies of the clients it answers for, each as (key,
        whether the reply must carry the key as its client id, the reply or the reason it is
        missing). The key is the client id, except for the hello of a node of one client: its
        node id, its client being not known yet. A node hosting several clients answers the
        hello packed, naming them."""
        if not protocol.is_packed(content):
            if node_id in self._packed and not hello:
                return [(k, True, "invalid reply: a packed node answered unpacked") for k in keys]
            return [(keys[0], not hello, content)]
        try:
            parts = protocol.unpack(content)
        except Exception as exc:  # a malformed reply must never stop the server
            return [(k, True, f"invalid packed reply: {exc}") for k in keys]
        if hello:
            if not parts:
                return [(k, False, "invalid reply: a packed hello naming no client") for k in keys]
            self._packed.add(node_id)
            return [(cid, True, _part(part)) for cid, part in parts.items()]
        unasked = sorted(set(parts) - set(keys))
        if unasked:
            log.warning("node %s answered for clients it was not asked: %s", node_id, unasked)
        missing = "no reply in its node's packed reply"
        return [(k, True, _part(parts[k]) if k in parts else missing) for k in keys]

    def screen(
        self,
        content: RecordDict,
        message_type: str,
        key: int,
        validate: Validator | None,
        expect_cid: bool = True,
    ) -> str | None:
        """Why a reply must be skipped (None: it may be used): the engine's checks, then the
        strategy's validator. A malformed reply never raises out of here."""
        try:
            size = protocol.payload_bytes(content)
            self._check_reply(content, message_type, key if expect_cid else None, size)
            if validate is not None:
                validate(key, content)
        except InvalidReply as exc:
            return f"invalid reply: {exc}"
        except Exception as exc:  # a malformed reply must never stop the server
            return f"invalid reply ({type(exc).__name__}): {exc}"
        return None

    def _check_reply(
        self, content: RecordDict, message_type: str, cid: int | None, size: int
    ) -> None:
        limit = self.run_settings.max_reply_mb * 1e6
        if size > limit:
            raise InvalidReply(f"payload of {size} bytes exceeds max-reply-mb")
        envelope = content.get(protocol.ENVELOPE)
        if not isinstance(envelope, ConfigRecord):
            raise InvalidReply("no 'pollen' envelope")
        if envelope.get("round") != self.server_round:
            raise InvalidReply(
                f"reply for round {envelope.get('round')!r}, expected {self.server_round}"
            )
        phase = envelope.get(protocol.MESSAGE_TYPE)
        if phase != message_type:
            raise InvalidReply(f"reply for phase {phase!r}, expected {message_type!r}")
        if cid is not None and envelope.get(protocol.CLIENT_ID) != cid:
            raise InvalidReply(
                f"reply from client {envelope.get(protocol.CLIENT_ID)!r}, expected {cid}"
            )
        metrics = content.get(protocol.METRICS)
        if not isinstance(metrics, MetricRecord):
            raise InvalidReply("no metrics record")
        n = metrics.get(protocol.NUM_EXAMPLES)
        if not isinstance(n, int | float) or isinstance(n, bool) or not math.isfinite(n):
            raise InvalidReply(f"num-examples is {n!r}")
        if n < 0 or n > self.run_settings.max_examples or n != int(n):
            raise InvalidReply(f"num-examples {n} is not a count in [0, max-examples]")
        for key, value in metrics.items():
            values = value if isinstance(value, list) else [value]
            if not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
                raise InvalidReply(f"metric {key!r} is not finite: {value!r}")
        for name, record in content.items():
            if isinstance(record, ArrayRecord):
                try:
                    arrays = protocol.from_record(record)
                except protocol.BundleError as exc:
                    raise InvalidReply(f"record {name!r}: {exc}") from None
                for key, arr in arrays.items():
                    if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
                        raise InvalidReply(f"array {name}.{key} has NaN or Inf")

    # ---- clients -------------------------------------------------------------------------
    def _forget_node(self, node_id: int) -> None:
        self._packed.discard(node_id)
        for cid in self._node_cids.pop(node_id, []):
            info = self._clients.get(cid)
            if info is not None and info.node_id == node_id:
                del self._clients[cid]

    def discover(self) -> set[int]:
        """Greet nodes not seen before; drop nodes that left. Returns the nodes online."""
        online = self._grid("list nodes", lambda: set(self.grid.get_node_ids()))
        for node_id in list(self._node_cids):
            if node_id not in online:
                self._forget_node(node_id)
        self._replaced &= online
        # a refused claimant is greeted again once its client's holder is gone or silent
        self._refused = {
            n: c for n, c in self._refused.items() if n in online and self._held_live(c, online)
        }
        self._unanswered = {n: k for n, k in self._unanswered.items() if n in online}
        # a node whose hello went unanswered after every resend is greeted again next round
        # (each greeting blocks the round until it is answered or given up)
        later = {n for n, r in self._gave_up.items() if r == self.server_round and n in online}
        known = set(self._node_cids) | self._replaced | set(self._refused) | later
        new = sorted(online - known)
        if not new:
            return online
        hello = {n: protocol.instruction(self.server_round, HELLO) for n in new}
        replies, _ = self._exchange(HELLO, hello, self._check_hello, hello=True)
        for node_id, _key, content in replies:  # of simultaneous claims, the lowest node id
            cid = protocol.as_int(content[protocol.ENVELOPE][protocol.CLIENT_ID])  # type: ignore[index]
            hello_of = protocol.Hello.of(protocol.metrics_of(content))
            old = self._clients.get(cid)
            # a node that went silent is taken to be the crashed predecessor of a restarted one
            # (Flower lists a crashed node as online until its heartbeat expires, ~1 min); a
            # second claim while the holder answers is refused, so no client counts twice
            if old is not None and old.node_id != node_id and self._held_live(cid, online):
                log.warning(
                    "round %s: node %s claims client %s, which live node %s holds; refused",
                    self.server_round,
                    node_id,
                    cid,
                    old.node_id,
                )
                self.results.event(
                    Event.CLIENT_REFUSED,
                    round=self.server_round,
                    client=cid,
                    node=node_id,
                    holder=old.node_id,
                )
                self._refused[node_id] = cid
                continue
            if old is not None and old.node_id != node_id:
                log.info("client %s moved from node %s to node %s", cid, old.node_id, node_id)
                self._node_cids.pop(old.node_id, None)
                self._packed.discard(old.node_id)
                self._replaced.add(old.node_id)
            self._clients[cid] = ClientInfo(
                cid=cid,
                node_id=node_id,
                num_train=hello_of.num_train,
                num_val=hello_of.num_val,
                num_test=hello_of.num_test,
            )
            self._node_cids.setdefault(node_id, []).append(cid)
        self.results.event(Event.CLIENTS, round=self.server_round, clients=sorted(self._clients))
        return online

    def _held_live(self, cid: int, online: set[int]) -> bool:
        """Whether a node that is online and answered its last instruction holds `cid`."""
        info = self._clients.get(cid)
        return info is not None and info.node_id in online and info.node_id not in self._silent

    def _check_hello(self, _node: int, content: RecordDict) -> None:
        cid = content[protocol.ENVELOPE].get(protocol.CLIENT_ID)  # type: ignore[union-attr]
        if not isinstance(cid, int) or isinstance(cid, bool):
            raise InvalidReply(f"hello without an integer client-id: {cid!r}")
        if not 0 <= cid < self.run_settings.num_clients:
            raise InvalidReply(f"client-id {cid} outside [0, num-clients)")
        try:
            protocol.Hello.of(protocol.metrics_of(content))
        except TypeError as exc:
            raise InvalidReply(str(exc)) from None

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
            have = len(self._clients)
            if have >= want:
                return
            over = self.clock() >= deadline
            if have >= need and (over or self._others_lost(online, want)):
                reason = self._missing(online, want)
                log.warning("round %s: starting with %s", self.server_round, reason)
                self.results.event(
                    Event.CLIENTS_MISSING,
                    round=self.server_round,
                    connected=have,
                    total=want,
                    missing=sorted(set(range(want)) - set(self._clients)),
                    reason=reason,
                )
                return
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
                    f"{self.run_settings.wait_for_clients:g} s: {self._missing(online, want)}"
                )
            self.sleep(min(1.0, self.run_settings.poll_interval))

    def _others_lost(self, online: set[int], want: int) -> bool:
        """Every node that could serve a missing client is online and left its hello
        unanswered after every resend (one client per node: a packed simulation node hosts
        several, and its clients are never taken for lost)."""
        if self._packed or len(online) < want or not self.run_settings.resend_limit:
            return False
        limit = self.run_settings.resend_limit + 1
        return all(
            n in self._node_cids or n in self._refused or n in self._replaced
            or self._unanswered.get(n, 0) >= limit
            for n in online
        )  # fmt: skip

    def _missing(self, online: set[int], want: int) -> str:
        """One line: how many clients are connected, which are missing and what is known of
        why (nodes that never answered their hello, SuperNodes that never connected)."""
        have = len(self._clients)
        missing = sorted(set(range(want)) - set(self._clients))
        shown = ", ".join(map(str, missing[:20])) + (", ..." if len(missing) > 20 else "")
        why = []
        silent = sorted(n for n in online if n in self._unanswered and n not in self._node_cids)
        if silent:
            asked = ", ".join(f"node {n} asked {_times(self._unanswered[n])}" for n in silent[:5])
            more = f" and {len(silent) - 5} more" if len(silent) > 5 else ""
            why.append(
                f"{len(silent)} connected node(s) never answered the hello ({asked}{more}; a "
                "reply lost on its way, e.g. to the SuperLink's 'database is locked', or a node "
                "too busy to answer)"
            )
        absent = want - len(online) if not self._packed else 0
        if absent > 0:
            why.append(f"{absent} SuperNode(s) not connected to the SuperLink")
        return f"{have} of {want} clients; missing: client(s) {shown}" + (
            f" ({'; '.join(why)})" if why else ""
        )

    # ---- the run -------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        settings = dict(self.settings)
        run = self.run_settings
        out = self.results.dir
        start_round = 1
        t0 = self.clock()
        threats = threat_summary(settings)
        if "attack" in threats:
            a = threats["attack"]
            log.warning("simulated attack: clients %s act as %s (evaluation, attack.*)",
                        a["clients"], a["kind"])  # fmt: skip
        try:
            if run.resume:
                ckpt = checkpoint.load(out)
                checkpoint.check_compatible(ckpt.settings, settings)
                self.strategy.load_state(ckpt.arrays, ckpt.strategy_meta)
                self.rng.bit_generator.state = ckpt.rng_state
                start_round = ckpt.server_round + 1
                self.results.truncate_after(ckpt.server_round)
                log.info("resuming after round %s", ckpt.server_round)
            else:
                self.strategy.initialize(run.seed)
                self.results.write_config(settings)
            # a resumed run rewrites config.json once it has completed a round of its own, so a
            # resume that fails leaves the interrupted (or completed) run's files as they were
            pending_config = run.resume
            self.server_round = start_round
            self.wait_for_clients()
            last: dict[str, Any] = {}
            for rnd in range(start_round, run.num_rounds + 1):
                self.server_round = rnd
                self._phases = []
                r0 = self.clock()
                codec0 = protocol.codec_seconds()
                self.results.event(Event.ROUND_START, round=rnd, rounds=run.num_rounds)
                self.discover()
                train = self.strategy.run_round(self)
                row: dict[str, Any] = {"round": rnd, "train": train}
                if run.server_eval:
                    self.results.event(Event.SERVER_EVAL_START, round=rnd)
                    row["server-eval"] = self.strategy.server_evaluate()
                row["phases"] = self._phases
                row["seconds"] = round(self.clock() - r0, 4)
                row["bytes-sent"] = sum(p["bytes-sent"] for p in self._phases)
                row["bytes-received"] = sum(p["bytes-received"] for p in self._phases)
                # arrays <-> record bytes in this process (encode instructions, decode replies)
                row["codec-seconds"] = round(protocol.codec_seconds() - codec0, 4)
                self.results.round(row)
                self._checkpoint(rnd, settings)
                if pending_config:
                    self.results.write_config(settings)
                    pending_config = False
                log.info("round %s: %s", rnd, _brief(row))
                last = row
            final: dict[str, Any] = {}
            if run.final_eval:
                self.server_round = run.num_rounds + 1
                self._phases = []
                self.results.event(Event.FINAL_START, round=self.server_round)
                self.discover()
                final = {"eval": self.strategy.finalize(self), "phases": self._phases}
                if run.server_eval:
                    self.results.event(Event.SERVER_EVAL_START, round=self.server_round)
                    final["server-eval"] = self.strategy.server_evaluate()
            model = self.strategy.global_arrays()
            if model is not None:
                self.results.final_model(model)
            summary = {
                "status": "completed",
                "algorithm": run.algorithm,
                "dataset": run.dataset,
                "rounds": run.num_rounds,
                "last-round": last,
                "final": final,
                "seconds": round(self.clock() - t0, 3),
                "clients": sorted(self._clients),
                "peak-rss-mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                **threats,
                **privacy_summary(
                    settings, last.get("train", {}), self.strategy.privacy_guarantees()
                ),
            }
            self.results.summary(summary)
            return summary
        except BaseException as exc:
            log.error("the run failed", exc_info=exc)  # the full traceback, in the server log
            self.results.summary(
                {
                    "status": "failed",
                    "reason": brief(f"{type(exc).__name__}: {exc}", limit=600),
                    "log": str(Path(out) / SERVER_LOG),
                    "algorithm": run.algorithm,
                    "dataset": run.dataset,
                    "last-completed-round": self.server_round - 1,
                    "seconds": round(self.clock() - t0, 3),
                    **threats,
                }
            )
            raise

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
            ),
        )


def threat_summary(settings: Mapping[str, Scalar]) -> dict[str, Any]:
    """What summary.json says of robustness: the robust rule when it is not the plain mean, and
    the simulated attack when one ran (docs/robustness.md)."""
    robust, attack = RobustSettings.of(settings), AttackSettings.of(settings)
    out: dict[str, Any] = {}
    if robust != RobustSettings():
        out["robust"] = {s.key: getattr(robust, f) for f, s in zip(
            (f.name for f in fields(RobustSettings)), RobustSettings.declarations(), strict=True
        )}  # fmt: skip
    if attack.active:
        out["attack"] = {"clients": list(attack.ids()), "kind": attack.kind,
                         "simulated": True}  # fmt: skip
    return out


def privacy_summary(
    settings: Mapping[str, Scalar],
    train: Mapping[str, Any],
    own: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """What summary.json says of differential privacy (docs/privacy.md): each guarantee the run
    gives, with the epsilon its last round reached (-1: none) and what it protects; `own`: the
    algorithm's own (Strategy.privacy_guarantees)."""
    out: dict[str, Any] = dict(own or {})
    mech = client_dp.mechanism(settings)
    if mech is not None:
        dp = ClientDPSettings.of(settings)
        out["client-level"] = {
            "epsilon": train.get(client_dp.EPSILON),
            "delta": dp.delta,
            "noise-multiplier": mech.noise_multiplier,
            "clip": dp.clip,
            "adaptive-clipping": dp.adaptive,
            "noise-at": dp.noise_at,
            "sample-rate": mech.sample_rate,
            "protects": "everything one client contributes over the run"
            + (", against the server too" if mech.at_client else ", against all but the server"),
        }
    example = DPSettings.of(settings)
    if example.enabled:
        out["example-level"] = {
            "epsilon": train.get(dp_sgd.EPSILON),
            "delta": example.delta,
            "mechanism": "DP-SGD",
            "protects": "one training example of a client, in everything the client sends",
        }
    return {"privacy": out} if out else {}


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def _pull(grid: Grid, message_ids: list[str]) -> list[Message]:
    return list(grid.pull_messages(message_ids))


class _Sends:
    """The instructions of one phase by node: their message ids (the first send's, then each
    resend's), when each node was last sent one, and the reply times of the nodes answered."""

    def __init__(self, messages: Sequence[Message], ids: Sequence[str], at: float) -> None:
        self.started = at
        self.content = {m.metadata.dst_node_id: m.content for m in messages}
        self.ids: dict[int, list[str]] = {
            m.metadata.dst_node_id: [mid] for m, mid in zip(messages, ids, strict=True)
        }
        self.last = dict.fromkeys(self.content, at)
        self.waiting = set(self.content)
        self.replied: list[float] = []  # seconds from the phase's push, in arrival order
        self.resends = 0

    def answered(self, node_id: int, now: float) -> None:
        self.waiting.discard(node_id)
        self.replied.append(now - self.started)

    def again(self, node_id: int, mid: str, now: float) -> None:
        self.ids[node_id].append(mid)
        self.last[node_id] = now
        self.resends += 1

    def typical(self) -> float | None:
        """When half of the phase's messages had been answered; None before."""
        half = math.ceil(len(self.content) / 2)
        return self.replied[half - 1] if len(self.replied) >= half else None

    def due(self, now: float, after: float, limit: int) -> list[int]:
        """The waiting nodes to send again now: `after` seconds since their last send, at most
        `limit` resends."""
        return sorted(
            n for n in self.waiting if len(self.ids[n]) <= limit and now - self.last[n] >= after
        )

    def lost(self, now: float, after: float, limit: int) -> bool:
        """Every waiting node was sent `limit` + 1 times and its last wait is over."""
        return all(len(self.ids[n]) > limit and now - self.last[n] >= after for n in self.waiting)

    def resent(self, batches: Mapping[int, Mapping[int, RecordDict]]) -> dict[str, int]:
        return {
            str(k): len(ids) - 1
            for n, ids in sorted(self.ids.items())
            if len(ids) > 1
            for k in batches[n]
        }


def _part(content: RecordDict) -> RecordDict | str:
    """A client's part of a packed reply, or why it has none (its handler raised)."""
    reason = protocol.error_of(content)
    return content if reason is None else "error: " + brief(reason)


def _brief(row: Mapping[str, Any]) -> str:
    parts = []
    for section in ("train", "server-eval"):
        for key, value in (row.get(section) or {}).items():
            if isinstance(value, float) and ("accuracy" in key or "loss" in key):
                parts.append(f"{section}/{key}={value:.4f}")
    return " ".join(parts) + f" ({row.get('seconds', 0):.1f} s)"
