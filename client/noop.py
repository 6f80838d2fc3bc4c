"""No-op client: answers at once (echoing any arrays), so an exchange measures only the
runtime's own cost."""

from __future__ import annotations

from flwr.app import ArrayRecord, RecordDict

from client.env import ClientEnv
from pollen.core import protocol


def noop(content: RecordDict, env: ClientEnv) -> RecordDict:
    echo = content.get(protocol.ARRAYS)
    metrics = {protocol.NUM_EXAMPLES: 0}
    if isinstance(echo, ArrayRecord):
        return protocol.reply(content, env.cid, metrics, arrays=echo)
    return protocol.reply(content, env.cid, metrics)


HANDLERS = {"query.noop": noop}
