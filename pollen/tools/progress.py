"""Live progress of a run, read from its results directory as the ServerApp writes it.

The ServerApp appends to events.jsonl (a run's phases, replies as they arrive, waits; the events
are listed in docs/monitoring.md), metrics.jsonl (a row per round) and clients.jsonl (a row per
client reply). `Progress` reads the lines added since its last poll and shows them in one of two
views:

- plain: one line per event worth a line (a phase's replies, a round's results, clients that
  connected, a restarted SuperNode), each stamped with the seconds since the run was submitted,
  and a line saying what the run still waits for when nothing happened for a while. For logs,
  CI and any output that is not a terminal.
- rich: a live panel (round i/N with a bar, elapsed time and ETA; the current phase with the
  replies received of those expected and what is awaited), above which each round's results
  are printed as a line.

Both read the same files, so they work the same for `pollen simulate`, `deploy` and `run`, and
for a results directory followed from elsewhere. Sinks (`Sink`, e.g. TensorBoard) get every
round row, client row and the final summary as they arrive.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from pollen.core.protocol import HELLO
from pollen.core.rundir import (
    CLIENTS,
    EVENTS,
    METRICS,
    SUMMARY,
    ClientRow,
    Event,
    EventRecord,
    RoundRow,
    Summary,
    Tail,
    read_summary,
)

NODE_RESTART_LIMIT = 8
"""How many times `pollen deploy` restarts one SuperNode before it gives the run up."""

STALL_FIRST = 15.0
"""Plain view: seconds without news before a line says what the run waits for..."""
STALL_MAX = 300.0
"""... repeated at doubling intervals up to this many seconds."""

HEADLINE: dict[str, tuple[tuple[str, str], ...]] = {
    "train": (
        ("test-accuracy", "acc"),
        ("test-accuracy-p10", "p10"),
        ("train-loss", "loss"),
        ("test-energy", "energy"),
        ("test-error", "error"),
        ("error-ratio", "error-ratio"),
        ("client-epsilon", "client-eps"),
        ("epsilon", "epsilon"),
    ),
    "server-eval": (
        ("test-accuracy", "acc"),
        ("test-loss", "loss"),
        ("test-error", "error"),
        ("sigma-mean", "sigma"),
        ("epsilon", "epsilon"),
    ),
}
"""The metrics a round's line shows per section of its metrics.jsonl row (the clients'
aggregate, the server's evaluation), in this order, with their short names."""
MOST_PER_SECTION = 4
"""At most this many metrics per section in a round's line."""


class Sink(Protocol):
    """Something else that follows the run's results (pollen.tensorboard.Board)."""

    def round(self, row: RoundRow) -> None: ...

    def client(self, row: ClientRow) -> None: ...

    def close(self, summary: Summary | None) -> None: ...


@dataclass
class _Phase:
    name: str
    round: int
    sent: int
    answered: int = 0
    valid: int = 0
    waiting: list[int] | None = None


@dataclass
class State:
    """What the files said so far, as the views need it."""

    num_rounds: int
    round: int = 0
    """The round in progress (num_rounds + 1: the final evaluation); 0 before the first."""
    done: int = 0
    """The last round whose results arrived."""
    doing: str = "start"
    """start | clients | round | phase | server-eval | server | ending | finished"""
    phase: _Phase | None = None
    connected: int = 0
    needed: int = 0
    wait_timeout: float = 0.0
    round_seconds: list[float] = field(default_factory=list)
    """Seconds of each round this command saw end (a resumed run's earlier ones are not)."""
    round_started: float | None = None
    """When (Progress's clock) the round in progress was seen to start."""

    def label(self, rnd: int | None = None) -> str:
        rnd = self.round if rnd is None else rnd
        if self.num_rounds and rnd > self.num_rounds:
            return "final"
        return f"round {rnd}/{self.num_rounds}" if self.num_rounds else f"round {rnd}"

    def eta(self, now: float) -> float | None:
        """Seconds until the last round ends, from the mean of the rounds seen so far but the
        first once there are others (it pays the clients' start-up); None before a round
        ended, or when the number of rounds is unknown."""
        if not self.round_seconds or not self.num_rounds:
            return None
        seen = self.round_seconds[1:] or self.round_seconds
        mean = sum(seen) / len(seen)
        left = max(0, self.num_rounds - self.done) * mean
        if self.round_started is not None and self.round > self.done:
            left -= now - self.round_started
        return max(0.0, left)

    def awaited(self) -> str:
        """What the run waits for now, in words."""
        if self.doing == "start":
            return "the ServerApp to start"
        if self.doing == "clients":
            return f"clients: {self.connected} of {self.needed} connected"
        if self.doing == "server-eval":
            return "the server's evaluation of the global model"
        if self.doing == "round":
            return "the round's first phase (the server samples clients)"
        if self.doing == "server":
            return "the server (aggregating the replies)"
        if self.doing == "ending":
            return "Flower to report the run ended (its summary is written)"
        phase = self.phase
        if phase is None:
            return "the next phase"
        whom = "nodes" if phase.name == HELLO else "clients"
        if phase.answered == 0:
            return f"{phase.name} replies from {phase.sent} {whom}"
        if phase.waiting:
            names = ", ".join(str(c) for c in phase.waiting)
            one = whom[:-1] if len(phase.waiting) == 1 else whom
            return f"{one} {names} ({phase.answered} of {phase.sent} replied)"
        return f"{phase.sent - phase.answered} more {phase.name} replies"

    def status(self) -> str:
        """The current activity in one line (rich view)."""
        phase = self.phase
        if self.doing == "phase" and phase is not None:
            text = f"{phase.name}: {phase.answered}/{phase.sent} replies"
            if phase.valid != phase.answered:
                text += f" ({phase.valid} valid)"
            if phase.answered < phase.sent:
                text += f" - waiting for {self.awaited()}"
            return text
        if self.doing == "finished":
            return "finished"
        return f"waiting for {self.awaited()}"


def format_round(row: RoundRow, num_rounds: int = 0, eta: float | None = None) -> str:
    """A round's results in one line: the headline metrics of the clients (their aggregate)
    and of the server's evaluation, the round's seconds and, given, the ETA."""
    rnd = row.round
    parts = [f"round {rnd}/{num_rounds}" if num_rounds else f"round {rnd}"]
    for section, who, metrics in (
        ("train", "clients", row.train), ("server-eval", "server", row.server_eval or {}),
    ):  # fmt: skip
        shown = metrics_text(metrics, section)
        if shown:
            parts.append(f"{who} {shown}")
    tail = f"{row.seconds:.1f} s"
    if eta is not None:
        tail += f", ETA {clock_text(eta)}"
    parts.append(tail)
    return " | ".join(parts)


def metrics_text(metrics: Mapping[str, Any], section: str = "train") -> str:
    shown: list[str] = []
    for key, name in HEADLINE[section]:
        value = _number(metrics.get(key))
        if value is not None and len(shown) < MOST_PER_SECTION:
            shown.append(f"{name} {value:.4f}")
    return " ".join(shown)


def clock_text(seconds: float) -> str:
    """0:42, 12:05, 1:02:03."""
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def id_ranges(ids: Sequence[int]) -> str:
    """Client ids as runs: [0, 1, 2, 5] -> "4: 0-2, 5" (a simulation may have thousands)."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs[:20])
    return f"{len(ids)}: {text}" + (", ..." if len(runs) > 20 else "")


# ---- views ---------------------------------------------------------------------------------
class PlainView:
    """Lines, each stamped with the seconds since the run was submitted."""

    def __init__(self, stream: TextIO, clock: Callable[[], float], t0: float) -> None:
        self.stream = stream
        self.clock = clock
        self.t0 = t0

    def line(self, text: str, style: str = "") -> None:
        print(f"[{self.clock() - self.t0:7.1f}s] {text}", file=self.stream, flush=True)

    def detail(self, text: str) -> None:
        self.line(text)

    def update(self, state: State, now: float) -> None:
        pass

    def close(self) -> None:
        pass


class RichView:
    """A live panel at the bottom of the terminal; lines printed above it."""

    BAR_WIDTH = 30

    def __init__(
        self, stream: TextIO, clock: Callable[[], float], t0: float, width: int | None = None
    ) -> None:
        from rich.console import Console  # lazy: rich, only for a terminal
        from rich.live import Live  # lazy: rich, only for a terminal

        self.clock = clock
        self.t0 = t0
        self.console = Console(file=stream, width=width, highlight=False)
        redirect = stream is sys.stdout
        self.live = Live(
            console=self.console,
            auto_refresh=False,  # refreshed at each poll (every 0.5 s): no thread of its own
            redirect_stdout=redirect,
            redirect_stderr=redirect,
        )
        self.live.start()

    def line(self, text: str, style: str = "") -> None:
        from rich.text import Text  # lazy: rich, only for a terminal

        self.console.print(Text(text, style=style))

    def detail(self, text: str) -> None:
        pass  # the panel shows it while it is current

    def panel(self, state: State, now: float) -> Any:
        from rich.console import Group  # lazy: rich, only for a terminal
        from rich.progress_bar import ProgressBar  # lazy: rich, only for a terminal
        from rich.table import Table  # lazy: rich, only for a terminal
        from rich.text import Text  # lazy: rich, only for a terminal

        total = max(state.num_rounds, 1)
        done = min(state.done, total)
        if state.doing == "finished" or not state.round:
            label = f"round {state.done}/{state.num_rounds}"
        else:
            label = state.label()
        head = Table.grid(padding=(0, 1))
        head.add_row(
            Text(label, style="bold"),
            ProgressBar(total=total, completed=done, width=self.BAR_WIDTH),
            Text(f"{100 * done / total:3.0f}%"),
            Text(f"elapsed {clock_text(now - self.t0)}", style="dim"),
            Text(_eta_text(state, now), style="dim"),
        )
        return Group(head, Text("  " + state.status(), style="cyan"))

    def update(self, state: State, now: float) -> None:
        self.live.update(self.panel(state, now), refresh=True)

    def close(self) -> None:
        self.live.stop()


def _eta_text(state: State, now: float) -> str:
    if state.doing == "finished":
        return ""
    if state.num_rounds and state.round > state.num_rounds:
        return "final evaluation"
    eta = state.eta(now)
    return f"ETA {clock_text(eta)}" if eta is not None else "ETA after round 1"


# ---- following -----------------------------------------------------------------------------
class Progress:
    """Shows a run's progress as the ServerApp writes its results directory."""

    def __init__(
        self,
        out_dir: Path,
        stream: TextIO = sys.stdout,
        num_rounds: int = 0,
        history: bool = False,
        *,
        plain: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        sinks: Sequence[Sink] = (),
        width: int | None = None,
    ) -> None:
        """`plain`: None chooses the plain view unless `stream` is a terminal. With `history`
        (a resumed run) what the directory already holds is the earlier run's: summed up in one
        line, never replayed as new progress (nor sent to the sinks again)."""
        self.out_dir = Path(out_dir)
        self.clock = clock
        self.t0 = clock()
        self.state = State(num_rounds=num_rounds)
        self.sinks = list(sinks)
        if plain is None:
            plain = not _is_terminal(stream)
        self.view: PlainView | RichView = (
            PlainView(stream, clock, self.t0) if plain else RichView(stream, clock, self.t0, width)
        )
        self._events = Tail(self.out_dir / EVENTS, history)
        self._metrics = Tail(self.out_dir / METRICS, history)
        self._clients = Tail(self.out_dir / CLIENTS, history)
        self._rows: list[RoundRow] = []
        self._summary = _mtime(self.out_dir / SUMMARY)  # a resumed run's is the earlier run's
        self.news_at: float | None = None
        """When (on `clock`) this run last wrote to its results directory; None: not yet."""
        self._stall = STALL_FIRST
        self._closed = False
        if history:
            self.state.done = self._metrics.skipped
            self.view.line(f"resuming: {self._metrics.skipped} rounds done before (in {METRICS})")

    # ---- reading -------------------------------------------------------------------------
    def poll(self) -> None:
        # rows and events are read in the order the server wrote them: clients.jsonl rows of a
        # phase before its phase-end, a round's metrics.jsonl row after its last event
        clients = [ClientRow.from_json(r) for r in self._clients.rows()]
        self._rows.extend(RoundRow.from_json(r) for r in self._metrics.rows())
        events = [EventRecord.from_json(r) for r in self._events.rows()]
        for sink in self.sinks:
            for row in clients:
                sink.client(row)
        if clients or events or self._rows:
            self.news_at = self.clock()
            self._stall = STALL_FIRST
        for ev in events:
            rnd = _int(ev.fields.get("round"))
            if rnd is not None:
                self._flush_rounds(before=rnd)
            self._event(ev)
        self._flush_rounds(before=None)
        summary = _mtime(self.out_dir / SUMMARY)
        if self.state.doing not in ("ending", "finished") and summary != self._summary:
            self.state.doing = "ending"  # the ServerApp wrote its last file
            self.news_at = self.clock()
        self._tick()

    def _event(self, record: EventRecord) -> None:
        kind, ev = record.kind, record.fields
        state, view = self.state, self.view
        rnd = _int(ev.get("round"))
        if kind in (Event.ROUND_START, Event.FINAL_START) and rnd is not None:
            state.round, state.phase, state.doing = rnd, None, "round"
            state.round_started = self.clock()
        elif kind == Event.WAITING_FOR_CLIENTS:
            state.doing = "clients"
            state.connected = _int(ev.get("connected")) or 0
            state.needed = _int(ev.get("needed")) or 0
            state.wait_timeout = _number(ev.get("timeout")) or 0.0
            view.line(
                f"waiting for clients: {state.connected} of {state.needed} connected (the run "
                f"starts at {state.needed}, gives up after {state.wait_timeout:g} s)",
                style="yellow",
            )
        elif kind == Event.PHASE_START and rnd is not None:
            if state.round < rnd:
                state.round, state.round_started = rnd, self.clock()
            state.doing = "phase"
            state.phase = _Phase(str(ev.get("phase")), rnd, _int(ev.get("clients")) or 0)
        elif kind == Event.PHASE_PROGRESS and state.phase is not None:
            state.phase.answered = _int(ev.get("answered")) or 0
            state.phase.valid = _int(ev.get("valid")) or 0
            waiting = ev.get("waiting")
            state.phase.waiting = [int(c) for c in waiting] if isinstance(waiting, list) else None
        elif kind == Event.PHASE_END and rnd is not None:
            self._phase_end(ev, rnd)
        elif kind == Event.SERVER_EVAL_START:
            state.doing = "server-eval"
        elif kind == Event.CLIENTS:
            ids = [int(c) for c in ev.get("clients") or []]
            state.connected = len(ids)
            view.line(f"clients connected: {id_ranges(ids)}")
        elif kind == Event.CLIENT_REFUSED:
            view.line(
                f"{state.label(rnd or state.round)}: node {ev.get('node')} claims client "
                f"{ev.get('client')}, which live node {ev.get('holder')} holds; refused",
                style="yellow",
            )
        elif kind == Event.CLIENTS_MISSING:
            view.line(f"starting with {ev.get('reason', '')}", style="yellow")
        elif kind == Event.RESEND:
            who = ev.get("clients")
            whom = f"clients {who}" if who is not None else f"nodes {ev.get('nodes')}"
            view.line(
                f"{state.label(rnd or state.round)} {ev.get('phase')}: no reply after "
                f"{ev.get('after')} s; sent again to {whom}",
                style="yellow",
            )
        elif kind == Event.NODE_RESTARTED:
            view.line(
                f"SuperNode of client {ev.get('client')} restarted (it exited with code "
                f"{ev.get('exit-code')}; restart {ev.get('restart')} of at most "
                f"{NODE_RESTART_LIMIT})",
                style="yellow",
            )
        elif kind == Event.RESUME_FAILED:
            view.line(f"the resume failed: {ev.get('reason', '')}", style="red")

    def _phase_end(self, ev: Mapping[str, Any], rnd: int) -> None:
        state, view = self.state, self.view
        late = {str(c) for c in ev.get("late") or ()}  # paced phases: counted, not listed
        failed = {c: r for c, r in dict(ev.get("failed") or {}).items() if c not in late}
        name = str(ev.get("phase"))
        extra = f", {len(failed)} skipped" if failed else ""
        if late:
            closed = _number(ev.get("closed-at"))
            unit = "virtual s" if ev.get("clock") == "virtual" else "s"
            at = f" (closed at {closed:.1f} {unit})" if closed is not None else ""
            extra += f", {len(late)} late{at}"
        seconds = _number(ev.get("seconds")) or 0.0
        if name == HELLO:  # a simulated node may host several clients
            view.detail(
                f"{state.label(rnd)} {name}: {ev.get('valid')} clients answered from "
                f"{ev.get('sent')} nodes in {seconds:.1f} s{extra}"
            )
        else:
            view.detail(
                f"{state.label(rnd)} {name}: {ev.get('valid')}/{ev.get('sent')} valid replies "
                f"in {seconds:.1f} s{extra}"
            )
        for cid, reason in dict(failed).items():
            view.line(f"    {state.label(rnd)} {name}: client {cid} skipped: {reason}", "yellow")
        state.phase = None
        state.doing = "round" if name == HELLO else "server"

    def _flush_rounds(self, before: int | None) -> None:
        while self._rows and (before is None or self._rows[0].round < before):
            row = self._rows.pop(0)
            rnd = row.round
            self.state.round_seconds.append(row.seconds)
            self.state.done = max(self.state.done, rnd)
            if self.state.round <= rnd:
                self.state.round_started = None
            self.state.doing = "server"
            now = self.clock()
            # the rich view's panel shows the ETA; a plain line carries it
            eta = self.state.eta(now) if rnd < self.state.num_rounds else None
            plain = isinstance(self.view, PlainView)
            line = format_round(row, self.state.num_rounds, eta if plain else None)
            self.view.line(line, style="green")
            for sink in self.sinks:
                sink.round(row)

    def _tick(self) -> None:
        now = self.clock()
        if isinstance(self.view, PlainView):
            quiet = now - (self.t0 if self.news_at is None else self.news_at)
            if quiet >= self._stall and self.state.doing != "finished":
                prefix = f"{self.state.label()}: " if self.state.round else ""
                self.view.line(
                    f"{prefix}waiting for {self.state.awaited()}; nothing new for {quiet:.0f} s"
                )
                self._stall = min(self._stall * 2, STALL_MAX)
        self.view.update(self.state, now)

    def close(self) -> None:
        """The last lines, then the sinks get the summary (when the run wrote one)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.poll()
        finally:
            self.state.doing = "finished"
            self.view.update(self.state, self.clock())
            self.view.close()
            summary = read_summary(self.out_dir)
            for sink in self.sinks:
                sink.close(summary)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _int(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
