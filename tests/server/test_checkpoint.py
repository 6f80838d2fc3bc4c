from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from server import checkpoint
from server.checkpoint import Checkpoint, CheckpointError


def _ckpt(rnd: int) -> Checkpoint:
    return Checkpoint(
        rnd, {"w": np.arange(6.0).reshape(2, 3) * rnd}, {"k": [1, 2]}, {"state": rnd}, {"lr": 0.1}
    )


def test_round_trip_and_replacement(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, _ckpt(1))
    checkpoint.save(tmp_path, _ckpt(2))
    got = checkpoint.load(tmp_path)
    assert got.server_round == 2 and got.strategy_meta == {"k": [1, 2]}
    np.testing.assert_array_equal(got.arrays["w"], np.arange(6.0).reshape(2, 3) * 2)
    assert not (tmp_path / "checkpoint.prev").exists()


def test_interrupted_swap_falls_back_to_the_previous(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, _ckpt(1))
    (tmp_path / "checkpoint").rename(tmp_path / "checkpoint.prev")  # crash between renames
    assert checkpoint.load(tmp_path).server_round == 1


@pytest.mark.parametrize("damage", ["truncate-npz", "garble-json", "drop-npz"])
def test_damaged_checkpoint_is_refused(tmp_path: Path, damage: str) -> None:
    checkpoint.save(tmp_path, _ckpt(1))
    d = tmp_path / "checkpoint"
    if damage == "truncate-npz":
        (d / "state.npz").write_bytes((d / "state.npz").read_bytes()[:50])
    elif damage == "garble-json":
        (d / "state.json").write_text("{not json")
    else:
        (d / "state.npz").unlink()
    with pytest.raises(CheckpointError, match=str(d)):
        checkpoint.load(tmp_path)


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="nothing to resume"):
        checkpoint.load(tmp_path)


def test_compatibility_allows_only_resumable_changes() -> None:
    checkpoint.check_compatible({"lr": 0.1, "num-rounds": 3}, {"lr": 0.1, "num-rounds": 5})
    with pytest.raises(CheckpointError, match=r"lr: 0\.1 -> 0\.2"):
        checkpoint.check_compatible({"lr": 0.1}, {"lr": 0.2})


def test_a_setting_added_since_the_checkpoint_resumes_only_at_its_default() -> None:
    # a run saved before `lr-min` existed behaved as lr-min = 0 (its default)
    checkpoint.check_compatible({"lr": 0.1}, {"lr": 0.1, "lr-min": 0.0})
    with pytest.raises(checkpoint.CheckpointError, match=r"lr-min: 0.0 -> 0.001"):
        checkpoint.check_compatible({"lr": 0.1}, {"lr": 0.1, "lr-min": 0.001})
    with pytest.raises(checkpoint.CheckpointError, match="not-a-setting"):
        checkpoint.check_compatible({"lr": 0.1}, {"lr": 0.1, "not-a-setting": 1})
