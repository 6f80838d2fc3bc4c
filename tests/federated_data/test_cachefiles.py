"""The partition files' reader (federated_data.cachefiles.load_npz) against np.load."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from federated_data.cachefiles import load_npz, save_npz_atomic


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "num_classes": np.asarray(10),  # 0-d
        "mean": np.zeros(0),  # empty
        "x": rng.standard_normal((9, 150)).astype(np.float32),
        "y": rng.integers(0, 10, 9).astype(np.int64),
        "half": rng.standard_normal(5).astype(np.float16),
        "big_endian": rng.standard_normal((2, 3)).astype(">f8"),
        "mask": rng.random(7) > 0.5,
        "u8": rng.integers(0, 255, (2, 2, 2)).astype(np.uint8),
        "fortran": np.asfortranarray(rng.standard_normal((3, 4))),
        "strided": rng.standard_normal((4, 6))[:, ::2],
        "complex": (rng.standard_normal(3) + 1j).astype(np.complex64),  # numpy's reader
    }


def test_reads_what_np_load_reads(tmp_path: Path) -> None:
    path = tmp_path / "client-0.npz"
    save_npz_atomic(path, _arrays())
    got = load_npz(path)
    with np.load(path, allow_pickle=False) as expected:
        assert list(got) == expected.files
        for key in expected.files:
            want = expected[key]
            assert got[key].dtype == want.dtype and got[key].shape == want.shape, key
            assert np.array_equal(got[key], want), key
            assert got[key].flags.writeable, key  # not a view of the file's bytes
    assert got["fortran"].flags.f_contiguous  # as np.load gives it


def test_object_arrays_are_refused_as_np_load_refuses_them(tmp_path: Path) -> None:
    path = tmp_path / "objects.npz"
    np.savez(path, o=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="allow_pickle"):
        load_npz(path)


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "not a zip"])
def test_a_damaged_file_raises_what_np_load_raises(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "client-0.npz"
    save_npz_atomic(path, _arrays())
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped byte":
        data[200] ^= 0xFF  # inside the first member's data: its CRC no longer matches
    else:
        data = bytearray(b"hello")
    path.write_bytes(bytes(data))
    with pytest.raises((OSError, ValueError, EOFError, zipfile.BadZipFile)):
        load_npz(path)
