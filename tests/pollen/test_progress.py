from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable
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


class _Clock:
    """Virtual time for follow(): sleep advances it, and a callback runs at each step."""

    def __init__(self, on_tick: Callable[[float], None]) -> None:
        self.now = 0.0
        self.on_tick = on_tick

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.on_tick(self.now)


class _Federation:
    def __init__(self, clock: _Clock, finished_at: float) -> None:
        self.clock = clock
        self.finished_at = finished_at
        self.queries: list[float] = []

    def check_alive(self) -> None:
        pass

    def run_status(self, run_id: str) -> dict[str, str]:
        self.queries.append(self.clock.now)
        done = self.clock.now >= self.finished_at
        return {"status": "finished:completed" if done else "running"}


def _follow(tmp_path: Path, finished_at: float, summary_at: float | None, monkeypatch) -> tuple:
    import pollen.launcher as launcher

    def tick(now: float) -> None:
        if (
            summary_at is not None
            and now >= summary_at
            and not (tmp_path / "summary.json").exists()
        ):
            (tmp_path / "summary.json").write_text("{}")

    clock = _Clock(tick)
    monkeypatch.setattr(launcher, "time", clock)
    fed = _Federation(clock, finished_at)
    status = launcher.follow(fed, "1", tmp_path, timeout=1000, stream=io.StringIO())  # type: ignore[arg-type]
    return status, fed.queries, clock.now


def test_follow_asks_for_the_status_at_once_when_the_summary_is_written(
    tmp_path: Path, monkeypatch
) -> None:
    status, queries, ended = _follow(
        tmp_path, finished_at=100.0, summary_at=100.0, monkeypatch=monkeypatch
    )
    assert status["status"] == "finished:completed"
    assert ended <= 100.5  # noticed at the first poll after the summary, not at the next interval
    # `flwr ls` processes are spaced out: at most one per 3 s at first, then one per 15 s
    assert len(queries) <= 12
    gaps = [b - a for a, b in itertools.pairwise(queries)]
    assert min(gaps) >= 3.0
    assert max(gaps[:-1]) <= 15.5


def test_follow_notices_a_run_that_ends_without_a_summary(tmp_path: Path, monkeypatch) -> None:
    status, _queries, ended = _follow(
        tmp_path, finished_at=60.0, summary_at=None, monkeypatch=monkeypatch
    )
    assert status["status"] == "finished:completed"
    assert 60.0 <= ended <= 60.0 + 15.5


def test_a_status_query_that_times_out_is_unknown_not_fatal(tmp_path: Path, monkeypatch) -> None:
    import subprocess

    from pollen.launcher import Federation

    def slow(*args: object, **kwargs: object) -> None:
        raise subprocess.TimeoutExpired(cmd="flwr ls", timeout=120)

    fed = Federation(tmp_path / "fed")
    monkeypatch.setattr(subprocess, "run", slow)  # the CLI process does not answer in time
    assert fed.run_status("1") == {}


def test_a_server_log_query_that_times_out_leaves_a_note(tmp_path: Path, monkeypatch) -> None:
    import subprocess

    from pollen.launcher import Federation

    def slow(*args: object, **kwargs: object) -> None:
        raise subprocess.TimeoutExpired(cmd="flwr log", timeout=60)

    fed = Federation(tmp_path / "fed")
    monkeypatch.setattr(subprocess, "run", slow)  # the CLI process does not answer in time
    assert "unavailable" in fed.server_log("7")
    fed.stop_run("7")  # best effort, no exception


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
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("query.hello: sent to 8 nodes")
    assert lines[1].endswith("query.hello: 10000 clients answered from 8 nodes in 15.2 s")
    assert lines[2].endswith("] clients connected: 10003: 0-9999, 10002, 10004-10005")
