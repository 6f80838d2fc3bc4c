from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from client.state import StateError, StateStore


def test_load_returns_the_state_before_a_round(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "c0", keep=3)
    assert store.load(before_round=1) is None
    for rnd in (1, 2, 3):
        store.save(rnd, {"w": np.full(2, float(rnd))}, {"round": rnd})
    arrays, meta = store.load(before_round=3)  # type: ignore[misc]
    assert meta == {"round": 2} and arrays["w"].tolist() == [2.0, 2.0]
    arrays, meta = store.load(before_round=10)  # type: ignore[misc]
    assert meta == {"round": 3}


def test_old_versions_are_pruned(tmp_path: Path) -> None:
    store = StateStore(tmp_path, keep=2)
    for rnd in range(1, 6):
        store.save(rnd, {"w": np.zeros(1)}, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state-000004.npz", "state-000005.npz"]


@pytest.mark.parametrize("damage", ["truncate", "flip-a-byte"])
def test_corrupt_state_is_reported_not_replaced(tmp_path: Path, damage: str) -> None:
    store = StateStore(tmp_path)
    store.save(1, {"w": np.zeros(100)}, {"a": 1})
    path = tmp_path / "state-000001.npz"
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:60]
    else:  # inside the array data: the zip's CRC-32 catches it
        data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(StateError, match=r"state-000001\.npz"):
        store.load(before_round=2)
    assert path.read_bytes() == bytes(data)
