"""What travels in a message: the envelope every instruction and reply carries, and array codecs.

Every instruction holds a `pollen` ConfigRecord naming its round and message type; every reply
echoes both and adds the client's stable id, so a reply can never be taken for one of another
phase or round. Algorithm content sits beside it in named records.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

ENVELOPE = "pollen"
CONFIG = "config"
METRICS = "metrics"
ARRAYS = "arrays"
NUM_EXAMPLES = "num-examples"
ROUND = "round"


def instruction(
    server_round: int,
    message_type: str,
    config: Mapping[str, int | float | str | bool] | None = None,
    **arrays: Mapping[str, np.ndarray] | ArrayRecord,
) -> RecordDict:
    """An instruction; each keyword becomes a named ArrayRecord."""
    content = RecordDict(
        {ENVELOPE: ConfigRecord({"round": server_round, "message-type": message_type})}
    )
    if config:
        content[CONFIG] = ConfigRecord(dict(config))
    for name, value in arrays.items():
        content[name] = value if isinstance(value, ArrayRecord) else to_record(value)
    return content


def reply(
    request: RecordDict,
    client_id: int,
    metrics: Mapping[str, int | float],
    **arrays: Mapping[str, np.ndarray] | ArrayRecord,
) -> RecordDict:
    env = request[ENVELOPE]
    content = RecordDict(
        {
            ENVELOPE: ConfigRecord(
                {
                    "round": round_of(request),
                    "message-type": str(env["message-type"]),  # type: ignore[index]
                    "client-id": client_id,
                }
            ),
            METRICS: MetricRecord(dict(metrics)),
        }
    )
    for name, value in arrays.items():
        content[name] = value if isinstance(value, ArrayRecord) else to_record(value)
    return content


# ---- packed messages (simulation) -----------------------------------------------------------
PACK = "pollen-pack"
"""In simulation a SuperNode may host many clients (setting simulation-nodes): the engine sends
it one message per phase carrying its clients' instructions, and it answers with one message
carrying their replies. This ConfigRecord lists the clients; client c's records are named
"c/<record>". Records shared by several clients (the same global model) travel once: Flower
stores a message's objects by content hash."""
ERROR = "error"
"""A packed reply's record for a client whose handler raised: its "reason"."""


class PackError(ValueError):
    """A packed message that does not hold what its client list says."""


def pack(contents: Mapping[int, RecordDict]) -> RecordDict:
    """One message's content carrying the contents of several clients, by client id."""
    packed = RecordDict({PACK: ConfigRecord({"clients": sorted(contents)})})
    for cid in sorted(contents):
        for name, record in contents[cid].items():
            packed[f"{cid}/{name}"] = record
    return packed


def is_packed(content: RecordDict) -> bool:
    return PACK in content


def unpack(content: RecordDict) -> dict[int, RecordDict]:
    """The per-client contents of a packed message, by client id (PackError when the message
    names records of clients it does not list, or lists something else than client ids)."""
    listed = content[PACK]
    clients = listed.get("clients") if isinstance(listed, ConfigRecord) else None
    if not isinstance(clients, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) for c in clients
    ):
        raise PackError(f"the pack's client list is not a list of ids: {clients!r}")
    parts: dict[int, RecordDict] = {int(c): RecordDict() for c in clients}  # type: ignore[arg-type]
    for name, record in content.items():
        if name == PACK:
            continue
        head, sep, rest = name.partition("/")
        if not sep or not head.isdigit() or int(head) not in parts or not rest:
            raise PackError(f"record {name!r} belongs to no client the pack lists")
        parts[int(head)][rest] = record
    return parts


def error_reply(reason: str) -> RecordDict:
    """A packed reply's part for a client whose handler raised."""
    return RecordDict({ERROR: ConfigRecord({"reason": reason})})


def error_of(content: RecordDict) -> str | None:
    """The reason of an error part (None: an ordinary reply)."""
    record = content.get(ERROR)
    if ENVELOPE in content or not isinstance(record, ConfigRecord):
        return None
    return str(record.get("reason", ""))


def without_arrays(content: RecordDict) -> RecordDict:
    """The content's records other than arrays (envelope, metrics, config)."""
    return RecordDict({k: v for k, v in content.items() if not isinstance(v, ArrayRecord)})


def as_int(value: object) -> int:
    """A record value that must be an integer (records are loosely typed)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise TypeError(f"expected an integer, got {value!r}")
    return int(value)


def round_of(content: RecordDict) -> int:
    return as_int(content[ENVELOPE][ROUND])  # type: ignore[index]


def metrics_of(content: RecordDict) -> MetricRecord:
    record = content[METRICS]
    if not isinstance(record, MetricRecord):
        raise TypeError("'metrics' is not a MetricRecord")
    return record


def arrays_of(content: RecordDict, name: str = ARRAYS) -> dict[str, np.ndarray]:
    record = content[name]
    if not isinstance(record, ArrayRecord):
        raise TypeError(f"'{name}' is not an ArrayRecord")
    return from_record(record)


_codec_seconds = 0.0


def codec_seconds() -> float:
    """Seconds this process has spent turning arrays into record bytes and back (flwr's Array
    runs np.save / np.load): the part of serialization that happens inside Pollen's code."""
    return _codec_seconds


def to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    global _codec_seconds
    started = time.perf_counter()
    record = ArrayRecord({k: Array(_contiguous(v)) for k, v in arrays.items()})
    _codec_seconds += time.perf_counter() - started
    return record


def _contiguous(value: np.ndarray) -> np.ndarray:
    """C-contiguous without changing the shape (np.ascontiguousarray turns a 0-d array, e.g.
    BatchNorm's num_batches_tracked, into shape (1,))."""
    array = np.asarray(value)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def from_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: decode(record[k]) for k in record}


def decode(array: Array) -> np.ndarray:
    global _codec_seconds
    started = time.perf_counter()
    value = array.numpy()
    _codec_seconds += time.perf_counter() - started
    return value


def config_of(content: RecordDict) -> dict[str, int | float | str | bool]:
    if CONFIG not in content:
        return {}
    return dict(content[CONFIG])  # type: ignore[arg-type]


def payload_bytes(content: RecordDict) -> int:
    """Bytes of array data in a message (what dominates traffic)."""
    total = 0
    for record in content.values():
        if isinstance(record, ArrayRecord):
            total += sum(len(record[k].data) for k in record)
    return total
