"""A run's results directory: the one place that knows its files, the kinds of event the
ServerApp records, and how the files are read and appended to. The ServerApp writes it
(server.results.ResultsWriter); `pollen report`, the live progress, the CLI, the launcher and
`pollen experiment` read it through here. Every field: docs/monitoring.md.

Layout (one directory per run):
    config.json         resolved settings
    metrics.jsonl       one JSON object per round
    clients.jsonl       one JSON object per client reply with metrics
    events.jsonl        what the run does and waits for (rounds, phases, replies as they come),
                        read live by the launcher
    summary.json        status and final figures
    resume-failed.json  a resume of a completed run that failed (the run's files stay as they
                        were)
    final_model.npz     the final global model, when the algorithm has one
    checkpoint/         the last completed round's state (server.checkpoint)
    server.log          the ServerApp's log (written by the launcher)
    processes/          Flower's processes of a local federation and their logs
"""

from __future__ import annotations

import errno
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG = "config.json"
METRICS = "metrics.jsonl"
CLIENTS = "clients.jsonl"
EVENTS = "events.jsonl"
SUMMARY = "summary.json"
RESUME_FAILED = "resume-failed.json"
FINAL_MODEL = "final_model.npz"
CHECKPOINT = "checkpoint"
SERVER_LOG = "server.log"
PROCESSES = "processes"

COMPLETED, FAILED = "completed", "failed"
"""summary.json's `status`."""


class Event:
    """The kinds of events.jsonl records (their `event` field), in the order a run meets them."""

    KEY = "event"
    WAITING_FOR_CLIENTS = "waiting-for-clients"
    CLIENTS_MISSING = "clients-missing"
    CLIENTS = "clients"
    CLIENT_REFUSED = "client-refused"
    ROUND_START = "round-start"
    PHASE_START = "phase-start"
    PHASE_PROGRESS = "phase-progress"
    RESEND = "resend"
    GRID_RETRY = "grid-retry"
    PHASE_END = "phase-end"
    SERVER_EVAL_START = "server-eval-start"
    FINAL_START = "final-start"
    NODE_RESTARTED = "node-restarted"
    """Written by the launcher (`pollen deploy` restarted a SuperNode), not the ServerApp."""
    RESUME_FAILED = "resume-failed"


class ResultsFileError(ValueError):
    """A results file that is not what it should be, naming the file and the line."""


@dataclass
class Rows:
    """The rows of a JSON-lines file."""

    rows: list[dict[str, Any]]
    cut_line: int | None = None
    """The number of a last line cut off mid-write (a process killed while appending), left
    out of `rows`; None when the file ends with a whole line."""


def read_rows(path: Path) -> Rows:
    """The rows of a JSON-lines file (none when it does not exist). A last line cut short is
    left out (`Rows.cut_line`); a line before it that is not a JSON object is an error."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Rows([])
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsFileError(f"{path}: cannot read: {exc}") from exc
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    rows: list[dict[str, Any]] = []
    for i, (lineno, line) in enumerate(numbered):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == len(numbered) - 1:
                return Rows(rows, cut_line=lineno)
            raise ResultsFileError(f"{path}: line {lineno}: invalid JSON: {exc.msg}") from exc
        if not isinstance(obj, dict):
            raise ResultsFileError(
                f"{path}: line {lineno}: expected a JSON object, found {type(obj).__name__}"
            )
        rows.append(obj)
    return Rows(rows)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """`read_rows`'s rows, with a warning on stderr for a last line cut off mid-write."""
    got = read_rows(path)
    if got.cut_line is not None:
        print(
            f"warning: {path}: the last line is incomplete (cut off mid-write); "
            f"using the {len(got.rows)} complete lines",
            file=sys.stderr,
        )
    return got.rows


def read_object(path: Path) -> dict[str, Any]:
    """A JSON file holding one object (config.json, summary.json), or ResultsFileError."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsFileError(f"{path}: cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ResultsFileError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc
    if not isinstance(obj, dict):
        raise ResultsFileError(f"{path}: expected a JSON object, found {type(obj).__name__}")
    return obj


def summary_of(directory: Path, name: str = SUMMARY) -> dict[str, Any] | None:
    """The run's summary.json (or `name`, e.g. RESUME_FAILED); None when there is none that
    can be read."""
    try:
        return read_object(directory / name)
    except ResultsFileError:
        return None


def completed(directory: Path) -> bool:
    """The run in `directory` ended with status `completed`."""
    summary = summary_of(directory)
    return summary is not None and summary.get("status") == COMPLETED


def resumable(directory: Path) -> bool:
    """The directory holds a run's settings and a checkpoint to go on from."""
    return (directory / CONFIG).exists() and (directory / CHECKPOINT / "state.json").exists()


class Tail:
    """The complete rows appended to a JSON-lines file since the last read, for following a
    run live. A line being written (no newline yet) is left for the next read; a line cut
    short by a crash is skipped (the report says so)."""

    def __init__(self, path: Path, skip_existing: bool = False) -> None:
        self.path = path
        self.offset = 0
        self.skipped = 0
        if skip_existing and path.exists():
            data = path.read_bytes()
            self.offset = data.rfind(b"\n") + 1
            self.skipped = data[: self.offset].count(b"\n")

    def rows(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        rows = []
        for line in complete.decode(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
        return rows


def append_line(path: Path, line: str) -> None:
    """Append one line whole or not at all: a write the disk cannot take (ENOSPC) is undone,
    so that the file stays a list of complete lines and a resumed run appends after them."""
    data = line.encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)
