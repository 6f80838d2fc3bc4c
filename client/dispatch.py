"""What a client runs for a message, wherever it runs: the run's handler for the message type
(or the hello every node answers, or a stage of secure aggregation: client.secagg), with the
client-timing figures. A ClientApp process (client.app) and a node's resident worker
(client.worker) both call `answer`."""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
from collections.abc import Callable, Mapping

import numpy as np
from flwr.app import MetricRecord, RecordDict

from client import secagg
from client.env import (
    ClientConfigError,
    ClientEnv,
    ClientHandler,
    client_handler,
    keep_simulated_data,
    pass_arrays_out_of_band,
)
from client.warm import lending
from pollen.core import protocol
from pollen.core.contracts import client_dp
from pollen.core.contracts import secagg as secagg_contract
from pollen.core.pacing import Device, HeterogeneitySettings
from pollen.core.protection import ClientDPSettings
from pollen.core.protocol import HELLO, Hello
from pollen.core.registry import AlgorithmSpec, get_algorithm
from pollen.core.settings import Scalar
from robust.attacks import attack_rows
from robust.client_dp import privatize_update
from robust.flat import flatten, unflatten
from robust.rules import mean

log = logging.getLogger("flwr.pollen")


def hello(content: RecordDict, env: ClientEnv) -> RecordDict:
    """Tell the server who this node is and how much data it holds."""
    data = env.data
    hello_of = Hello(len(data.train), len(data.val), len(data.test), env.data_fn is not None)
    return protocol.reply(content, env.cid, hello_of.metrics())


def answer(message_type: str, content: RecordDict, env: ClientEnv) -> RecordDict:
    """The reply content of the run's handler for `message_type` (with the client-timing
    metrics when the run asks for them): what a ClientApp and a resident worker both run."""
    entered = time.perf_counter()
    timing = env.run.client_timing
    spec = None if message_type == HELLO else get_algorithm(env.run.algorithm)
    if timing and spec is not None and spec.uses_torch:
        _time_torch_import(env)
    codec = protocol.codec_seconds()
    device = protocol.device_of(content)
    served = _examples_served()
    stage = message_type in secagg_contract.STAGES
    masked = not stage and spec is not None and secagg.is_masked(content)
    handler: ClientHandler
    if spec is None:
        handler = hello
    elif stage:
        handler = secagg.HANDLERS[message_type]
    else:
        handler = client_handler(spec, message_type)
    with lending():  # the models this client is lent are free again when it is done
        reply = handler(content, env)
    if spec is not None and message_type == "train" and spec.client_dp and not masked:
        reply = privatized(reply, content, env, spec)
    if spec is not None and message_type.startswith("train") and env.attack is not None:
        reply = attacked(reply, content, env, spec.model_reply)
    if masked:  # secure aggregation: the summed records leave encoded and masked
        reply = secagg.masked(reply, content, env)
    if device is not None:
        paced(reply, content, device, _examples_served() - served, time.perf_counter() - entered)
    if timing:
        add_timing(reply, env, time.perf_counter() - entered, protocol.codec_seconds() - codec)
    return reply


def paced(
    reply: RecordDict,
    instruction: RecordDict,
    device: Mapping[str, float | str],
    examples: int,
    seconds: float,
) -> None:
    """The message as the client's device (heterogeneity.*, docs/pacing.md#devices) would take
    it: on the virtual clock the reply reports the device's time (`device-seconds`) for the
    examples its handler trained on and the bytes it received and sends; on the wall clock it
    reports what its device would take longer than this machine did (`device-wait-seconds`),
    which the process that hands the reply to Flower waits out (`wait_out`): never a node's
    resident worker, which other nodes' messages may be waiting for."""
    own = Device.from_json(device)
    down, up = protocol.payload_bytes(instruction), protocol.payload_bytes(reply)
    metrics = protocol.metrics_of(reply)
    if device.get("clock") == "virtual":
        metrics[protocol.DEVICE_SECONDS] = own.seconds(examples, down, up)
        return
    reference = Device(float(device["reference-ms"]), 1.0, 0.0)
    metrics[protocol.DEVICE_WAIT] = own.extra_seconds(seconds, reference, down, up)


def wait_out(
    content: RecordDict,
    settings: Mapping[str, Scalar],
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Wait what the reply's device adds on the wall clock (`paced`); a packed reply's clients
    are devices of their own, working side by side: the longest. Returns the seconds waited
    (a run without devices on the wall clock: 0, at once)."""
    het = HeterogeneitySettings.of(settings)
    if not het.enabled or het.virtual:
        return 0.0
    parts = [content] if protocol.METRICS in content else []
    if protocol.is_packed(content):
        parts = [p for p in protocol.unpack(content).values() if protocol.METRICS in p]
    waits = [dict(p[protocol.METRICS]).get(protocol.DEVICE_WAIT, 0.0) for p in parts]
    longest = max([float(w) for w in waits if isinstance(w, int | float)], default=0.0)
    if longest > 0:
        sleep(longest)
    return longest


def _examples_served() -> int:
    """The examples this process's training batches served so far (0 before any training:
    torch is not imported for a message that trains on nothing)."""
    training = sys.modules.get("client.training")
    served: int = training.examples_served() if training is not None else 0
    return served


def privatized(
    reply: RecordDict, instruction: RecordDict, env: ClientEnv, spec: AlgorithmSpec
) -> RecordDict:
    """The training reply as client-level DP with the noise on the clients sends it
    (`client-dp.noise-at=client`, docs/privacy.md#client-level-dp): the client's update of the
    round (its model minus the model it received, and its other update records, as one
    vector) clipped to `client-dp.clip`, plus N(0, (z clip)^2) on every coordinate, drawn from
    the client's private seed. Unchanged in any other run."""
    mech = client_dp.mechanism(env.settings)
    if mech is None or not mech.local:
        return reply
    names = (protocol.ARRAYS, *spec.update_records)
    parts = {name: protocol.arrays_of(reply, name) for name in names}
    received = protocol.arrays_of(instruction) if spec.model_reply else None
    keys = {name: list(arrays) for name, arrays in parts.items()}
    starts = [
        flatten(received, keys[name]) if name == protocol.ARRAYS and received is not None
        else np.zeros(sum(np.size(a) for a in parts[name].values()))
        for name in names
    ]  # fmt: skip
    base = np.concatenate(starts)
    update = np.concatenate([flatten(parts[name], keys[name]) for name in names]) - base
    rnd = protocol.round_of(instruction)
    reproducible = ClientDPSettings.of(env.settings).reproducible
    seed = env.seed(rnd, "client-dp") if reproducible else env.private_seed(rnd, "client-dp")
    rng = np.random.default_rng(seed)
    sent = base + privatize_update(update, mech.clip, mech.noise_multiplier, rng)
    start = 0
    for name in names:
        size = sum(np.size(a) for a in parts[name].values())
        reply[name] = protocol.to_record(
            unflatten(sent[start : start + size], parts[name], keys[name])
        )
        start += size
    return reply


ATTACKING = "attacking"
"""Metric of an attacking client's training reply: 1 (honest replies do not carry it, so a
round's metrics show `attacking` = 1 whenever an attacking client's reply was among them); an
attack is never silent in the results."""


def attacked(
    reply: RecordDict, instruction: RecordDict, env: ClientEnv, model_reply: bool
) -> RecordDict:
    """The training reply as the client's own attack changes it (docs/robustness.md#attacks):
    for the node's sign-flip, gaussian or model-replacement the trained model w becomes
    g + a(w - g), g the model received and a the attack's transformation of the client's
    update (robust.attacks); for label-flip the arrays stay (the labels were flipped before
    training). Either way the reply's metrics carry `attacking` = 1. An algorithm whose reply
    is not a model (`model_reply`) takes label-flip only."""
    kind = env.attack
    if kind is None:
        return reply
    protocol.metrics_of(reply)[ATTACKING] = 1.0
    attack = env.node_attack
    if attack is None or kind == "label-flip":
        return reply
    if not model_reply:
        raise ClientConfigError(
            f"node attack {kind}: {env.run.algorithm}'s training replies are not models this "
            "node can change; a node runs label-flip there, the other attacks run in simulation "
            "(attack.*)"
        )
    received = protocol.arrays_of(instruction)
    trained = protocol.arrays_of(reply)
    keys = list(trained)
    start = flatten(received, keys)
    row = attack_rows(
        attack.kind,
        np.zeros((0, start.size)),
        (flatten(trained, keys) - start)[None, :],
        rule=lambda x, _f: mean(x),
        f=0,
        rng=np.random.default_rng(env.seed(protocol.round_of(instruction), "attack")),
        scale=attack.scale,
        std=attack.std,
    )[0]
    reply[protocol.ARRAYS] = protocol.to_record(unflatten(start + row, trained, keys))
    return reply


def answer_node(message_type: str, content: RecordDict, env: ClientEnv) -> RecordDict:
    """What the node answers: its client's reply; on a simulated node hosting several clients
    (setting simulation-nodes), one packed reply carrying the reply of each client the packed
    instruction names (the hello: of every client the node hosts). A client whose handler
    raises gets an error part with the reason; the node's other clients are not affected."""
    if not env.packed:
        return answer(message_type, content, env)
    keep_simulated_data()
    pass_arrays_out_of_band()
    if message_type == HELLO:
        instructions = dict.fromkeys(env.hosted, content)
    elif not protocol.is_packed(content):
        raise ClientConfigError(
            "this node hosts several clients (setting simulation-nodes) and got an instruction "
            "that is not packed"
        )
    else:
        instructions = protocol.unpack(content)
    replies: dict[int, RecordDict] = {}
    for cid, instruction in instructions.items():
        try:
            replies[cid] = answer(message_type, instruction, env.for_client(cid))
        except Exception as exc:  # this client's failure, not its node's
            log.exception("client %s failed on %s", cid, message_type)
            replies[cid] = protocol.error_reply(f"{type(exc).__name__}: {exc}")
    return protocol.pack(replies)


_first_message = True


def _time_torch_import(env: ClientEnv) -> None:
    """With client-timing, torch is imported up front so that its share is known apart."""
    if "torch" not in sys.modules:
        started = time.perf_counter()
        import torch  # lazy: torch  # noqa: F401

        env._extra["torch-import-seconds"] = time.perf_counter() - started


def seconds_since_process_start() -> float | None:
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
    process only (a ClientApp process without a resident worker serves one message; a
    resident worker and a simulation's Ray worker live on). peak-rss-mb: the process that ran
    the handler."""
    global _first_message
    metrics = content[protocol.METRICS]
    assert isinstance(metrics, MetricRecord)
    metrics["time-handler"] = handler_seconds
    metrics["time-data"] = float(env._extra.get("data-seconds", 0.0))
    metrics["time-import-torch"] = float(env._extra.get("torch-import-seconds", 0.0))
    metrics["time-codec"] = codec_seconds
    alive = seconds_since_process_start()
    if _first_message and alive is not None:
        metrics["time-startup"] = max(0.0, alive - handler_seconds)
    _first_message = False
    metrics["peak-rss-mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
