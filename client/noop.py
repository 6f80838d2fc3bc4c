"""No-op client: answers at once, so an exchange measures only the runtime's own cost."""

from __future__ import annotations

from flwr.app import RecordDict

from client.env import ClientEnv
from pollen import protocol


def noop(content: RecordDict, env: ClientEnv) -> RecordDict:
    return protocol.reply(content, env.cid, {protocol.NUM_EXAMPLES: 0}, **{
        name: rec for name, rec in content.items() if name == protocol.ARRAYS
    })


HANDLERS = {"query.noop": noop}
