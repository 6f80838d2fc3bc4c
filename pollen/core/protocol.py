"""What travels in a message: the envelope every instruction and reply carries, and array codecs.

Every instruction holds a `pollen` ConfigRecord naming its round and message type; every reply
echoes both and adds the client's stable id, so a reply can never be taken for one of another
phase or round. Algorithm content sits beside it in named records.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

ENVELOPE = "pollen"
CONFIG = "config"
METRICS = "metrics"
ARRAYS = "arrays"
NUM_EXAMPLES = "num-examples"
ROUND = "round"
MESSAGE_TYPE = "message-type"
CLIENT_ID = "client-id"
"""The envelope's keys: the round and message type an instruction belongs to (a reply repeats
them), and the client a reply is from."""

UNSEEN = "unseen"
"""Config key of an `evaluate` instruction: the client never trained in this run (an unseen
client, evaluated after one step of personalisation where the algorithm has one)."""

HELLO = "query.hello"
"""Sent to every newly seen node before it takes part (server.engine); answered by
client.dispatch.hello with the client's id and its `Hello`."""


@dataclass(frozen=True)
class Hello:
    """What a client tells the server of itself in its hello reply: the sizes of its
    partition's splits (the train size is the reply's `num-examples`)."""

    num_train: int
    num_val: int
    num_test: int
    own_data: bool = False
    """The client's data came from a Flower app's own data function (pollen.flower), not from
    the run's `dataset` setting."""

    VAL: ClassVar[str] = "val-examples"
    TEST: ClassVar[str] = "test-examples"
    OWN_DATA: ClassVar[str] = "own-data"

    def metrics(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {
            NUM_EXAMPLES: self.num_train, self.VAL: self.num_val, self.TEST: self.num_test
        }  # fmt: skip
        if self.own_data:
            out[self.OWN_DATA] = 1
        return out

    @classmethod
    def of(cls, metrics: Mapping[str, Any]) -> Hello:
        """The hello in a reply's metrics; TypeError naming the count that is missing or not
        an integer."""
        counts = []
        for key in (NUM_EXAMPLES, cls.VAL, cls.TEST):
            try:
                counts.append(as_int(metrics.get(key)))
            except TypeError:
                raise TypeError(f"hello without a count {key}") from None
        train, val, test = counts
        return cls(train, val, test, own_data=metrics.get(cls.OWN_DATA) == 1)


def instruction(
    server_round: int,
    message_type: str,
    config: Mapping[str, int | float | str | bool] | None = None,
    **arrays: Mapping[str, np.ndarray] | ArrayRecord,
) -> RecordDict:
    """An instruction; each keyword becomes a named ArrayRecord."""
    content = RecordDict(
        {ENVELOPE: ConfigRecord({ROUND: server_round, MESSAGE_TYPE: message_type})}
    )
    if config:
        content[CONFIG] = ConfigRecord(dict(config))
    for name, value in arrays.items():
        content[name] = value if isinstance(value, ArrayRecord) else to_record(value)
    return content


def to_each(clients: Iterable[int], content: RecordDict) -> dict[int, RecordDict]:
    """The same instruction for each of `clients`, by client id: one content object, built
    once (contents are never changed once made; a packed message names its records once per
    client and Flower moves an object shared by several of them once)."""
    return dict.fromkeys(clients, content)


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
                    ROUND: round_of(request),
                    MESSAGE_TYPE: str(env[MESSAGE_TYPE]),  # type: ignore[index]
                    CLIENT_ID: client_id,
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


def arrays_of(content: RecordDict, name: str = ARRAYS, copy: bool = True) -> dict[str, np.ndarray]:
    """The arrays of the content's record `name` (`from_record`; `copy=False`: read-only
    views of the message's bytes)."""
    record = content[name]
    if not isinstance(record, ArrayRecord):
        raise TypeError(f"'{name}' is not an ArrayRecord")
    return from_record(record, copy)


_codec_seconds = 0.0


def codec_seconds() -> float:
    """Seconds this process has spent turning arrays into record bytes and back (flwr's Array
    runs np.save / np.load): the part of serialization that happens inside Pollen's code."""
    return _codec_seconds


BUNDLE = "pollen-arrays"
"""The one key of every ArrayRecord Pollen sends, and the stype of its one Array: all the
record's arrays in a single Flower object. Flower 1.39 moves each object of a message with a
request of its own at every hop (ServerApp, SuperLink, SuperNode, ClientApp and back), so a
model sent as one array per tensor costs a request per tensor per hop; bundled it costs one.

Layout of the bundle's bytes: a 4-byte little-endian length L, L bytes of JSON (a list of
[name, dtype, shape], dtype as numpy's `dtype.str`), then each array's C-ordered bytes in that
order. Only numeric and boolean dtypes travel; nothing in a bundle is ever unpickled."""

_HEADER_BYTES = 4
_DTYPE_KINDS = "biufc"


class BundleError(ValueError):
    """Bytes that are not a well-formed array bundle (a bad or hostile reply)."""


def to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """The arrays as an ArrayRecord holding one bundle (see BUNDLE)."""
    global _codec_seconds
    started = time.perf_counter()
    values = {k: np.asarray(v) for k, v in arrays.items()}
    for name, value in values.items():
        if value.dtype.kind not in _DTYPE_KINDS:
            raise TypeError(f"array {name!r} has dtype {value.dtype}: only numbers travel")
    header = _header(tuple((name, value.dtype.str, value.shape) for name, value in values.items()))
    parts: list[bytes | memoryview] = [len(header).to_bytes(_HEADER_BYTES, "little"), header]
    # each array's bytes copied once, into the bundle (the arrays may share a model's memory)
    parts += [_contiguous(value).reshape(-1).view(np.uint8).data for value in values.values()]
    data = b"".join(parts)
    record = ArrayRecord({BUNDLE: Array("uint8", (len(data),), BUNDLE, data)})
    _codec_seconds += time.perf_counter() - started
    return record


def array_fields(array: Array) -> tuple[str, tuple[int, ...], str, np.ndarray]:
    """An Array as its fields, its bytes as a NumPy view of them: how a simulation worker hands
    Ray an Array (client.env.pass_arrays_out_of_band). Ray moves a NumPy array's memory beside
    the pickle stream, written once into its object store, where `bytes` would be copied into
    the stream first (a packed node's reply carries every client's model)."""
    return array.dtype, array.shape, array.stype, np.frombuffer(array.data, np.uint8)


def array_of_fields(fields: tuple[str, tuple[int, ...], str, np.ndarray]) -> Array:
    """The Array again, owning its bytes (a copy out of Ray's object store)."""
    dtype, shape, stype, data = fields
    return Array(dtype, tuple(shape), stype, data.tobytes())


@functools.lru_cache(maxsize=64)
def _header(layout: tuple[tuple[str, str, tuple[int, ...]], ...]) -> bytes:
    """A bundle's JSON header of (name, dtype, shape) entries (kept: a run sends the same
    layout with every message)."""
    entries = [[name, dtype, list(shape)] for name, dtype, shape in layout]
    return json.dumps(entries, separators=(",", ":")).encode()


def _contiguous(value: np.ndarray) -> np.ndarray:
    """C-contiguous without changing the shape (np.ascontiguousarray turns a 0-d array, e.g.
    BatchNorm's num_batches_tracked, into shape (1,))."""
    array = np.asarray(value)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def from_record(record: ArrayRecord, copy: bool = True) -> dict[str, np.ndarray]:
    """The arrays of a record made by `to_record`, each a fresh writable array, or with
    `copy=False` a read-only view of the record's bytes (for reading at once: checking a reply,
    folding it into a mean); BundleError when the record is anything else or its bytes do not
    match their header."""
    global _codec_seconds, _last_views
    started = time.perf_counter()
    if list(record.keys()) != [BUNDLE] or record[BUNDLE].stype != BUNDLE:
        raise BundleError(f"not a Pollen array bundle (keys {sorted(record.keys())})")
    data = record[BUNDLE].data
    last = _last_views
    if not copy and last is not None and last[0] is data:
        arrays = dict(last[1])  # the same reply read again (its check, then its fold)
    else:
        arrays = _unbundle(data, copy)
        if not copy:
            _last_views = (data, arrays)
    _codec_seconds += time.perf_counter() - started
    return arrays


_last_views: tuple[bytes, dict[str, np.ndarray]] | None = None
"""The newest bundle read as views and its arrays: the server reads each reply as it comes,
checks it, validates it and folds it, so that it is decoded once."""


def _unbundle(data: bytes, copy: bool = True) -> dict[str, np.ndarray]:
    if len(data) < _HEADER_BYTES:
        raise BundleError("array bundle shorter than its header length")
    size = int.from_bytes(data[:_HEADER_BYTES], "little")
    offset = _HEADER_BYTES + size
    if offset > len(data):
        raise BundleError("array bundle shorter than its header")
    header = bytes(data[_HEADER_BYTES:offset])
    layout = _kept_layout(header) if size <= _MOST_KEPT_HEADER else _layout(header)
    out: dict[str, np.ndarray] = {}
    view = memoryview(data)
    for name, dtype, shape, count in layout:
        end = offset + count * dtype.itemsize
        if end > len(data):
            raise BundleError(f"array bundle too short for {name!r}")
        flat = np.frombuffer(view[offset:end], dtype=dtype, count=count).reshape(shape)
        if copy:
            out[name] = flat.copy()
        else:
            flat.setflags(write=False)  # bytes are immutable; a bytearray's view is made so
            out[name] = flat
        offset = end
    if offset != len(data):
        raise BundleError(f"array bundle has {len(data) - offset} bytes its header does not name")
    return out


Layout = tuple[tuple[str, np.dtype[Any], tuple[int, ...], int], ...]


def _layout(header: bytes) -> Layout:
    """A bundle header's (name, dtype, shape, element count) entries, checked."""
    try:
        entries = json.loads(header)
    except ValueError:
        raise BundleError("array bundle header is not JSON") from None
    if not isinstance(entries, list):
        raise BundleError("array bundle header is not a list")
    layout: list[tuple[str, np.dtype[Any], tuple[int, ...], int]] = []
    names: set[str] = set()
    for entry in entries:
        name, dtype, shape = _entry(entry)
        if name in names:
            raise BundleError(f"array bundle names {name!r} twice")
        names.add(name)
        layout.append((name, dtype, shape, math.prod(shape)))
    return tuple(layout)


_kept_layout = functools.lru_cache(maxsize=64)(_layout)
"""`_layout` kept for the headers a run sends again and again (every reply of a model has the
same); a header that fails its checks raises every time and is never kept."""

_MOST_KEPT_HEADER = 64 * 2**10
"""Bytes of the largest header `_kept_layout` keeps (a larger one is parsed every time)."""


def _entry(entry: object) -> tuple[str, np.dtype[Any], tuple[int, ...]]:
    if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)):
        raise BundleError(f"array bundle entry {entry!r} is not [name, dtype, shape]")
    name, dtype_str, shape = entry
    try:
        dtype = np.dtype(dtype_str)
    except (TypeError, ValueError):
        raise BundleError(f"array {name!r}: unknown dtype {dtype_str!r}") from None
    if dtype.kind not in _DTYPE_KINDS or dtype.hasobject:
        raise BundleError(f"array {name!r}: dtype {dtype_str!r} is not numeric")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise BundleError(f"array {name!r}: shape {shape!r} is not a list of sizes")
    return name, dtype, tuple(shape)


DEVICE = "pollen-device"
"""A record of an instruction under `heterogeneity.*` (pollen.core.pacing): the device the client
runs on and the clock (`clock`: wall or virtual). A client on the virtual clock reports its
device's time for the message as the metric DEVICE_SECONDS; on the wall clock it waits out
what its device adds (DEVICE_WAIT)."""
DEVICE_SECONDS = "device-seconds"
DEVICE_WAIT = "device-wait-seconds"
"""On the wall clock: what the client's device adds to this machine's time for the message,
waited out before the reply goes back."""


def with_device(content: RecordDict, device: Mapping[str, float | str]) -> RecordDict:
    """The instruction with a DEVICE record; the instruction's own records are shared, not
    copied (an instruction is never changed once made)."""
    out = RecordDict(dict(content.items()))
    out[DEVICE] = ConfigRecord(dict(device))  # type: ignore[arg-type]
    return out


def device_seconds(content: RecordDict) -> float | None:
    """A reply's DEVICE_SECONDS (the virtual clock's arrival after its send), or None when it
    has none that is a finite, non-negative number."""
    value = dict(content[METRICS]).get(DEVICE_SECONDS)  # type: ignore[arg-type]
    if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def device_of(content: RecordDict) -> dict[str, float | str] | None:
    """The instruction's DEVICE record, or None."""
    if DEVICE not in content:
        return None
    return dict(content[DEVICE])  # type: ignore[arg-type]


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
