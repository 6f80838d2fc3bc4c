"""The results directory's typed records (pollen.core.rundir): every field a run writes is
carried by its record, and directories written by earlier versions still read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flwr.app import Context, RecordDict

from client.app import app as client_app
from pollen.core import rundir
from pollen.core.rundir import ClientRow, EventRecord, RoundRow, Summary
from server.app import app as server_app
from tests.fakes import FakeGrid, settings_of


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_runs_files_read_back_typed_field_for_field(run_config: dict[str, Any]) -> None:
    """Typed and back, every line of a fresh run is what was written: no field is dropped or
    added by the records the writer and the readers share."""
    cfg = settings_of({**run_config, "num-rounds": 2, "server-eval": True})
    grid = FakeGrid(client_app, 3, cfg)
    server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                             run_config=cfg))  # fmt: skip
    out = Path(cfg["out-dir"])
    for name, kind in (("metrics.jsonl", RoundRow), ("clients.jsonl", ClientRow),
                       ("events.jsonl", EventRecord)):  # fmt: skip
        raw = _lines(out / name)
        assert raw, name
        assert [kind.from_json(r).to_json() for r in raw] == raw, name
    raw_summary = json.loads((out / "summary.json").read_text())
    summary = Summary.from_json(raw_summary)
    assert summary.to_json() == raw_summary and summary.completed
    assert summary.final is not None and summary.final.eval["test-accuracy"] > 0
    rounds = rundir.read_rounds(out)
    assert [r.round for r in rounds] == [1, 2] and rounds[-1].server_eval is not None
    assert rounds[-1].phases[0].phase == "train" and rounds[-1].phases[0].valid == 3
    assert {c.client_id for c in rundir.read_clients(out)} == {0, 1, 2}
    assert rundir.read_events(out)[0].kind in vars(rundir.Event).values()
    assert rundir.read_summary(out) == summary


def test_a_failed_runs_summary_reads_back(tmp_path: Path) -> None:
    failed = Summary(status="failed", algorithm="fedem", dataset="digits", seconds=1.5,
                     reason="PhaseFailed: ...", log=str(tmp_path / "server.log"),
                     last_completed_round=2)  # fmt: skip
    raw = failed.to_json()
    assert "final" not in raw and "rounds" not in raw and raw["last-completed-round"] == 2
    assert Summary.from_json(raw) == failed and not failed.completed


def test_rows_of_an_earlier_version_still_read(tmp_path: Path) -> None:
    """A metrics row before phases had push-seconds and rounds had codec-seconds, and a
    summary before node restarts and privacy were recorded."""
    (tmp_path / "metrics.jsonl").write_text(json.dumps({
        "round": 1, "train": {"test-accuracy": 0.5}, "seconds": 2.0,
        "phases": [{"phase": "train", "sent": 4, "valid": 4, "failed": {}, "seconds": 1.9}],
    }) + "\n")  # fmt: skip
    (tmp_path / "summary.json").write_text(json.dumps({
        "status": "completed", "algorithm": "fedavg", "dataset": "digits", "rounds": 1,
        "last-round": {}, "final": {"eval": {"test-accuracy": 0.6}, "phases": []},
        "seconds": 3.0,
    }))  # fmt: skip
    (row,) = rundir.read_rounds(tmp_path)
    assert row.train == {"test-accuracy": 0.5} and row.codec_seconds == 0.0
    assert row.phases[0].push_seconds == 0.0 and row.phases[0].bytes_sent == 0
    summary = rundir.read_summary(tmp_path)
    assert summary is not None and summary.last_round is None and summary.clients is None
    assert summary.final is not None and summary.final.eval == {"test-accuracy": 0.6}
    assert rundir.read_summary(tmp_path / "missing") is None
