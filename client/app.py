"""The ClientApp: routes each message type to the run's algorithm's client handler.

Deployment starts a fresh process per message, so this module imports nothing heavy. On a node
with a resident worker (client.worker; `pollen client` and `pollen deploy` start one) this
process only relays the message to it (client.relay); otherwise the handler module (and torch
with it) is imported here, once the message type is known.
"""

from __future__ import annotations

import logging
import resource
import time

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

from client import relay, resident
from client.dispatch import answer_node, seconds_since_process_start, wait_out
from client.env import ClientEnv
from pollen.core import protocol
from pollen.core.registry import all_message_types
from pollen.core.runconfig import from_run_config
from pollen.core.settings import RunSettings

log = logging.getLogger("flwr.pollen")

app = ClientApp()


def handle(msg: Message, context: Context) -> Message:
    """Flower's entry point: the node's resident worker answers when the node has one
    (client.relay), else this process runs the handler."""
    entered = time.perf_counter()
    sock = relay.configured_socket()
    settings = from_run_config(context.run_config)
    timing = RunSettings.of(settings).client_timing
    if sock is not None:
        try:
            content = relay.forward(msg, context, sock, timing)
        except resident.WorkerUnavailable as exc:
            log.warning("pollen: %s; this ClientApp runs the handler itself", exc)
        else:
            wait_out(content, settings)
            reply = Message(content, reply_to=msg)
            if timing:
                add_relay_timing(content, time.perf_counter() - entered)
                add_serialization_timing(msg, reply)
            return reply
    env = ClientEnv.from_context(context)
    content = answer_node(msg.metadata.message_type, msg.content, env)
    wait_out(content, settings)
    reply = Message(content, reply_to=msg)
    if env.run.client_timing:
        add_serialization_timing(msg, reply)
    return reply


def add_relay_timing(content: RecordDict, relay_seconds: float) -> None:
    """What relaying cost (client-timing): time-relay is this process's part of the message
    (context and contents to the worker and back) beside the worker's handler; time-relay-startup
    this ClientApp process's start to its handler (Flower's start-up, the bundle, the imports)."""
    metrics = content[protocol.METRICS]
    assert isinstance(metrics, MetricRecord)
    handler = metrics.get("time-handler", 0.0)
    assert isinstance(handler, float | int)
    metrics["time-relay"] = max(0.0, relay_seconds - handler)
    alive = seconds_since_process_start()
    if alive is not None:
        metrics["time-relay-startup"] = max(0.0, alive - relay_seconds)
    metrics["relay-peak-rss-mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def add_serialization_timing(incoming: Message, reply: Message) -> None:
    """Flower's own serialization, which runs outside the handler: time-serialize is the reply
    turned into the objects Flower pushes (each deflated, with its content hash as id),
    time-deserialize the incoming message rebuilt from such objects (for a packed message,
    each client's share). Measured by doing each once more here (client-timing only); the
    reply's array ids stay cached for Flower's push."""
    started = time.perf_counter()
    for obj in get_all_nested_objects(reply).values():
        obj.deflate()
    serialize = time.perf_counter() - started
    objects = get_all_nested_objects(incoming)
    contents = {object_id: obj.deflate() for object_id, obj in objects.items()}
    started = time.perf_counter()
    inflate_object_from_contents(incoming.object_id, contents)
    deserialize = time.perf_counter() - started
    # a packed reply (a simulated node hosting several clients): each client its share
    content = reply.content
    parts = [content[n] for n in content if n.split("/")[-1] == protocol.METRICS]
    for metrics in parts:
        if isinstance(metrics, MetricRecord):
            metrics["time-serialize"] = serialize / len(parts)
            metrics["time-deserialize"] = deserialize / len(parts)


def _register() -> None:
    decorators = {"train": app.train, "evaluate": app.evaluate, "query": app.query}
    for message_type in all_message_types():
        category, _, action = message_type.partition(".")
        if action:
            decorators[category](action)(handle)
        else:
            decorators[category]()(handle)


_register()
