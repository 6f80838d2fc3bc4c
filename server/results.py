"""A run's results directory: resolved config, per-round and per-client metrics, summary, model.

Layout (one directory per run):
    config.json       resolved settings
    metrics.jsonl     one JSON object per round
    clients.jsonl     one JSON object per client reply with metrics
    events.jsonl      phase progress, read live by the launcher
    summary.json      status and final figures
    final_model.npz   the final global model, when the algorithm has one
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

METRICS = "metrics.jsonl"
CLIENTS = "clients.jsonl"
EVENTS = "events.jsonl"
SUMMARY = "summary.json"
CONFIG = "config.json"
FINAL_MODEL = "final_model.npz"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temporary file and rename, so readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            rows.append(json.loads(line))
    return rows


class ResultsWriter:
    def __init__(self, out_dir: str | Path) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._t0 = time.time()

    def _append(self, name: str, obj: Mapping[str, Any]) -> None:
        with open(self.dir / name, "a") as fh:
            fh.write(json.dumps(obj, sort_keys=True, default=_jsonable) + "\n")
            fh.flush()

    def write_config(self, config: Mapping[str, Any]) -> None:
        atomic_write_json(self.dir / CONFIG, dict(config))

    def round(self, row: Mapping[str, Any]) -> None:
        self._append(METRICS, row)

    def client(self, row: Mapping[str, Any]) -> None:
        self._append(CLIENTS, row)

    def event(self, kind: str, **fields: Any) -> None:
        self._append(EVENTS, {"event": kind, "time": round(time.time() - self._t0, 3), **fields})

    def summary(self, summary: Mapping[str, Any]) -> None:
        atomic_write_json(self.dir / SUMMARY, json.loads(json.dumps(summary, default=_jsonable)))

    def final_model(self, arrays: Mapping[str, np.ndarray]) -> None:
        import io

        buf = io.BytesIO()
        np.savez(buf, **dict(arrays))  # type: ignore[arg-type]
        atomic_write_bytes(self.dir / FINAL_MODEL, buf.getvalue())

    def truncate_after(self, last_round: int) -> None:
        """On resume: drop rows of rounds the checkpoint does not cover."""
        for name in (METRICS, CLIENTS):
            path = self.dir / name
            rows = [r for r in read_jsonl(path) if int(r.get("round", 0)) <= last_round]
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
