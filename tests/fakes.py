"""An in-process Grid that routes messages to a real ClientApp, with fault injection."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from flwr.app import Error, Message, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from pollen.core import protocol
from server.local_grid import LocalGrid
from strategies.base import ClientInfo, Secured, Summed

# A fault decides, per (node id, message), what happens instead of a normal answer:
# return "drop" (never answered), "lost" (answered, and the reply lost on its way, as when the
# SuperLink fails to store it: the client ran the handler), "late" (answered, but the reply
# arrives only with the next push, i.e. during the next phase), "error" (error reply), a
# RecordDict (replaces the content), a function of the content (changes it), or None (answer
# normally).
Fault = Callable[[int, Message, RecordDict | None], Any]


class FakeGrid(LocalGrid):
    def __init__(
        self,
        client_app: ClientApp,
        num_nodes: int,
        run_config: dict[str, Any],
        node_config: dict[str, Any] | None = None,
    ) -> None:
        self._late: dict[str, Message] = {}
        # True: pull_messages also hands over replies nobody asked for (stray deliveries)
        self.leaky = False
        # True: a ClientApp exception becomes an error reply, as a SuperNode sends it
        self.errors_as_replies = False
        # the reason of an injected "error" reply
        self.error_reason = "node unavailable (injected)"
        self.sent: list[tuple[int, str]] = []
        self.lost: list[tuple[int, str]] = []  # (node, message type) of each reply lost
        self.faults: list[Fault] = []
        super().__init__(client_app, num_nodes, run_config, node_config)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        self._replies.update(self._late)  # late replies arrive now
        self._late = {}
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            node = msg.metadata.dst_node_id
            self.sent.append((node, msg.metadata.message_type))
            ids.append(msg.metadata.message_id)
            action: Any = None
            for fault in self.faults:
                action = fault(node, msg, None)
                if action is not None:
                    break
            if action == "drop" or node not in self.contexts:
                continue
            if action == "error":
                self._replies[msg.metadata.message_id] = Message(
                    Error(code=5, reason=self.error_reason), reply_to=msg
                )
                continue
            try:
                reply = self.deliver(msg)
            except Exception as exc:
                if not self.errors_as_replies:
                    raise
                reason = str(type(exc)) + ":<'" + str(exc) + "'>"  # as flwr-clientapp words it
                self._replies[msg.metadata.message_id] = Message(
                    Error(code=2, reason=reason), reply_to=msg
                )
                continue
            if action == "lost":
                self.lost.append((node, msg.metadata.message_type))
                continue
            if isinstance(action, RecordDict):
                reply = Message(action, reply_to=msg)
            elif callable(action):
                reply = Message(action(copy.deepcopy(reply.content)), reply_to=msg)
            held = self._late if action == "late" else self._replies
            held[msg.metadata.message_id] = copy.deepcopy(reply)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        ids = list(self._replies) if self.leaky else list(message_ids)
        return [self._replies.pop(i) for i in ids if i in self._replies]


def settings_of(values: dict[str, Any]) -> dict[str, Any]:
    """Checked run settings, typed loosely for tests."""
    from pollen.core.runconfig import resolve

    return dict(resolve(values))


class FakeClock:
    """Time that advances only when the engine sleeps: timeouts without waiting."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.001)


class FixedLogits(nn.Module):
    """A stand-in model: its input is example indices, its output the preset logits of those
    examples."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return self.logits[index]


Answer = Callable[[int, str, RecordDict], RecordDict]
"""A scripted client: (client id, message type, instruction) -> its reply."""


class ScriptedFederation:
    """A Federation (strategies.base) whose clients are a script: one round of a strategy driven
    without the engine, each reply `answer(cid, message type, instruction)`. It records the
    instructions and replies of each message type (`sent`, `replies`) and of the last exchange
    (`last`)."""

    def __init__(
        self,
        settings: Mapping[str, Any],
        answer: Answer,
        clients: Sequence[ClientInfo],
        server_round: int = 1,
    ) -> None:
        self.settings = settings
        self.server_round = server_round
        self.answer = answer
        self.clients = list(clients)
        self.sent: dict[str, dict[int, RecordDict]] = {}
        self.replies: dict[str, dict[int, RecordDict]] = {}
        self.last: dict[int, RecordDict] = {}

    def available(self) -> list[ClientInfo]:
        return list(self.clients)

    def unseen(self) -> list[ClientInfo]:
        return []

    def sample(self, clients: Sequence[ClientInfo] | None = None) -> list[ClientInfo]:
        return list(self.clients if clients is None else clients)

    def exchange(
        self,
        message_type: str,
        payloads: Mapping[int, RecordDict],
        validate: Any = None,
        min_replies: int | None = None,
        fold: Any = None,
    ) -> dict[int, RecordDict]:
        self.sent[message_type] = dict(payloads)
        out = {}
        for cid, content in payloads.items():
            reply = self.answer(cid, message_type, content)
            if validate is not None:
                validate(cid, reply)
            if fold is not None:
                fold(cid, reply)
            out[cid] = reply
        assert len(out) >= min(min_replies or 0, len(payloads))  # as the engine counts
        self.replies[message_type] = out
        self.last = out
        return out

    def secure_exchange(
        self,
        message_type: str,
        payloads: Mapping[int, RecordDict],
        summed: Summed,
        min_replies: int | None = None,
    ) -> Secured:
        """The exchange, its replies summed exactly (`exact_sum`): a strategy's secure path
        without the protocol."""
        replies = self.exchange(message_type, payloads, None, min_replies)
        return exact_sum(payloads, replies, summed)


def exact_sum(
    payloads: Mapping[int, RecordDict],
    replies: Mapping[int, RecordDict],
    summed: Summed,
    weights: Mapping[int, float] | None = None,
) -> Secured:
    """What a secure sum would give if its arithmetic were exact: the plain weighted sum of the
    replies' records (minus the instruction's `around` records), each client's vector clipped
    to `summed.l2_clip` first; `weights`: each client's (default: its num-examples when
    weighted, else 1). The oracle the real protocol is checked against."""
    import numpy as np

    sums: dict[str, dict[str, Any]] = {
        r: {k: np.zeros(np.shape(v)) for k, v in a.items() if np.asarray(v).dtype.kind == "f"}
        for r, a in summed.records.items()
    }
    used: dict[int, float] = {}
    for cid, reply in sorted(replies.items()):
        parts = {}
        for record in summed.records:
            arrays = protocol.arrays_of(reply, record)
            base = summed.around.get(record)
            if base is not None:
                sent = protocol.arrays_of(payloads[cid], base)
                arrays = {k: v.astype(np.float64) - sent[k] for k, v in arrays.items()}
            parts[record] = {
                k: np.asarray(v, np.float64) for k, v in arrays.items() if k in sums[record]
            }
        scale = 1.0
        if summed.l2_clip > 0:
            norm = float(np.sqrt(sum((v**2).sum() for a in parts.values() for v in a.values())))
            scale = min(1.0, summed.l2_clip / norm) if norm > 0 else 1.0
        count = protocol.as_int(protocol.metrics_of(reply)[protocol.NUM_EXAMPLES])
        w = float(count) if summed.weighted else 1.0
        w = float(weights[cid]) if weights is not None else w
        used[cid] = w
        for record, arrays in parts.items():
            for k, v in arrays.items():
                sums[record][k] += w * scale * v
    return Secured(
        replies={c: protocol.without_arrays(r) for c, r in sorted(replies.items())},
        sums=sums,
        weight=float(sum(used.values())),
        weights=used,
    )


def run_in_process(tmp: Any, cache: Any, name: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """One federation on `digits` (unless `settings` says otherwise) through the real ServerApp
    and ClientApp over FakeGrid, its results in tmp/name; its summary.json, which must say
    `completed`."""
    import json
    from pathlib import Path

    from flwr.app import Context

    from client.app import app as client_app
    from pollen.core.runconfig import resolve
    from server.app import app as server_app

    tmp = Path(tmp)
    cfg = dict(
        resolve(
            {
                "dataset": "digits", "lr": 0.1, "batch-size": 16, "num-rounds": 6,
                "server-eval": False, "cache-dir": str(cache), "out-dir": str(tmp / name),
                "run-name": name, "client-state-dir": str(tmp / "state"), **settings,
            }
        )
    )  # fmt: skip
    grid = FakeGrid(client_app, int(cfg["num-clients"]), cfg)
    server_app(grid, Context(1, 0, {}, RecordDict(), cfg))
    summary: dict[str, Any] = json.loads((tmp / name / "summary.json").read_text())
    assert summary["status"] == "completed", summary.get("reason")
    return summary


NODE_SIGNATURE = ("a", "p")
"""A keys reply's node signature on its digest and the node's key id: not digested."""


def secagg_digests(
    session: str, advertised: Mapping[int, Mapping[str, bytes]]
) -> dict[int, bytes]:
    """Each client's keys digest (secagg.keys.bundle_digest) of its keys stage answer."""
    from secagg import keys  # lazy: the secagg package's cryptography

    return {
        j: keys.bundle_digest(session, j, {n: v for n, v in a.items() if n not in NODE_SIGNATURE})
        for j, a in advertised.items()
    }


def secagg_shares_items(
    session: str, advertised: Mapping[int, Mapping[str, bytes]], k: int, client: int
) -> tuple[list[int], dict[str, bytes]]:
    """What an honest server sends `client` in a secure sum's shares stage: the members (the
    clients of `advertised`, each one's keys stage answer) and the byte strings of the digests
    and of `client`'s neighbourhood's keys in the graph of degree `k` they draw."""
    from secagg import graph  # lazy: the secagg package's cryptography

    members = sorted(advertised)
    node = NODE_SIGNATURE
    digests = secagg_digests(session, advertised)
    seed = graph.seed_of(session, digests)
    group = sorted(graph.neighbours(members, k, seed)[client] | {client})
    sides = {"c": "c", "s": "s", "h": "b-hash", "v": "v"}
    items = {"digests": b"".join(digests[j] for j in members)}
    for j in group:
        items.update({f"{p}/{j}": advertised[j][n] for p, n in sides.items() if n in advertised[j]})
    for j in members:
        items.update({f"{n}/{j}": advertised[j][n] for n in sorted(node) if n in advertised[j]})
    return members, items
