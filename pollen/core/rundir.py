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
from collections.abc import Mapping
from dataclasses import dataclass, field
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


Metrics = dict[str, Any]
"""Named figures: a client's reply metrics (a number, or a list of numbers) or their
aggregate (numbers)."""


def _metrics(value: Any) -> Metrics:
    return dict(value) if isinstance(value, Mapping) else {}


def _int(value: Any, default: int = 0) -> int:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return int(value) if number else default


def _float(value: Any, default: float = 0.0) -> float:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if number else default


@dataclass(frozen=True)
class PhaseReport:
    """One phase of a round (metrics.jsonl `phases`, and a `phase-end` event's fields)."""

    phase: str
    sent: int  # clients instructed (messages: fewer when a node hosts several)
    valid: int
    failed: dict[str, str]  # client id (for the hello: node id) -> why it was skipped
    seconds: float
    push_seconds: float  # Flower serializing the instructions and handing them over
    bytes_sent: int
    bytes_received: int
    resent: dict[str, int] | None = None  # client (hello: node) id -> times sent again
    late: list[int] | None = None  # paced phases (docs/pacing.md): the clients left out as late
    closed_at: float | None = None  # paced phases: seconds (virtual: device seconds) to close

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": self.phase, "sent": self.sent, "valid": self.valid,
            "failed": dict(self.failed), "seconds": self.seconds,
            "push-seconds": self.push_seconds,
            **({"resent": dict(self.resent)} if self.resent is not None else {}),
            **({"late": list(self.late)} if self.late is not None else {}),
            **({"closed-at": self.closed_at} if self.closed_at is not None else {}),
            "bytes-sent": self.bytes_sent, "bytes-received": self.bytes_received,
        }  # fmt: skip
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PhaseReport:
        """Lenient: a field an older version did not write reads as 0 (or none)."""
        resent = obj.get("resent")
        late = obj.get("late")
        closed_at = obj.get("closed-at")
        return cls(
            phase=str(obj.get("phase", "")),
            sent=_int(obj.get("sent")),
            valid=_int(obj.get("valid")),
            failed={str(k): str(v) for k, v in _metrics(obj.get("failed")).items()},
            seconds=_float(obj.get("seconds")),
            push_seconds=_float(obj.get("push-seconds")),
            bytes_sent=_int(obj.get("bytes-sent")),
            bytes_received=_int(obj.get("bytes-received")),
            resent={str(k): _int(v) for k, v in resent.items()}
            if isinstance(resent, Mapping)
            else None,
            late=[_int(c) for c in late] if isinstance(late, list) else None,
            closed_at=None if closed_at is None else _float(closed_at),
        )


@dataclass(frozen=True)
class RoundRow:
    """A line of metrics.jsonl: one round."""

    round: int
    train: Metrics  # the clients' aggregated metrics
    phases: list[PhaseReport]
    seconds: float
    bytes_sent: int
    bytes_received: int
    codec_seconds: float  # arrays <-> record bytes in the ServerApp's process
    server_eval: Metrics | None = None  # the server's evaluation (server-eval)
    time: float | None = None
    """When the round ended, in seconds since the run started (a resumed run: counted on from
    the interrupted one): on the virtual clock (docs/pacing.md), the devices' time."""
    late: int = 0  # replies left out as late, over the round's phases (docs/pacing.md)

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "train": dict(self.train),
            **({"server-eval": dict(self.server_eval)} if self.server_eval is not None else {}),
            "phases": [p.to_json() for p in self.phases],
            **({"time": self.time} if self.time is not None else {}),
            **({"late": self.late} if self.late else {}),
            "seconds": self.seconds,
            "bytes-sent": self.bytes_sent,
            "bytes-received": self.bytes_received,
            "codec-seconds": self.codec_seconds,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RoundRow:
        """Lenient, as PhaseReport.from_json."""
        phases = obj.get("phases")
        server_eval = obj.get("server-eval")
        return cls(
            round=_int(obj.get("round")),
            train=_metrics(obj.get("train")),
            phases=[PhaseReport.from_json(p) for p in phases if isinstance(p, Mapping)]
            if isinstance(phases, list)
            else [],
            seconds=_float(obj.get("seconds")),
            bytes_sent=_int(obj.get("bytes-sent")),
            bytes_received=_int(obj.get("bytes-received")),
            codec_seconds=_float(obj.get("codec-seconds")),
            server_eval=_metrics(server_eval) if isinstance(server_eval, Mapping) else None,
            time=None if obj.get("time") is None else _float(obj.get("time")),
            late=_int(obj.get("late")),
        )


@dataclass(frozen=True)
class ClientRow:
    """A line of clients.jsonl: one client's valid reply in one phase."""

    round: int
    client_id: int
    phase: str
    metrics: Metrics

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "client-id": self.client_id,
            "phase": self.phase,
            "metrics": dict(self.metrics),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ClientRow:
        return cls(
            round=_int(obj.get("round")),
            client_id=_int(obj.get("client-id"), -1),
            phase=str(obj.get("phase", "")),
            metrics=_metrics(obj.get("metrics")),
        )


@dataclass(frozen=True)
class EventRecord:
    """A line of events.jsonl: its kind (an `Event` attribute), the seconds since the ServerApp
    started, and the kind's own fields (docs/monitoring.md#eventsjsonl)."""

    kind: str
    time: float
    fields: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {Event.KEY: self.kind, "time": self.time, **self.fields}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> EventRecord:
        rest = {k: v for k, v in obj.items() if k not in (Event.KEY, "time")}
        return cls(str(obj.get(Event.KEY, "")), _float(obj.get("time")), rest)


@dataclass(frozen=True)
class FinalRecord:
    """summary.json's `final`: the evaluation after the last round."""

    eval: Metrics
    phases: list[PhaseReport]
    server_eval: Metrics | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "eval": dict(self.eval),
            "phases": [p.to_json() for p in self.phases],
            **({"server-eval": dict(self.server_eval)} if self.server_eval is not None else {}),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> FinalRecord:
        phases = obj.get("phases")
        server_eval = obj.get("server-eval")
        return cls(
            eval=_metrics(obj.get("eval")),
            phases=[PhaseReport.from_json(p) for p in phases if isinstance(p, Mapping)]
            if isinstance(phases, list)
            else [],
            server_eval=_metrics(server_eval) if isinstance(server_eval, Mapping) else None,
        )


@dataclass(frozen=True)
class Summary:
    """summary.json: how the run ended. A completed run has `rounds` to `peak_rss_mb`; a failed
    one `reason`, `log` and `last_completed_round`. `robust`, `attack` and `privacy` are there
    when the run had them (docs/robustness.md, docs/privacy.md); `node_restarts` when
    `pollen deploy` restarted a SuperNode."""

    status: str
    algorithm: str
    dataset: str
    seconds: float
    rounds: int | None = None
    last_round: RoundRow | None = None
    final: FinalRecord | None = None
    clients: list[int] | None = None
    peak_rss_mb: float | None = None
    reason: str | None = None
    log: str | None = None
    last_completed_round: int | None = None
    robust: dict[str, Any] | None = None
    attack: dict[str, Any] | None = None
    privacy: dict[str, Any] | None = None
    secure_aggregation: dict[str, Any] | None = None
    node_restarts: list[dict[str, Any]] | None = None

    @property
    def completed(self) -> bool:
        return self.status == COMPLETED

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        if self.reason is not None:
            out["reason"] = self.reason
        if self.log is not None:
            out["log"] = self.log
        out["algorithm"] = self.algorithm
        out["dataset"] = self.dataset
        if self.completed:
            out["rounds"] = self.rounds
            out["last-round"] = self.last_round.to_json() if self.last_round else {}
            out["final"] = self.final.to_json() if self.final else {}
        if self.last_completed_round is not None:
            out["last-completed-round"] = self.last_completed_round
        out["seconds"] = self.seconds
        if self.clients is not None:
            out["clients"] = list(self.clients)
        if self.peak_rss_mb is not None:
            out["peak-rss-mb"] = self.peak_rss_mb
        for key, value in (
            ("robust", self.robust), ("attack", self.attack), ("privacy", self.privacy),
            ("secure-aggregation", self.secure_aggregation), ("node-restarts", self.node_restarts),
        ):  # fmt: skip
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Summary:
        """Lenient: what a version did not write reads as absent."""

        def opt(key: str, kind: type) -> Any:
            value = obj.get(key)
            return value if isinstance(value, kind) else None

        last, final = obj.get("last-round"), obj.get("final")
        clients = obj.get("clients")
        return cls(
            status=str(obj.get("status", "")),
            algorithm=str(obj.get("algorithm", "")),
            dataset=str(obj.get("dataset", "")),
            seconds=_float(obj.get("seconds")),
            rounds=_int(obj["rounds"]) if "rounds" in obj else None,
            last_round=RoundRow.from_json(last) if isinstance(last, Mapping) and last else None,
            final=FinalRecord.from_json(final) if isinstance(final, Mapping) and final else None,
            clients=[_int(c) for c in clients if isinstance(c, int)]
            if isinstance(clients, list)
            else None,
            peak_rss_mb=_float(obj["peak-rss-mb"]) if "peak-rss-mb" in obj else None,
            reason=opt("reason", str),
            log=opt("log", str),
            last_completed_round=_int(obj["last-completed-round"])
            if "last-completed-round" in obj
            else None,
            robust=opt("robust", dict),
            attack=opt("attack", dict),
            privacy=opt("privacy", dict),
            secure_aggregation=opt("secure-aggregation", dict),
            node_restarts=opt("node-restarts", list),
        )


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


def read_rounds(directory: Path) -> list[RoundRow]:
    """metrics.jsonl as typed rows (read_jsonl's warning on a cut last line)."""
    return [RoundRow.from_json(r) for r in read_jsonl(directory / METRICS)]


def read_clients(directory: Path) -> list[ClientRow]:
    """clients.jsonl as typed rows."""
    return [ClientRow.from_json(r) for r in read_jsonl(directory / CLIENTS)]


def read_events(directory: Path) -> list[EventRecord]:
    """events.jsonl as typed records."""
    return [EventRecord.from_json(r) for r in read_jsonl(directory / EVENTS)]


def read_summary(directory: Path, name: str = SUMMARY) -> Summary | None:
    """summary.json (or `name`) typed; None when there is none that can be read."""
    obj = summary_of(directory, name)
    return None if obj is None else Summary.from_json(obj)
