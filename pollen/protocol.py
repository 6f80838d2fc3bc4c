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
