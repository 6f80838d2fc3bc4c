"""Replies that never come or come late, in every phase of FeDLRT's and FedSC's multi-phase
rounds: the phase times out without them, and a late reply that turns up during a later phase
or round is never taken for a reply of that phase (the grid here even hands it over unasked)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message

from pollen.core.rundir import read_jsonl
from tests.fakes import FakeGrid
from tests.server.test_bad_replies import ROUNDS, TOL, ScreeningEngine, _run, _settings

CASES = [(a, p) for a in ("fedlrt", "fedsc") for p in ROUNDS[a][1]]


@pytest.mark.slow
@pytest.mark.parametrize(("algorithm", "phase"), CASES)
def test_a_late_reply_is_never_mixed_into_a_later_phase_or_round(
    run_config: dict[str, Any], algorithm: str, phase: str
) -> None:
    def fault(kind: str) -> Any:
        def decide(_engine: ScreeningEngine, node: int, msg: Message) -> str | None:
            first = msg.metadata.group_id == "1" and msg.metadata.message_type == phase
            return kind if node == 100 and first else None

        return decide

    def settings(tag: str) -> dict[str, Any]:
        cfg = _settings(run_config, algorithm, f"{tag}-{phase}")
        # no resends: this grid hands a late reply over at the next push, which a resend would
        # make happen inside the phase (tests/server/test_resend.py covers resends)
        return {**cfg, "num-rounds": 2, "final-eval": False, "resend-limit": 0}

    silent_cfg, late_cfg = settings("silent"), settings("late")
    silent, silent_summary = _run(silent_cfg, fault("drop"))
    late, late_summary = _run(late_cfg, fault("late"), leaky=True)
    assert silent_summary["status"] == late_summary["status"] == "completed"

    grid = late.grid
    assert isinstance(grid, FakeGrid)
    assert not grid._late and not grid._replies  # the late reply was handed over, and dropped
    for cfg in (silent_cfg, late_cfg):
        first = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")[0]
        report = next(p for p in first["phases"] if p["phase"] == phase)
        assert report["failed"] == {"0": "no reply within 30 s"}
        # later phases of the round got only the replies of those they asked
        for later in first["phases"][first["phases"].index(report) + 1 :]:
            assert later["valid"] == later["sent"] and not later["failed"]
    # the late reply changed nothing: the run is the one where it never came
    arrays, meta = late.strategy.state()
    ref_arrays, ref_meta = silent.strategy.state()
    assert meta == ref_meta and set(arrays) == set(ref_arrays)
    for key, value in ref_arrays.items():
        np.testing.assert_allclose(arrays[key], value, rtol=TOL, atol=TOL, err_msg=key)
