"""The ClientApp: routes each message type to the run's algorithm's client handler.

Deployment starts a fresh process per message, so this module imports nothing heavy: the
handler module (and torch with it) is imported only once the message type is known.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
import time

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

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
    entered = time.perf_counter()
    env = ClientEnv.from_context(context)
    message_type = msg.metadata.message_type
    timing = env.run.client_timing
    spec = None if message_type == HELLO else get_algorithm(env.run.algorithm)
    if timing and spec is not None and spec.uses_torch:
        _time_torch_import(env)
    codec = protocol.codec_seconds()
    if spec is None:
        content = hello(msg.content, env)
    else:
        content = spec.client_handler(message_type)(msg.content, env)
    reply = Message(content, reply_to=msg)
    if timing:
        add_timing(content, env, time.perf_counter() - entered, protocol.codec_seconds() - codec)
        add_serialization_timing(msg, reply)
    return reply


_first_message = True


def _time_torch_import(env: ClientEnv) -> None:
    """With client-timing, torch is imported up front so that its share is known apart."""
    if "torch" not in sys.modules:
        started = time.perf_counter()
        import torch  # lazy: torch  # noqa: F401

        env._extra["torch-import-seconds"] = time.perf_counter() - started


def _seconds_since_process_start() -> float | None:
    """Linux: time from this process's start to now (10 ms resolution); None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def add_timing(
    content: RecordDict, env: ClientEnv, handler_seconds: float, codec_seconds: float
) -> None:
    """Where a client's time went (setting `client-timing`); time-handler includes
    time-data, time-import-torch and time-codec (arrays <-> record bytes). time-startup is
    process start -> reply ready minus the handler, reported for the first message of a
    process only (in deployment every message starts a process; in simulation the worker
    lives on)."""
    global _first_message
    metrics = content[protocol.METRICS]
    assert isinstance(metrics, MetricRecord)
    metrics["time-handler"] = handler_seconds
    metrics["time-data"] = float(env._extra.get("data-seconds", 0.0))
    metrics["time-import-torch"] = float(env._extra.get("torch-import-seconds", 0.0))
    metrics["time-codec"] = codec_seconds
    alive = _seconds_since_process_start()
    if _first_message and alive is not None:
        metrics["time-startup"] = max(0.0, alive - handler_seconds)
    _first_message = False
    metrics["peak-rss-mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def add_serialization_timing(incoming: Message, reply: Message) -> None:
    """Flower's own serialization, which runs outside the handler: time-serialize is the reply
    turned into the objects Flower pushes (each deflated, with its content hash as id),
    time-deserialize the incoming message rebuilt from such objects. Measured by doing each
    once more here (client-timing only); the reply's array ids stay cached for Flower's push."""
    started = time.perf_counter()
    for obj in get_all_nested_objects(reply).values():
        obj.deflate()
    serialize = time.perf_counter() - started
    objects = get_all_nested_objects(incoming)
    contents = {object_id: obj.deflate() for object_id, obj in objects.items()}
    started = time.perf_counter()
    inflate_object_from_contents(incoming.object_id, contents)
    deserialize = time.perf_counter() - started
    metrics = reply.content[protocol.METRICS]
    assert isinstance(metrics, MetricRecord)
    metrics["time-serialize"] = serialize
    metrics["time-deserialize"] = deserialize


def _register() -> None:
    decorators = {"train": app.train, "evaluate": app.evaluate, "query": app.query}
    for message_type in all_message_types():
        category, _, action = message_type.partition(".")
        if action:
            decorators[category](action)(handle)
        else:
            decorators[category]()(handle)


_register()
