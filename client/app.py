"""The ClientApp: routes each message type to the run's algorithm's client handler.

Deployment starts a fresh process per message, so this module imports nothing heavy: the
handler module (and torch with it) is imported only once the message type is known.
"""

from __future__ import annotations

import logging

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from client.env import ClientEnv
from pollen import protocol
from pollen.registry import HELLO, all_message_types, get_algorithm

log = logging.getLogger("flwr.pollen")

app = ClientApp()


def hello(content: RecordDict, env: ClientEnv) -> RecordDict:
    """Tell the server who this node is and how much data it holds."""
    data = env.data
    return protocol.reply(
        content,
        env.cid,
        {
            protocol.NUM_EXAMPLES: len(data.train),
            "val-examples": len(data.val),
            "test-examples": len(data.test),
        },
    )


def handle(msg: Message, context: Context) -> Message:
    env = ClientEnv.from_context(context)
    message_type = msg.metadata.message_type
    if message_type == HELLO:
        content = hello(msg.content, env)
    else:
        spec = get_algorithm(str(env.settings["algorithm"]))
        content = spec.client_handler(message_type)(msg.content, env)
    return Message(content, reply_to=msg)


def _register() -> None:
    decorators = {"train": app.train, "evaluate": app.evaluate, "query": app.query}
    for message_type in all_message_types():
        category, _, action = message_type.partition(".")
        if action:
            decorators[category](action)(handle)
        else:
            decorators[category]()(handle)


_register()
