"""Who takes part: Flower's node ids mapped to stable client ids (each node answers a
`query.hello` naming its client, or the clients it hosts when packed), and what is known of the
nodes that did not answer.

The round engine (server.engine) greets new nodes and hands their hello replies to `admit`; a
phase's exchange (server.exchange) marks nodes silent or answered. A node that went silent is
taken to be the crashed predecessor of a restarted one; a second claim on a client while its
holder answers is refused, so no client counts twice.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from flwr.app import RecordDict

from pollen.core import protocol
from pollen.core.rundir import Event
from server.results import ResultsWriter
from strategies.base import ClientInfo

log = logging.getLogger("flwr.pollen")


class Roster:
    """The clients known, by client id, and the nodes they live on."""

    def __init__(self) -> None:
        self.clients: dict[int, ClientInfo] = {}  # by client id
        self.node_cids: dict[int, list[int]] = {}  # node id -> the clients it hosts
        self.packed: set[int] = set()  # nodes hosting several clients (packed messages)
        self.silent: set[int] = set()  # nodes whose last instruction went unanswered
        self.replaced: set[int] = set()  # silent nodes whose client has restarted elsewhere
        self.refused: dict[int, int] = {}  # node -> the client it claimed from a live holder
        self.unanswered: dict[int, int] = {}  # node -> hellos sent that it never answered
        self.gave_up: dict[int, int] = {}  # node -> the round its hello was last given up in
        self.own_data = False
        """A client said its data came from a Flower app's data function (Hello.own_data)."""
        self.errors: dict[int, tuple[int, str]] = {}
        """node -> (hellos in a row it answered with an error or an invalid reply, the last
        reason): a node whose ClientApp cannot serve the run (its data or model cannot be
        loaded) answers every hello so."""

    def forget_node(self, node_id: int) -> None:
        self.packed.discard(node_id)
        for cid in self.node_cids.pop(node_id, []):
            info = self.clients.get(cid)
            if info is not None and info.node_id == node_id:
                del self.clients[cid]

    def to_greet(self, online: set[int], server_round: int) -> list[int]:
        """Drop the nodes that left; the online nodes to greet now, in node order."""
        for node_id in list(self.node_cids):
            if node_id not in online:
                self.forget_node(node_id)
        self.replaced &= online
        # a refused claimant is greeted again once its client's holder is gone or silent
        self.refused = {
            n: c for n, c in self.refused.items() if n in online and self.held_live(c, online)
        }
        self.unanswered = {n: k for n, k in self.unanswered.items() if n in online}
        self.errors = {n: e for n, e in self.errors.items() if n in online}
        # a node whose hello went unanswered after every resend is greeted again next round
        # (each greeting blocks the round until it is answered or given up)
        later = {n for n, r in self.gave_up.items() if r == server_round and n in online}
        known = set(self.node_cids) | self.replaced | set(self.refused) | later
        return sorted(online - known)

    def admit(
        self,
        replies: Sequence[tuple[int, int, RecordDict]],
        online: set[int],
        server_round: int,
        results: ResultsWriter,
    ) -> None:
        """Take the valid hello replies (node id, key, content), in node order: of
        simultaneous claims on one client, the lowest node id's."""
        for node_id, _key, content in replies:
            cid = protocol.as_int(content[protocol.ENVELOPE][protocol.CLIENT_ID])  # type: ignore[index]
            hello_of = protocol.Hello.of(protocol.metrics_of(content))
            self.own_data |= hello_of.own_data
            old = self.clients.get(cid)
            # a node that went silent is taken to be the crashed predecessor of a restarted one
            # (Flower lists a crashed node as online until its heartbeat expires, ~1 min); a
            # second claim while the holder answers is refused, so no client counts twice
            if old is not None and old.node_id != node_id and self.held_live(cid, online):
                log.warning(
                    "round %s: node %s claims client %s, which live node %s holds; refused",
                    server_round,
                    node_id,
                    cid,
                    old.node_id,
                )
                results.event(
                    Event.CLIENT_REFUSED,
                    round=server_round,
                    client=cid,
                    node=node_id,
                    holder=old.node_id,
                )
                self.refused[node_id] = cid
                continue
            if old is not None and old.node_id != node_id:
                log.info("client %s moved from node %s to node %s", cid, old.node_id, node_id)
                self.node_cids.pop(old.node_id, None)
                self.packed.discard(old.node_id)
                self.replaced.add(old.node_id)
            self.clients[cid] = ClientInfo(
                cid=cid,
                node_id=node_id,
                num_train=hello_of.num_train,
                num_val=hello_of.num_val,
                num_test=hello_of.num_test,
            )
            self.node_cids.setdefault(node_id, []).append(cid)
        results.event(Event.CLIENTS, round=server_round, clients=sorted(self.clients))

    def greeted(
        self, sends: dict[int, list[str]], waiting: set[int], repeat: int, server_round: int
    ) -> None:
        """After a hello phase: the nodes that never answered (`waiting`, each sent
        len(sends[node]) hellos), given up for this round once sent more than `repeat` times."""
        for node_id in sends:
            self.gave_up.pop(node_id, None)
            if node_id not in waiting:
                self.unanswered.pop(node_id, None)
                continue
            self.unanswered[node_id] = len(sends[node_id])
            if repeat and len(sends[node_id]) > repeat:  # greeted again next round
                self.gave_up[node_id] = server_round

    def failed(self, failures: Mapping[int, str]) -> None:
        """After a hello phase: count the nodes that answered with an error or an invalid reply
        (`failures` but those that never answered); a node admitted starts again from 0."""
        for node_id in self.node_cids:
            self.errors.pop(node_id, None)
        for node_id, reason in failures.items():
            if node_id in self.unanswered or node_id in self.node_cids:
                continue
            self.errors[node_id] = (self.errors.get(node_id, (0, ""))[0] + 1, reason)

    def cannot_serve(self, online: set[int], want: int, resend_limit: int) -> bool:
        """Every node that could serve a missing client is online and answered its hello with
        an error more than resend-limit times in a row: waiting longer changes nothing."""
        if self.packed or len(online) < want:
            return False
        waiting = [n for n in online if n not in self.node_cids and n not in self.refused
                   and n not in self.replaced]  # fmt: skip
        limit = resend_limit + 1
        return bool(waiting) and all(self.errors.get(n, (0, ""))[0] >= limit for n in waiting)

    def held_live(self, cid: int, online: set[int]) -> bool:
        """Whether a node that is online and answered its last instruction holds `cid`."""
        info = self.clients.get(cid)
        return info is not None and info.node_id in online and info.node_id not in self.silent

    def others_lost(self, online: set[int], want: int, resend_limit: int) -> bool:
        """Every node that could serve a missing client is online and left its hello
        unanswered after every resend (one client per node: a packed simulation node hosts
        several, and its clients are never taken for lost)."""
        if self.packed or len(online) < want or not resend_limit:
            return False
        limit = resend_limit + 1
        return all(
            n in self.node_cids or n in self.refused or n in self.replaced
            or self.unanswered.get(n, 0) >= limit
            for n in online
        )  # fmt: skip

    def missing(self, online: set[int], want: int) -> str:
        """One line: how many clients are connected, which are missing and what is known of
        why (nodes that never answered their hello, SuperNodes that never connected)."""
        have = len(self.clients)
        missing = sorted(set(range(want)) - set(self.clients))
        shown = ", ".join(map(str, missing[:20])) + (", ..." if len(missing) > 20 else "")
        why = []
        silent = sorted(n for n in online if n in self.unanswered and n not in self.node_cids)
        if silent:
            asked = ", ".join(f"node {n} asked {_times(self.unanswered[n])}" for n in silent[:5])
            more = f" and {len(silent) - 5} more" if len(silent) > 5 else ""
            why.append(
                f"{len(silent)} connected node(s) never answered the hello ({asked}{more}; a "
                "reply lost on its way, e.g. to the SuperLink's 'database is locked', or a node "
                "too busy to answer)"
            )
        failing = sorted(n for n in online if n in self.errors and n not in self.node_cids)
        if failing:
            first = failing[0]
            why.append(
                f"{len(failing)} node(s) answered the hello with an error (node {first}, "
                f"{_times(self.errors[first][0])}: {self.errors[first][1]})"
            )
        absent = want - len(online) if not self.packed else 0
        if absent > 0:
            why.append(f"{absent} SuperNode(s) not connected to the SuperLink")
        return f"{have} of {want} clients; missing: client(s) {shown}" + (
            f" ({'; '.join(why)})" if why else ""
        )


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"
