"""The checks every reply passes before a strategy sees it: size, the envelope (round, phase,
client id), the metrics (a sane example count, finite values) and finite arrays, then the
strategy's own validator. A reply that fails is skipped with the reason; a malformed reply
never raises out of here (docs/reliability.md)."""

from __future__ import annotations

import math

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from pollen.core import protocol
from pollen.core.settings import RunSettings
from strategies.base import InvalidReply, Validator


def screen(
    content: RecordDict,
    message_type: str,
    key: int,
    validate: Validator | None,
    server_round: int,
    run: RunSettings,
    expect_cid: bool = True,
) -> str | None:
    """Why a reply must be skipped (None: it may be used): the engine's checks, then the
    strategy's validator."""
    try:
        size = protocol.payload_bytes(content)
        check_reply(content, message_type, key if expect_cid else None, size, server_round, run)
        if validate is not None:
            validate(key, content)
    except InvalidReply as exc:
        return f"invalid reply: {exc}"
    except Exception as exc:  # a malformed reply must never stop the server
        return f"invalid reply ({type(exc).__name__}): {exc}"
    return None


def check_reply(
    content: RecordDict,
    message_type: str,
    cid: int | None,
    size: int,
    server_round: int,
    run: RunSettings,
) -> None:
    """Raises InvalidReply naming what is wrong with a reply of `size` bytes to the
    `message_type` instruction of `server_round` sent to client `cid` (None: not known yet)."""
    limit = run.max_reply_mb * 1e6
    if size > limit:
        raise InvalidReply(f"payload of {size} bytes exceeds max-reply-mb")
    envelope = content.get(protocol.ENVELOPE)
    if not isinstance(envelope, ConfigRecord):
        raise InvalidReply("no 'pollen' envelope")
    if envelope.get("round") != server_round:
        raise InvalidReply(f"reply for round {envelope.get('round')!r}, expected {server_round}")
    phase = envelope.get(protocol.MESSAGE_TYPE)
    if phase != message_type:
        raise InvalidReply(f"reply for phase {phase!r}, expected {message_type!r}")
    if cid is not None and envelope.get(protocol.CLIENT_ID) != cid:
        raise InvalidReply(
            f"reply from client {envelope.get(protocol.CLIENT_ID)!r}, expected {cid}"
        )
    metrics = content.get(protocol.METRICS)
    if not isinstance(metrics, MetricRecord):
        raise InvalidReply("no metrics record")
    n = metrics.get(protocol.NUM_EXAMPLES)
    if not isinstance(n, int | float) or isinstance(n, bool) or not math.isfinite(n):
        raise InvalidReply(f"num-examples is {n!r}")
    if n < 0 or n > run.max_examples or n != int(n):
        raise InvalidReply(f"num-examples {n} is not a count in [0, max-examples]")
    for key, value in metrics.items():
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
            raise InvalidReply(f"metric {key!r} is not finite: {value!r}")
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            try:
                arrays = protocol.from_record(record, copy=False)
            except protocol.BundleError as exc:
                raise InvalidReply(f"record {name!r}: {exc}") from None
            for key, arr in arrays.items():
                if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
                    raise InvalidReply(f"array {name}.{key} has NaN or Inf")


def check_hello(content: RecordDict, num_clients: int) -> None:
    """Raises InvalidReply unless a hello reply names a client id of the run and carries the
    hello's counts (pollen.core.protocol.Hello)."""
    cid = content[protocol.ENVELOPE].get(protocol.CLIENT_ID)  # type: ignore[union-attr]
    if not isinstance(cid, int) or isinstance(cid, bool):
        raise InvalidReply(f"hello without an integer client-id: {cid!r}")
    if not 0 <= cid < num_clients:
        raise InvalidReply(f"client-id {cid} outside [0, num-clients)")
    try:
        protocol.Hello.of(protocol.metrics_of(content))
    except TypeError as exc:
        raise InvalidReply(str(exc)) from None
