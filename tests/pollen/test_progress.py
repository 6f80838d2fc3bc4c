from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from pollen.tools.progress import PlainView, Progress, RichView, State, clock_text


def _write(path: Path, rows: list[dict]) -> None:
    with open(path, "a") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


RECORDED = Path(__file__).parent / "recorded" / "fedavg-digits-seed0"
"""A real run's files: `pollen simulate --algorithm fedavg --dataset digits --clients 3
--rounds 2` (the final evaluation is written as round 3)."""


def _lines(out: io.StringIO) -> list[str]:
    """The plain view's lines without their time stamps."""
    return [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]


class _Replay:
    """Appends a recorded run's lines to a results directory in the order the ServerApp wrote
    them (clients.jsonl rows with their phase's end, a round's metrics.jsonl row before the
    next round starts), the clock at each event's time: no sleeps."""

    def __init__(self, src: Path, dst: Path) -> None:
        self.dst = dst
        self.now = 0.0
        self.events = [json.loads(x) for x in (src / "events.jsonl").read_text().splitlines()]
        self.metrics = [json.loads(x) for x in (src / "metrics.jsonl").read_text().splitlines()]
        self.clients = [json.loads(x) for x in (src / "clients.jsonl").read_text().splitlines()]
        self.summary = (src / "summary.json").read_text()
        self.at = 0

    def clock(self) -> float:
        return self.now

    def step(self, until: Callable[[dict], bool] | None = None) -> None:
        """Writes events up to the first one `until` accepts (all of them without)."""
        while self.at < len(self.events):
            ev = self.events[self.at]
            self.at += 1
            self.now = ev["time"]
            if ev["event"] == "phase-end":
                mine = [c for c in self.clients if (c["round"], c["phase"]) ==
                        (ev["round"], ev["phase"])]  # fmt: skip
                _write(self.dst / "clients.jsonl", mine)
            if ev["event"] in ("round-start", "final-start"):
                done = [m for m in self.metrics if m["round"] == ev["round"] - 1]
                _write(self.dst / "metrics.jsonl", done)
            _write(self.dst / "events.jsonl", [ev])
            if until is not None and until(ev):
                return
        (self.dst / "summary.json").write_text(self.summary)


def test_a_recorded_run_in_plain_lines(tmp_path: Path) -> None:
    replay = _Replay(RECORDED, tmp_path)
    out = io.StringIO()
    progress = Progress(tmp_path, out, num_rounds=2, clock=replay.clock)
    assert isinstance(progress.view, PlainView)  # not a terminal: plain lines
    replay.step()
    progress.close()
    assert _lines(out) == [
        "round 1/2 query.hello: 3 clients answered from 3 nodes in 36.6 s",
        "clients connected: 3: 0-2",
        "round 1/2 train: 3/3 valid replies in 20.5 s",
        "round 1/2 | clients acc 0.0722 p10 0.0467 loss 2.2462 | server acc 0.3611 loss 2.1811"
        " | 20.9 s, ETA 0:21",
        "round 2/2 train: 3/3 valid replies in 0.3 s",
        "round 2/2 | clients acc 0.3611 p10 0.3267 loss 2.0826 | server acc 0.5750 loss 1.9978"
        " | 0.5 s",
        "final evaluate: 3/3 valid replies in 0.2 s",
    ]


def test_a_recorded_run_in_the_live_panel(tmp_path: Path) -> None:
    """The rich view: round i/N with a bar, elapsed and ETA; the phase with the replies
    received of those expected and whom it waits for; each round's results as a line above."""
    replay = _Replay(RECORDED, tmp_path)
    out = io.StringIO()
    progress = Progress(tmp_path, out, num_rounds=2, plain=False, clock=replay.clock, width=100)
    assert isinstance(progress.view, RichView)

    def panel() -> str:
        console = Console(record=True, width=100, file=io.StringIO())
        console.print(progress.view.panel(progress.state, replay.now))  # type: ignore[union-attr]
        return console.export_text()

    replay.step(lambda ev: ev["event"] == "phase-start" and ev["phase"] == "train")
    progress.poll()
    first = panel()
    assert "round 1/2" in first and "0%" in first and "ETA after round 1" in first
    assert "train: 0/3 replies - waiting for train replies from 3 clients" in first
    # two of three replied: the panel names the straggler
    replay.step(lambda ev: ev["event"] == "phase-progress" and ev.get("waiting") == [1])
    progress.poll()
    assert "train: 2/3 replies - waiting for client 1 (2 of 3 replied)" in panel()
    replay.step(lambda ev: ev["event"] == "phase-progress" and ev.get("waiting") == [1, 2])
    progress.poll()
    second = panel()
    assert "round 2/2" in second and "50%" in second
    # round 1 took 20.9 s; round 2 started 0.3 s ago
    assert f"elapsed {clock_text(replay.now)}" in second and "ETA 0:21" in second
    assert "train: 1/3 replies - waiting for clients 1, 2 (1 of 3 replied)" in second
    replay.step(lambda ev: ev["event"] == "server-eval-start" and ev["round"] == 2)
    progress.poll()
    assert "waiting for the server's evaluation of the global model" in panel()
    replay.step(lambda ev: ev["event"] == "phase-start" and ev["phase"] == "evaluate")
    progress.poll()
    assert "final" in panel() and "100%" in panel() and "final evaluation" in panel()
    replay.step()  # the last events, then summary.json
    progress.poll()
    assert "waiting for Flower to report the run ended (its summary is written)" in panel()
    progress.close()
    text = out.getvalue()
    assert "round 1/2 | clients acc 0.0722 p10 0.0467 loss 2.2462 | server acc 0.3611" in text
    assert "round 2/2 | clients acc 0.3611" in text
    assert "round 2/2" in text.splitlines()[-2] and "100%" in text and "finished" in text
    assert "train: 3/3 valid replies" not in text  # protocol details stay in the panel


def test_the_plain_view_says_what_a_quiet_run_waits_for(tmp_path: Path) -> None:
    now = [0.0]
    out = io.StringIO()
    progress = Progress(tmp_path, out, num_rounds=3, clock=lambda: now[0])
    for now[0] in (5.0, 14.0):
        progress.poll()
    assert out.getvalue() == ""
    now[0] = 16.0
    progress.poll()
    assert _lines(out) == ["waiting for the ServerApp to start; nothing new for 16 s"]
    now[0] = 20.0  # the next line comes after twice the quiet: at 32 s
    progress.poll()
    assert len(_lines(out)) == 1
    _write(tmp_path / "events.jsonl", [
        {"event": "waiting-for-clients", "round": 1, "connected": 1, "needed": 3, "timeout": 300},
    ])  # fmt: skip
    progress.poll()
    assert _lines(out)[-1] == (
        "waiting for clients: 1 of 3 connected (the run starts at 3, gives up after 300 s)"
    )
    _write(tmp_path / "events.jsonl", [
        {"event": "clients", "round": 1, "clients": [0, 1, 2]},
        {"event": "round-start", "round": 1, "rounds": 3},
        {"event": "phase-start", "round": 1, "phase": "train", "clients": 3, "messages": 3},
        {"event": "phase-progress", "round": 1, "phase": "train", "answered": 2, "valid": 2,
         "total": 3, "waiting": [2]},
    ])  # fmt: skip
    progress.poll()
    now[0] = 40.0
    progress.poll()
    assert _lines(out)[-2:] == [
        "clients connected: 3: 0-2",
        "round 1/3: waiting for client 2 (2 of 3 replied); nothing new for 20 s",
    ]


def test_eta_is_the_mean_round_times_the_rounds_left() -> None:
    state = State(num_rounds=10)
    assert state.eta(0.0) is None  # no round ended yet
    state.round_seconds = [30.0]
    state.done, state.round, state.round_started = 1, 2, 100.0
    assert state.eta(105.0) == 9 * 30.0 - 5.0
    # the first round paid the clients' start-up: left out once others ended
    state.round_seconds = [30.0, 10.0, 14.0]
    state.done, state.round, state.round_started = 3, 4, 100.0
    assert state.eta(105.0) == 7 * 12.0 - 5.0
    assert state.eta(1000.0) == 0.0
    assert clock_text(95) == "1:35" and clock_text(3725) == "1:02:05"


def test_the_view_is_plain_unless_the_output_is_a_terminal(tmp_path: Path) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    live = Progress(tmp_path, Terminal())
    assert isinstance(live.view, RichView)
    live.close()
    assert isinstance(Progress(tmp_path, Terminal(), plain=True).view, PlainView)


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
    assert _lines(out) == [
        "round 1/2 train: 2/2 valid replies in 1.0 s",
        "round 1/2 | clients acc 0.5000 | 1.0 s, ETA 0:01",
    ]
    with open(tmp_path / "events.jsonl", "a") as fh:
        fh.write(
            'nd": 3, "phase": "evaluate", "valid": 1, "sent": 2, "seconds": 2.0, '
            '"failed": {"1": "no reply within 5 s"}}\n'
        )
    progress.poll()
    assert _lines(out)[-2:] == [
        "final evaluate: 1/2 valid replies in 2.0 s, 1 skipped",
        "    final evaluate: client 1 skipped: no reply within 5 s",
    ]


def test_the_hello_and_thousands_of_clients_print_in_a_line_each(tmp_path: Path) -> None:
    out = io.StringIO()
    progress = Progress(tmp_path, out, num_rounds=1)
    hello = {"phase": "query.hello", "round": 1}
    _write(tmp_path / "events.jsonl", [
        {"event": "phase-start", **hello, "clients": 8, "messages": 8},
        {"event": "phase-end", **hello, "valid": 10000, "sent": 8, "seconds": 15.2, "failed": {}},
        {"event": "clients", "round": 1, "clients": [*range(10000), 10002, 10004, 10005]},
    ])  # fmt: skip
    progress.poll()
    assert _lines(out) == [
        "round 1/1 query.hello: 10000 clients answered from 8 nodes in 15.2 s",
        "clients connected: 10003: 0-9999, 10002, 10004-10005",
    ]


def test_late_clients_are_counted_in_the_phases_line_not_listed(tmp_path: Path) -> None:
    out = io.StringIO()
    progress = Progress(tmp_path, out, num_rounds=1)
    late = "late: the phase closed with the 2 valid replies it wanted"
    _write(tmp_path / "events.jsonl", [
        {"event": "phase-start", "phase": "train", "round": 1, "clients": 5},
        {"event": "phase-end", "phase": "train", "round": 1, "valid": 2, "sent": 5,
         "seconds": 0.4, "failed": {"1": "error: boom", "3": late, "4": late},
         "late": [3, 4], "closed-at": 2.5},
        {"event": "phase-end", "phase": "train", "round": 1, "valid": 2, "sent": 3,
         "seconds": 0.1, "failed": {"2": late}, "late": [2], "closed-at": 7.0,
         "clock": "virtual"},
    ])  # fmt: skip
    progress.poll()
    assert _lines(out) == [
        "round 1/1 train: 2/5 valid replies in 0.4 s, 1 skipped, 2 late (closed at 2.5 s)",
        "    round 1/1 train: client 1 skipped: error: boom",
        "round 1/1 train: 2/3 valid replies in 0.1 s, 1 late (closed at 7.0 virtual s)",
    ]
