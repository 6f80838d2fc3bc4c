"""When an unanswered instruction is sent again (server.exchange): each phase's sends by node,
their reply times, and the wait before a resend, which grows with how long the phase's other
replies took."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from flwr.app import Message, RecordDict

RESEND_FLOOR = 10.0
"""Least seconds before an unanswered instruction is sent again (a deployed exchange takes 3-6 s
at best: the SuperNode pulls every 3 s)."""
RESEND_FACTOR = 2.0
"""An instruction is sent again once it has waited this many times the phase's typical reply
time (the time by which half of its messages were answered)."""


def resend_after(sent: Sends, earlier: float | None) -> float | None:
    """Seconds an instruction waits for its reply before it is sent again: RESEND_FACTOR times
    the phase's typical reply time (`earlier`, that of the earlier phase of this type, until
    half of this one's messages are answered), at least RESEND_FLOOR. A loaded machine answers
    slowly and so waits longer before asking again. None (no resend yet) with nothing to go by:
    a phase none of whose replies came may be slow, not lost, and sending it all again would
    only add to the load (a SuperNode starts a ClientApp process for every instruction it
    holds, even while an earlier one runs)."""
    typical = sent.typical()
    if typical is None:
        typical = earlier
    if typical is None:
        return None
    return max(RESEND_FLOOR, RESEND_FACTOR * typical)


class Sends:
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

    def due(
        self, now: float, after: float, limit: int, patience: Mapping[int, float] | None = None
    ) -> list[int]:
        """The waiting nodes to send again now: `after` seconds since their last send (times
        the node's `patience`, a slow device's slowness on the wall clock: a resend would only
        start its work again), at most `limit` resends."""
        times = patience or {}
        return sorted(
            n
            for n in self.waiting
            if len(self.ids[n]) <= limit and now - self.last[n] >= after * times.get(n, 1.0)
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
