from __future__ import annotations

import numpy as np

from pollen import protocol


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
