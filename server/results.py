"""Writes a run's results directory as the ServerApp runs (its layout, event kinds and readers:
pollen.core.rundir)."""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pollen.core.files import atomic_write_bytes, atomic_write_json
from pollen.core.rundir import (
    CLIENTS,
    COMPLETED,
    CONFIG,
    EVENTS,
    FINAL_MODEL,
    METRICS,
    RESUME_FAILED,
    SUMMARY,
    ClientRow,
    Event,
    EventRecord,
    RoundRow,
    Summary,
    append_line,
    completed,
    read_jsonl,
)

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def brief(reason: str, limit: int = 300) -> str:
    """One readable line from an error text that may be a multi-line traceback with terminal
    colour codes (a client's CUDA failure inside Ray, say): its last line, which names the
    exception, without escape codes, at most `limit` characters. The full text goes to the log."""
    lines = [line.strip() for line in ANSI.sub("", reason).splitlines() if line.strip()]
    text = lines[-1] if lines else ""
    if len(lines) > 1 and lines[0] != text and len(lines[0]) < 120 and "Traceback" not in lines[0]:
        text = f"{lines[0]} ... {text}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ResultsWriter:
    def __init__(self, out_dir: str | Path) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._t0 = time.time()
        self._truncate: int | None = None

    def _append(self, name: str, obj: Mapping[str, Any]) -> None:
        if self._truncate is not None and name in (METRICS, CLIENTS):
            last, self._truncate = self._truncate, None
            self._drop_after(last)
        append_line(self.dir / name, json.dumps(obj, sort_keys=True, default=_jsonable) + "\n")

    def write_config(self, config: Mapping[str, Any]) -> None:
        atomic_write_json(self.dir / CONFIG, dict(config))

    def round(self, row: RoundRow) -> None:
        self._append(METRICS, row.to_json())

    def client(self, row: ClientRow) -> None:
        self._append(CLIENTS, row.to_json())

    def event(self, kind: str, **fields: Any) -> None:
        record = EventRecord(kind, round(time.time() - self._t0, 3), fields)
        self._append(EVENTS, record.to_json())

    def summary(self, summary: Summary) -> None:
        """Write summary.json, except that a failure never replaces the summary of a completed
        run (a resume that failed): that failure is recorded beside it, in resume-failed.json
        and as a `resume-failed` event, and the completed results stay as they were."""
        record = json.loads(json.dumps(summary.to_json(), default=_jsonable))
        if record.get("status") != COMPLETED and self.completed():
            atomic_write_json(self.dir / RESUME_FAILED, record)
            self.event(Event.RESUME_FAILED, reason=record.get("reason", ""))
            return
        atomic_write_json(self.dir / SUMMARY, record)

    def completed(self) -> bool:
        """Whether this directory holds a completed run's summary."""
        return completed(self.dir)

    def final_model(self, arrays: Mapping[str, np.ndarray]) -> None:
        buf = io.BytesIO()
        np.savez(buf, **dict(arrays))  # type: ignore[arg-type]
        atomic_write_bytes(self.dir / FINAL_MODEL, buf.getvalue())

    def truncate_after(self, last_round: int) -> None:
        """On resume: drop rows of rounds the checkpoint does not cover, once the resumed run
        writes its first row (a resume that fails before that changes no file)."""
        self._truncate = last_round

    def _drop_after(self, last_round: int) -> None:
        for name in (METRICS, CLIENTS):
            path = self.dir / name
            every = read_jsonl(path)
            rows = [r for r in every if int(r.get("round", 0)) <= last_round]
            if len(rows) == len(every) and path.exists():
                continue  # nothing to drop: the file stays as it is, byte for byte
            atomic_write_bytes(
                path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()
            )


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")
