from __future__ import annotations

import json
import re

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, RecordDict

from pollen.core import protocol


def test_records_keep_every_shape_including_0d_and_non_contiguous() -> None:
    arrays: dict[str, np.ndarray] = {
        "count": np.array(7, dtype=np.int64),  # BatchNorm's num_batches_tracked is 0-d
        "weight": np.arange(12, dtype=np.float32).reshape(3, 4).T,  # not C-contiguous
        "empty": np.zeros((0, 5), dtype=np.float64),
    }
    back = protocol.from_record(protocol.to_record(arrays))
    assert set(back) == set(arrays)
    for key, value in arrays.items():
        assert back[key].shape == value.shape and back[key].dtype == value.dtype
        np.testing.assert_array_equal(back[key], value)


def test_the_codec_clock_counts_encoding_and_decoding() -> None:
    arrays = {"w": np.ones((256, 256), dtype=np.float32)}
    before = protocol.codec_seconds()
    record = protocol.to_record(arrays)
    encoded = protocol.codec_seconds()
    np.testing.assert_array_equal(protocol.from_record(record)["w"], arrays["w"])
    assert before < encoded < protocol.codec_seconds()


def _bundle(data: bytes) -> ArrayRecord:
    return ArrayRecord({protocol.BUNDLE: Array("uint8", (len(data),), protocol.BUNDLE, data)})


def _header(entries: object, body: bytes = b"") -> bytes:
    text = json.dumps(entries).encode()
    return len(text).to_bytes(4, "little") + text + body


def test_a_record_is_one_flower_array_whatever_the_number_of_tensors() -> None:
    """One object on the wire per record: Flower moves each Array with a request of its own."""
    arrays = {f"layer{i}": np.full((3, i + 1), i, np.float32) for i in range(6)}
    record = protocol.to_record(arrays)
    assert list(record.keys()) == [protocol.BUNDLE]
    assert protocol.payload_bytes(RecordDict({"arrays": record})) > sum(
        a.nbytes for a in arrays.values()
    )
    back = protocol.from_record(record)
    assert list(back) == list(arrays)  # the order of the tensors is kept
    back["layer0"][0, 0] = 5.0  # decoded arrays are fresh and writable


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x01", "shorter than its header length"),
        (_header([["w", "<f4", [2]]])[:-1], "shorter than its header"),
        ((2).to_bytes(4, "little") + b"{]", "not JSON"),
        (_header({"w": 1}), "not a list"),
        (_header([["w", "<f4"]]), "is not [name, dtype, shape]"),
        (_header([["w", "|O", [1]]], bytes(8)), "not numeric"),
        (_header([["w", "nope", [1]]], bytes(8)), "unknown dtype"),
        (_header([["w", "<f4", [-1]]]), "not a list of sizes"),
        (_header([["w", "<f4", [2]]], bytes(7)), "too short for 'w'"),
        (_header([["w", "<f4", [1]]], bytes(5)), "1 bytes its header does not name"),
        (_header([["w", "<f4", [1]], ["w", "<f4", [1]]], bytes(8)), "names 'w' twice"),
    ],
)
def test_a_malformed_bundle_is_refused_with_its_reason(data: bytes, reason: str) -> None:
    with pytest.raises(protocol.BundleError, match=re.escape(reason)):
        protocol.from_record(_bundle(data))


def test_a_header_read_before_still_checks_the_bytes_that_follow_it() -> None:
    good = _header([["w", "<f4", [2]]], np.arange(2, dtype="<f4").tobytes())
    for _ in range(2):  # the second read finds the header's layout kept
        np.testing.assert_array_equal(protocol.from_record(_bundle(good))["w"], [0.0, 1.0])
    with pytest.raises(protocol.BundleError, match="too short for 'w'"):
        protocol.from_record(_bundle(good[:-1]))
    twice = _header([["w", "<f4", [1]], ["w", "<f4", [1]]], bytes(8))
    for _ in range(2):  # a refused header is refused every time
        with pytest.raises(protocol.BundleError, match="names 'w' twice"):
            protocol.from_record(_bundle(twice))


def test_one_instruction_for_every_client_is_packed_and_unpacked_per_client() -> None:
    one = protocol.instruction(4, "train", {"lr": 0.1}, arrays={"w": np.ones(3, np.float32)})
    payloads = protocol.to_each(iter([5, 2, 9]), one)
    assert list(payloads) == [5, 2, 9] and all(p is one for p in payloads.values())
    parts = protocol.unpack(protocol.pack(payloads))
    assert sorted(parts) == [2, 5, 9]
    for part in parts.values():
        assert protocol.round_of(part) == 4 and protocol.config_of(part) == {"lr": 0.1}
        np.testing.assert_array_equal(protocol.arrays_of(part)["w"], np.ones(3))


def test_only_bundles_are_decoded_and_only_numbers_encoded() -> None:
    flower = ArrayRecord({"w": Array(np.ones(2, np.float32))})
    with pytest.raises(protocol.BundleError, match="not a Pollen array bundle"):
        protocol.from_record(flower)
    with pytest.raises(TypeError, match="only numbers travel"):
        protocol.to_record({"names": np.array(["a", "b"], dtype=object)})


def test_views_read_the_messages_bytes_without_copying_and_cannot_change_them() -> None:
    arrays: dict[str, np.ndarray] = {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3),
        "n": np.array(3, np.int64),
    }
    record = protocol.to_record(arrays)
    views = protocol.from_record(record, copy=False)
    data = record[protocol.BUNDLE].data
    for key, value in arrays.items():
        np.testing.assert_array_equal(views[key], value)
        assert views[key].shape == value.shape
        assert not views[key].flags.writeable
        assert np.shares_memory(views[key], np.frombuffer(data, np.uint8))
    with pytest.raises(ValueError, match="read-only"):
        views["w"][0, 0] = 1.0
    content = RecordDict({protocol.ARRAYS: record})
    again = protocol.arrays_of(content, copy=False)  # read again: decoded once
    assert again is not views and all(again[k] is views[k] for k in views)
    other = protocol.to_record({"w": np.zeros((2, 3), np.float32)})
    np.testing.assert_array_equal(protocol.from_record(other, copy=False)["w"], 0.0)
    fresh = protocol.from_record(record)  # a copy is always fresh
    assert fresh["w"].flags.writeable and not np.shares_memory(fresh["w"], views["w"])


def test_encoding_copies_the_arrays_so_a_model_changed_afterwards_leaves_the_record_alone() -> None:
    weights = np.ones((4, 4), dtype=np.float32)
    record = protocol.to_record({"w": weights[:, ::2]})  # a strided view, as a model's may be
    weights[:] = 7.0
    np.testing.assert_array_equal(protocol.from_record(record)["w"], np.ones((4, 2), np.float32))


def test_an_array_for_ray_travels_beside_the_pickle_stream_and_comes_back_whole() -> None:
    """array_fields gives Ray the Array's bytes as a NumPy view, which pickle (protocol 5, as
    Ray uses it) passes out of band instead of copying into the stream; array_of_fields builds
    an equal Array whose bytes are its own."""
    import pickle

    weights = np.arange(3000, dtype=np.float32).reshape(1000, 3)
    array = protocol.to_record({"w": weights})[protocol.BUNDLE]
    fields = protocol.array_fields(array)
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(fields, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1 and len(stream) < len(array.data)
    again = protocol.array_of_fields(pickle.loads(stream, buffers=buffers))
    assert isinstance(again.data, bytes) and again.data == array.data
    assert (again.dtype, again.shape, again.stype) == (array.dtype, array.shape, array.stype)
    content = RecordDict({protocol.ARRAYS: ArrayRecord({protocol.BUNDLE: again})})
    np.testing.assert_array_equal(protocol.arrays_of(content)["w"], weights)
