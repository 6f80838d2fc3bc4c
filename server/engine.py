"""The round engine: runs a strategy's rounds over a Flower Grid.

It owns everything a strategy should not: finding clients (a `query.hello` to every new node
maps Flower's node ids to stable client ids), sampling, sending each client its instruction,
waiting with a timeout, checking every reply before the strategy sees it, metrics files,
checkpoints and resume. A bad or missing reply is logged and skipped; too few good replies stop
the run with a clear reason.

A node normally hosts one client. A simulated node may host many (setting simulation-nodes): it
answers the hello with a packed reply (pollen.protocol.pack), and from then on gets one packed
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
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from pollen import protocol
from pollen.registry import HELLO
from pollen.settings import AttackSettings, RobustSettings, RunSettings, Scalar
from server import checkpoint
from server.results import ResultsWriter, brief
from strategies.base import ClientInfo, Fold, InvalidReply, Strategy, Validator

log = logging.getLogger("flwr.pollen")

WAITING_NAMED = 5
"""A `phase-progress` event names the clients still awaited when at most this many are."""


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
        self._clients: dict[int, ClientInfo] = {}  # by client id
        self._node_cids: dict[int, list[int]] = {}  # node id -> the clients it hosts
        self._packed: set[int] = set()  # nodes hosting several clients (packed messages)
        self._silent: set[int] = set()  # nodes whose last instruction went unanswered
        self._replaced: set[int] = set()  # silent nodes whose client has restarted elsewhere
        self._refused: dict[int, int] = {}  # node -> the client it claimed from a live holder
        self._phases: list[dict[str, Any]] = []

    # ---- what strategies use -------------------------------------------------------------
    @property
    def first_unseen(self) -> int:
        total = self.run_settings.num_clients
        return total - math.floor(self.run_settings.unseen_fraction * total)

    def available(self) -> list[ClientInfo]:
        return [self._clients[c] for c in sorted(self._clients) if c < self.first_unseen]

    def unseen(self) -> list[ClientInfo]:
        return [self._clients[c] for c in sorted(self._clients) if c >= self.first_unseen]

    def sample(self, clients: Sequence[ClientInfo] | None = None) -> list[ClientInfo]:
        pool = list(self.available() if clients is None else clients)
        if not pool:
            raise PhaseFailed(f"round {self.server_round}: no clients available to sample")
        fraction = self.run_settings.fraction_train
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
            messages.append(
                Message(
                    content,
                    dst_node_id=node_id,
                    message_type=message_type,
                    group_id=str(self.server_round),
                )
            )
        self.results.event(
            "phase-start",
            round=self.server_round,
            phase=message_type,
            clients=len(payloads),  # for the hello: the nodes greeted
            messages=len(messages),
        )
        pushed = self.clock()
        message_ids = list(self.grid.push_messages(messages))
        push_seconds = self.clock() - pushed
        by_message: dict[str, int] = {}
        for mid, msg in zip(message_ids, messages, strict=True):
            by_message[mid] = msg.metadata.dst_node_id
        pending = set(by_message)
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
            for msg in self.grid.pull_messages(list(pending)):
                mid = msg.metadata.reply_to_message_id
                if mid not in pending:
                    continue  # not a reply to this phase: ignore, never mix phases
                pending.discard(mid)
                node_id = by_message[mid]
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
                    "phase-progress",
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
            # poll fast first (in-memory simulation answers in milliseconds), then back off in
            # proportion to the time already waited: a reply is picked up at most ~25% late
            # (doubling waits picked it up up to 100% late: 0.5 s instead of 0.25 s per round)
            wait = min(poll, max(0.005, 0.25 * (self.clock() - started)))
            self.sleep(min(wait, max(0.0, deadline - self.clock())))
        timeout = self.run_settings.phase_timeout
        for mid in pending:
            for key in batches[by_message[mid]]:
                failures[key] = f"no reply within {timeout:g} s"
            self._silent.add(by_message[mid])
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
            "bytes-sent": bytes_sent,
            "bytes-received": bytes_received,
        }
        self._phases.append(report)
        self.results.event("phase-end", round=self.server_round, messages=len(messages), **report)
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
        if envelope.get("message-type") != message_type:
            raise InvalidReply(
                f"reply for phase {envelope.get('message-type')!r}, expected {message_type!r}"
            )
        if cid is not None and envelope.get("client-id") != cid:
            raise InvalidReply(f"reply from client {envelope.get('client-id')!r}, expected {cid}")
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

    def discover(self) -> None:
        """Greet nodes not seen before; drop nodes that left."""
        online = set(self.grid.get_node_ids())
        for node_id in list(self._node_cids):
            if node_id not in online:
                self._forget_node(node_id)
        self._replaced &= online
        # a refused claimant is greeted again once its client's holder is gone or silent
        self._refused = {
            n: c for n, c in self._refused.items() if n in online and self._held_live(c, online)
        }
        new = sorted(online - set(self._node_cids) - self._replaced - set(self._refused))
        if not new:
            return
        hello = {n: protocol.instruction(self.server_round, HELLO) for n in new}
        replies, _ = self._exchange(HELLO, hello, self._check_hello, hello=True)
        for node_id, _key, content in replies:  # of simultaneous claims, the lowest node id
            cid = protocol.as_int(content[protocol.ENVELOPE]["client-id"])  # type: ignore[index]
            m = protocol.metrics_of(content)
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
                    "client-refused",
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
                num_train=protocol.as_int(m[protocol.NUM_EXAMPLES]),
                num_val=protocol.as_int(m["val-examples"]),
                num_test=protocol.as_int(m["test-examples"]),
            )
            self._node_cids.setdefault(node_id, []).append(cid)
        self.results.event("clients", round=self.server_round, clients=sorted(self._clients))

    def _held_live(self, cid: int, online: set[int]) -> bool:
        """Whether a node that is online and answered its last instruction holds `cid`."""
        info = self._clients.get(cid)
        return info is not None and info.node_id in online and info.node_id not in self._silent

    def _check_hello(self, _node: int, content: RecordDict) -> None:
        cid = content[protocol.ENVELOPE].get("client-id")  # type: ignore[union-attr]
        if not isinstance(cid, int) or isinstance(cid, bool):
            raise InvalidReply(f"hello without an integer client-id: {cid!r}")
        if not 0 <= cid < self.run_settings.num_clients:
            raise InvalidReply(f"client-id {cid} outside [0, num-clients)")
        m = protocol.metrics_of(content)
        for key in ("val-examples", "test-examples"):
            try:
                protocol.as_int(m.get(key))
            except TypeError:
                raise InvalidReply(f"hello without a count {key}") from None

    def wait_for_clients(self) -> None:
        need = self.run_settings.min_available_clients
        deadline = self.clock() + self.run_settings.wait_for_clients
        said = -1
        while True:
            self.discover()
            if len(self._clients) >= need:
                return
            if len(self._clients) != said:  # what the run waits for, each time it changes
                said = len(self._clients)
                self.results.event(
                    "waiting-for-clients",
                    round=self.server_round,
                    connected=said,
                    needed=need,
                    timeout=self.run_settings.wait_for_clients,
                )
            if self.clock() >= deadline:
                raise PhaseFailed(
                    f"only {len(self._clients)} of the {need} required clients connected within "
                    f"{self.run_settings.wait_for_clients:g} s"
                )
            self.sleep(min(1.0, self.run_settings.poll_interval))

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
                self.results.event("round-start", round=rnd, rounds=run.num_rounds)
                self.discover()
                train = self.strategy.run_round(self)
                row: dict[str, Any] = {"round": rnd, "train": train}
                if run.server_eval:
                    self.results.event("server-eval-start", round=rnd)
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
                self.results.event("final-start", round=self.server_round)
                self.discover()
                final = {"eval": self.strategy.finalize(self), "phases": self._phases}
                if run.server_eval:
                    self.results.event("server-eval-start", round=self.server_round)
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
            }
            self.results.summary(summary)
            return summary
        except BaseException as exc:
            log.error("the run failed", exc_info=exc)  # the full traceback, in the server log
            self.results.summary(
                {
                    "status": "failed",
                    "reason": brief(f"{type(exc).__name__}: {exc}", limit=600),
                    "log": str(Path(out) / "server.log"),
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
