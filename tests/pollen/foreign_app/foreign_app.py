"""An app that is not the operator's: if its ClientApp ever runs on a SuperNode, it leaves the
file named by its `marker` setting behind. Its ServerApp prints what the nodes answered."""

from __future__ import annotations

import time
from pathlib import Path

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

server = ServerApp()
client = ClientApp()


@client.query()
def query(msg: Message, context: Context) -> Message:
    Path(str(context.run_config["marker"])).write_text("foreign code ran here\n")
    return Message(RecordDict(), reply_to=msg)


@server.main()
def main(grid: Grid, context: Context) -> None:
    nodes: list[int] = []
    for _ in range(120):
        nodes = list(grid.get_node_ids())
        if len(nodes) >= int(context.run_config["nodes"]):
            break
        time.sleep(0.5)
    msgs = [Message(RecordDict(), dst_node_id=n, message_type="query") for n in nodes]
    replies = list(grid.send_and_receive(msgs, timeout=120))
    for reply in replies:
        print("foreign app reply:", reply.error.reason if reply.has_error() else "ok")
