from __future__ import annotations

import io
import json
from pathlib import Path

from pollen.launcher import Progress


def _write(path: Path, rows: list[dict]) -> None:
    with open(path, "a") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def test_rounds_and_phases_print_in_order(tmp_path: Path) -> None:
    out = io.StringIO()
    progress = Progress(tmp_path, out, num_rounds=2)
    start = {"event": "phase-start", "phase": "train", "clients": 2}
    end = {
        "event": "phase-end",
        "phase": "train",
        "valid": 2,
        "sent": 2,
        "seconds": 1.0,
        "failed": {},
    }
    _write(tmp_path / "events.jsonl", [{**start, "round": 1}, {**end, "round": 1}])
    _write(
        tmp_path / "metrics.jsonl", [{"round": 1, "train": {"test-accuracy": 0.5}, "seconds": 1.0}]
    )
    _write(tmp_path / "events.jsonl", [{**start, "round": 2}])
    (tmp_path / "events.jsonl").open("a").write('{"event": "phase-end", "rou')  # partial line
    progress.poll()
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines == [
        "round 1 train: sent to 2 clients",
        "round 1 train: 2/2 valid replies in 1.0 s",
        "round 1  clients test-accuracy=0.5000  (1.0 s)",
        "round 2 train: sent to 2 clients",
    ]
    with open(tmp_path / "events.jsonl", "a") as fh:
        fh.write(
            'nd": 3, "phase": "evaluate", "valid": 1, "sent": 2, "seconds": 2.0, '
            '"failed": {"1": "no reply within 5 s"}}\n'
        )
    progress.poll()
    assert (
        out.getvalue()
        .splitlines()[-2:][0]
        .endswith("final evaluate: 1/2 valid replies in 2.0 s, 1 skipped")
    )
    assert out.getvalue().splitlines()[-1].endswith("client 1: no reply within 5 s")
